// spool-demo: the project's main job. One producer and four competing worker processes
// share a queue directory (no daemon). One worker is killed with SIGKILL while it holds a
// lease; its message comes back after the visibility timeout and another worker finishes
// it. At the end every job must have been acked at least once.
//
// Usage: spool-demo [DIR]   DIR: a new or empty directory for the queue (kept afterwards);
//                           without it the queue lives in a temp dir that is removed.
#include <cinttypes>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "spool/queue.h"

namespace {

constexpr uint32_t kJobs = 2000;
constexpr uint32_t kBatch = 100;
constexpr uint32_t kWorkers = 4;
constexpr uint32_t kVictimJob = 500;  // the worker that receives this one stalls and is killed
constexpr spool::Millis kVisibility{1000};
constexpr uint32_t kMaxReceives = 5;
constexpr uint64_t kSegmentSize = 64 << 10;  // small, so that even this demo rolls segments
constexpr spool::Millis kLongPoll{200};
constexpr auto kWork = std::chrono::microseconds(200);
constexpr double kDeadlineS = 15;  // give up (and fail) rather than hang

using Clock = std::chrono::steady_clock;

// What the children tell the parent, one fixed-size record per write(2): pipe writes of at
// most PIPE_BUF bytes are atomic, so records from several processes never interleave.
enum class Kind : uint32_t { kSent, kAcked, kLeaseLost, kStalled };
struct Event {
  Kind kind;
  uint32_t worker;  // 0: the producer
  uint64_t id;      // message id (kSent: number of messages sent)
  uint32_t job;     // N of "job N"
  uint32_t receive_count;
  int32_t pid;
  uint32_t unused = 0;
};
static_assert(sizeof(Event) == 32);

volatile sig_atomic_t g_stop = 0;         // workers: SIGTERM, leave after the current message
volatile sig_atomic_t g_interrupted = 0;  // parent: Ctrl-C, kill the children and clean up
void on_term(int) {
  g_stop = 1;
}
void on_interrupt(int) {
  g_interrupted = 1;
}

spool::QueueOptions demo_options() {
  spool::QueueOptions o;
  o.visibility = kVisibility;
  o.max_receives = kMaxReceives;
  o.segment_size = kSegmentSize;
  o.max_payload = 1024;  // the default (1 MiB) must fit one segment
  return o;
}

// ---- children ------------------------------------------------------------------------------

void emit(int fd, const Event& ev) {
  const char* p = reinterpret_cast<const char*>(&ev);
  size_t left = sizeof ev;
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ::_exit(3);  // the parent is gone; nobody to report to
    p += n;
    left -= static_cast<size_t>(n);
  }
}

[[noreturn]] void fail(const char* who, const spool::Status& s) {
  std::fprintf(stderr, "spool-demo: %s (pid %d): %s\n", who, ::getpid(), s.to_string().c_str());
  ::_exit(1);
}

// Children open the queue themselves: a Queue must never be used across fork().
std::unique_ptr<spool::Queue> open_or_die(const std::string& dir, const char* who) {
  auto q = spool::Queue::open(dir, demo_options());
  if (!q.ok()) fail(who, q.status());
  return std::move(q).value();
}

uint32_t job_of(std::string_view payload) {
  uint32_t n = 0;
  if (payload.starts_with("job "))
    std::from_chars(payload.data() + 4, payload.data() + payload.size(), n);
  return n;
}

void producer_main(const std::string& dir, int out) {
  auto q = open_or_die(dir, "producer");
  std::vector<std::string> bodies;
  std::vector<std::string_view> views;
  for (uint32_t first = 1; first <= kJobs; first += kBatch) {
    bodies.clear();
    for (uint32_t n = first; n < first + kBatch && n <= kJobs; ++n)
      bodies.push_back("job " + std::to_string(n));
    views.assign(bodies.begin(), bodies.end());
    auto ids = q->send_batch(views);
    if (!ids.ok()) fail("producer", ids.status());
  }
  emit(out, {Kind::kSent, 0, kJobs, 0, 0, ::getpid()});
}

