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

#include "nats_bench.h"
#include "spool/queue.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

}  // namespace

int main(int argc, char** argv) {
  NatsBench b;
  if (!start_nats_bench(argc, argv, "bench_forward", &b)) return b.root.empty() && argc < 3 ? 2 : 1;
  const std::string &spool = b.spool, &url = b.url;
  const size_t messages = b.messages, size = b.size;
  const fs::path& root = b.root;

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
  return stop_nats_bench(b, rc);
}
