// Fan-out: R readers of one stream (one queue with subscriptions) against R separate queues
// fed the same messages (issue 46). Plain main with fork()ed processes, as bench_queue: the
// parent creates the queues, starts a producer and one process per reader together, collects
// their numbers through an anonymous shared mapping and prints the tables.
//
//  A "subs":   one queue; its readers are the queue's own handle (the default subscription)
//              and R-1 subscriptions, so every reader gets every message from the one stored
//              copy and the default reader holds nothing back.
//  B "queues": R queues; the producer sends each batch to every one of them; reader i drains
//              queue i.
//
// Producer: send_batch of 64 payloads. Readers: receive(64) and an ack per message (or, with
// --ack=batch, one ack_batch of the 64), until each has acked all N. Both setups run in
// every round, interleaved (A first in odd rounds, B first in even ones), and the medians
// over the rounds are printed with the ratios B/A.
//
// Modes: "live" starts the producer and the readers together (throughput of a reader =
// N / time from the common start to its last ack, so it is also bounded by the producer);
// "backlog" sends all N first (timed as the producer's rate) and then starts the readers on
// the full queue(s), which times the readers alone.
//
// Disk: compaction is held off during the run (the parent holds each queue's compact.lock,
// so the background pass after a roll returns at once), and "log" is then the bytes of the
// queues' segments holding records at the end (a scan): every record appended, MSG, LEASE and
// ACK alike. "dirtied" = the sum over every process of the run of write_bytes in
// /proc/self/io: file pages they dirtied (log and index files), counted when a clean page is
// dirtied, so a page dirtied again after writeback counts again. Index = the index files'
// sizes (QUEUE/index and QUEUE/subs/*.index) at the end; RSS and anon = each reader's VmRSS
// and RssAnon when it was done (RSS counts the mapped log and index pages it touched, which
// the processes share); CPU = CPU time of all processes per delivery (N x readers).
//
// Usage: bench_fanout [--n=N] [--size=B] [--readers=R] [--rounds=K] [--mode=live,backlog]
//                     [--sync=never|interval|always] [--setups=A,B] [--ack=each|batch] [--keep]
// Files go to a fresh directory under /var/tmp (SPOOL_BENCH_DIR overrides), removed at the end.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bench_util.h"
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

constexpr char kName[] = "bench_fanout";
constexpr size_t kBatch = 64;
constexpr size_t kMaxReaders = 17;  // the default reader + at most 16 subscriptions
constexpr Millis kVisibility{600000};  // no lease runs out during a run
constexpr Millis kWait{50};            // long-poll slice of the readers
constexpr uint64_t kDeadlineNs = 900ull * 1000000000ull;  // a reader gives up after this

struct Child {
  std::atomic<uint64_t> acked;
  std::atomic<uint64_t> t_end;        // CLOCK_MONOTONIC when done
  std::atomic<uint64_t> cpu_ns;       // its CPU time (user + system)
  std::atomic<uint64_t> write_bytes;  // /proc/self/io at the end
  std::atomic<uint64_t> rss_kb;       // VmRSS at the end
  std::atomic<uint64_t> anon_kb;      // RssAnon at the end
};

struct Shared {
  std::atomic<uint64_t> ready;
  Child producer;
  Child reader[kMaxReaders];
  std::atomic<uint64_t> v[2 * kMaxReaders];  // verify results
};

Shared* g_sh = nullptr;
std::string g_root;
std::string g_setups = "A,B";  // --setups: A, B or both (for profiling one of them)
bool g_keep = false;  // --keep: leave the queues of the last round for a look

void reset_shared() { std::memset(static_cast<void*>(g_sh), 0, sizeof(Shared)); }

[[noreturn]] void child_fail(const char* what, const Status& s) {
  std::fprintf(stderr, "%s[%d]: %s: %s\n", kName, ::getpid(), what, s.to_string().c_str());
  std::fflush(stderr);
  ::_exit(2);
}

uint64_t proc_write_bytes() {
  std::ifstream f("/proc/self/io");
  for (std::string line; std::getline(f, line);) {
    if (line.starts_with("write_bytes:")) return std::strtoull(line.c_str() + 12, nullptr, 10);
  }
  return 0;
}

