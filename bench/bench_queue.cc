// End-to-end benchmarks of the public Queue API with real processes. Every producer and
// consumer is a fork()ed child that opens the queue itself (a Queue object never crosses a
// fork); the parent only creates directories, starts the children together, collects their
// numbers through an anonymous shared mapping and prints the tables.
//
//  1. send -> receive -> ack throughput, 100 B payloads, 1 producer + 1 or 2 consumers, for
//     each sync policy, "single" (send / receive(1) / ack per message) and "batched"
//     (send_batch of 64 / receive(64) / ack per message: the API has no batched ack).
//     Throughput is messages / (time from the common start to the last ack).
//  2. Long-poll wake latency: a consumer blocked in receive(1, vis, wait = 5 s); the
//     producer puts CLOCK_MONOTONIC in the payload right before send(); the consumer takes
//     the difference when receive returns. So a sample is send() (lock, append, index,
//     wake) + futex wake-up + the consumer's receive (lock, read, LEASE append, sync).
//  3. Index and log bytes per queued message at 1M (and, with --big, 10M) messages of
//     100 B, sent with send_batch(1000) under sync=never.
//  4. Receive throughput (receive(64) + ack, one consumer, sync=never) at a backlog of 1k
//     vs the 1M (10M) queue of 3, plus the time of stats() and peek(10) at that backlog (each
//     walks the whole index under the lock) and of an open that rebuilds the index from the log.
//
// Usage: bench_queue [--big] [--only=e2e,bound,latency,index,groups] [--sync=always|interval|never]
//                    [--consumers=1|2] [--scale=F]
// Files go to a fresh directory under /var/tmp (SPOOL_BENCH_DIR overrides), which must be a
// disk: on tmpfs fdatasync is free and the sync rows mean nothing. It is removed at the end
// (not when the run is interrupted: remove /var/tmp/spool-bench-queue-* by hand then).
// SPOOL_IO=pwrite selects the pwrite backend (in every child, since they inherit the
// environment).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bench_util.h"
#include "io/io.h"
#include "queue/config.h"
#include "spool/queue.h"
#include "storage/log.h"
#include "storage/segment.h"

