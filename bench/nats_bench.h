// Scaffolding of the NATS benchmarks (bench_forward, bench_pull): a nats-server of their own
// with JetStream on a free port of 127.0.0.1, processes started with their output in a log,
// and a stream's message count. Header only.
#pragma once

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

namespace {

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("bench: free port");
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

// Starts nats-server (JetStream, file storage under `root`, log root/nats.log) on a free port;
// sets `url` and returns its pid once a client can connect, or -1 (said on stderr, as `who`).
pid_t start_nats_server(const std::string& server, const std::filesystem::path& root, std::string& url,
                        const char* who) {
  const int port = free_port();
  url = "nats://127.0.0.1:" + std::to_string(port);
  pid_t nats = spawn({server, "-js", "-a", "127.0.0.1", "-p", std::to_string(port), "-sd", (root / "store").string()},
                     (root / "nats.log").string());
  for (int i = 0; i < 100; ++i) {
    natsConnection* nc = nullptr;
    bool up = natsConnection_ConnectTo(&nc, url.c_str()) == NATS_OK;
    natsConnection_Destroy(nc);
    if (up) return nats;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::fprintf(stderr, "%s: nats-server did not start (see %s)\n", who, (root / "nats.log").c_str());
  ::kill(nats, SIGKILL);
  return -1;
}

// What both benchmarks take and set up: SPOOL NATS_SERVER [MESSAGES] [PAYLOAD_BYTES], a
// temporary directory and a nats-server in it.
struct NatsBench {
  std::string spool, server, url;
  size_t messages = 20000, size = 100;
  std::filesystem::path root;
  pid_t nats = -1;
};

// Parses argv and starts the server; false (said on stderr, as `who`) when it cannot.
bool start_nats_bench(int argc, char** argv, const char* who, NatsBench* b) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s SPOOL NATS_SERVER [MESSAGES] [PAYLOAD_BYTES]\n", who);
    return false;
  }
  b->spool = std::filesystem::absolute(argv[1]);
  b->server = argv[2];
  if (argc > 3) b->messages = std::strtoul(argv[3], nullptr, 10);
  if (argc > 4) b->size = std::strtoul(argv[4], nullptr, 10);
  std::string tmpl = std::string("/tmp/spool-") + who + ".XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::perror("mkdtemp");
    return false;
  }
  b->root = tmpl;
  b->nats = start_nats_server(b->server, b->root, b->url, who);
  return b->nats >= 0;
}

// Stops the server; removes the directory when every run passed (else it keeps the logs).
int stop_nats_bench(NatsBench& b, int rc) {
  ::kill(b.nats, SIGTERM);
  ::waitpid(b.nats, nullptr, 0);
  nats_CloseAndWait(2000);
  if (rc == 0) std::filesystem::remove_all(b.root);
  return rc;
}

}  // namespace
