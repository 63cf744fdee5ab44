// Crash campaign (docs/reliability.md, campaign 1): real processes on one queue with 64 KiB
// segments, so compaction really runs, killed with SIGKILL at random moments and restarted:
//   P0, P1  producers (library send_batch), journaling each id after its send returned;
//   C0, C1  consumers (library receive + ack / nack / extend); C1 binds its leases to its
//           life (instant release on death), C0 does not;
//   W0      `spool work` (the CLI binary, $SPOOL_CLI) running a shell command per message;
//   K0      a compactor: Queue::compact in a loop.
// A cycle is a run of random kills; then every process is killed, the queue is checked while
// quiet (index invariants, verify, depth = recount, nothing lost, nothing acked came back),
// and the next cycle starts. At the end the queue is drained and every delivery is
// accounted for: each redelivery must be explained by a lease expiry (the timing is checked
// against the lease deadline on CLOCK_BOOTTIME), a nack, or the death of its holder.
//
// The ledger that reads the journals is tests/campaign_ledger.{h,cc}; the soak's samples and
// growth criterion are tests/soak_samples.{h,cc}.
//
// Journals are plain files appended one line per write(2): the campaign kills processes,
// not the machine, so the page cache keeps every line a process wrote before it died.
//
// SPOOL_CAMPAIGN_MAX_RECEIVES=N (meson's crash-campaign/dlq: 2) gives the queue a dead-letter
// limit, and the ledger accounts for the dead-letter queue too.
//
// SPOOL_CAMPAIGN_SUBSCRIPTIONS=N (1-3; meson's crash-campaign/subs: 3) adds subscriptions
// s1..sN when the queue is made, so each message is read by N+1 views of one stored copy:
// C0 reads s1, C1 (leases bound) s2, W0 (`spool work --sub`) s3 (the last one there is),
// and a third consumer C2 the queue's own view. Each view has its own ledger, its own quiet
// checks (check_index and depth = recount on a handle opened as the subscription) and its
// own drain and accounting: nothing lost, acked back, duplicated or unexplained in any view.
//
// Size: SPOOL_TEST_SCALE scales the kills (300 at scale 1); SPOOL_SOAK_SECONDS=N runs
// cycles until N seconds have passed instead (see docs/reliability.md).
//
// Soak: three survivors run beside the killed processes for the whole soak and are never
// killed (a producer, a consumer, a compactor calling Queue::compact every second), so the
// resources of long-lived processes can be watched. They pause between two calls while the
// queue is checked after each cycle (the check is then not a first opener, and the index is
// not deleted: SPOOL_SOAK_SURVIVORS=0 runs the soak without them, as before). Every
// SPOOL_SOAK_SAMPLE_SECONDS (30; 5 at CI size) the campaign samples the survivors' VmRSS,
// the bytes of all files of the queue directory, the index file and the depth; at the end it
// prints them and, given 8 samples or more, fails if one grew without bound (see
// growth_problem()).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "campaign_ledger.h"
#include "proc_util.h"
#include "soak_samples.h"
#include "spool/queue.h"
#include "test_util.h"