namespace {

using spool::Code;
using spool::Millis;
using spool::Queue;
using spool::QueueOptions;
using spool::Status;
using spool::SyncPolicy;
using spool::queue::sync_name;
using namespace spool::bench;

constexpr char kName[] = "bench_queue";  // in notes about children

constexpr size_t kPayload = 100;
constexpr size_t kBatch = 64;
constexpr Millis kVisibility{60000};  // long enough that no lease runs out during a run
constexpr Millis kConsumerWait{50};   // long-poll slice of the e2e consumers
constexpr int kLatencyWarmup = 20;
constexpr int kLatencySamples = 500;
constexpr size_t kMaxSamples = 1024;

// CPU time of this process (all threads): robust against other load on the machine.
uint64_t cpu_ns() { return clock_ns(CLOCK_PROCESS_CPUTIME_ID); }

// ---- shared state between the parent and its children -----------------------------------

struct Shared {
  std::atomic<uint64_t> ready;        // children that opened the queue
  std::atomic<uint64_t> acked;        // e2e: messages acked so far
  std::atomic<uint64_t> redelivered;  // e2e: deliveries with receive_count > 1
  std::atomic<uint64_t> t_end;        // e2e: CLOCK_MONOTONIC of the ack that completed the run
  std::atomic<uint64_t> t_prod_end;   // e2e: when the producer's last send returned
  std::atomic<uint64_t> timeouts;     // latency: receives that came back kEmpty
  // Generic result slots for the one-child measurements.
  std::atomic<uint64_t> v[16];
  uint64_t lat[kMaxSamples];   // latency: send -> receive returned, ns
  uint64_t send[kMaxSamples];  // latency: duration of the producer's send(), ns
};

Shared* g_sh = nullptr;

void reset_shared() {
  std::memset(static_cast<void*>(g_sh), 0, sizeof(Shared));
}

[[noreturn]] void child_fail(const char* what, const Status& s) {
  std::fprintf(stderr, "bench_queue[%d]: %s: %s\n", ::getpid(), what, s.to_string().c_str());
  std::fflush(stderr);
  ::_exit(2);
}

std::unique_ptr<Queue> open_queue(const std::string& dir, SyncPolicy sync) {
  QueueOptions o;
  o.sync = sync;
  o.visibility = kVisibility;
  auto q = Queue::open(dir, o);
  if (!q.ok()) child_fail(("open " + dir).c_str(), q.status());
  return std::move(q).value();
}

// Creates the queue (fixing its sync policy) in a child of its own, before the workers
// start: creation stays out of the timings, and the workers do not race to create it.
void create_queue(const std::string& dir, SyncPolicy sync) {
  if (!wait_all({spawn([&] {
        open_queue(dir, sync);
        return 0;
      })}, kName)) {
    std::fprintf(stderr, "bench_queue: cannot create %s\n", dir.c_str());
    std::exit(1);
  }
}

std::string g_root;

// ---- 1. end-to-end throughput --------------------------------------------------------------

struct E2eRow {
  SyncPolicy sync = SyncPolicy::kNever;
  int consumers = 1;
  bool batched = false;
  bool bound = false;  // consumers bind their leases (instant release on death)
  uint64_t n = 0;
  bool ok = false;
  double seconds = 0, rate = 0, send_rate = 0;
  uint64_t redelivered = 0;
  std::string check;
};

// Verifies, in a child, that the queue ended empty with every message sent and acked once.
std::string verify_empty(const std::string& dir, SyncPolicy sync, uint64_t n) {
  reset_shared();
  pid_t p = spawn([&] {
    auto q = open_queue(dir, sync);
    auto st = q->stats();
    if (!st.ok()) child_fail("stats", st.status());
    g_sh->v[0] = st->ready;
    g_sh->v[1] = st->in_flight;
    g_sh->v[2] = st->sent_total;
    g_sh->v[3] = st->acked_total;
    g_sh->v[4] = q->check_index().empty() ? 1 : 0;
    return 0;
  });
  if (!wait_all({p}, kName)) return "verify failed";
  if (g_sh->v[0] != 0 || g_sh->v[1] != 0 || g_sh->v[2] != n || g_sh->v[3] != n || g_sh->v[4] != 1) {
    char b[160];
    std::snprintf(b, sizeof b, "BAD ready=%" PRIu64 " inflight=%" PRIu64 " sent=%" PRIu64 " acked=%" PRIu64 " idx=%" PRIu64,
                  g_sh->v[0].load(), g_sh->v[1].load(), g_sh->v[2].load(), g_sh->v[3].load(), g_sh->v[4].load());
    return b;
  }
  return "ok";
}

void run_e2e(E2eRow& row, int serial) {
  std::string dir = fresh_dir(g_root, "e2e-" + std::to_string(serial));
  create_queue(dir, row.sync);
  sync_fs(g_root);
  reset_shared();
  const uint64_t n = row.n;
  StartGate gate(g_sh->ready);
  std::vector<pid_t> pids;
  // Producer.
  pids.push_back(spawn(
      [&] {
        auto q = open_queue(dir, row.sync);
        std::string payload = make_payload(kPayload, 1);
        std::vector<std::string_view> batch(kBatch, payload);
        gate.child_wait();
        if (row.batched) {
          for (uint64_t sent = 0; sent < n;) {
            size_t k = static_cast<size_t>(std::min<uint64_t>(kBatch, n - sent));
            auto r = q->send_batch(std::span(batch.data(), k));
            if (!r.ok()) child_fail("send_batch", r.status());
            sent += k;
          }
        } else {
          for (uint64_t i = 0; i < n; ++i) {
            auto r = q->send(payload);
            if (!r.ok()) child_fail("send", r.status());
          }
        }
        g_sh->t_prod_end = mono_ns();
        return 0;
      }));
  // Consumers.
  for (int c = 0; c < row.consumers; ++c) {
    pids.push_back(spawn(
        [&] {
          auto q = open_queue(dir, row.sync);
          if (row.bound) {
            if (Status s = q->bind_leases(); !s.ok()) child_fail("bind_leases", s);
          }
          const size_t max = row.batched ? kBatch : 1;
          gate.child_wait();
          uint64_t last_progress = mono_ns();
          while (g_sh->acked.load(std::memory_order_relaxed) < n) {
            auto r = q->receive(max, kVisibility, kConsumerWait);
            if (!r.ok()) {
              if (r.status().code() != Code::kEmpty) child_fail("receive", r.status());
              if (mono_ns() - last_progress > 60'000'000'000ull) {
                child_fail("receive", Status(Code::kEmpty, "nothing to receive for 60 s (producer gone?)"));
              }
              continue;
            }
            last_progress = mono_ns();
            for (const auto& m : *r) {
              if (m.receive_count > 1) g_sh->redelivered.fetch_add(1, std::memory_order_relaxed);
              if (Status s = q->ack(m.receipt); !s.ok()) child_fail("ack", s);
              if (g_sh->acked.fetch_add(1) + 1 == n) g_sh->t_end = mono_ns();
            }
          }
          return 0;
        }));
  }
  uint64_t t0 = gate.release(pids, kName);
  row.ok = t0 != 0 && wait_all(pids, kName);
  if (row.ok && g_sh->t_end.load() > t0) {
    uint64_t el = g_sh->t_end.load() - t0;
    row.seconds = secs(el);
    row.rate = static_cast<double>(n) / row.seconds;
    row.send_rate = static_cast<double>(n) / secs(g_sh->t_prod_end.load() - t0);
    row.redelivered = g_sh->redelivered.load();
    row.check = verify_empty(dir, row.sync, n);
  } else {
    row.ok = false;
    row.check = "FAILED";
  }
  remove_dir(dir);
}

// Message counts per run, sized for ~1-3 s each with the default io_uring backend on the
// development VM (2 vCPUs, virtio ext4, fdatasync 0.3..4 ms); --scale multiplies them.
uint64_t e2e_count(SyncPolicy p, bool batched, double scale) {
  uint64_t n = 0;
  switch (p) {
    case SyncPolicy::kAlways: n = batched ? 1200 : 500; break;
    case SyncPolicy::kInterval: n = batched ? 40000 : 15000; break;
    case SyncPolicy::kNever: n = batched ? 40000 : 15000; break;
  }
  return std::max<uint64_t>(64, static_cast<uint64_t>(static_cast<double>(n) * scale));
}

void section_e2e(const std::vector<int>& consumer_counts, double scale, const std::vector<SyncPolicy>& policies) {
  std::printf("\n== 1. send -> receive -> ack throughput (100 B payloads, visibility 60 s, consumer wait %lld ms) ==\n",
              static_cast<long long>(kConsumerWait.count()));
  std::printf("single  = send() / receive(1) / ack() per message\n");
  std::printf("batched = send_batch(64) / receive(64) / ack() per message (there is no batched ack)\n");
  std::printf("msgs/s  = messages / (start .. last ack); send-side = messages / (start .. last send returned)\n\n");
  std::printf("%-9s %-6s %-8s %8s %7s %10s %10s %7s  %s\n", "sync", "procs", "mode", "msgs", "secs",
              "msgs/s", "send-side", "redeliv", "check");
  int serial = 0;
  for (SyncPolicy p : policies) {
    for (int c : consumer_counts) {
      for (bool batched : {false, true}) {
        E2eRow row;
        row.sync = p;
        row.consumers = c;
        row.batched = batched;
        row.n = e2e_count(p, batched, scale);
        run_e2e(row, serial++);
        char procs[16];
        std::snprintf(procs, sizeof procs, "1P+%dC", c);
        if (row.ok) {
          std::printf("%-9s %-6s %-8s %8" PRIu64 " %7.2f %10s %10s %7" PRIu64 "  %s\n", sync_name(p), procs,
                      batched ? "batched" : "single", row.n, row.seconds, human(row.rate).c_str(),
                      human(row.send_rate).c_str(), row.redelivered, row.check.c_str());
        } else {
          std::printf("%-9s %-6s %-8s %8" PRIu64 "  FAILED\n", sync_name(p), procs,
                      batched ? "batched" : "single", row.n);
        }
        std::fflush(stdout);
      }
    }
  }
}

// ---- 1b. the cost of bound leases --------------------------------------------------------------

void section_bound(double scale) {
  std::printf("\n== 1b. bound leases (instant release on death) vs plain leases, sync=interval, single mode ==\n");
  std::printf("runs alternate plain / bound, 3 of each per consumer count; ratio = median bound / median plain\n\n");
  std::printf("%-6s %12s %12s %7s\n", "procs", "plain msgs/s", "bound msgs/s", "ratio");
  int serial = 1000;
  for (int c : {1, 2}) {
    std::vector<double> rate[2];
    bool ok = true;
    for (int round = 0; round < 3; ++round) {
      for (bool bound : {false, true}) {
        E2eRow row;
        row.sync = SyncPolicy::kInterval;
        row.consumers = c;
        row.bound = bound;
        row.n = e2e_count(SyncPolicy::kInterval, false, scale);
        run_e2e(row, serial++);
        ok = ok && row.ok && row.check == "ok";
        rate[bound].push_back(row.rate);
      }
    }
    for (auto& r : rate) std::sort(r.begin(), r.end());
    char procs[16];
    std::snprintf(procs, sizeof procs, "1P+%dC", c);
    if (!ok) {
      std::printf("%-6s FAILED\n", procs);
      continue;
    }
    std::printf("%-6s %12s %12s %7.2f\n", procs, human(rate[0][1]).c_str(), human(rate[1][1]).c_str(),
                rate[1][1] / rate[0][1]);
    std::fflush(stdout);
  }
}

// ---- 2. long-poll wake latency ----------------------------------------------------------------

void section_latency(const std::vector<SyncPolicy>& policies) {
  std::printf("\n== 2. long-poll wake latency: consumer blocked in receive(1, 60 s, wait=5 s); producer sends one message ==\n");
  std::printf("sample = CLOCK_MONOTONIC before send() (carried in the payload) -> consumer's receive() returned;\n");
  std::printf("the producer sends 2-3 ms after the consumer announced it is about to block. %d samples after %d warm-up.\n",
              kLatencySamples, kLatencyWarmup);
  std::printf("send() = duration of the producer's send call. All times in microseconds.\n\n");
  std::printf("%-9s %9s %9s %9s %9s   %9s %9s %9s  %s\n", "sync", "p50", "p90", "p99", "max", "send p50",
              "send p99", "send max", "timeouts");
 int serial = 0;
  for (SyncPolicy p : policies) {
    std::string dir = fresh_dir(g_root, "lat-" + std::to_string(serial++));
    create_queue(dir, p);
    sync_fs(g_root);
    reset_shared();
    int turn[2];  // consumer -> producer: "about to block in receive"
    if (::pipe2(turn, O_CLOEXEC) != 0) die("pipe");
    const int total = kLatencyWarmup + kLatencySamples;
    StartGate gate(g_sh->ready);
    std::vector<pid_t> pids;
    pids.push_back(spawn(
        [&] {  // consumer
          ::close(turn[0]);
          auto q = open_queue(dir, p);
          gate.child_wait();
          for (int i = 0; i < total; ++i) {
            char c = 1;
            if (::write(turn[1], &c, 1) != 1) return 3;
            auto r = q->receive(1, kVisibility, Millis(5000));
            uint64_t t = mono_ns();
            if (!r.ok()) {
              if (r.status().code() != Code::kEmpty) child_fail("receive", r.status());
              g_sh->timeouts.fetch_add(1);
              continue;
            }
            const auto& m = r->front();
            uint64_t ts = 0;
            std::memcpy(&ts, m.payload.data(), sizeof ts);
            if (i >= kLatencyWarmup) g_sh->lat[i - kLatencyWarmup] = t - ts;
            if (Status s = q->ack(m.receipt); !s.ok()) child_fail("ack", s);
          }
          return 0;
        }));
    pids.push_back(spawn(
        [&] {  // producer
          ::close(turn[1]);
          auto q = open_queue(dir, p);
          std::string payload = make_payload(kPayload, 7);
          gate.child_wait();
          uint64_t rnd = 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(::getpid());
          for (int i = 0; i < total; ++i) {
            char c;
            if (::read(turn[0], &c, 1) != 1) return 3;
            rnd ^= rnd << 13;
            rnd ^= rnd >> 7;
            rnd ^= rnd << 17;
            ::usleep(2000 + static_cast<useconds_t>(rnd % 1000));
            uint64_t ts = mono_ns();
            std::memcpy(payload.data(), &ts, sizeof ts);
            auto r = q->send(payload);
            uint64_t done = mono_ns();
            if (!r.ok()) child_fail("send", r.status());
            if (i >= kLatencyWarmup) g_sh->send[i - kLatencyWarmup] = done - ts;
          }
          return 0;
        }));
    ::close(turn[0]);
    ::close(turn[1]);
    bool ok = gate.release(pids, kName) != 0 && wait_all(pids, kName);
    if (!ok) {
      std::printf("%-9s FAILED\n", sync_name(p));
    } else {
      std::vector<uint64_t> lat(g_sh->lat, g_sh->lat + kLatencySamples);
      std::vector<uint64_t> snd(g_sh->send, g_sh->send + kLatencySamples);
      std::printf("%-9s %9.1f %9.1f %9.1f %9.1f   %9.1f %9.1f %9.1f  %" PRIu64 "\n", sync_name(p),
                  pct_us(lat, 0.5), pct_us(lat, 0.9), pct_us(lat, 0.99), pct_us(lat, 1.0), pct_us(snd, 0.5),
                  pct_us(snd, 0.99), pct_us(snd, 1.0), g_sh->timeouts.load());
    }
    std::fflush(stdout);
    remove_dir(dir);
  }
}

// ---- 3 + 4. index size per message, receive throughput vs backlog ----------------------------

struct Sizes {
  uint64_t n = 0;
  double fill_rate = 0;
  double worst_batch_ms = 0;  // slowest send_batch(1000) of the fill (index growth)
  uint64_t worst_batch_at = 0;  // messages queued when it started
  uint64_t index_size = 0, index_alloc = 0;
  uint64_t log_size = 0, log_alloc = 0, log_used = 0, segments = 0;
};

struct Drain {
  uint64_t backlog = 0;  // messages queued when draining started
  uint64_t drained = 0;
  double rate = 0;      // per wall-clock second
  double cpu_rate = 0;  // per CPU second of the consumer (user + system)
  double open_ms = 0, stats_cold_ms = 0, stats_ms = 0, peek_ms = 0, rebuild_ms = 0;
  uint64_t rss_kb = 0, anon_kb = 0, file_kb = 0;  // the consumer's, when it was done
  bool ok = false;
};

// VmRSS, RssAnon and RssFile of this process, into g_sh->v[7..9].
void record_rss() {
  auto st = proc_status();
  g_sh->v[7] = static_cast<uint64_t>(st["VmRSS"]);
  g_sh->v[8] = static_cast<uint64_t>(st["RssAnon"]);
  g_sh->v[9] = static_cast<uint64_t>(st["RssFile"]);
}
void take_rss(Drain& d) {
  d.rss_kb = g_sh->v[7];
  d.anon_kb = g_sh->v[8];
  d.file_kb = g_sh->v[9];
}

bool fill(const std::string& dir, uint64_t n, Sizes& out) {
  reset_shared();
  pid_t p = spawn([&] {
    auto q = open_queue(dir, SyncPolicy::kNever);
    std::string payload = make_payload(kPayload, 3);
    std::vector<std::string_view> batch(1000, payload);
    uint64_t t0 = mono_ns(), worst = 0, worst_at = 0;
    for (uint64_t sent = 0; sent < n;) {
      size_t k = static_cast<size_t>(std::min<uint64_t>(batch.size(), n - sent));
      uint64_t b0 = mono_ns();
      auto r = q->send_batch(std::span(batch.data(), k));
      uint64_t took = mono_ns() - b0;
      if (!r.ok()) child_fail("send_batch", r.status());
      if (took > worst) {
        worst = took;
        worst_at = sent;
      }
      sent += k;
    }
    g_sh->v[0] = mono_ns() - t0;
    g_sh->v[1] = worst;
    g_sh->v[2] = worst_at;
    return 0;
  });
  if (!wait_all({p}, kName)) return false;
  out.n = n;
  out.fill_rate = static_cast<double>(n) / secs(g_sh->v[0].load());
  out.worst_batch_ms = static_cast<double>(g_sh->v[1].load()) / 1e6;
  out.worst_batch_at = g_sh->v[2].load();
  struct stat st {};
  if (::stat((dir + "/index").c_str(), &st) == 0) {
    out.index_size = static_cast<uint64_t>(st.st_size);
    out.index_alloc = static_cast<uint64_t>(st.st_blocks) * 512;
  }
  // Log: file sizes and allocation here; bytes actually holding records from a scan (in a
  // child, like everything that maps queue files).
  reset_shared();
  p = spawn([&] {
    spool::storage::LogOptions lo;
    lo.read_only = true;
    auto log = spool::storage::Log::open(dir + "/segments", lo);
    if (!log.ok()) child_fail("open log", log.status());
    auto seqs = (*log)->segments();
    if (!seqs.ok()) child_fail("segments", seqs.status());
    uint64_t used = 0, size = 0, alloc = 0;
    for (uint64_t s : *seqs) {
      auto seg = (*log)->segment(s);
      if (!seg.ok()) child_fail("segment", seg.status());
      auto r = spool::storage::scan(**seg, spool::format::kSegmentHeaderSize, [](const spool::storage::RecordView&) {});
      used += r.end;  // header + records
      struct stat ss {};
      if (::stat((*log)->segment_path(s).c_str(), &ss) == 0) {
        size += static_cast<uint64_t>(ss.st_size);
        alloc += static_cast<uint64_t>(ss.st_blocks) * 512;
      }
    }
    g_sh->v[0] = used;
    g_sh->v[1] = size;
    g_sh->v[2] = alloc;
    g_sh->v[3] = seqs->size();
    return 0;
  });
  if (!wait_all({p}, kName)) return false;
  out.log_used = g_sh->v[0];
  out.log_size = g_sh->v[1];
  out.log_alloc = g_sh->v[2];
  out.segments = g_sh->v[3];
  return true;
}

// Opens the filled queue in a new process (the first opener: it reuses the index), times
// stats() and peek(10) at this backlog, then receive(64)+ack of `n` messages.
bool drain(const std::string& dir, uint64_t n, Drain& d) {
  reset_shared();
  sync_fs(g_root);
  pid_t p = spawn([&] {
    uint64_t t0 = mono_ns();
    auto q = open_queue(dir, SyncPolicy::kNever);
    g_sh->v[0] = mono_ns() - t0;
    t0 = mono_ns();
    auto st = q->stats();  // first touch of the index pages in this process
    if (!st.ok()) child_fail("stats", st.status());
    g_sh->v[6] = mono_ns() - t0;
    g_sh->v[4] = st->ready;
    t0 = mono_ns();
    st = q->stats();
    if (!st.ok()) child_fail("stats", st.status());
    g_sh->v[1] = mono_ns() - t0;
    t0 = mono_ns();
    auto pk = q->peek(10);
    if (!pk.ok()) child_fail("peek", pk.status());
    g_sh->v[2] = mono_ns() - t0;
    uint64_t done = 0;
    t0 = mono_ns();
    uint64_t c0 = cpu_ns();
    while (done < n) {
      auto r = q->receive(std::min<uint64_t>(kBatch, n - done), kVisibility);
      if (!r.ok()) child_fail("receive", r.status());
      for (const auto& m : *r) {
        if (Status s = q->ack(m.receipt); !s.ok()) child_fail("ack", s);
      }
      done += r->size();
    }
    g_sh->v[3] = mono_ns() - t0;
    g_sh->v[5] = cpu_ns() - c0;
    record_rss();
    return 0;
  });
  if (!wait_all({p}, kName)) return false;
  d.backlog = g_sh->v[4];
  d.drained = n;
  d.open_ms = static_cast<double>(g_sh->v[0]) / 1e6;
  d.stats_ms = static_cast<double>(g_sh->v[1]) / 1e6;
  d.stats_cold_ms = static_cast<double>(g_sh->v[6]) / 1e6;
  d.peek_ms = static_cast<double>(g_sh->v[2]) / 1e6;
  d.rate = static_cast<double>(n) / secs(g_sh->v[3]);
  d.cpu_rate = static_cast<double>(n) / secs(g_sh->v[5]);
  take_rss(d);
  return true;
}

// Deletes the index (no process attached) and times the open that rebuilds it from the log.
bool rebuild_time(const std::string& dir, Drain& d) {
  ::unlink((dir + "/index").c_str());
  sync_fs(g_root);
  reset_shared();
  pid_t p = spawn([&] {
    uint64_t t0 = mono_ns();
    auto q = open_queue(dir, SyncPolicy::kNever);
    g_sh->v[0] = mono_ns() - t0;
    return 0;
  });
  if (!wait_all({p}, kName)) return false;
  d.rebuild_ms = static_cast<double>(g_sh->v[0]) / 1e6;
  return true;
}

// Backlog of ~1k: repeated cycles of send_batch(1000) then timed drain of those 1000.
bool drain_small(const std::string& dir, uint64_t cycles, Drain& d) {
  reset_shared();
  sync_fs(g_root);
  pid_t p = spawn([&] {
    auto q = open_queue(dir, SyncPolicy::kNever);
    std::string payload = make_payload(kPayload, 5);
    std::vector<std::string_view> batch(1000, payload);
    uint64_t total = 0, total_cpu = 0, stats_ns = 0, peek_ns = 0;
    for (uint64_t c = 0; c < cycles; ++c) {
      auto sr = q->send_batch(batch);
      if (!sr.ok()) child_fail("send_batch", sr.status());
      if (c == cycles / 2) {
        uint64_t t = mono_ns();
        auto st = q->stats();
        if (!st.ok()) child_fail("stats", st.status());
        stats_ns = mono_ns() - t;
        t = mono_ns();
        auto pk = q->peek(10);
        if (!pk.ok()) child_fail("peek", pk.status());
        peek_ns = mono_ns() - t;
      }
      uint64_t done = 0, t0 = mono_ns(), c0 = cpu_ns();
      while (done < batch.size()) {
        auto r = q->receive(kBatch, kVisibility);
        if (!r.ok()) child_fail("receive", r.status());
        for (const auto& m : *r) {
          if (Status s = q->ack(m.receipt); !s.ok()) child_fail("ack", s);
        }
        done += r->size();
      }
      total += mono_ns() - t0;
      total_cpu += cpu_ns() - c0;
    }
    g_sh->v[0] = total;
    g_sh->v[3] = total_cpu;
    g_sh->v[1] = stats_ns;
    g_sh->v[2] = peek_ns;
    record_rss();
    return 0;
  });
  if (!wait_all({p}, kName)) return false;
  d.backlog = 1000;
  d.drained = cycles * 1000;
  d.rate = static_cast<double>(d.drained) / secs(g_sh->v[0]);
  d.cpu_rate = static_cast<double>(d.drained) / secs(g_sh->v[3]);
  d.stats_ms = static_cast<double>(g_sh->v[1]) / 1e6;
  d.peek_ms = static_cast<double>(g_sh->v[2]) / 1e6;
  take_rss(d);
  return true;
}

// After everything is drained: the index's allocation and the consumer's RSS once it has
// acked the last message, then how long the last close (it seals the index: a checksum of
// the whole region) and the next first open (it checks the seal) take. An index sized for
// the old backlog would cost all three.
struct Emptied {
  uint64_t drained = 0, index_alloc = 0, rss_kb = 0;
  double close_ms = 0, open_ms = 0;
  bool ok = false;
};

bool drain_all(const std::string& dir, Emptied& e) {
  reset_shared();
  pid_t p = spawn([&] {
    auto q = open_queue(dir, SyncPolicy::kNever);
    uint64_t done = 0;
    for (;;) {
      auto r = q->receive(kBatch, kVisibility);
      if (!r.ok() && r.status().code() == spool::Code::kEmpty) break;
      if (!r.ok()) child_fail("receive", r.status());
      for (const auto& m : *r) {
        if (Status s = q->ack(m.receipt); !s.ok()) child_fail("ack", s);
      }
      done += r->size();
    }
    if (auto st = q->stats(); !st.ok()) child_fail("stats", st.status());
    record_rss();
    g_sh->v[0] = done;
    uint64_t t0 = mono_ns();
    q.reset();
    g_sh->v[1] = mono_ns() - t0;
    return 0;
  });
  if (!wait_all({p}, kName)) return false;
  e.drained = g_sh->v[0];
  e.close_ms = static_cast<double>(g_sh->v[1]) / 1e6;
  e.rss_kb = g_sh->v[7];
  struct stat st {};
  if (::stat((dir + "/index").c_str(), &st) == 0) e.index_alloc = static_cast<uint64_t>(st.st_blocks) * 512;
  reset_shared();
  sync_fs(g_root);
  p = spawn([&] {
    uint64_t t0 = mono_ns();
    auto q = open_queue(dir, SyncPolicy::kNever);
    if (auto s2 = q->stats(); !s2.ok()) child_fail("stats", s2.status());
    g_sh->v[0] = mono_ns() - t0;
    return 0;
  });
  if (!wait_all({p}, kName)) return false;
  e.open_ms = static_cast<double>(g_sh->v[0]) / 1e6;
  e.ok = true;
  return true;
}

// Ordered groups: the same backlog sent ungrouped, in 1,000 groups and in 100,000 groups
// (members interleaved, as many producers would send them), then drained by one consumer
// with receive(64) + ack per message. A group's later members are blocked in no heap, and
// each ack that releases the next costs a few probes of the group table: the rates should
// stay near the ungrouped ones however many groups wait.
struct GroupRun {
  bool ok = false;
  uint64_t groups = 0;
  double fill_rate = 0, drain_rate = 0, drain_cpu_rate = 0;
};

bool group_run(const std::string& dir, uint64_t n, uint64_t drain_n, GroupRun& g) {
  reset_shared();
  sync_fs(g_root);
  pid_t p = spawn([&] {
    auto q = open_queue(dir, SyncPolicy::kNever);
    const std::string payload = make_payload(kPayload, 7);
    std::vector<std::string> keys;
    for (uint64_t k = 0; k < g.groups; ++k) keys.push_back("group-" + std::to_string(k));
    std::vector<std::string_view> plain(1000, payload);
    std::vector<spool::SendItem> items(1000);
    uint64_t t0 = mono_ns();
    for (uint64_t sent = 0; sent < n; sent += 1000) {
      if (g.groups == 0) {
        auto r = q->send_batch(plain);
        if (!r.ok()) child_fail("send_batch", r.status());
        continue;
      }
      for (uint64_t i = 0; i < items.size(); ++i) {
        items[i].payload = payload;
        items[i].group = keys[(sent + i) % g.groups];
      }
      auto r = q->send_batch(std::span<const spool::SendItem>(items));
      if (!r.ok()) child_fail("send_batch(items)", r.status());
    }
    g_sh->v[0] = mono_ns() - t0;
    uint64_t done = 0, t1 = mono_ns(), c1 = cpu_ns();
    while (done < drain_n) {
      auto r = q->receive(kBatch, kVisibility);
      if (!r.ok()) child_fail("receive", r.status());
      for (const auto& m : *r) {
        if (Status st = q->ack(m.receipt); !st.ok()) child_fail("ack", st);
      }
      done += r->size();
    }
    g_sh->v[1] = mono_ns() - t1;
    g_sh->v[2] = cpu_ns() - c1;
    g_sh->v[3] = done;
    return 0;
  });
  if (!wait_all({p}, "groups")) return false;
  g.fill_rate = static_cast<double>(n) / secs(g_sh->v[0]);
  g.drain_rate = static_cast<double>(g_sh->v[3]) / secs(g_sh->v[1]);
  g.drain_cpu_rate = static_cast<double>(g_sh->v[3]) / secs(g_sh->v[2]);
  g.ok = true;
  return true;
}

void section_groups(double scale) {
  const uint64_t n = std::max<uint64_t>(10'000, static_cast<uint64_t>(1'000'000 * scale)) / 1000 * 1000;
  const uint64_t drain_n = n / 5;
  std::vector<GroupRun> runs;
  for (uint64_t groups : {uint64_t{0}, uint64_t{1'000}, uint64_t{100'000}}) {
    GroupRun g;
    g.groups = groups;
    std::string dir = fresh_dir(g_root, "groups-" + std::to_string(groups));
    std::printf("(ordered groups: %s messages in %s groups ...)\n", human(static_cast<double>(n)).c_str(),
                groups == 0 ? "no" : human(static_cast<double>(groups)).c_str());
    std::fflush(stdout);
    (void)group_run(dir, n, drain_n, g);
    runs.push_back(g);
    remove_dir(dir);
  }
  std::printf("\n== 5. ordered groups (100 B, send_batch(1000) of %s, then receive(64) + ack of %s, sync=never) ==\n",
              human(static_cast<double>(n)).c_str(), human(static_cast<double>(drain_n)).c_str());
  std::printf("groups: the backlog's messages spread round-robin over this many groups (0: ungrouped);\n");
  std::printf("x ungrouped = the rate over the ungrouped run's rate, in this same run.\n\n");
  std::printf("%9s %10s %7s %11s %7s %10s %7s\n", "groups", "fill/s", "x", "recv+ack/s", "x", "per CPU-s", "x");
  const GroupRun& base = runs.front();
  for (const GroupRun& g : runs) {
    if (!g.ok || !base.ok) {
      std::printf("%9s FAILED\n", human(static_cast<double>(g.groups)).c_str());
      continue;
    }
    std::printf("%9s %10s %6.2fx %11s %6.2fx %10s %6.2fx\n", human(static_cast<double>(g.groups)).c_str(),
                human(g.fill_rate).c_str(), g.fill_rate / base.fill_rate, human(g.drain_rate).c_str(),
                g.drain_rate / base.drain_rate, human(g.drain_cpu_rate).c_str(), g.drain_cpu_rate / base.drain_cpu_rate);
  }
}

void section_index(bool big) {
  std::vector<uint64_t> sizes = {1'000'000};
  if (big) sizes.push_back(10'000'000);
  const uint64_t kDrain = 200'000;
  std::vector<Sizes> rows;
  std::vector<Drain> drains;
  std::vector<Emptied> emptied;

  Drain small;
  {
    std::string dir = fresh_dir(g_root, "backlog-1k");
    small.ok = drain_small(dir, 200, small);
    remove_dir(dir);
  }
  for (uint64_t n : sizes) {
    std::string dir = fresh_dir(g_root, "backlog-" + std::to_string(n));
    Sizes s;
    Drain d;
    std::printf("(filling %s messages ...)\n", human(static_cast<double>(n)).c_str());
    std::fflush(stdout);
    if (fill(dir, n, s)) {
      rows.push_back(s);
      d.ok = drain(dir, kDrain, d) && rebuild_time(dir, d);
    } else {
      rows.push_back(Sizes{});
    }
    drains.push_back(d);
    Emptied e;
    if (d.ok) e.ok = drain_all(dir, e);
    emptied.push_back(e);
    remove_dir(dir);
  }

  std::printf("\n== 3. bytes per queued message (100 B payloads, send_batch(1000), sync=never) ==\n");
  std::printf("index = QUEUE/index (4 KiB header + 24 B window slots, 1-1.25x the backlog, + heap and overflow); log = segment files\n");
  std::printf("(64 MiB, preallocated); log used = segment headers + records, found by scanning.\n\n");
  std::printf("fill/s = send_batch(1000) rate; worst batch = slowest send_batch(1000) call and the backlog\n");
  std::printf("when it started (the index window grows by a quarter, O(n) under the lock, when it is full).\n\n");
  std::printf("%10s %10s %12s %12s %12s %11s %11s %11s %11s %5s %16s\n", "messages", "fill/s", "index size",
              "index B/msg", "idx alloc/msg", "log B/msg", "log alloc/msg", "log used", "log alloc", "segs",
              "worst batch");
  for (const Sizes& s : rows) {
    if (s.n == 0) {
      std::printf("FAILED\n");
      continue;
    }
    double n = static_cast<double>(s.n);
    char worst[48];
    std::snprintf(worst, sizeof worst, "%.0f ms @ %s", s.worst_batch_ms,
                  human(static_cast<double>(s.worst_batch_at)).c_str());
    std::printf("%10s %10s %9.1f MiB %12.1f %12.1f %11.1f %11.1f %7.1f MiB %7.1f MiB %5" PRIu64 " %16s\n",
                human(n).c_str(), human(s.fill_rate).c_str(), static_cast<double>(s.index_size) / 1048576.0,
                static_cast<double>(s.index_size) / n, static_cast<double>(s.index_alloc) / n,
                static_cast<double>(s.log_used) / n, static_cast<double>(s.log_alloc) / n,
                static_cast<double>(s.log_used) / 1048576.0, static_cast<double>(s.log_alloc) / 1048576.0,
                s.segments, worst);
  }

  std::printf("\n== 4. receive throughput vs backlog (one consumer, receive(64) + ack per message, sync=never) ==\n");
  std::printf("1k: 200 cycles of send_batch(1000) then a timed drain of those 1000 (backlog 1000 -> 0).\n");
  std::printf("big: a fresh process opens the filled queue and drains %s of it (e.g. 1M -> 800k).\n",
              human(static_cast<double>(kDrain)).c_str());
  std::printf("open = first open reusing the index; 1st stats = the first stats() after that open (faults the\n");
  std::printf("index mapping in); stats / peek = one more stats(), then peek(10): each holds the index lock.\n");
  std::printf("rebuild = open after deleting QUEUE/index (replays the whole log).\n");
  std::printf("per CPU-s = messages per second of the consumer's own CPU time (less sensitive to other load).\n");
  std::printf("RSS = the consumer's VmRSS when done, MiB, and of it RssAnon / RssFile (the index and segment\n");
  std::printf("pages it has mapped in); the 1k consumer is also the producer.\n\n");
  std::printf("%8s %8s %11s %6s %10s %6s %8s %10s %9s %8s %10s %7s %13s\n", "backlog", "drained", "recv+ack/s",
              "vs 1k", "per CPU-s", "vs 1k", "open ms", "1st stats", "stats ms", "peek ms", "rebuild ms", "RSS",
              "anon / file");
  auto line = [&](const Drain& d) {
    if (!d.ok) {
      std::printf("%10s FAILED\n", human(static_cast<double>(d.backlog)).c_str());
      return;
    }
    char open[16] = "-", reb[16] = "-", cold[16] = "-";
    if (d.open_ms > 0) std::snprintf(open, sizeof open, "%.1f", d.open_ms);
    if (d.rebuild_ms > 0) std::snprintf(reb, sizeof reb, "%.0f", d.rebuild_ms);
    if (d.stats_cold_ms > 0) std::snprintf(cold, sizeof cold, "%.1f", d.stats_cold_ms);
    std::printf("%8s %8s %11s %5.2fx %10s %5.2fx %8s %10s %9.2f %8.2f %10s %7.1f %6.1f/%6.1f\n",
                human(static_cast<double>(d.backlog)).c_str(), human(static_cast<double>(d.drained)).c_str(),
                human(d.rate).c_str(), small.ok && small.rate > 0 ? d.rate / small.rate : 0.0,
                human(d.cpu_rate).c_str(), small.ok && small.cpu_rate > 0 ? d.cpu_rate / small.cpu_rate : 0.0, open,
                cold, d.stats_ms, d.peek_ms, reb, static_cast<double>(d.rss_kb) / 1024,
                static_cast<double>(d.anon_kb) / 1024, static_cast<double>(d.file_kb) / 1024);
  };
  line(small);
  for (const Drain& d : drains) line(d);

  std::printf("\n== 5. after draining everything ==\n");
  std::printf("The rest of each queue above drained by one consumer (receive(64) + ack). index alloc = the\n");
  std::printf("index file's allocated bytes then; RSS = that consumer's VmRSS then; last close = its close,\n");
  std::printf("which seals the index; next open = a new process's open + stats() (checks the seal).\n\n");
  std::printf("%8s %8s %12s %9s %11s %10s\n", "backlog", "drained", "index alloc", "RSS", "last close", "next open");
  for (size_t i = 0; i < emptied.size(); ++i) {
    const Emptied& e = emptied[i];
    if (!e.ok) {
      std::printf("%8s FAILED\n", human(static_cast<double>(sizes[i])).c_str());
      continue;
    }
    std::printf("%8s %8s %8.2f MiB %5.1f MiB %8.2f ms %7.2f ms\n", human(static_cast<double>(sizes[i])).c_str(),
                human(static_cast<double>(e.drained)).c_str(), static_cast<double>(e.index_alloc) / 1048576.0,
                static_cast<double>(e.rss_kb) / 1024, e.close_ms, e.open_ms);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool big = false;
  double scale = 1.0;
  std::string only = "e2e,bound,latency,index,groups";
  std::vector<int> consumers = {1, 2};
  std::vector<SyncPolicy> policies = {SyncPolicy::kAlways, SyncPolicy::kInterval, SyncPolicy::kNever};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--big") {
      big = true;
    } else if (a.starts_with("--only=")) {
      only = a.substr(7);
    } else if (a.starts_with("--scale=")) {
      scale = std::atof(a.c_str() + 8);
    } else if (a.starts_with("--sync=")) {
      std::string v = a.substr(7);
      if (v == "always") policies = {SyncPolicy::kAlways};
      else if (v == "interval") policies = {SyncPolicy::kInterval};
      else if (v == "never") policies = {SyncPolicy::kNever};
      else return std::fprintf(stderr, "--sync: always, interval or never\n"), 2;
    } else if (a.starts_with("--consumers=")) {
      consumers = {std::atoi(a.c_str() + 12)};
    } else {
      std::fprintf(stderr,
                   "usage: %s [--big] [--only=e2e,bound,latency,index,groups] [--sync=P] [--consumers=N] [--scale=F]\n"
                   "  --big        also measure 10M queued messages in the index section (slow)\n"
                   "  --only       sections to run (default all five)\n"
                   "  --sync       only this policy (always, interval, never) in the e2e and latency sections\n"
                   "  --consumers  consumer processes in the e2e section (default: 1 and 2)\n"
                   "  --scale      multiply the e2e message counts\n",
                   argv[0]);
      return 2;
    }
  }
  g_sh = map_shared<Shared>();
  g_root = make_root("spool-bench-queue", "");
  if (g_root.empty()) return 1;

  bool tmpfs = is_tmpfs(g_root);
  // The parent never opens a queue; this only asks which backend the children will pick.
  const char* backend = spool::io::default_io()->name();
  std::printf("bench_queue: dir %s%s, I/O backend %s, %ld CPUs%s\n", g_root.c_str(), tmpfs ? " (tmpfs!)" : "",
              backend, ::sysconf(_SC_NPROCESSORS_ONLN), big ? ", --big" : "");
  std::printf("load average at the start: %s (other processes on this machine skew every number)\n", loadavg().c_str());
  if (tmpfs) std::printf("WARNING: tmpfs: fdatasync is free, the sync policy rows mean nothing\n");
  std::fflush(stdout);

  uint64_t t0 = mono_ns();
  if (selected(only, "e2e")) section_e2e(consumers, scale, policies);
  if (selected(only, "bound")) section_bound(scale);
  if (selected(only, "latency")) section_latency(policies);
  if (selected(only, "index")) section_index(big);
  if (selected(only, "groups")) section_groups(scale);
  std::printf("\ntotal %.1f s; load average at the end: %s\n", secs(mono_ns() - t0), loadavg().c_str());

  remove_dir(g_root);
  return 0;
}