void worker_main(const std::string& dir, uint32_t worker, int out) {
  struct sigaction sa {};
  sa.sa_handler = on_term;  // finish the current message, then leave
  ::sigaction(SIGTERM, &sa, nullptr);
  auto q = open_or_die(dir, "worker");
  const int32_t pid = ::getpid();
  while (!g_stop) {
    auto got = q->receive(1, spool::Millis{0}, kLongPoll);
    if (!got.ok()) {
      if (got.status().code() == spool::Code::kEmpty) continue;
      fail("worker", got.status());
    }
    for (const spool::Message& m : *got) {
      uint32_t job = job_of(m.payload);
      if (job == kVictimJob && m.receive_count == 1) {
        // Simulate a worker that hangs mid-task: it keeps the lease until it is killed.
        emit(out, {Kind::kStalled, worker, m.id, job, m.receive_count, pid});
        for (;;) ::pause();
      }
      std::this_thread::sleep_for(kWork);
      spool::Status s = q->ack(m.receipt);
      if (s.ok()) {
        emit(out, {Kind::kAcked, worker, m.id, job, m.receive_count, pid});
      } else if (s.code() == spool::Code::kLeaseLost) {
        // Took longer than the visibility timeout: someone else has (or had) it now.
        emit(out, {Kind::kLeaseLost, worker, m.id, job, m.receive_count, pid});
      } else {
        fail("worker", s);
      }
    }
  }
}

// ---- parent --------------------------------------------------------------------------------

struct Proc {
  uint32_t worker = 0;  // 0: producer
  pid_t pid = -1;
  bool running = false;
  bool killed = false;  // by us, on purpose
  int status = 0;
  uint64_t processed = 0;
};

class Demo {
 public:
  Demo(std::string dir, std::unique_ptr<spool::Queue> q) : dir_(std::move(dir)), q_(std::move(q)) {}

  int run();

 private:
  double now_s() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  void spawn(uint32_t worker);
  void on_event(const Event& ev);
  bool read_events(int timeout_ms);
  void reap(bool block);
  Proc& proc(uint32_t worker) { return procs_[worker]; }

  std::string dir_;
  std::unique_ptr<spool::Queue> q_;
  int rd_ = -1, wr_ = -1;
  Clock::time_point t0_;
  std::vector<Proc> procs_;
  std::string pending_;  // partial event bytes
  std::vector<uint32_t> acks_ = std::vector<uint32_t>(kJobs + 1, 0);
  uint64_t sent_ = 0;
  uint64_t lease_lost_ = 0;
  uint64_t redelivered_ = 0;
  bool victim_killed_ = false;
  uint64_t victim_id_ = 0;
  double t_killed_ = 0, t_last_first_ = 0;
};

void Demo::spawn(uint32_t worker) {
  std::fflush(stdout);  // or the child's copy of the buffer could be written twice
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("spool-demo: fork");
    std::exit(1);
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphans if the demo itself dies
    if (::getppid() != parent) ::_exit(1);
    ::signal(SIGINT, SIG_IGN);  // Ctrl-C reaches the whole group; the parent decides
    ::close(rd_);
    if (worker == 0) {
      producer_main(dir_, wr_);
    } else {
      worker_main(dir_, worker, wr_);
    }
    ::_exit(0);  // skips the parent's objects (its Queue) copied into this process
  }
  if (procs_.size() <= worker) procs_.resize(worker + 1);
  procs_[worker] = Proc{worker, pid, true};
}

void Demo::on_event(const Event& ev) {
  switch (ev.kind) {
    case Kind::kSent:
      sent_ = ev.id;
      std::printf("[%5.2fs] producer sent %" PRIu64 " messages in batches of %u\n", now_s(), ev.id, kBatch);
      break;
    case Kind::kAcked:
      if (ev.job >= 1 && ev.job <= kJobs) ++acks_[ev.job];
      ++proc(ev.worker).processed;
      if (ev.receive_count == 1) {
        t_last_first_ = now_s();
      } else {
        ++redelivered_;
        std::printf(
            "[%5.2fs] message %" PRIu64 " redelivered (receive_count %u) to worker %u, acked "
            "%.2f s after the kill\n",
            now_s(), ev.id, ev.receive_count, ev.worker, now_s() - t_killed_);
      }
      break;
    case Kind::kLeaseLost:
      ++lease_lost_;
      break;
    case Kind::kStalled: {
      Proc& p = proc(ev.worker);
      std::printf(
          "[%5.2fs] worker %u (pid %d) stalls on message %" PRIu64 " \"job %u\", holding its lease\n",
          now_s(), ev.worker, ev.pid, ev.id, ev.job);
      ::kill(p.pid, SIGKILL);
      while (::waitpid(p.pid, &p.status, 0) < 0 && errno == EINTR) {
      }
      p.running = false;
      p.killed = true;
      victim_killed_ = true;
      victim_id_ = ev.id;
      t_killed_ = now_s();
      std::printf("[%5.2fs] killed worker %u (pid %d) with SIGKILL holding message %" PRIu64 "\n", now_s(),
                  ev.worker, ev.pid, ev.id);
      uint32_t replacement = static_cast<uint32_t>(procs_.size());
      spawn(replacement);
      std::printf("[%5.2fs] started replacement worker %u (pid %d)\n", now_s(), replacement,
                  proc(replacement).pid);
      break;
    }
  }
}