// What every child records when it is done.
void finish(Child& c) {
  c.t_end = mono_ns();
  c.cpu_ns = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
  c.write_bytes = proc_write_bytes();
  auto st = proc_status();
  c.rss_kb = static_cast<uint64_t>(st["VmRSS"]);
  c.anon_kb = static_cast<uint64_t>(st["RssAnon"]);
}

std::unique_ptr<Queue> open_queue(const std::string& dir, SyncPolicy sync, const std::string& sub = {}) {
  QueueOptions o;
  o.sync = sync;
  o.visibility = kVisibility;
  o.subscription = sub;
  auto q = Queue::open(dir, o);
  if (!q.ok()) child_fail(("open " + dir + (sub.empty() ? "" : " --sub " + sub)).c_str(), q.status());
  return std::move(q).value();
}

std::string sub_name(size_t i) {
  std::string s = std::to_string(i);
  return s.insert(0, 1, 's');  // not "s" + ...: gcc 12's -Wrestrict misfires on that at -O3
}

struct Setup {
  bool subs = false;  // A: one queue with subscriptions; B: separate queues
  int readers = 10;
  std::string base;  // A: the queue; B: base + "-i" for queue i

  std::string queue_of(int i) const { return subs ? base : base + "-" + std::to_string(i); }
  std::string sub_of(int i) const { return subs && i > 0 ? sub_name(static_cast<size_t>(i)) : std::string(); }
  std::vector<std::string> dirs() const {
    std::vector<std::string> d;
    for (int i = 0; i < (subs ? 1 : readers); ++i) d.push_back(queue_of(i));
    return d;
  }
};

// Creates the queue(s), and the subscriptions of A, in a child (out of the timings).
void create(const Setup& s, SyncPolicy sync) {
  if (!wait_all({spawn([&] {
        for (const std::string& d : s.dirs()) {
          auto q = open_queue(d, sync);
          if (s.subs) {
            for (int i = 1; i < s.readers; ++i) {
              Status st = q->add_subscription(sub_name(static_cast<size_t>(i)));
              if (!st.ok()) child_fail("add_subscription", st);
            }
          }
        }
        return 0;
      })}, kName)) {
    std::fprintf(stderr, "%s: cannot create %s\n", kName, s.base.c_str());
    std::exit(1);
  }
}

void produce(const Setup& s, SyncPolicy sync, uint64_t n, size_t size) {
  std::vector<std::unique_ptr<Queue>> qs;
  for (const std::string& d : s.dirs()) qs.push_back(open_queue(d, sync));
  std::string payload = make_payload(size, 7);
  std::vector<std::string_view> batch(kBatch, payload);
  for (uint64_t sent = 0; sent < n;) {
    size_t k = static_cast<size_t>(std::min<uint64_t>(kBatch, n - sent));
    for (auto& q : qs) {
      auto r = q->send_batch(std::span(batch.data(), k));
      if (!r.ok()) child_fail("send_batch", r.status());
    }
    sent += k;
  }
}

// --ack=batch: each received batch acked with one ack_batch call, not an ack per message.
bool g_ack_batch = false;

void consume(std::unique_ptr<Queue>& q, uint64_t n, Child& me) {
  const uint64_t deadline = mono_ns() + kDeadlineNs;
  uint64_t acked = 0;
  while (acked < n) {
    if (mono_ns() > deadline) {
      std::fprintf(stderr, "%s[%d]: gave up after %" PRIu64 " of %" PRIu64 "\n", kName, ::getpid(), acked, n);
      ::_exit(3);
    }
    auto r = q->receive(kBatch, Millis{0}, kWait);
    if (!r.ok()) {
      if (r.status().code() == Code::kEmpty) continue;
      child_fail("receive", r.status());
    }
    if (g_ack_batch) {
      std::vector<std::string_view> receipts;
      receipts.reserve(r->size());
      for (const auto& m : *r) receipts.push_back(m.receipt);
      auto res = q->ack_batch(receipts);
      if (!res.ok()) child_fail("ack_batch", res.status());
      for (const Status& st : *res) {
        if (!st.ok()) child_fail("ack_batch", st);
      }
    } else {
      for (const auto& m : *r) {
        Status st = q->ack(m.receipt);
        if (!st.ok()) child_fail("ack", st);
      }
    }
    acked += r->size();
  }
  me.acked = acked;
}

