// Compaction benchmarks of the public Queue API with real processes. Every process that
// uses a queue is a fork()ed child that opens it itself (a Queue object never crosses a
// fork); the parent only creates directories, starts the children, collects their numbers
// through an anonymous shared mapping and prints the tables.
//
//  1. Queue::compact() throughput. A queue (segment_size 4 MiB, max_payload 4096,
//     sync=interval) is filled with ~256 MiB of 1 KiB payloads (send_batch(64)); then a
//     random subset of the messages (100 %, 90 %, 50 %) is leased with receive_id() and
//     acked, and the others stay ready; then a fresh process times one compact().
//     While filling and acking, the parent holds QUEUE/compact.lock (flock), so automatic
//     compaction (which skips when that lock is taken, docs/compaction.md) cannot remove
//     segments before the timed call. The page cache is synced (syncfs) before timing and
//     not dropped: compaction reads the live messages from memory, as it usually would.
//     MB/s freed = bytes_freed / s; MB/s copied = messages_copied x 1 KiB payload / s.
//  2. send -> receive -> ack throughput with and without a compacting process, in one run:
//     1 producer (send_batch(64), 100 B payloads) + 1 consumer (receive(64) + ack per
//     message), for a fixed time, on a queue like the one of 1, with 4 MiB and then 1 MiB
//     segments (--e2e-segment-kib), so that the log rolls and automatic compaction, always
//     on, runs during a window even when the machine is slow;
//     "+compactor" adds a third process calling compact() back to back. The producer keeps
//     at most kWindow messages un-acked (a closed loop; otherwise the backlog, and with it
//     the live data every compaction copies, would grow with the run time).
//     msgs/s = messages acked in the window / window. The rounds alternate (base, +compactor,
//     base, +compactor, ...) so slow drifts of the machine's load hit both alike. After each
//     window the consumer drains what is left and a checker verifies the queue is empty and
//     every message was acked exactly once.
//
// Usage: bench_compact [--only=compact,e2e] [--fill-mib=N] [--seconds=S] [--rounds=R]
//                      [--e2e-segment-kib=K[,K...]]
// Files go to a fresh directory under /var/tmp (SPOOL_BENCH_DIR overrides), removed at the
// end (not when interrupted: remove /var/tmp/spool-bench-compact-* by hand then).
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
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
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bench_util.h"
#include "spool/queue.h"