// Handles what arrives within `timeout_ms`; false if nothing did or at EOF (writers gone).
bool Demo::read_events(int timeout_ms) {
  pollfd pfd{rd_, POLLIN, 0};
  if (::poll(&pfd, 1, timeout_ms) <= 0) return false;
  char buf[4096];
  ssize_t n = ::read(rd_, buf, sizeof buf);
  if (n < 0) return errno == EINTR;
  if (n == 0) return false;
  pending_.append(buf, static_cast<size_t>(n));
  size_t used = 0;
  for (; pending_.size() - used >= sizeof(Event); used += sizeof(Event)) {
    Event ev;
    std::memcpy(&ev, pending_.data() + used, sizeof ev);
    on_event(ev);
  }
  pending_.erase(0, used);
  return true;
}

void Demo::reap(bool block) {
  for (Proc& p : procs_) {
    if (!p.running) continue;
    pid_t r;
    while ((r = ::waitpid(p.pid, &p.status, block ? 0 : WNOHANG)) < 0 && errno == EINTR) {
    }
    if (r == p.pid) p.running = false;
  }
}

int Demo::run() {
  int fds[2];
  if (::pipe(fds) != 0) {
    std::perror("spool-demo: pipe");
    return 1;
  }
  rd_ = fds[0];
  wr_ = fds[1];
  procs_.reserve(kWorkers + 2);  // producer, workers, one replacement

  t0_ = Clock::now();
  spawn(0);
  for (uint32_t w = 1; w <= kWorkers; ++w) spawn(w);
  std::printf("[%5.2fs] started producer (pid %d) and workers 1-%u (pids", now_s(), proc(0).pid,
              kWorkers);
  for (uint32_t w = 1; w <= kWorkers; ++w) std::printf(" %d", proc(w).pid);
  std::printf(")\n");

  // Drained: the producer is done and nothing is ready, leased or delayed.
  bool ok = true;
  for (;;) {
    (void)read_events(20);
    reap(false);
    if (!proc(0).running && (!WIFEXITED(proc(0).status) || WEXITSTATUS(proc(0).status) != 0)) {
      std::printf("FAIL: the producer failed\n");
      ok = false;
      break;
    }
    auto st = q_->stats();
    if (!st.ok()) {
      std::printf("FAIL: stats: %s\n", st.status().to_string().c_str());
      ok = false;
      break;
    }
    if (!proc(0).running && sent_ == kJobs && st->ready + st->in_flight + st->delayed == 0) break;
    if (g_interrupted) break;
    if (now_s() > kDeadlineS) {
      std::printf("FAIL: not drained after %.0f s (ready %" PRIu64 ", in_flight %" PRIu64 ", delayed %" PRIu64 ")\n",
                  kDeadlineS, st->ready, st->in_flight, st->delayed);
      ok = false;
      break;
    }
  }
  double elapsed = now_s();
  if (ok && !g_interrupted) std::printf("[%5.2fs] queue drained; stopping workers\n", elapsed);

  // SIGTERM: each worker leaves after its current long poll (<= 200 ms).
  for (Proc& p : procs_) {
    if (p.running) ::kill(p.pid, ok && !g_interrupted ? SIGTERM : SIGKILL);
  }
  reap(true);
  ::close(wr_);
  if (g_interrupted) {
    std::printf("[%5.2fs] interrupted: workers killed, results discarded\n", now_s());
    ::close(rd_);
    return 130;
  }
  while (read_events(1000)) {  // the last events, until every writer is gone (EOF)
  }
  ::close(rd_);

  std::printf("\n worker  pid      processed\n");
  uint64_t total = 0;
  for (const Proc& p : procs_) {
    if (p.worker == 0) continue;
    total += p.processed;
    const char* note = p.killed              ? "  (killed with SIGKILL)"
                       : p.worker > kWorkers ? "  (replacement)"
                                             : "";
    std::printf(" %6u  %-7d  %9" PRIu64 "%s\n", p.worker, p.pid, p.processed, note);
    bool clean = p.killed || (WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0);
    if (!clean) {
      std::printf("FAIL: worker %u did not exit cleanly (status 0x%x)\n", p.worker, p.status);
      ok = false;
    }
  }
  std::printf(
      "total processed: %" PRIu64 " in %.2f s = %.0f msgs/s (%" PRIu64 " first deliveries in %.2f s = "
      "%.0f msgs/s)\n",
      total, elapsed, static_cast<double>(total) / elapsed, total - redelivered_, t_last_first_,
      static_cast<double>(total - redelivered_) / t_last_first_);

  auto st = q_->stats();
  if (!st.ok()) {
    std::printf("FAIL: stats: %s\n", st.status().to_string().c_str());
    return 1;
  }
  std::printf(
      "final stats: ready %" PRIu64 ", in_flight %" PRIu64 ", delayed %" PRIu64 ", dead %" PRIu64 ", sent_total %" PRIu64 ",\n"
      "             acked_total %" PRIu64 ", segments %" PRIu64 ", bytes_on_disk %" PRIu64 "\n",
      st->ready, st->in_flight, st->delayed, st->dead, st->sent_total, st->acked_total,
      st->segments, st->bytes_on_disk);

  // At-least-once: every job acked; more than one ack of a job would be a duplicate.
  uint32_t lost = 0, dups = 0, first_lost = 0;
  for (uint32_t n = 1; n <= kJobs; ++n) {
    if (acks_[n] == 0 && lost++ == 0) first_lost = n;
    if (acks_[n] > 1) ++dups;
  }
  std::printf(
      "check: %u/%u jobs acked, %u lost%s, %u duplicates, %" PRIu64 " redelivered, %" PRIu64 " lease lost\n",
      kJobs - lost, kJobs, lost,
      lost ? (" (first: job " + std::to_string(first_lost) + ")").c_str() : "", dups, redelivered_,
      lease_lost_);
  if (lost != 0) ok = false;
  if (!victim_killed_) {
    std::printf("FAIL: no worker stalled on job %u\n", kVictimJob);
    ok = false;
  } else if (redelivered_ == 0) {
    std::printf("FAIL: the killed worker's message %" PRIu64 " was not redelivered\n", victim_id_);
    ok = false;
  }
  if (st->acked_total != kJobs || st->sent_total != kJobs || st->dead != 0) {
    std::printf("FAIL: stats disagree with the %u jobs sent\n", kJobs);
    ok = false;
  }
  std::printf("%s\n", ok ? "OK: no message lost" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    std::fprintf(stderr,
                 "usage: spool-demo [DIR]   (DIR: a new or empty directory for the queue)\n");
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGINT, on_interrupt);
  // The library logs its I/O backend choice at info level; keep warnings and errors only.
  spdlog::set_level(spdlog::level::warn);
  bool temp = argc < 2;
  std::string dir;
  if (temp) {
    char tmpl[] = "/tmp/spool-demo-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      std::perror("spool-demo: mkdtemp");
      return 1;
    }
    dir = tmpl;
  } else {
    dir = argv[1];
  }

  int rc = 1;
  if (auto q = spool::Queue::open(dir, demo_options()); !q.ok()) {
    std::fprintf(stderr, "spool-demo: %s\n", q.status().to_string().c_str());
  } else if (auto st = (*q)->stats(); !st.ok() || st->next_id != 1) {
    std::fprintf(stderr,
                 "spool-demo: %s already holds a used queue; give a new or empty directory\n",
                 dir.c_str());
  } else {
    std::printf("spool demo: 1 producer, %u workers, %u jobs; queue in %s\n", kWorkers, kJobs,
                dir.c_str());
    std::printf(
        "  visibility %lld ms, max_receives %u, segments of %" PRIu64 " KiB, long poll %lld ms, "
        "work %lld us/job\n",
        static_cast<long long>(kVisibility.count()), kMaxReceives, kSegmentSize >> 10,
        static_cast<long long>(kLongPoll.count()), static_cast<long long>(kWork.count()));
    Demo demo(dir, std::move(q).value());
    rc = demo.run();
  }  // the queue is closed before its directory goes

  if (temp) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    if (ec)
      std::fprintf(stderr, "spool-demo: could not remove %s: %s\n", dir.c_str(),
                   ec.message().c_str());
  }
  return rc;
}