namespace spool {
namespace {

using namespace std::chrono_literals;
using namespace campaign;
using test::boot_ns;
using test::Journal;
using test::TempDir;
using test::wait_exit;
namespace fs = std::filesystem;

constexpr Millis kConsumerVis{1500};
constexpr Millis kWorkVis{2000};
constexpr uint64_t kSlackNs = 50'000'000;  // clock conversions, /proc/uptime's 10 ms steps
constexpr const char* kUnjournaled = "receiver killed before it journaled the delivery";

constexpr test::TaggedPayloads kPayloads{30, 1800, 'A', 48};

// SPOOL_CAMPAIGN_MAX_RECEIVES (default 0: every redelivery stays visible to the campaign).
// With a small limit, messages also leave through the dead-letter hand-off under the kills,
// and the ledger accounts for the dead-letter queue: no delivery past the limit, every
// message acked, drained or dead-lettered, nothing in the DLQ that was never sent.
uint32_t campaign_max_receives() {
  const char* s = std::getenv("SPOOL_CAMPAIGN_MAX_RECEIVES");
  return s != nullptr ? static_cast<uint32_t>(std::strtoul(s, nullptr, 10)) : 0;
}

// SPOOL_CAMPAIGN_SUBSCRIPTIONS (default 0: the queue's own view only).
int campaign_subscriptions() {
  const char* s = std::getenv("SPOOL_CAMPAIGN_SUBSCRIPTIONS");
  return s != nullptr ? std::clamp(std::atoi(s), 0, 3) : 0;
}

// View 0 is the queue's own; view k is subscription "sk".
std::string view_name(int view) { return view == 0 ? std::string() : "s" + std::to_string(view); }
std::string view_label(int view) { return view == 0 ? std::string("the queue's own view") : "subscription " + view_name(view); }

// The view a consumer reads (campaign_subscriptions()).
int view_of(char role, int slot) {
  const int n = campaign_subscriptions();
  if (n == 0 || (role != 'C' && role != 'W')) return 0;
  if (role == 'W') return n;
  return slot < 2 ? std::min(slot + 1, n) : 0;
}

QueueOptions campaign_options(int view = 0) {
  QueueOptions o;
  o.segment_size = 64 << 10;
  o.visibility = kConsumerVis;
  o.max_receives = campaign_max_receives();
  o.subscription = view_name(view);
  return o;
}

// ---- the processes ---------------------------------------------------------------------------

// Shared (MAP_SHARED before the fork) between the campaign and its survivors. To pause them,
// the campaign bumps `epoch` and sets `pause`; each survivor, between two calls, switches to
// the journal of the new epoch, stores the epoch in its `at` and waits until `pause` clears.
// Survivor journals are thus read chunk by chunk, each complete when it is read.
struct SurvivorControl {
  std::atomic<uint32_t> epoch{0};
  std::atomic<uint32_t> pause{0};
  std::atomic<uint32_t> at[3]{};
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

std::string survivor_journal(const std::string& base, uint32_t epoch) {
  return base + "." + std::to_string(epoch) + ".log";
}

struct SurvivorHook {
  SurvivorControl* ctl = nullptr;
  int index = 0;
  std::string base;  // journal path without ".<epoch>.log"
  void maybe_pause(Journal& j) const {
    if (ctl == nullptr || ctl->pause.load() == 0) return;
    uint32_t e = ctl->epoch.load();
    if (ctl->at[index].load() == e) return;
    j.switch_to(survivor_journal(base, e));
    ctl->at[index].store(e);
    while (ctl->pause.load() != 0) std::this_thread::sleep_for(1ms);
  }
};

// `hold_back`: the soak's producers wait while more than 3 000 messages are ready, so the
// depth stays bounded for an hour (the CI run only slows down a little there).
int producer(const std::string& q_dir, const std::string& journal, int slot, int inc, uint32_t seed,
             bool hold_back = false, const SurvivorHook& hook = {}) {
  Journal j(journal);
  auto q = test::open_journaled(j, q_dir, campaign_options());
  if (q == nullptr) return 1;
  std::mt19937 rng(seed);
  for (int n = 0;; ) {
    hook.maybe_pause(j);
    std::vector<std::string> tags;
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
      tags.push_back("p" + std::to_string(slot) + "." + std::to_string(inc) + "." + std::to_string(n++));
    }
    if (!test::send_journaled(*q, j, kPayloads, tags)) {
      std::this_thread::sleep_for(10ms);
      continue;
    }
    if (n % 64 < 3) {  // keep the backlog bounded
      auto st = q->stats();
      if (st.ok() && st->ready > 3000) std::this_thread::sleep_for(50ms);
      for (; hold_back && st.ok() && st->ready > 3000; st = q->stats()) {
        hook.maybe_pause(j);
        std::this_thread::sleep_for(50ms);
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
  }
}

int consumer(const std::string& q_dir, const std::string& journal, bool bind, uint32_t seed, int view,
             const SurvivorHook& hook = {}) {
  Journal j(journal);
  auto q = test::open_journaled(j, q_dir, campaign_options(view));
  if (q == nullptr) return 1;
  if (bind) {
    Status s = q->bind_leases();
    j.line(s.ok() ? "B ok" : "B " + s.to_string());
  }
  std::mt19937 rng(seed);
  for (;;) {
    hook.maybe_pause(j);
    uint64_t t0 = boot_ns();
    auto got = q->receive(1 + rng() % 4, kConsumerVis, 200ms);
    uint64_t t1 = boot_ns();
    if (!got.ok()) {
      if (got.status().code() != Code::kEmpty) j.line("E receive: " + got.status().to_string());
      continue;
    }
    for (auto& m : *got) {
      std::string tag;
      if (!kPayloads.check(m.payload, &tag)) j.line("E bad payload for " + std::to_string(m.id));
      j.line("R " + std::to_string(m.id) + " " + std::to_string(m.receive_count) + " " + std::to_string(t0) + " " +
             std::to_string(t1) + " " + std::to_string(kConsumerVis.count()) + " " + tag);
    }
    for (auto& m : *got) {
      std::string key = std::to_string(m.id) + " " + std::to_string(m.receive_count);
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));  // "work"
      int r = static_cast<int>(rng() % 100);
      if (r < 8) {
        j.line("n " + key);
        Status s = q->nack(m.receipt, Millis(rng() % 200));
        j.line(s.ok() ? "N " + key : "L " + key + " " + code_name(s.code()));
        continue;
      }
      if (r < 13) {
        uint64_t te = boot_ns();
        Status s = q->extend(m.receipt, 2000ms);
        if (s.ok()) j.line("X " + key + " " + std::to_string(te) + " 2000");
      }
      j.line("a " + key);
      Status s = q->ack(m.receipt);
      j.line(s.ok() ? "A " + key : "L " + key + " " + code_name(s.code()));
    }
  }
}

// Compacts every 5-35 ms; a survivor compacts every `period` instead.
int compactor(const std::string& q_dir, const std::string& journal, uint32_t seed, const SurvivorHook& hook = {},
              Millis period = Millis{0}) {
  Journal j(journal);
  auto q = test::open_journaled(j, q_dir, campaign_options());
  if (q == nullptr) return 1;
  std::mt19937 rng(seed);
  for (;;) {
    hook.maybe_pause(j);
    auto r = q->compact();
    if (!r.ok()) j.line("E compact: " + r.status().to_string());
    else if (r->segments_removed > 0) j.line("K " + std::to_string(r->segments_removed) + " " + std::to_string(r->messages_copied));
    std::this_thread::sleep_for(period.count() > 0 ? period : std::chrono::milliseconds(5 + rng() % 30));
  }
}

// fork + exec of `spool work`; the command journals "id count uptime" per message and fails
// (nack, 1 s backoff) the first delivery of every 17th id.
pid_t start_work(const std::string& cli, const std::string& q_dir, const std::string& journal,
                 const std::string& err_path, int view) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    int devnull = ::open("/dev/null", O_RDWR);
    int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::dup2(err, 2);
    ::setenv("J", journal.c_str(), 1);
    const char* script =
        "IFS=: read -r tag rest; read up rest < /proc/uptime; "
        "echo \"$SPOOL_MESSAGE_ID $SPOOL_RECEIVE_COUNT $up $tag\" >> \"$J\"; "
        "[ $((SPOOL_MESSAGE_ID % 17)) -ne 0 ] || [ \"$SPOOL_RECEIVE_COUNT\" -gt 1 ]";
    std::string vis = std::to_string(kWorkVis.count()) + "ms", sub = view_name(view);
    if (view == 0) {
      ::execl(cli.c_str(), cli.c_str(), "work", q_dir.c_str(), "--visibility", vis.c_str(), "--", "sh", "-c", script,
              static_cast<char*>(nullptr));
    } else {
      ::execl(cli.c_str(), cli.c_str(), "work", q_dir.c_str(), "--sub", sub.c_str(), "--visibility", vis.c_str(), "--",
              "sh", "-c", script, static_cast<char*>(nullptr));
    }
    ::_exit(127);
  }
  return pid;
}

// ---- the campaign ----------------------------------------------------------------------------

struct Figures {
  int cycles = 0;
  uint64_t kills = 0, cycle_end_kills = 0, restarts = 0;
  uint64_t lost = 0, acked_came_back = 0, unexplained = 0, redeliveries = 0;
  uint64_t duplicate = 0, bad_payload = 0, phantom = 0, check_failures = 0;
  uint64_t known_bug_unreadable = 0, known_bug_symptoms = 0;
  // With max_receives: messages in the dead-letter queue at the end, copies beyond one per
  // message (a hand-off killed between its send to the DLQ and its DEAD record), dead
  // letters whose ack had also returned (the same cut hand-off, then the holder's ack), and
  // deliveries past the limit (a failure).
  uint64_t dead_lettered = 0, dlq_extra_copies = 0, acked_and_dead = 0, past_limit = 0;
  std::map<std::string, uint64_t> explained;
};

class Campaign {
 public:
  Campaign(std::string root, std::string cli, uint64_t seed, bool survivors, Millis sample_period)
      : root_(std::move(root)), qdir_(root_ + "/q"), cli_(std::move(cli)), rng_(seed), sample_period_(sample_period),
        views_(1 + campaign_subscriptions()), leds_(views_), drained_(views_), dead_letters_(views_) {
    fs::create_directories(root_ + "/j");
    auto q = Queue::open(qdir_, campaign_options());
    EXPECT_TRUE(q.ok()) << q.status().to_string();
    for (int k = 1; q.ok() && k < views_; ++k) {
      Status s = (*q)->add_subscription(view_name(k));
      EXPECT_TRUE(s.ok()) << s.to_string();
    }
    if (survivors) {
      void* m = ::mmap(nullptr, sizeof(SurvivorControl), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) ADD_FAILURE() << "mmap: " << std::strerror(errno);
      else ctl_ = new (m) SurvivorControl;
    }
  }
  ~Campaign() {
    if (ctl_ != nullptr) ::munmap(ctl_, sizeof(SurvivorControl));
  }
  Campaign(const Campaign&) = delete;
  Campaign& operator=(const Campaign&) = delete;