struct Result1 {
  bool ok = false;
  double prod_rate = 0;               // distinct messages per second of the producer
  std::vector<double> reader_rates;   // per reader, msgs/s
  double wall = 0;                    // start to the last reader done, s
  uint64_t written = 0;               // write_bytes, all processes
  uint64_t log = 0;                   // the logs' record bytes at the end
  uint64_t index = 0;                 // index files' bytes
  std::vector<double> rss_mib;        // per reader
  std::vector<double> anon_mib;       // per reader
  double cpu_us_per_delivery = 0;     // all processes' CPU / (N * readers)
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}

uint64_t size_of(const std::filesystem::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// In a child: the bytes of the log of queue `dir` that hold records (segment headers
// included), from a scan of every segment; 0 on failure.
uint64_t log_bytes(const std::string& dir) {
  g_sh->v[0] = 0;
  pid_t p = spawn([&] {
    spool::storage::LogOptions lo;
    lo.read_only = true;
    auto lg = spool::storage::Log::open(dir + "/segments", lo);
    if (!lg.ok()) child_fail("open log", lg.status());
    auto seqs = (*lg)->segments();
    if (!seqs.ok()) child_fail("segments", seqs.status());
    uint64_t used = 0;
    for (uint64_t seq : *seqs) {
      auto seg = (*lg)->segment(seq);
      if (!seg.ok()) child_fail("segment", seg.status());
      used += spool::storage::scan(**seg, spool::format::kSegmentHeaderSize, [](const spool::storage::RecordView&) {}).end;
    }
    g_sh->v[0] = used;
    return 0;
  });
  return wait_all({p}, kName) ? g_sh->v[0].load() : 0;
}

// In a child: every reader's view of its queue is empty (nothing ready, leased or delayed).
bool verify_empty(const Setup& s, SyncPolicy sync) {
  reset_shared();
  pid_t p = spawn([&] {
    for (int i = 0; i < s.readers; ++i) {
      auto q = open_queue(s.queue_of(i), sync, s.sub_of(i));
      auto st = q->stats();
      if (!st.ok()) child_fail("stats", st.status());
      g_sh->v[i] = st->ready + st->in_flight + st->delayed + st->blocked;
    }
    return 0;
  });
  if (!wait_all({p}, kName)) return false;
  for (int i = 0; i < s.readers; ++i) {
    if (g_sh->v[i] != 0) {
      std::fprintf(stderr, "%s: reader %d's view still holds %" PRIu64 " messages\n", kName, i, g_sh->v[i].load());
      return false;
    }
  }
  return true;
}

Result1 run(const Setup& s, SyncPolicy sync, uint64_t n, size_t size, bool live) {
  Result1 out;
  for (const std::string& d : s.dirs()) remove_dir(d);
  create(s, sync);
  // Compaction held off for the run (its background pass finds compact.lock taken and
  // returns): the log's records at the end are then every byte appended.
  std::vector<int> held_off;
  for (const std::string& d : s.dirs()) {
    int fd = ::open((d + "/compact.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) die("compact.lock");
    held_off.push_back(fd);
  }
  struct Unlock {
    std::vector<int>& fds;
    ~Unlock() {
      for (int fd : fds) ::close(fd);
    }
  } unlock{held_off};
  sync_fs(g_root);
  reset_shared();
  StartGate gate(g_sh->ready);
  std::vector<pid_t> pids;
  uint64_t t_fill = 0;
  if (!live) {
    // The backlog first, timed on its own.
    uint64_t t0 = mono_ns();
    if (!wait_all({spawn([&] {
          produce(s, sync, n, size);
          finish(g_sh->producer);
          return 0;
        })}, kName)) return out;
    t_fill = g_sh->producer.t_end.load() - t0;
  } else {
    pids.push_back(spawn([&] {
      std::vector<std::unique_ptr<Queue>> warm;  // opened before the start, as the readers
      for (const std::string& d : s.dirs()) warm.push_back(open_queue(d, sync));
      gate.child_wait();
      produce(s, sync, n, size);
      finish(g_sh->producer);
      return 0;
    }));
  }
  for (int i = 0; i < s.readers; ++i) {
    pids.push_back(spawn([&, i] {
      auto q = open_queue(s.queue_of(i), sync, s.sub_of(i));
      gate.child_wait();
      consume(q, n, g_sh->reader[i]);
      finish(g_sh->reader[i]);
      return 0;
    }));
  }
  uint64_t t0 = gate.release(pids, kName);
  if (t0 == 0) return out;
  if (!wait_all(pids, kName)) return out;

  out.prod_rate = static_cast<double>(n) / secs(live ? g_sh->producer.t_end.load() - t0 : t_fill);
  uint64_t last = 0, cpu = g_sh->producer.cpu_ns.load();
  out.written = g_sh->producer.write_bytes.load();
  for (int i = 0; i < s.readers; ++i) {
    const Child& c = g_sh->reader[i];
    if (c.acked.load() != n) return out;
    out.reader_rates.push_back(static_cast<double>(n) / secs(c.t_end.load() - t0));
    out.rss_mib.push_back(static_cast<double>(c.rss_kb.load()) / 1024);
    out.anon_mib.push_back(static_cast<double>(c.anon_kb.load()) / 1024);
    last = std::max(last, c.t_end.load());
    cpu += c.cpu_ns.load();
    out.written += c.write_bytes.load();
  }
  out.wall = secs(last - t0) + (live ? 0 : secs(t_fill));
  out.cpu_us_per_delivery = static_cast<double>(cpu) / 1e3 / static_cast<double>(n * static_cast<uint64_t>(s.readers));
  namespace fs = std::filesystem;
  for (const std::string& d : s.dirs()) {
    uint64_t lb = log_bytes(d);
    if (lb == 0) return out;
    out.log += lb;
    std::error_code ec;
    out.index += size_of(d + "/index");
    for (const auto& e : fs::directory_iterator(d + "/subs", ec)) {
      if (e.path().extension() == ".index") out.index += size_of(e.path());
    }
  }
  if (!verify_empty(s, sync)) return out;  // after the figures above: it reuses the shared slots
  if (!g_keep)
    for (const std::string& d : s.dirs()) remove_dir(d);
  out.ok = true;
  return out;
}

double mib(double b) { return b / 1048576.0; }

void print_row(const char* label, const Result1& r, uint64_t n) {
  if (!r.ok) {
    std::printf("%-9s FAILED\n", label);
    return;
  }
  auto rates = r.reader_rates;
  std::sort(rates.begin(), rates.end());
  std::printf("%-9s %9s %9s %9s %9s %7.2f %8.1f %7.0f %8.1f %8.1f %7.1f %6.1f %7.2f\n", label, human(r.prod_rate).c_str(),
              human(rates.front()).c_str(), human(median(rates)).c_str(), human(rates.back()).c_str(), r.wall,
              mib(static_cast<double>(r.log)), static_cast<double>(r.log) / static_cast<double>(n),
              mib(static_cast<double>(r.written)), mib(static_cast<double>(r.index)), median(r.rss_mib),
              median(r.anon_mib), r.cpu_us_per_delivery);
}

void print_header() {
  std::printf("%-9s %9s %9s %9s %9s %7s %8s %7s %8s %8s %7s %6s %7s\n", "", "producer", "reader", "reader", "reader",
              "wall", "log", "log", "dirtied", "index", "RSS", "anon", "CPU");
  std::printf("%-9s %9s %9s %9s %9s %7s %8s %7s %8s %8s %7s %6s %7s\n", "", "msgs/s", "min/s", "median/s", "max/s", "s",
              "MiB", "B/msg", "MiB", "MiB", "MiB", "MiB", "us/dlv");
}

// The medians over the rounds of each figure (each figure on its own).
Result1 medians(const std::vector<Result1>& rs) {
  Result1 m;
  std::vector<double> prod, mn, med, mx, wall, wr, lg, idx, rss, anon, cpu;
  for (const Result1& r : rs) {
    if (!r.ok) continue;
    auto rates = r.reader_rates;
    std::sort(rates.begin(), rates.end());
    prod.push_back(r.prod_rate);
    mn.push_back(rates.front());
    med.push_back(median(rates));
    mx.push_back(rates.back());
    wall.push_back(r.wall);
    wr.push_back(static_cast<double>(r.written));
    lg.push_back(static_cast<double>(r.log));
    idx.push_back(static_cast<double>(r.index));
    rss.push_back(median(r.rss_mib));
    anon.push_back(median(r.anon_mib));
    cpu.push_back(r.cpu_us_per_delivery);
  }
  if (prod.empty()) return m;
  m.ok = true;
  m.prod_rate = median(prod);
  m.reader_rates = {median(mn), median(med), median(mx)};
  m.wall = median(wall);
  m.written = static_cast<uint64_t>(median(wr));
  m.log = static_cast<uint64_t>(median(lg));
  m.index = static_cast<uint64_t>(median(idx));
  m.rss_mib = {median(rss)};
  m.anon_mib = {median(anon)};
  m.cpu_us_per_delivery = median(cpu);
  return m;
}

void section(bool live, SyncPolicy sync, uint64_t n, size_t size, int readers, int rounds) {
  std::printf("\n== %s, sync=%s: %" PRIu64 " messages of %zu B, %d readers ==\n", live ? "live" : "backlog",
              sync_name(sync), n, size, readers);
  std::printf("A subs   = one queue read by its default reader + %d subscriptions (%d readers of one copy)\n",
              readers - 1, readers);
  std::printf("B queues = %d queues, the producer sends every batch of %zu to each; one reader per queue\n", readers,
              kBatch);
  if (live) std::printf("producer and readers start together; reader msgs/s = N / (start -> its last ack)\n");
  else std::printf("the producer fills first (its msgs/s); then the readers start on the full queue(s)\n");
  std::printf("\n");
  print_header();
  Setup a{true, readers, g_root + "/a"};
  Setup b{false, readers, g_root + "/b"};
  std::vector<Result1> ra, rb;
  for (int r = 0; r < rounds; ++r) {
    char la[16], lb[16];
    std::snprintf(la, sizeof la, "A r%d", r + 1);
    std::snprintf(lb, sizeof lb, "B r%d", r + 1);
    auto run_a = [&] {
      if (!selected(g_setups, "A")) return;
      ra.push_back(run(a, sync, n, size, live));
      print_row(la, ra.back(), n);
    };
    auto run_b = [&] {
      if (!selected(g_setups, "B")) return;
      rb.push_back(run(b, sync, n, size, live));
      print_row(lb, rb.back(), n);
    };
    if (r % 2 == 0) {
      run_a();
      run_b();
    } else {
      run_b();
      run_a();
    }
    std::fflush(stdout);
  }
  Result1 ma = medians(ra), mb = medians(rb);
  std::printf("\nmedians of %d rounds (each column on its own):\n", rounds);
  print_header();
  if (!ra.empty()) print_row("A subs", ma, n);
  if (!rb.empty()) print_row("B queues", mb, n);
  if (ma.ok && mb.ok) {
    auto ratio = [](double x, double y) { return y > 0 ? x / y : 0.0; };
    std::printf("%-9s %8.2fx %8.2fx %8.2fx %8.2fx %6.2fx %7.2fx %6.2fx %7.2fx %7.2fx %6.2fx %5.2fx %6.2fx\n", "B/A",
                ratio(mb.prod_rate, ma.prod_rate), ratio(mb.reader_rates[0], ma.reader_rates[0]),
                ratio(mb.reader_rates[1], ma.reader_rates[1]), ratio(mb.reader_rates[2], ma.reader_rates[2]),
                ratio(mb.wall, ma.wall), ratio(static_cast<double>(mb.log), static_cast<double>(ma.log)),
                ratio(static_cast<double>(mb.log), static_cast<double>(ma.log)),
                ratio(static_cast<double>(mb.written), static_cast<double>(ma.written)),
                ratio(static_cast<double>(mb.index), static_cast<double>(ma.index)),
                ratio(mb.rss_mib[0], ma.rss_mib[0]), ratio(mb.anon_mib[0], ma.anon_mib[0]),
                ratio(mb.cpu_us_per_delivery, ma.cpu_us_per_delivery));
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 200000;
  size_t size = 100;
  int readers = 10, rounds = 3;
  std::string modes = "live,backlog";
  SyncPolicy sync = SyncPolicy::kNever;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.starts_with("--n=")) {
      n = std::strtoull(a.c_str() + 4, nullptr, 10);
    } else if (a.starts_with("--size=")) {
      size = std::strtoull(a.c_str() + 7, nullptr, 10);
    } else if (a.starts_with("--readers=")) {
      readers = std::atoi(a.c_str() + 10);
    } else if (a.starts_with("--rounds=")) {
      rounds = std::atoi(a.c_str() + 9);
    } else if (a.starts_with("--mode=")) {
      modes = a.substr(7);
    } else if (a.starts_with("--setups=")) {
      g_setups = a.substr(9);
    } else if (a == "--ack=batch" || a == "--ack=each") {
      g_ack_batch = a == "--ack=batch";
    } else if (a == "--keep") {
      g_keep = true;
    } else if (a.starts_with("--sync=")) {
      std::string v = a.substr(7);
      if (v == "always") sync = SyncPolicy::kAlways;
      else if (v == "interval") sync = SyncPolicy::kInterval;
      else if (v == "never") sync = SyncPolicy::kNever;
      else return std::fprintf(stderr, "--sync: always, interval or never\n"), 2;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--n=N] [--size=B] [--readers=R] [--rounds=K] [--mode=live,backlog] [--sync=P] [--setups=A,B] [--ack=each|batch] [--keep]\n"
                   "  --n        messages (default 200000)\n"
                   "  --size     payload bytes (default 100)\n"
                   "  --readers  readers in each setup, 2..17 (default 10)\n"
                   "  --rounds   rounds of A and B, interleaved (default 3)\n"
                   "  --mode     live (producer and readers together), backlog (fill, then drain), or both\n"
                   "  --sync     the queues' sync policy (default never)\n"
                   "  --setups   run A (subscriptions), B (queues) or both (default)\n"
                   "  --ack      each: one ack per message (default); batch: one ack_batch per receive\n"
                   "  --keep     leave the last round's queues (and print where)\n",
                   argv[0]);
      return 2;
    }
  }
  if (n == 0 || size == 0 || readers < 2 || readers > static_cast<int>(kMaxReaders) || rounds < 1 ||
      (!selected(modes, "live") && !selected(modes, "backlog")) ||
      (!selected(g_setups, "A") && !selected(g_setups, "B"))) {
    std::fprintf(stderr, "%s: --n and --size must be > 0, --readers 2..17, --rounds >= 1, --mode live and/or backlog, --setups A and/or B\n",
                 kName);
    return 2;
  }
  g_sh = map_shared<Shared>();
  g_root = make_root("spool-bench-fanout", "");
  if (g_root.empty()) return 1;
  std::printf("%s: dir %s%s, %ld CPUs\n", kName, g_root.c_str(), is_tmpfs(g_root) ? " (tmpfs!)" : "",
              ::sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("load average at the start: %s (other processes on this machine skew every number)\n", loadavg().c_str());
  std::printf("log = bytes of the queues' logs holding records at the end, compaction held off during the run\n");
  std::printf("(so: every record appended; B/msg per distinct message); dirtied = write_bytes of /proc/self/io\n");
  std::printf("summed over producer and readers (file pages dirtied: log and index files); index = the\n");
  std::printf("index files' sizes (QUEUE/index + QUEUE/subs/*.index); RSS, anon = a reader's VmRSS and RssAnon\n");
  std::printf("when done (median; RSS includes the mapped log and index pages, shared between processes);\n");
  std::printf("CPU = CPU time of all processes per delivery (N x readers). Receive in batches of %zu, %s.\n",
              kBatch, g_ack_batch ? "acked with one ack_batch each" : "one ack each");
  uint64_t t0 = mono_ns();
  if (selected(modes, "live")) section(true, sync, n, size, readers, rounds);
  if (selected(modes, "backlog")) section(false, sync, n, size, readers, rounds);
  std::printf("\ntotal %.1f s; load average at the end: %s\n", secs(mono_ns() - t0), loadavg().c_str());
  if (g_keep) std::printf("kept: %s\n", g_root.c_str());
  else remove_dir(g_root);
  return 0;
}