namespace {

using spool::Code;
using spool::Millis;
using spool::Queue;
using spool::QueueOptions;
using spool::Status;
using spool::SyncPolicy;
using namespace spool::bench;

constexpr char kName[] = "bench_compact";  // in notes about children

constexpr uint64_t kSegmentSize = 4ull << 20;
constexpr uint64_t kMaxPayload = 4096;
constexpr size_t kBigPayload = 1024;   // section 1
constexpr size_t kSmallPayload = 100;  // section 2
constexpr size_t kBatch = 64;
constexpr Millis kVisibility{600000};  // no lease runs out during a run
constexpr Millis kConsumerWait{50};
constexpr uint64_t kWindow = 8192;     // section 2: most messages sent and not yet acked
uint64_t g_e2e_segment = 4ull << 20;  // section 2: segment size of the current queue

void atomic_max(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

// ---- shared state between the parent and its children -----------------------------------

struct Shared {
  std::atomic<uint64_t> ready;  // children that opened the queue
  std::atomic<uint64_t> stop;   // section 2: the window is over
  std::atomic<uint64_t> producer_done;
  std::atomic<uint64_t> sent;
  std::atomic<uint64_t> acked;
  std::atomic<uint64_t> redelivered;
  std::atomic<uint64_t> max_send_ns, max_recv_ns, max_ack_ns;
  std::atomic<uint64_t> compact_calls, compact_ns, compact_max_ns, compact_segs, compact_copied;
  std::atomic<uint64_t> v[16];  // generic result slots
};

Shared* g_sh = nullptr;
std::string g_root;

void reset_shared() { std::memset(static_cast<void*>(g_sh), 0, sizeof(Shared)); }

[[noreturn]] void child_fail(const char* what, const Status& s) {
  std::fprintf(stderr, "bench_compact[%d]: %s: %s\n", ::getpid(), what, s.to_string().c_str());
  std::fflush(stderr);
  ::_exit(2);
}

std::unique_ptr<Queue> open_queue(const std::string& dir, uint64_t segment_size = kSegmentSize) {
  QueueOptions o;
  o.sync = SyncPolicy::kInterval;
  o.segment_size = segment_size;
  o.max_payload = kMaxPayload;
  o.visibility = kVisibility;
  auto q = Queue::open(dir, o);
  if (!q.ok()) child_fail(("open " + dir).c_str(), q.status());
  return std::move(q).value();
}

// Opens the gate once `n` children are ready, or exits after a minute: a child that could
// not open the queue never gets ready.
uint64_t start_when_ready(StartGate& gate, size_t n) {
  uint64_t give_up = mono_ns() + 60'000'000'000ull;
  while (g_sh->ready.load() < n) {
    if (mono_ns() > give_up) {
      std::fprintf(stderr, "bench_compact: children did not get ready\n");
      std::exit(1);
    }
    ::usleep(200);
  }
  return gate.open();
}

// Highest segment sequence number among QUEUE/segments/*.seg (= segments ever created,
// since they are numbered from 1) and how many are present now. Read from the directory
// listing only.
std::pair<uint64_t, uint64_t> segment_files(const std::string& dir) {
  uint64_t hi = 0, n = 0;
  if (DIR* d = ::opendir((dir + "/segments").c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name.size() > 4 && name.ends_with(".seg")) {
        ++n;
        hi = std::max<uint64_t>(hi, std::strtoull(name.c_str(), nullptr, 10));
      }
    }
    ::closedir(d);
  }
  return {hi, n};
}

// Holds QUEUE/compact.lock so that automatic compaction skips (it never waits for it).
struct CompactionBlocker {
  int fd = -1;
  explicit CompactionBlocker(const std::string& dir) {
    fd = ::open((dir + "/compact.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) {
      std::perror("compact.lock");
      std::exit(1);
    }
  }
  ~CompactionBlocker() { release(); }
  void release() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

// ---- 1. compact() throughput ---------------------------------------------------------------

struct CompactRow {
  int ack_pct = 0;
  uint64_t n = 0, acked = 0;
  bool ok = false;
  double fill_s = 0, ack_s = 0;
  uint64_t segs_before = 0, disk_before = 0;
  uint64_t removed = 0, freed = 0, copied = 0;
  double seconds = 0;
  uint64_t segs_after = 0, disk_after = 0, ready_after = 0;
  std::string check;
};

void run_compact(CompactRow& row, uint64_t fill_bytes, int serial) {
  std::string dir = fresh_dir(g_root, "compact-" + std::to_string(serial));
  const uint64_t n = fill_bytes / kBigPayload;
  row.n = n;
  row.acked = n * static_cast<uint64_t>(row.ack_pct) / 100;
  row.check = "FAILED";
  // Create the queue, then hold compact.lock through the fill and the acks.
  reset_shared();
  if (!wait_all({spawn([&] {
        open_queue(dir);
        return 0;
      })}, kName))
    return;
  CompactionBlocker blocker(dir);

  // Fill.
  reset_shared();
  pid_t p = spawn([&] {
    auto q = open_queue(dir);
    std::string payload = make_payload(kBigPayload, 7);
    std::vector<std::string_view> batch(kBatch, payload);
    uint64_t t0 = mono_ns(), first = 0, last = 0;
    for (uint64_t sent = 0; sent < n;) {
      size_t k = static_cast<size_t>(std::min<uint64_t>(kBatch, n - sent));
      auto r = q->send_batch(std::span(batch.data(), k));
      if (!r.ok()) child_fail("send_batch", r.status());
      if (sent == 0) first = r->front();
      last = r->back();
      sent += k;
    }
    if (Status s = q->sync(); !s.ok()) child_fail("sync", s);
    g_sh->v[0] = mono_ns() - t0;
    g_sh->v[1] = first;
    g_sh->v[2] = last;
    return 0;
  });
  if (!wait_all({p}, kName)) return;
  row.fill_s = secs(g_sh->v[0]);
  if (g_sh->v[1] != 1 || g_sh->v[2] != n) {
    row.check = "unexpected ids";
    return;
  }

  // Ack a random subset of exactly row.acked messages (ids 1..n); the rest stay ready.
  reset_shared();
  p = spawn([&] {
    auto q = open_queue(dir);
    std::vector<uint64_t> ids(n);
    for (uint64_t i = 0; i < n; ++i) ids[i] = i + 1;
    std::mt19937_64 rng(12345 + static_cast<uint64_t>(row.ack_pct));
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(row.acked);
    uint64_t t0 = mono_ns();
    for (uint64_t id : ids) {
      auto m = q->receive_id(id, kVisibility);
      if (!m.ok()) child_fail("receive_id", m.status());
      if (Status s = q->ack(m->receipt); !s.ok()) child_fail("ack", s);
    }
    if (Status s = q->sync(); !s.ok()) child_fail("sync", s);
    g_sh->v[0] = mono_ns() - t0;
    return 0;
  });
  if (!wait_all({p}, kName)) return;
  row.ack_s = secs(g_sh->v[0]);
  blocker.release();
  sync_fs(g_root);

  // Time one compact() in a fresh process.
  reset_shared();
  p = spawn([&] {
    auto q = open_queue(dir);
    auto st = q->stats();
    if (!st.ok()) child_fail("stats", st.status());
    g_sh->v[0] = st->segments;
    g_sh->v[1] = st->bytes_on_disk;
    uint64_t t0 = mono_ns();
    auto r = q->compact();
    uint64_t el = mono_ns() - t0;
    if (!r.ok()) child_fail("compact", r.status());
    g_sh->v[2] = el;
    g_sh->v[3] = r->segments_removed;
    g_sh->v[4] = r->bytes_freed;
    g_sh->v[5] = r->messages_copied;
    st = q->stats();
    if (!st.ok()) child_fail("stats", st.status());
    g_sh->v[6] = st->segments;
    g_sh->v[7] = st->bytes_on_disk;
    g_sh->v[8] = st->ready;
    g_sh->v[9] = st->in_flight;
    g_sh->v[10] = st->sent_total;
    g_sh->v[11] = st->acked_total;
    g_sh->v[12] = q->check_index().empty() ? 1 : 0;
    return 0;
  });
  if (!wait_all({p}, kName)) return;
  row.ok = true;
  row.segs_before = g_sh->v[0];
  row.disk_before = g_sh->v[1];
  row.seconds = secs(g_sh->v[2]);
  row.removed = g_sh->v[3];
  row.freed = g_sh->v[4];
  row.copied = g_sh->v[5];
  row.segs_after = g_sh->v[6];
  row.disk_after = g_sh->v[7];
  row.ready_after = g_sh->v[8];
  uint64_t live = n - row.acked;
  if (g_sh->v[8] == live && g_sh->v[9] == 0 && g_sh->v[10] == n && g_sh->v[11] == row.acked &&
      g_sh->v[12] == 1) {
    row.check = "ok";
  } else {
    char b[200];
    std::snprintf(b, sizeof b,
                  "BAD ready=%" PRIu64 " inflight=%" PRIu64 " sent=%" PRIu64 " acked=%" PRIu64 " idx=%" PRIu64,
                  g_sh->v[8].load(), g_sh->v[9].load(), g_sh->v[10].load(), g_sh->v[11].load(), g_sh->v[12].load());
    row.check = b;
  }
  remove_dir(dir);
}

void section_compact(uint64_t fill_mib) {
  std::printf("\n== 1. Queue::compact() of a filled queue (4 MiB segments, max_payload 4096, sync=interval) ==\n");
  std::printf("fill: %" PRIu64 " MiB of 1 KiB payloads with send_batch(64); then receive_id + ack of a random\n", fill_mib);
  std::printf("subset (acked %%), the rest stay ready; automatic compaction held off (compact.lock) until the\n");
  std::printf("one timed compact() in a fresh process. freed = bytes_freed (allocated blocks of the removed\n");
  std::printf("segments); copied MB = messages_copied x 1 KiB of payload. segs = segment files before -> after.\n\n");
  std::printf("%6s %8s %7s %7s %11s %8s %9s %9s %8s %10s %10s  %s\n", "acked", "msgs", "fill s", "ack s",
              "segs", "removed", "freed MB", "copied", "secs", "freed MB/s", "copied MB/s", "check");
  int serial = 0;
  for (int pct : {100, 90, 50}) {
    CompactRow row;
    row.ack_pct = pct;
    run_compact(row, fill_mib << 20, serial++);
    if (!row.ok) {
      std::printf("%5d%% FAILED (%s)\n", pct, row.check.c_str());
      std::fflush(stdout);
      continue;
    }
    char segs[32];
    std::snprintf(segs, sizeof segs, "%" PRIu64 " -> %" PRIu64, row.segs_before, row.segs_after);
    double freed_mb = static_cast<double>(row.freed) / 1e6;
    double copied_mb = static_cast<double>(row.copied * kBigPayload) / 1e6;
    std::printf("%5d%% %8" PRIu64 " %7.2f %7.2f %11s %8" PRIu64 " %9.1f %9" PRIu64 " %8.3f %10.1f %10.1f  %s\n", pct,
                row.n, row.fill_s, row.ack_s, segs, row.removed, freed_mb, row.copied, row.seconds,
                freed_mb / row.seconds, copied_mb / row.seconds, row.check.c_str());
    std::fflush(stdout);
  }
  std::printf("(MB = 10^6 bytes)\n");
}

// ---- 2. e2e throughput with and without a compacting process ---------------------------------

struct E2eRow {
  bool compactor = false;
  bool ok = false;
  double window_s = 0, rate = 0;
  uint64_t acked_in_window = 0, total = 0, redelivered = 0;
  double max_send_ms = 0, max_recv_ms = 0, max_ack_ms = 0;
  uint64_t calls = 0, segs = 0, copied = 0;
  double compact_busy = 0, compact_max_ms = 0;
  uint64_t segs_created = 0, segs_present = 0;
  std::string check;
};

void run_e2e(E2eRow& row, double seconds, int serial) {
  std::string dir = fresh_dir(g_root, "e2e-" + std::to_string(serial));
  sync_fs(g_root);
  reset_shared();
  StartGate gate(g_sh->ready);
  std::vector<pid_t> pids;
  pids.push_back(spawn(
      [&] {  // producer
        auto q = open_queue(dir, g_e2e_segment);
        std::string payload = make_payload(kSmallPayload, 1);
        std::vector<std::string_view> batch(kBatch, payload);
        gate.child_wait();
        uint64_t sent = 0;
        while (g_sh->stop.load(std::memory_order_relaxed) == 0) {
          if (sent - g_sh->acked.load(std::memory_order_relaxed) + kBatch > kWindow) {
            ::usleep(50);
            continue;
          }
          uint64_t t = mono_ns();
          auto r = q->send_batch(batch);
          atomic_max(g_sh->max_send_ns, mono_ns() - t);
          if (!r.ok()) child_fail("send_batch", r.status());
          sent += kBatch;
          g_sh->sent.store(sent, std::memory_order_relaxed);
        }
        g_sh->producer_done.store(1);
        return 0;
      }));
  pids.push_back(spawn(
      [&] {  // consumer: runs until the window ends, then drains what the producer sent
        auto q = open_queue(dir, g_e2e_segment);
        gate.child_wait();
        for (;;) {
          if (g_sh->producer_done.load() != 0 && g_sh->acked.load() >= g_sh->sent.load()) break;
          uint64_t t = mono_ns();
          auto r = q->receive(kBatch, kVisibility, kConsumerWait);
          uint64_t took = mono_ns() - t;
          if (!r.ok()) {
            if (r.status().code() == Code::kEmpty) continue;
            child_fail("receive", r.status());
          }
          atomic_max(g_sh->max_recv_ns, took);
          for (const auto& m : *r) {
            if (m.receive_count > 1) g_sh->redelivered.fetch_add(1, std::memory_order_relaxed);
            t = mono_ns();
            if (Status s = q->ack(m.receipt); !s.ok()) child_fail("ack", s);
            atomic_max(g_sh->max_ack_ns, mono_ns() - t);
            g_sh->acked.fetch_add(1, std::memory_order_relaxed);
          }
        }
        return 0;
      }));
  if (row.compactor) {
    pids.push_back(spawn(
        [&] {  // compactor
          auto q = open_queue(dir, g_e2e_segment);
          gate.child_wait();
          while (g_sh->stop.load(std::memory_order_relaxed) == 0) {
            uint64_t t = mono_ns();
            auto r = q->compact();
            uint64_t took = mono_ns() - t;
            if (!r.ok()) child_fail("compact", r.status());
            g_sh->compact_calls.fetch_add(1, std::memory_order_relaxed);
            g_sh->compact_ns.fetch_add(took, std::memory_order_relaxed);
            atomic_max(g_sh->compact_max_ns, took);
            g_sh->compact_segs.fetch_add(r->segments_removed, std::memory_order_relaxed);
            g_sh->compact_copied.fetch_add(r->messages_copied, std::memory_order_relaxed);
          }
          return 0;
        }));
  }
  uint64_t t0 = start_when_ready(gate, pids.size());
  uint64_t until = t0 + static_cast<uint64_t>(seconds * 1e9);
  for (uint64_t now = mono_ns(); now < until; now = mono_ns()) {
    uint64_t left = until - now;
    ::usleep(static_cast<useconds_t>(std::min<uint64_t>(left / 1000, 100000)));
  }
  row.acked_in_window = g_sh->acked.load();
  uint64_t t1 = mono_ns();
  g_sh->stop.store(1);
  row.ok = wait_all(pids, kName);
  row.window_s = secs(t1 - t0);
  row.rate = static_cast<double>(row.acked_in_window) / row.window_s;
  row.total = g_sh->sent.load();
  row.redelivered = g_sh->redelivered.load();
  row.max_send_ms = static_cast<double>(g_sh->max_send_ns.load()) / 1e6;
  row.max_recv_ms = static_cast<double>(g_sh->max_recv_ns.load()) / 1e6;
  row.max_ack_ms = static_cast<double>(g_sh->max_ack_ns.load()) / 1e6;
  row.calls = g_sh->compact_calls.load();
  row.segs = g_sh->compact_segs.load();
  row.copied = g_sh->compact_copied.load();
  row.compact_busy = secs(g_sh->compact_ns.load()) / row.window_s;
  row.compact_max_ms = static_cast<double>(g_sh->compact_max_ns.load()) / 1e6;
  auto [hi, present] = segment_files(dir);
  row.segs_created = hi;
  row.segs_present = present;
  if (!row.ok) {
    row.check = "FAILED";
    remove_dir(dir);
    return;
  }
  // Check: empty, every message sent was acked once, index consistent.
  uint64_t total = row.total;
  reset_shared();
  pid_t p = spawn([&] {
    auto q = open_queue(dir, g_e2e_segment);
    auto st = q->stats();
    if (!st.ok()) child_fail("stats", st.status());
    g_sh->v[0] = st->ready;
    g_sh->v[1] = st->in_flight;
    g_sh->v[2] = st->sent_total;
    g_sh->v[3] = st->acked_total;
    g_sh->v[4] = q->check_index().empty() ? 1 : 0;
    return 0;
  });
  if (!wait_all({p}, kName)) {
    row.check = "check failed";
  } else if (g_sh->v[0] != 0 || g_sh->v[1] != 0 || g_sh->v[2] != total || g_sh->v[3] != total ||
             g_sh->v[4] != 1) {
    char b[200];
    std::snprintf(b, sizeof b, "BAD ready=%" PRIu64 " inflight=%" PRIu64 " sent=%" PRIu64 "/%" PRIu64
                  " acked=%" PRIu64 " idx=%" PRIu64,
                  g_sh->v[0].load(), g_sh->v[1].load(), g_sh->v[2].load(), total, g_sh->v[3].load(),
                  g_sh->v[4].load());
    row.check = b;
  } else {
    row.check = "ok";
  }
  remove_dir(dir);
}

void section_e2e(double seconds, int rounds, const std::vector<uint64_t>& segment_kib) {
  std::printf("\n== 2. send -> receive -> ack, 1 producer + 1 consumer, 100 B payloads, batched 64, %.1f s windows ==\n",
              seconds);
  std::printf("sync=interval (50 ms), automatic compaction always on; +compactor = a third process calling compact()\n");
  std::printf("back to back. The producer keeps <= %" PRIu64 " messages un-acked (~1.6 MB of log records). Small\n",
              kWindow);
  std::printf("segments make the log roll (and automatic compaction run) several times per window.\n");
  std::printf("msgs/s = acked in the window / window. max send/recv/ack = slowest send_batch(64) / receive(64)\n");
  std::printf("(that returned messages; includes up to 50 ms of long-poll wait) / ack() call.\n");
  std::printf("segs = segment files created in the run / left at the end. compactor: calls, segments removed,\n");
  std::printf("messages copied (and per message acked in the window), share of the window inside compact(),\n");
  std::printf("slowest call. Rounds alternate base / +compactor.\n");
  for (uint64_t kib : segment_kib) {
    g_e2e_segment = kib << 10;
    std::printf("\n-- segment_size %" PRIu64 " KiB --\n", kib);
    std::printf("%-11s %8s %9s %8s %8s %8s %7s %7s  %-48s %s\n", "mode", "acked", "msgs/s", "send ms", "recv ms",
                "ack ms", "redeliv", "segs", "compactor", "check");
    std::vector<double> base, comp;
    static int serial = 0;
    for (int r = 0; r < rounds; ++r) {
      for (bool c : {false, true}) {
        E2eRow row;
        row.compactor = c;
        run_e2e(row, seconds, serial++);
        char segs[32], cinfo[128] = "-";
        std::snprintf(segs, sizeof segs, "%" PRIu64 "/%" PRIu64, row.segs_created, row.segs_present);
        if (c) {
          double per = row.acked_in_window > 0
                           ? static_cast<double>(row.copied) / static_cast<double>(row.acked_in_window)
                           : 0.0;
          std::snprintf(cinfo, sizeof cinfo, "%" PRIu64 " calls, %" PRIu64 " segs, %s cp (%.1f/ack), %.0f%%, %.0f ms",
                        row.calls, row.segs, human(static_cast<double>(row.copied)).c_str(), per,
                        100.0 * row.compact_busy, row.compact_max_ms);
        }
        std::printf("%-11s %8" PRIu64 " %9s %8.1f %8.1f %8.1f %7" PRIu64 " %7s  %-48s %s\n",
                    c ? "+compactor" : "base", row.acked_in_window, human(row.rate).c_str(), row.max_send_ms,
                    row.max_recv_ms, row.max_ack_ms, row.redelivered, segs, cinfo, row.check.c_str());
        std::fflush(stdout);
        if (row.ok && row.check == "ok") (c ? comp : base).push_back(row.rate);
      }
    }
    auto mean = [](const std::vector<double>& v) {
      double sum = 0;
      for (double x : v) sum += x;
      return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
    };
    double b = mean(base), cm = mean(comp);
    std::printf("mean msgs/s (%" PRIu64 " KiB segments): base %s, +compactor %s, ratio +compactor/base = %.2f\n", kib,
                human(b).c_str(), human(cm).c_str(), b > 0 ? cm / b : 0.0);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string only = "compact,e2e";
  uint64_t fill_mib = 256;
  double seconds = 3.0;
  int rounds = 2;
  std::vector<uint64_t> segment_kib = {4096, 1024};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.starts_with("--only=")) {
      only = a.substr(7);
    } else if (a.starts_with("--fill-mib=")) {
      fill_mib = std::strtoull(a.c_str() + 11, nullptr, 10);
    } else if (a.starts_with("--seconds=")) {
      seconds = std::atof(a.c_str() + 10);
    } else if (a.starts_with("--e2e-segment-kib=")) {
      segment_kib.clear();
      for (const char* c = a.c_str() + 18; *c != 0;) {
        char* e = nullptr;
        segment_kib.push_back(std::strtoull(c, &e, 10));
        if (e == c) return std::fprintf(stderr, "--e2e-segment-kib: K[,K...]\n"), 2;
        c = *e == ',' ? e + 1 : e;
      }
    } else if (a.starts_with("--rounds=")) {
      rounds = std::atoi(a.c_str() + 9);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--only=compact,e2e] [--fill-mib=N] [--seconds=S] [--rounds=R] [--e2e-segment-kib=K,...]\n"
                   "  --only      sections to run (default both)\n"
                   "  --fill-mib  payload MiB queued before the timed compact() (default 256)\n"
                   "  --seconds   length of each e2e window (default 3)\n"
                   "  --rounds    base / +compactor pairs in the e2e section (default 2)\n"
                   "  --e2e-segment-kib  segment sizes of the e2e queues, one set of rounds each (default 4096,1024)\n",
                   argv[0]);
      return 2;
    }
  }
  if (fill_mib == 0 || seconds <= 0 || rounds < 1 || segment_kib.empty() ||
      *std::min_element(segment_kib.begin(), segment_kib.end()) < 4) {
    std::fprintf(stderr, "bench_compact: bad arguments\n");
    return 2;
  }
  g_sh = map_shared<Shared>();
  g_root = make_root("spool-bench-compact", "");
  if (g_root.empty()) return 1;

  bool tmpfs = is_tmpfs(g_root);
  std::printf("bench_compact: dir %s%s, %ld CPUs\n", g_root.c_str(), tmpfs ? " (tmpfs!)" : "",
              ::sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("load average at the start: %s (other processes on this machine skew every number)\n",
              loadavg().c_str());
  std::fflush(stdout);

  uint64_t t0 = mono_ns();
  if (selected(only, "compact")) section_compact(fill_mib);
  if (selected(only, "e2e")) section_e2e(seconds, rounds, segment_kib);
  std::printf("\ntotal %.1f s; load average at the end: %s\n", secs(mono_ns() - t0), loadavg().c_str());

  remove_dir(g_root);
  return 0;
}