  void run(int cycles, int kills_per_cycle, int soak_seconds) {
    hold_back_ = soak_seconds > 0;
    start_ = std::chrono::steady_clock::now();
    next_sample_ = start_ + sample_period_;
    if (ctl_ != nullptr) start_survivors();
    for (int c = 0;; ++c) {
      if (soak_seconds > 0) {
        if (std::chrono::steady_clock::now() - start_ > std::chrono::seconds(soak_seconds)) break;
      } else if (c >= cycles) {
        break;
      }
      cycle(kills_per_cycle);
      if (::testing::Test::HasFatalFailure()) {
        stop_survivors();
        return;
      }
      ++fig_.cycles;
    }
    stop_survivors();
    drain_and_account();
  }

  const Figures& figures() const { return fig_; }
  int views() const { return views_; }
  const Ledger& ledger(int view) const { return leds_[static_cast<size_t>(view)]; }
  bool work_enabled() const { return !cli_.empty(); }
  const std::vector<Sample>& samples() const { return samples_; }
  const std::vector<std::string>& survivor_names() const { return survivor_names_; }

 private:
  struct Survivor {
    char role;
    int slot;
    pid_t pid;
    std::string base;
  };

  // The producer P2, the consumer C2 (its leases not bound) and the compactor K1 (every 1 s).
  void start_survivors() {
    static const char roles[] = "PCK";
    static const int slots[] = {2, 2, 1};
    for (int i = 0; i < 3; ++i) {
      Survivor s{roles[i], slots[i], -1,
                 root_ + "/j/" + std::string(1, roles[i]) + std::to_string(slots[i]) + "-survivor"};
      SurvivorHook hook{ctl_, i, s.base};
      std::string q = qdir_, j = survivor_journal(s.base, 0);
      uint32_t seed = static_cast<uint32_t>(rng_());
      int inc = next_inc_++;
      switch (s.role) {
        case 'P': s.pid = test::spawn([=] { return producer(q, j, 2, inc, seed, true, hook); }); break;
        case 'C': s.pid = test::spawn([=] { return consumer(q, j, false, seed, view_of('C', 2), hook); }); break;
        default: s.pid = test::spawn([=] { return compactor(q, j, seed, hook, 1000ms); }); break;
      }
      survivors_.push_back(s);
      survivor_names_.push_back(std::string(1, s.role) + std::to_string(s.slot));
    }
  }

