// Throughput of `spool pull` (NATS JetStream -> local queue), end to end.
//
//   bench_pull SPOOL NATS_SERVER [MESSAGES] [PAYLOAD_BYTES]      (default 20000 100)
//
// Starts its own nats-server with JetStream (file storage in a temporary directory, a free
// port on 127.0.0.1), then for -j 1 and -j 256 publishes MESSAGES messages (MESSAGES / 10
// for -j 1, which syncs the queue once per message) to a fresh work-queue stream and times
// `spool pull --once` into a fresh queue until it exits: every message fetched, queued,
// synced to disk and acked. Connecting and creating the consumer are inside the time. Each
// run is checked: the queue holds exactly the messages published and the stream is empty.
// Prints a table; exit code 0 when every run pulled everything.
#include <sys/wait.h>

#include <nats/nats.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "nats_bench.h"
#include "spool/queue.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Creates `stream` (work queue, file storage, subject `subject`) and publishes `n` messages
// of `payload` to it; false (said on stderr) on an error.
bool fill_stream(const std::string& url, const std::string& stream, const std::string& subject, size_t n,
                 const std::string& payload) {
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;
  natsStatus s = natsConnection_ConnectTo(&nc, url.c_str());
  if (s == NATS_OK) s = natsConnection_JetStream(&js, nc, nullptr);
  jsStreamConfig cfg;
  jsStreamConfig_Init(&cfg);
  const char* subjects[] = {subject.c_str()};
  cfg.Name = stream.c_str();
  cfg.Subjects = subjects;
  cfg.SubjectsLen = 1;
  cfg.Retention = js_WorkQueuePolicy;
  cfg.Storage = js_FileStorage;
  if (s == NATS_OK) s = js_AddStream(nullptr, js, &cfg, nullptr, nullptr);
  for (size_t i = 0; s == NATS_OK && i < n; ++i) {
    s = js_PublishAsync(js, subject.c_str(), payload.data(), static_cast<int>(payload.size()), nullptr);
  }
  jsPubOptions po;
  jsPubOptions_Init(&po);
  po.MaxWait = 60000;
  if (s == NATS_OK) s = js_PublishAsyncComplete(js, &po);
  if (s != NATS_OK) std::fprintf(stderr, "bench_pull: filling %s: %s\n", stream.c_str(), natsStatus_GetText(s));
  jsCtx_Destroy(js);
  natsConnection_Destroy(nc);
  return s == NATS_OK;
}

}  // namespace

int main(int argc, char** argv) {
  NatsBench b;
  if (!start_nats_bench(argc, argv, "bench_pull", &b)) return b.root.empty() && argc < 3 ? 2 : 1;
  const std::string &spool = b.spool, &url = b.url;
  const size_t messages = b.messages, size = b.size;
  const fs::path& root = b.root;

  std::printf("NATS JetStream -> spool pull (file storage, same host, queue sync per batch): messages of %zu B\n",
              size);
  std::printf("%8s %10s %10s %12s\n", "-j", "messages", "seconds", "msg/s");
  int rc = 0;
  const std::string payload(size, 'x');
  for (size_t batch : {1, 256}) {
    const size_t n = batch == 1 ? std::max<size_t>(1, messages / 10) : messages;
    const std::string stream = "BENCH" + std::to_string(batch), subject = "bench." + std::to_string(batch);
    if (!fill_stream(url, stream, subject, n, payload)) return 1;
    const std::string dir = (root / ("q" + std::to_string(batch))).string();
    pid_t pull = spawn({spool, "init", dir}, (root / "pull.log").string());
    ::waitpid(pull, nullptr, 0);
    auto start = Clock::now();
    pull = spawn({spool, "pull", dir, "--nats", url, "--stream", stream, "--consumer", "bench", "-j",
                  std::to_string(batch), "--once"},
                 (root / "pull.log").string());
    int status = 0;
    ::waitpid(pull, &status, 0);
    double secs = std::chrono::duration<double>(Clock::now() - start).count();
    uint64_t queued = 0;
    if (auto q = spool::Queue::open(dir); q.ok()) {
      if (auto st = (*q)->stats(); st.ok()) queued = st->sent_total;
    }
    long long left = stream_count(url, stream);
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 && queued == n && left == 0;
    std::printf("%8zu %10zu %10.2f %12.0f%s\n", batch, n, secs, static_cast<double>(n) / secs,
                batch == 256 ? "   (default)" : "");
    if (!ok) {
      std::printf("  FAILED: exit status %d, %lu queued, %lld left in the stream (log: %s)\n", status,
                  static_cast<unsigned long>(queued), left, (root / "pull.log").c_str());
      rc = 1;
    }
    std::fflush(stdout);
  }
  return stop_nats_bench(b, rc);
}
