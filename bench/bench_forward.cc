// Throughput of `spool forward` (local queue -> NATS JetStream), end to end.
//
//   bench_forward SPOOL NATS_SERVER [MESSAGES] [PAYLOAD_BYTES]      (default 20000 100)
//
// Starts its own nats-server with JetStream (file storage in a temporary directory, a free
// port on 127.0.0.1), then for several windows (-j) fills a fresh queue with MESSAGES
// messages and times `spool forward --once` until it exits: every message published, its
// PubAck received and the local copy acked. Connecting and creating the stream are inside
// the time (a few milliseconds). Each run's stream is checked to hold exactly MESSAGES.
// Prints a table; exit code 0 when every run forwarded everything.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nats/nats.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "spool/queue.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("bench_forward: free port");
    std::exit(1);
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// Runs argv with stdout and stderr appended to `log`; returns its pid.
pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

// The number of messages in `stream`, or -1.
long long stream_count(const std::string& url, const std::string& stream) {
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;
  jsStreamInfo* si = nullptr;
  long long n = -1;
  if (natsConnection_ConnectTo(&nc, url.c_str()) == NATS_OK && natsConnection_JetStream(&js, nc, nullptr) == NATS_OK &&
      js_GetStreamInfo(&si, js, stream.c_str(), nullptr, nullptr) == NATS_OK) {
    n = static_cast<long long>(si->State.Msgs);
  }
  jsStreamInfo_Destroy(si);
  jsCtx_Destroy(js);
  natsConnection_Destroy(nc);
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: bench_forward SPOOL NATS_SERVER [MESSAGES] [PAYLOAD_BYTES]\n");
    return 2;
  }
  const std::string spool = fs::absolute(argv[1]), server = argv[2];
  const size_t messages = argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 20000;
  const size_t size = argc > 4 ? std::strtoul(argv[4], nullptr, 10) : 100;
  char tmpl[] = "/tmp/spool-bench-forward.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::perror("bench_forward: mkdtemp");
    return 1;
  }
  const fs::path root = tmpl;
  const int port = free_port();
  const std::string url = "nats://127.0.0.1:" + std::to_string(port);
  pid_t nats = spawn({server, "-js", "-a", "127.0.0.1", "-p", std::to_string(port), "-sd", (root / "store").string()},
                     (root / "nats.log").string());
  // Up when a client can connect.
  bool up = false;
  for (int i = 0; i < 100 && !up; ++i) {
    natsConnection* nc = nullptr;
    up = natsConnection_ConnectTo(&nc, url.c_str()) == NATS_OK;
    natsConnection_Destroy(nc);
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!up) {
    std::fprintf(stderr, "bench_forward: nats-server did not start (see %s)\n", (root / "nats.log").c_str());
    ::kill(nats, SIGKILL);
    return 1;
  }

  std::printf("spool forward -> NATS JetStream (file storage, same host): %zu messages of %zu B\n", messages, size);
  std::printf("%8s %10s %12s\n", "-j", "seconds", "msg/s");
  int rc = 0;
  const std::string payload(size, 'x');
  for (size_t window : {1, 16, 256, 1024}) {
    const std::string dir = (root / ("q" + std::to_string(window))).string();
    {
      auto q = spool::Queue::open(dir);
      if (!q.ok()) {
        std::fprintf(stderr, "bench_forward: %s\n", q.status().to_string().c_str());
        return 1;
      }
      std::vector<std::string_view> batch(1000, payload);
      for (size_t sent = 0; sent < messages; sent += batch.size()) {
        batch.resize(std::min<size_t>(1000, messages - sent));
        if (auto ids = (*q)->send_batch(batch); !ids.ok()) {
          std::fprintf(stderr, "bench_forward: send: %s\n", ids.status().to_string().c_str());
          return 1;
        }
      }
      if (spool::Status s = (*q)->sync(); !s.ok()) return 1;
    }
    const std::string stream = "BENCH" + std::to_string(window);
    const std::string subject = "bench." + std::to_string(window);
    auto start = Clock::now();
    pid_t fwd = spawn({spool, "forward", dir, "--nats", url, "--subject", subject, "--stream", stream, "-j",
                       std::to_string(window), "--once"},
                      (root / "forward.log").string());
    int status = 0;
    ::waitpid(fwd, &status, 0);
    double secs = std::chrono::duration<double>(Clock::now() - start).count();
    long long stored = stream_count(url, stream);
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 && stored == static_cast<long long>(messages);
    std::printf("%8zu %10.2f %12.0f%s\n", window, secs, static_cast<double>(messages) / secs,
                window == 256 ? "   (default)" : "");
    if (!ok) {
      std::printf("  FAILED: exit status %d, %lld messages in the stream (log: %s)\n", status, stored,
                  (root / "forward.log").c_str());
      rc = 1;
    }
    std::fflush(stdout);
  }
  ::kill(nats, SIGTERM);
  ::waitpid(nats, nullptr, 0);
  nats_CloseAndWait(2000);
  if (rc == 0) fs::remove_all(root);
  return rc;
}