  // Each survivor stops between two calls and starts a new journal; the finished ones are
  // read into the ledger. A survivor that is still inside a call after 60 s has its threads'
  // states and kernel stacks printed; after 10 minutes the soak stops (a fatal failure):
  // reading a journal its survivor still writes would lose lines, and every later check
  // would then fail for the campaign's own reasons.
  void pause_survivors() {
    uint32_t e = ctl_->epoch.load() + 1;
    ctl_->epoch.store(e);
    ctl_->pause.store(1);
    for (size_t i = 0; i < survivors_.size(); ++i) {
      auto t0 = std::chrono::steady_clock::now();
      bool shown = false;
      while (ctl_->at[i].load() != e) {
        auto waited = std::chrono::steady_clock::now() - t0;
        if (waited > 60s && !shown) {
          shown = true;
          std::printf("*** survivor %s (pid %d) has not paused for 60 s; its threads:\n%s", survivor_names_[i].c_str(),
                      static_cast<int>(survivors_[i].pid), thread_states(survivors_[i].pid).c_str());
          std::fflush(stdout);
        }
        if (waited > 600s) FAIL() << "survivor " << survivor_names_[i] << " did not pause within 10 minutes";
        std::this_thread::sleep_for(1ms);
      }
      if (shown) {
        std::printf("*** survivor %s paused after %.0f s\n", survivor_names_[i].c_str(),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    for (const auto& s : survivors_) absorb(survivor_chunk(s, e - 1));
  }

  // State, wait channel and kernel stack of each thread of `pid` (for a stuck survivor).
  static std::string thread_states(pid_t pid) {
    std::string out;
    std::error_code ec;
    std::string task = "/proc/" + std::to_string(pid) + "/task";
    for (fs::directory_iterator it(task, ec), end; !ec && it != end; it.increment(ec)) {
      std::string t = it->path().string();
      std::string stat = test::slurp(t + "/stat");
      auto close = stat.rfind(')');
      out += "  thread " + it->path().filename().string() + " " + stat.substr(0, close + 3) + " wchan " +
             test::slurp(t + "/wchan") + "\n" + test::slurp(t + "/stack");
    }
    return out;
  }

  void resume_survivors() { ctl_->pause.store(0); }

  Incarnation survivor_chunk(const Survivor& s, uint32_t epoch) {
    Incarnation in;
    in.role = s.role;
    in.slot = s.slot;
    in.inc = next_inc_++;
    in.pid = s.pid;
    in.view = view_of(s.role, s.slot);
    in.journal = survivor_journal(s.base, epoch);
    return in;
  }

  // Kills the survivors (the end of the soak) and reads their last journals.
  void stop_survivors() {
    for (const auto& s : survivors_) {
      running_.push_back(survivor_chunk(s, ctl_->epoch.load()));
      kill(running_.size() - 1, false);
      --fig_.cycle_end_kills;  // not a cycle's end
    }
    survivors_.clear();
  }

  // While the queue is checked between cycles with the survivors attached, no compaction
  // may run (a background compaction of a paused survivor could still): the campaign holds
  // compact.lock. -1 if it could not be had in 30 s.
  int hold_compaction() {
    std::string path = qdir_ + "/compact.lock";
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return -1;
    auto until = std::chrono::steady_clock::now() + 30s;
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (std::chrono::steady_clock::now() > until) {
        ADD_FAILURE() << "compact.lock still held 30 s after the survivors paused";
        ::close(fd);
        return -1;
      }
      std::this_thread::sleep_for(1ms);
    }
    return fd;
  }

  void maybe_sample() {
    auto now = std::chrono::steady_clock::now();
    if (now < next_sample_) return;
    next_sample_ = std::max(next_sample_ + sample_period_, now + sample_period_ / 2);
    Sample s;
    s.t = std::chrono::duration<double>(now - start_).count();
    for (const auto& sv : survivors_) {
      int64_t kb = status_kb(sv.pid, "VmRSS"), anon = status_kb(sv.pid, "RssAnon");
      if (kb < 0) ADD_FAILURE() << "survivor " << sv.role << sv.slot << " is gone";
      s.rss_kb.push_back(static_cast<uint64_t>(std::max<int64_t>(kb, 0)));
      s.anon_kb.push_back(static_cast<uint64_t>(std::max<int64_t>(anon, 0)));
    }
    s.disk = disk_bytes(qdir_, &s.tmp);
    std::error_code ec;
    uint64_t ib = fs::file_size(qdir_ + "/index", ec);
    s.index = ec ? 0 : ib;
    {
      auto q = Queue::open(qdir_, campaign_options());
      auto st = q.ok() ? (*q)->stats() : Result<Stats>(q.status());
      if (st.ok()) {
        s.depth = st->ready + st->in_flight + st->delayed;
        s.segments = st->segments;
      }
    }
    std::string rss;
    for (size_t i = 0; i < s.rss_kb.size(); ++i) {
      rss += " " + survivor_names_[i] + "_rss_kb=" + std::to_string(s.rss_kb[i]) + "/" + std::to_string(s.anon_kb[i]);
    }
    std::printf("[soak] t=%.0fs cycle=%d kills=%" PRIu64 "%s disk=%" PRIu64 " tmp=%" PRIu64 " index=%" PRIu64
                " depth=%" PRIu64 " segments=%" PRIu64 "\n",
                s.t, fig_.cycles, fig_.kills, rss.c_str(), s.disk, s.tmp, s.index, s.depth, s.segments);
    std::fflush(stdout);
    samples_.push_back(std::move(s));
  }

  // A consumer's journal goes to its view's ledger, a producer's (what was sent) to every
  // view's, a compactor's to view 0's; its E lines are reported once.
  void absorb(const Incarnation& in) {
    const bool reader = in.role == 'C' || in.role == 'W';
    for (int k = 0; k < views_; ++k) {
      if (reader ? k != in.view : in.role != 'P' && k != 0) continue;
      Ledger& led = leds_[static_cast<size_t>(k)];
      if (in.role == 'W') led.read_work(in);
      else led.read_library(in);
      for (const auto& e : led.errors) {
        if (!reader && k != 0) break;
        if (known_bug_symptom(e)) {
          ++fig_.known_bug_symptoms;
          continue;
        }
        ADD_FAILURE() << e;
      }
      led.errors.clear();
    }
    dead_.push_back(in);
  }

  struct Slot {
    char role;
    int slot;
  };

  void start(Slot s) {
    Incarnation in;
    in.role = s.role;
    in.slot = s.slot;
    in.inc = next_inc_++;
    in.view = view_of(s.role, s.slot);
    std::string base = root_ + "/j/" + std::string(1, s.role) + std::to_string(s.slot) + "-" + std::to_string(in.inc);
    in.journal = base + ".log";
    in.err = base + ".err";
    uint32_t seed = static_cast<uint32_t>(rng_());
    std::string q = qdir_, j = in.journal;
    int slot = s.slot, inc = in.inc, view = in.view;
    switch (s.role) {
      case 'P': in.pid = test::spawn([=, hb = hold_back_] { return producer(q, j, slot, inc, seed, hb); }); break;
      case 'C':
        in.bound = slot == 1;
        in.pid = test::spawn([=] { return consumer(q, j, slot == 1, seed, view); });
        break;
      case 'K': in.pid = test::spawn([=] { return compactor(q, j, seed); }); break;
      case 'W': in.pid = start_work(cli_, q, j, in.err, view); break;
    }
    running_.push_back(in);
  }

  void kill(size_t i, bool random) {
    Incarnation in = running_[i];
    running_.erase(running_.begin() + static_cast<ptrdiff_t>(i));
    in.killed_at = boot_ns();
    ::kill(in.pid, SIGKILL);
    int rc = wait_exit(in.pid);
    if (rc != 128 + SIGKILL) {
      ADD_FAILURE() << in.role << in.slot << "." << in.inc << " had exited by itself with " << rc
                    << (in.role == 'W' ? "; stderr: " + test::slurp(in.err) : std::string());
    }
    if (in.bound) in.bound = test::slurp(in.journal).find("B ok\n") != std::string::npos;
    (random ? fig_.kills : fig_.cycle_end_kills) += 1;
    absorb(in);
  }

  void cycle(int kills) {
    std::vector<Slot> slots = {{'P', 0}, {'P', 1}, {'C', 0}, {'C', 1}, {'K', 0}};
    if (work_enabled()) slots.push_back({'W', 0});
    if (views_ > 1) slots.push_back({'C', 2});  // the queue's own view
    for (Slot s : slots) start(s);
    for (int k = 0; k < kills; ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5 + rng_() % 115));
      // Weighted: consumers and producers most, where the state changes are.
      static const char roles[] = "PPPCCCCKKWW";
      char role = roles[rng_() % (sizeof roles - 1)];
      if (role == 'W' && !work_enabled()) role = 'C';
      std::vector<size_t> of_role;
      for (size_t i = 0; i < running_.size(); ++i)
        if (running_[i].role == role) of_role.push_back(i);
      size_t victim = of_role[rng_() % of_role.size()];
      Slot s{running_[victim].role, running_[victim].slot};
      kill(victim, true);
      start(s);
      ++fig_.restarts;
      maybe_sample();
    }
    while (!running_.empty()) kill(running_.size() - 1, false);
    if (ctl_ != nullptr) {
      // The survivors stay: the check runs while they pause, and the index stays.
      pause_survivors();
      if (::testing::Test::HasFatalFailure()) return;
      int lock_fd = hold_compaction();
      check_quiet();
      if (lock_fd >= 0) ::close(lock_fd);
      resume_survivors();
      return;
    }
    check_quiet();
    if (fig_.cycles % 3 == 2 || std::getenv("SPOOL_KNOWN_BUG_REUSE_AFTER_OWNER_DEATH") != nullptr) {
      fs::remove(qdir_ + "/index");  // the next cycle rebuilds from the log
    }
  }

  // Everything is dead: the queue must hold exactly what the journals say.
  void check_quiet() {
    SCOPED_TRACE("after cycle " + std::to_string(fig_.cycles));
    // Known bug REUSE_AFTER_OWNER_DEATH: a first opener may reuse an index that a process
    // killed inside the lock left half-updated. While it is declared known, every first
    // open (this one, and the first child of the next cycle) starts from a deleted index.
    if (ctl_ == nullptr) {  // with survivors attached the check cannot be a first opener
      wait_detached();
      if (std::getenv("SPOOL_KNOWN_BUG_REUSE_AFTER_OWNER_DEATH") != nullptr) fs::remove(qdir_ + "/index");
    }
    auto q = Queue::open(qdir_, campaign_options());
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    Queue& Q = **q;
    std::string inv = Q.check_index();
    if (!inv.empty()) {
      ++fig_.check_failures;
      ADD_FAILURE() << "check_index: " << inv;
    }
    auto v = Q.verify(false);
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    if (!v->ok()) {
      bool only_known = std::getenv("SPOOL_KNOWN_BUG_COMPACT_REPAIR") != nullptr &&
                        std::all_of(v->problems.begin(), v->problems.end(), [](const std::string& p) {
                          return p.find("points at a wrong or unreadable record") != std::string::npos;
                        });
      if (only_known) {
        std::printf("*** KNOWN BUG SPOOL_KNOWN_BUG_COMPACT_REPAIR hit after cycle %d: %s; repairing ***\n",
                    fig_.cycles, v->problems.front().c_str());
        ++fig_.known_bug_unreadable;
        (void)Q.verify(true);
      } else {
        ++fig_.check_failures;
        ADD_FAILURE() << "verify: " << v->problems.size() << " problems, first: " << v->problems.front();
        if (std::getenv("CAMPAIGN_DEBUG") != nullptr) {
          std::string cmd = "cp -a '" + root_ + "' /tmp/campaign-verify-" + std::to_string(::getpid()) + "-" +
                            std::to_string(fig_.cycles);
          if (std::system(cmd.c_str()) == 0) std::printf("kept %s\n", cmd.c_str());
        }
      }
    }
    auto st = Q.stats();
    ASSERT_TRUE(st.ok());
    uint64_t dead_depth = 0;
    for (int k = 0; k < views_; ++k) {
      SCOPED_TRACE(view_label(k));
      if (k == 0) {
        check_view(Q, k, v->messages, &dead_depth);
        continue;
      }
      // A subscription's own depth: what its handle counts and lists, and what
      // subscriptions() says it holds.
      auto subs = Q.subscriptions();
      ASSERT_TRUE(subs.ok()) << subs.status().to_string();
      auto info = std::find_if(subs->begin(), subs->end(), [&](const SubscriptionInfo& i) { return i.name == view_name(k); });
      ASSERT_NE(info, subs->end()) << "the subscription is gone";
      auto h = Queue::open(qdir_, campaign_options(k));
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      if (std::string sub_inv = (*h)->check_index(); !sub_inv.empty()) {
        ++fig_.check_failures;
        ADD_FAILURE() << "check_index: " << sub_inv;
      }
      check_view(**h, k, info->messages, &dead_depth);
    }
    if (st->dead != dead_depth + dead_unreadable_) {
      ++fig_.check_failures;
      ADD_FAILURE() << "stats counts " << st->dead << " dead letters, the dead-letter queue lists "
                    << dead_depth + dead_unreadable_;
    }
  }

  // The quiet checks of one view, on a handle `Q` that reads it: depth = listed = `expected`
  // (view 0: the messages in the log), each listed message sent, nothing gone unacked,
  // nothing still there after its ack. Adds the view's dead letters to `dead_depth`.
  void check_view(Queue& Q, int k, uint64_t expected, uint64_t* dead_depth) {
    const Ledger& led = leds_[static_cast<size_t>(k)];
    auto st = Q.stats();
    auto all = Q.peek(SIZE_MAX);
    ASSERT_TRUE(st.ok() && all.ok()) << st.status().to_string() << " " << all.status().to_string();
    uint64_t depth = st->ready + st->in_flight + st->delayed;
    if (depth != all->size() || depth != expected) {
      ++fig_.check_failures;
      ADD_FAILURE() << "depth " << depth << ", listed " << all->size() << (k == 0 ? ", in the log " : ", held ")
                    << expected;
    }
    const std::map<std::string, uint64_t> dead = dead_letter_tags(Q, "in the dead-letter queue", k);
    for (auto& [tag, n] : dead) *dead_depth += n;
    std::set<uint64_t> present;
    for (auto& m : *all) {
      present.insert(m.id);
      std::string tag;
      if (!kPayloads.check(m.payload, &tag)) {
        ++fig_.bad_payload;
        ADD_FAILURE() << "message " << m.id << " has a damaged payload";
      } else if (!led.attempted.count(tag)) {
        ++fig_.phantom;
        ADD_FAILURE() << "message " << m.id << " (" << tag << ") was never sent";
      }
    }
    for (auto& [id, tag] : led.sent) {
      if (!present.count(id) && !led.ack_tried_ids.count(id) && !dead.count(tag) && !known_unreadable(Q, id)) {
        ++fig_.check_failures;
        ADD_FAILURE() << "message " << id << " (" << tag << ") is gone, but nobody tried to ack it and it is not "
                      << "in the dead-letter queue";
      }
    }
    for (uint64_t id : led.acked_ids) {
      if (present.count(id)) {
        ++fig_.check_failures;
        ADD_FAILURE() << "message " << id << " is still queued after its ack returned";
      }
    }
  }

  // Waits until no process is attached to the queue (QUEUE/lock can be taken exclusively),
  // so the check below is a first opener. The children are dead, but a `spool work` killed
  // between its fork and the exec of a command leaves that child holding copies of its
  // descriptors, the lock's among them, until the parent-death signal reaches it.
  void wait_detached() {
    int fd = ::open((qdir_ + "/lock").c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return;
    auto until = std::chrono::steady_clock::now() + 10s;
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (std::chrono::steady_clock::now() > until) {
        ADD_FAILURE() << "a process still holds the queue 10 s after every process was killed";
        break;
      }
      std::this_thread::sleep_for(1ms);
    }
    ::close(fd);
  }

  // Errors that known bug COMPACT_REPAIR causes (an index pointing into a removed segment),
  // tolerated only while SPOOL_KNOWN_BUG_COMPACT_REPAIR is set.
  static bool known_bug_symptom(const std::string& e) {
    return std::getenv("SPOOL_KNOWN_BUG_COMPACT_REPAIR") != nullptr &&
           (e.find("could not be read") != std::string::npos ||
            e.find("compaction stopped: open segment") != std::string::npos ||
            e.find("compaction stopped: a message of the prefix was not copied") != std::string::npos);
  }

  // The tags of view k's messages in the dead-letter queue (a subscription's are marked
  // spool.dead.subscription), with their copies. A payload that is no campaign payload, or
  // a tag never sent, is a failure (`where` names the moment); "could not be read" entries
  // (known bug COMPACT_REPAIR) are counted in dead_unreadable_ (with view 0's).
  std::map<std::string, uint64_t> dead_letter_tags(Queue& q, const char* where, int k) {
    std::map<std::string, uint64_t> tags;
    if (k == 0) dead_unreadable_ = 0;
    auto dlq = q.dead_letters();
    if (!dlq.ok()) {
      ADD_FAILURE() << "dead_letters: " << dlq.status().to_string();
      return tags;
    }
    auto dead = (*dlq)->peek(SIZE_MAX);
    if (!dead.ok()) {
      ADD_FAILURE() << "peek of the dead-letter queue: " << dead.status().to_string();
      return tags;
    }
    for (auto& m : *dead) {
      auto of = m.attributes.find("spool.dead.subscription");
      if ((of == m.attributes.end() ? std::string() : of->second) != view_name(k)) continue;
      std::string tag;
      if (kPayloads.check(m.payload, &tag)) {
        if (!leds_[static_cast<size_t>(k)].attempted.count(tag)) {
          ++fig_.phantom;
          ADD_FAILURE() << "dead letter " << m.id << " (" << tag << ") " << where << " was never sent";
        }
        ++tags[tag];
      } else if (std::getenv("SPOOL_KNOWN_BUG_COMPACT_REPAIR") != nullptr &&
                 m.payload.find(" could not be read") != std::string::npos) {
        ++dead_unreadable_;
      } else {
        ++fig_.bad_payload;
        ADD_FAILURE() << "dead letter " << m.id << " " << where << " has a damaged payload: "
                      << m.payload.substr(0, 80);
      }
    }
    return tags;
  }

  // Whether the dead-letter queue holds message `id` as "could not be read" (known bug
  // COMPACT_REPAIR), when that bug is declared known.
  bool known_unreadable(Queue& q, uint64_t id) {
    if (std::getenv("SPOOL_KNOWN_BUG_COMPACT_REPAIR") == nullptr) return false;
    if (unreadable_.empty()) {
      auto dlq = q.dead_letters();
      if (dlq.ok()) {
        auto dead = (*dlq)->peek(SIZE_MAX);
        if (dead.ok()) {
          for (auto& m : *dead) {
            uint64_t n = 0;
            int end = 0;
            if (std::sscanf(m.payload.c_str(), "spool: message %" SCNu64 " could not be read%n", &n, &end) == 1 && end > 0) {
              unreadable_.insert(n);
            }
          }
        }
      }
    }
    if (!unreadable_.count(id)) return false;
    if (counted_unreadable_.insert(id).second) ++fig_.known_bug_unreadable;
    return true;
  }

  void drain_and_account() {
    wait_detached();
    if (std::getenv("CAMPAIGN_DEBUG") != nullptr) {
      // The queue as the cycles left it, before the drain (and its compactions) change it:
      // kept if a delivery count repeats (account()).
      kept_ = "/tmp/campaign-dup-" + std::to_string(::getpid());
      std::string cmd = "cp -a '" + root_ + "' '" + kept_ + "'";
      if (std::system(cmd.c_str()) != 0) std::printf("could not copy %s\n", root_.c_str());
    }
    if (std::getenv("SPOOL_KNOWN_BUG_REUSE_AFTER_OWNER_DEATH") != nullptr) fs::remove(qdir_ + "/index");
    for (int k = 0; k < views_; ++k) {
      SCOPED_TRACE(view_label(k));
      drain_view(k);
      if (::testing::Test::HasFatalFailure()) return;
    }
    if (!kept_.empty() && !keep_) fs::remove_all(kept_);
  }

  // Drains view k through a handle that reads it, journaling each delivery in its ledger,
  // then accounts for the view.
  void drain_view(int k) {
    Ledger& led = leds_[static_cast<size_t>(k)];
    auto q = Queue::open(qdir_, campaign_options(k));
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    Queue& Q = **q;
    auto until = std::chrono::steady_clock::now() + 60s;
    for (;;) {
      auto st = Q.stats();
      ASSERT_TRUE(st.ok());
      if (st->ready + st->in_flight + st->delayed == 0) break;
      ASSERT_LT(std::chrono::steady_clock::now(), until) << "the queue did not drain";
      uint64_t t0 = boot_ns();
      auto got = Q.receive(256, 60s, 500ms);
      uint64_t t1 = boot_ns();
      if (!got.ok()) continue;
      for (auto& m : *got) {
        Delivery d;
        d.id = m.id;
        d.count = m.receive_count;
        d.who = "D";
        d.t0 = t0;
        d.t1 = t1;
        d.vis_ns = 60'000'000'000ull;
        d.deadline = t0 + d.vis_ns;
        d.ack_tried = true;
        std::string tag;
        if (!kPayloads.check(m.payload, &tag)) {
          ++fig_.bad_payload;
          ADD_FAILURE() << "drained message " << m.id << " has a damaged payload";
        } else if (!led.attempted.count(tag)) {
          ++fig_.phantom;
          ADD_FAILURE() << "drained message " << m.id << " (" << tag << ") was never sent";
        }
        d.tag = tag;
        Status s = Q.ack(m.receipt);
        EXPECT_TRUE(s.ok()) << s.to_string();
        d.acked = s.ok();
        led.add(d);
        drained_[static_cast<size_t>(k)].insert(m.id);
        led.ack_tried_ids.insert(m.id);
      }
    }
    EXPECT_EQ(Q.check_index(), "");
    dead_letters_[static_cast<size_t>(k)] = dead_letter_tags(Q, "after the drain", k);
    account(Q, k);
  }

  // In view k: every send that returned was delivered and acked (or is in the drain);
  // every redelivery has a reason.
  void account(Queue& Q, int k) {
    const Ledger& led = leds_[static_cast<size_t>(k)];
    const std::set<uint64_t>& drained = drained_[static_cast<size_t>(k)];
    const std::map<std::string, uint64_t>& dead_letters = dead_letters_[static_cast<size_t>(k)];
    std::map<std::string, const Incarnation*> by_who;
    for (const auto& in : dead_) by_who[std::string(1, in.role) + std::to_string(in.slot) + "." + std::to_string(in.inc)] = &in;
    for (auto& [id, tag] : led.sent) {
      if (!led.ack_tried_ids.count(id) && !drained.count(id) && !dead_letters.count(tag) && !known_unreadable(Q, id)) {
        if (++fig_.lost <= 10) ADD_FAILURE() << "message " << id << " (" << tag << ") lost";
      }
    }
    fig_.dead_lettered += dead_letters.size();
    std::set<uint64_t> dead_ids;
    for (auto& [id, tag] : led.sent) {
      if (dead_letters.count(tag)) dead_ids.insert(id);
    }
    for (auto& [tag, n] : dead_letters) fig_.dlq_extra_copies += n - 1;
    for (uint64_t id : dead_ids) fig_.acked_and_dead += led.acked_ids.count(id);
    // Past the limit: a receive that finds a message delivered max_receives times moves it
    // to the DLQ instead of delivering it, so no delivery count exceeds the limit.
    const uint32_t limit = campaign_max_receives();
    for (auto& [key, d] : led.deliveries) {
      if (limit == 0 || key.second <= limit) continue;
      if (++fig_.past_limit <= 10) {
        ADD_FAILURE() << "message " << key.first << " was delivered to " << d.who << " with receive count "
                      << key.second << " though max_receives is " << limit;
      }
    }
    fig_.duplicate += led.duplicate_deliveries.size();
    if (std::getenv("CAMPAIGN_DEBUG") != nullptr && !led.duplicate_deliveries.empty()) {
      // Keep the evidence: the queue directory and the journals, and the log's records of
      // each message delivered twice with one count.
      keep_ = true;
      const std::string& keep = kept_;
      std::string cmd;
      std::string dump = cli_.empty() ? std::string("spool-dump") : fs::path(cli_).parent_path().string() + "/spool-dump";
      for (auto& [id, count] : led.duplicate_deliveries) {
        std::printf("kept %s; records of message %" PRIu64 " (delivery %u twice):\n", keep.c_str(), id, count);
        std::fflush(stdout);
        cmd = "for f in '" + keep + "'/q/segments/*.seg; do echo \"== $f\"; '" + dump + "' \"$f\" | grep 'id " +
              std::to_string(id) + " '; done; grep -H -e ' " + std::to_string(id) + " ' -e '^" + std::to_string(id) +
              " ' '" + keep + "'/j/*.log";
        (void)std::system(cmd.c_str());
      }
    }
    for (auto& detail : led.duplicate_details) ADD_FAILURE() << "delivered twice with one receive count: " << detail;
    // Walk each message's deliveries in receive-count order.
    const Delivery* prev = nullptr;
    uint64_t unjournaled = 0;
    for (auto& [key, d] : led.deliveries) {
      if (prev != nullptr && prev->id != d.id) prev = nullptr;
      const Delivery* before = prev;
      prev = &d;
      if (before != nullptr && before->acked) {
        ++fig_.acked_came_back;
        ADD_FAILURE() << "message " << d.id << " was acked by " << before->who << " (delivery " << before->count
                      << ") and delivered again to " << d.who << " (delivery " << d.count << ")";
        continue;
      }
      if (d.count == 1) continue;
      ++fig_.redeliveries;
      std::string why = explain(before, d, by_who);
      if (why.empty()) {
        if (++fig_.unexplained <= 10) {
          ADD_FAILURE() << "unexplained redelivery of message " << d.id << " (delivery " << d.count << " to "
                        << d.who << " at " << d.t1 << "; before: "
                        << (before ? before->who + " delivery " + std::to_string(before->count) + " deadline " +
                                         std::to_string(before->deadline)
                                   : std::string("unobserved"))
                        << ")";
        }
      } else {
        ++fig_.explained[why];
        unjournaled += why == kUnjournaled;
      }
    }
    // Deliveries no process lived to journal: bounded by the kills of the view's receivers.
    uint64_t receiver_kills = 0;
    for (const auto& in : dead_) {
      if (in.view == k) receiver_kills += in.role == 'C' ? 4 : in.role == 'W' ? 1 : 0;
    }
    if (unjournaled > receiver_kills) {
      ADD_FAILURE() << "more unjournaled deliveries than receivers killed could explain";
    }
  }

  std::string explain(const Delivery* before, const Delivery& d,
                      const std::map<std::string, const Incarnation*>& by_who) {
    if (before == nullptr || before->count + 1 != d.count) return kUnjournaled;
    if (before->nack_tried) return "nacked";
    if (before->w_failed) return "spool work command failed (nack)";
    auto it = by_who.find(before->who);
    const Incarnation* holder = it == by_who.end() ? nullptr : it->second;
    if (before->who.starts_with("W")) {
      // The lease keeper renews while spool work lives; its acks are not journaled.
      if (before->lease_lost) return "spool work's ack failed (lease lost)";
      if (holder != nullptr && !before->w_ack_known) return "spool work killed before its ack returned";
      return "";
    }
    // A library consumer's lease: redelivered only after its deadline, or at once after
    // the death of a holder that bound its leases.
    if (d.t1 + kSlackNs >= before->deadline) {
      bool dead_by_then = holder != nullptr && holder->killed_at != 0 && holder->killed_at <= before->deadline;
      if (before->ack_tried && !before->acked) return "lease expired; holder killed during its ack";
      return dead_by_then ? "lease expired; holder killed mid-lease" : "lease expired; holder alive but late";
    }
    if (holder != nullptr && holder->bound && holder->killed_at != 0 && d.t1 + kSlackNs >= holder->killed_at) {
      return "holder killed mid-lease; lease released at its death";
    }
    return "";
  }

  std::string root_, qdir_, cli_;
  std::string kept_;  // CAMPAIGN_DEBUG: a copy of root_ before the drain
  bool keep_ = false;  // kept_ holds evidence of a duplicate delivery
  std::mt19937_64 rng_;
  SurvivorControl* ctl_ = nullptr;  // null: no survivors
  std::vector<Survivor> survivors_;
  std::vector<std::string> survivor_names_;
  Millis sample_period_;
  std::chrono::steady_clock::time_point start_, next_sample_;
  std::vector<Sample> samples_;
  bool hold_back_ = false;
  int next_inc_ = 0;
  std::vector<Incarnation> running_, dead_;
  int views_;                 // 1 + subscriptions
  std::vector<Ledger> leds_;  // per view
  Figures fig_;
  std::vector<std::set<uint64_t>> drained_;  // per view
  std::set<uint64_t> unreadable_, counted_unreadable_;
  // Per view: tag -> copies in the dead-letter queue after the drain.
  std::vector<std::map<std::string, uint64_t>> dead_letters_;
  uint64_t dead_unreadable_ = 0;         // "could not be read" dead letters (COMPACT_REPAIR)
};

// Prints the samples, and a summary per series: first, max, last, least-squares slope. In a
// soak with 8 samples or more, fails a series that grows without bound (growth_problem).
void report_samples(const Campaign& c, bool judge) {
  const auto& ss = c.samples();
  if (ss.empty()) return;
  const auto& names = c.survivor_names();
  std::vector<std::pair<std::string, double>> series;  // name, slack
  // Leftover "*.tmp.*" files count as disk: the hour soak found them piling up
  // (TMP_SEGMENT_LEAK, fixed: the repair after a dead lock holder removes them).
  for (const auto& n : names) series.emplace_back(n + " VmRSS kB", 4096);
  for (const auto& n : names) series.emplace_back(n + " RssAnon kB", 2048);
  series.emplace_back("disk bytes", 2 << 20);
  series.emplace_back("*.tmp.* bytes", 1e18);  // shown; judged as part of disk
  series.emplace_back("index bytes", 1 << 20);
  series.emplace_back("depth", 1000);
  series.emplace_back("segments", 1e18);  // shown; judged as part of disk
  std::vector<double> t;
  std::vector<std::vector<double>> v(series.size());
  std::string head = "[soak]      t";
  for (const auto& [name, slack] : series) head += " | " + name;
  std::printf("%s\n", head.c_str());
  for (const auto& s : ss) {
    t.push_back(s.t);
    std::vector<double> row;
    for (uint64_t kb : s.rss_kb) row.push_back(static_cast<double>(kb));
    for (uint64_t kb : s.anon_kb) row.push_back(static_cast<double>(kb));
    row.push_back(static_cast<double>(s.disk));
    row.push_back(static_cast<double>(s.tmp));
    row.push_back(static_cast<double>(s.index));
    row.push_back(static_cast<double>(s.depth));
    row.push_back(static_cast<double>(s.segments));
    std::string line;
    char buf[64];
    std::snprintf(buf, sizeof buf, "[soak] %6.0f", s.t);
    line = buf;
    for (size_t i = 0; i < row.size() && i < v.size(); ++i) {
      v[i].push_back(row[i]);
      std::snprintf(buf, sizeof buf, " | %.0f", row[i]);
      line += buf;
    }
    std::printf("%s\n", line.c_str());
  }
  for (size_t i = 0; i < series.size(); ++i) {
    if (v[i].size() != t.size()) continue;
    std::printf("[figures] soak %s: first %.0f, max %.0f, last %.0f, slope %.0f/h (%zu samples over %.0f s)\n",
                series[i].first.c_str(), v[i].front(), *std::max_element(v[i].begin(), v[i].end()), v[i].back(),
                slope_per_hour(t, v[i]), t.size(), t.back());
    if (judge && t.size() >= 8 && series[i].second < 1e18) {
      std::string problem = growth_problem(series[i].first, v[i], series[i].second);
      EXPECT_EQ(problem, "");
    }
  }
}

TEST(CrashCampaign, KillNineAnyProcessAtAnyMomentLosesNothingAndExplainsEveryRedelivery) {
  if (std::getenv("SPOOL_LOG") == nullptr) spdlog::set_level(spdlog::level::err);
  const char* cli_env = std::getenv("SPOOL_CLI");
  std::string cli = cli_env != nullptr && ::access(cli_env, X_OK) == 0 ? cli_env : "";
  if (cli.empty()) {
    std::printf("\n*** SPOOL_CLI is not set to the spool binary: the `spool work` consumer is LEFT OUT "
                "of this run (tests/meson.build sets it) ***\n\n");
  }
  int soak = 0;
  if (const char* s = std::getenv("SPOOL_SOAK_SECONDS")) soak = std::max(0, std::atoi(s));
  const int kills_per_cycle = soak > 0 ? 200 : 60;
  const int cycles = std::max(1, test::scaled(300) / 60);
  const int per_cycle = soak > 0 ? kills_per_cycle : std::max(1, test::scaled(300) / cycles);
  uint64_t seed = 1234567;
  if (const char* s = std::getenv("SPOOL_CAMPAIGN_SEED")) seed = std::strtoull(s, nullptr, 10);
  const char* sv = std::getenv("SPOOL_SOAK_SURVIVORS");
  const bool survivors = soak > 0 && (sv == nullptr || std::string(sv) != "0");
  int sample_s = soak > 0 ? 30 : 5;
  if (const char* s = std::getenv("SPOOL_SOAK_SAMPLE_SECONDS")) sample_s = std::max(1, std::atoi(s));
  TempDir d;
  Campaign c(d.path(), cli, seed, survivors, Millis(sample_s * 1000));
  auto t0 = std::chrono::steady_clock::now();
  c.run(cycles, per_cycle, soak);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Figures& f = c.figures();
  const Ledger& l = c.ledger(0);
  std::printf("[figures] crash campaign (seed %" PRIu64 ", %.0f s%s): cycles=%d random_kills=%" PRIu64
              " cycle_end_kills=%" PRIu64 " restarts=%" PRIu64 "\n",
              seed, secs, c.work_enabled() ? "" : ", without spool work", f.cycles, f.kills, f.cycle_end_kills,
              f.restarts);
  std::printf("[figures]   sent=%" PRIu64 " (attempted %zu) acked=%" PRIu64 " nacked=%" PRIu64 " extended=%" PRIu64
              " lease_lost=%" PRIu64 " spool_work_handled=%" PRIu64 " spool_work_ack_failed=%" PRIu64
              " compactions=%" PRIu64 " copied=%" PRIu64 " deliveries=%zu\n",
              l.sends, l.attempted.size(), l.acks, l.nacks, l.extends, l.lease_lost, l.work_handled,
              l.work_ack_failed, l.compactions, l.copied, l.deliveries.size());
  std::printf("[figures]   lost=%" PRIu64 " acked_came_back=%" PRIu64 " duplicate_deliveries=%" PRIu64
              " bad_payloads=%" PRIu64 " phantoms=%" PRIu64 " failed_checks=%" PRIu64 " redeliveries=%" PRIu64
              " unexplained_redeliveries=%" PRIu64 "\n",
              f.lost, f.acked_came_back, f.duplicate, f.bad_payload, f.phantom, f.check_failures, f.redeliveries,
              f.unexplained);
  if (f.known_bug_unreadable + f.known_bug_symptoms > 0) {
    std::printf("[figures]   *** KNOWN BUG SPOOL_KNOWN_BUG_COMPACT_REPAIR tolerated: %" PRIu64
                " messages dead-lettered as unreadable or index entries repaired, %" PRIu64 " error lines ***\n",
                f.known_bug_unreadable, f.known_bug_symptoms);
  }
  const uint32_t limit = campaign_max_receives();
  if (limit > 0) {
    std::printf("[figures]   max_receives=%u dead_lettered=%" PRIu64 " dlq_extra_copies=%" PRIu64
                " acked_and_dead_lettered=%" PRIu64 " delivered_past_the_limit=%" PRIu64 "\n",
                limit, f.dead_lettered, f.dlq_extra_copies, f.acked_and_dead, f.past_limit);
  }
  for (int k = 1; k < c.views(); ++k) {
    const Ledger& s = c.ledger(k);
    std::printf("[figures]   subscription %s: acked=%" PRIu64 " nacked=%" PRIu64 " extended=%" PRIu64
                " lease_lost=%" PRIu64 " spool_work_handled=%" PRIu64 " spool_work_ack_failed=%" PRIu64
                " deliveries=%zu\n",
                view_name(k).c_str(), s.acks, s.nacks, s.extends, s.lease_lost, s.work_handled, s.work_ack_failed,
                s.deliveries.size());
  }
  for (auto& [why, n] : f.explained) std::printf("[figures]   redelivered, %s: %" PRIu64 "\n", why.c_str(), n);
  report_samples(c, soak > 0);
  EXPECT_GE(f.kills, static_cast<uint64_t>(soak > 0 ? 1 : cycles * per_cycle));
  EXPECT_GT(l.sends, 100u) << "the producers did no real work";
  for (int k = 0; k < c.views(); ++k) {
    // The last subscription's one consumer is `spool work` (a fork and exec per message, and
    // a restart per kill): under ASan on a loaded machine it handled 19 in a 7 s run.
    const bool work_only = k != 0 && k == campaign_subscriptions();
    EXPECT_GT(c.ledger(k).acks + c.ledger(k).work_handled, work_only ? 5u : 50u)
        << view_label(k) << ": the consumers did no real work";
  }
  EXPECT_EQ(f.lost, 0u);
  EXPECT_EQ(f.acked_came_back, 0u);
  EXPECT_EQ(f.unexplained, 0u);
  if (limit > 0) {
    EXPECT_GT(f.dead_lettered, 0u) << "max_receives is " << limit << " but nothing reached the dead-letter queue";
    EXPECT_EQ(f.past_limit, 0u);
  }
  // Every other check ran; the skip is counted and named by scripts/test.sh.
}

}  // namespace
}  // namespace spool
