// The queue across real processes: fork, kill -9, SIGSTOP, long polls.
// Children open the queue themselves after fork (a Queue never crosses fork).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "index/index.h"
#include "spool/queue.h"
#include "storage/log.h"
#include "storage/segment.h"
#include "proc_util.h"
#include "test_util.h"

namespace spool {
namespace {

using test::in_timed_futex_wait;
using test::mono_ns;
using test::readable;
using test::spawn;
using test::wait_exit;
using test::wait_for_file;
using namespace std::chrono_literals;


using QueueProcessTest = test::QueueDirTest;

// A consumer child: receives up to `max` at a time and acks each, appending each payload it
// acked to `out`, until nothing is receivable and the file `done` exists.
pid_t acking_consumer(const std::string& qdir, const std::string& out, size_t max, const std::string& done) {
  return spawn([=] {
    auto q = Queue::open(qdir);
    if (!q.ok()) return 1;
    FILE* f = std::fopen(out.c_str(), "w");
    for (;;) {
      auto got = (*q)->receive(max, 60s, 100ms);
      if (!got.ok()) {
        if (got.status().code() != Code::kEmpty) return 2;
        if (std::filesystem::exists(done)) break;
        continue;
      }
      for (auto& m : *got) {
        if (!(*q)->ack(m.receipt).ok()) return 3;
        std::fprintf(f, "%s\n", m.payload.c_str());
      }
    }
    std::fclose(f);
    return 0;
  });
}

// Sends `prefix``from` .. `prefix``from + count - 1` in batches of 1,000.
Status send_numbered(Queue& q, const std::string& prefix, int from, int count) {
  std::vector<std::string> bodies;
  for (int i = 0; i < count; i += 1000) {
    bodies.clear();
    for (int k = i; k < std::min(count, i + 1000); ++k) bodies.push_back(prefix + std::to_string(from + k));
    std::vector<std::string_view> views(bodies.begin(), bodies.end());
    if (auto r = q.send_batch(views); !r.ok()) return r.status();
  }
  return {};
}

// Receives and acks `n` messages, up to 1,000 at a time.
void receive_and_ack(Queue& q, int n) {
  for (int left = n; left > 0;) {
    auto ms = q.receive(static_cast<size_t>(std::min(left, 1000)), 60s);
    ASSERT_TRUE(ms.ok()) << ms.status().to_string();
    for (auto& m : *ms) ASSERT_TRUE(q.ack(m.receipt).ok());
    left -= static_cast<int>(ms->size());
  }
}

// How often each payload was acked, from the files acking_consumer wrote.
std::map<std::string, int> acked_payloads(const std::vector<std::string>& files) {
  std::map<std::string, int> acked;
  for (const auto& file : files) {
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) ++acked[line];
  }
  return acked;
}

TEST_F(QueueProcessTest, TwoProducersFourConsumersAckEveryMessageExactlyOnce) {
  constexpr int kPerProducer = 50000;
  auto parent = open();  // keeps the queue attached throughout
  std::string done = dir_ / "producers-done";
  std::vector<pid_t> producers, consumers;
  for (int p = 0; p < 2; ++p) {
    producers.push_back(spawn([&, p] {
      auto q = Queue::open(qdir());
      if (!q.ok()) return 1;
      std::vector<std::string> bodies(100);
      std::vector<std::string_view> views(100);
      for (int i = 0; i < kPerProducer; i += 100) {
        for (int k = 0; k < 100; ++k) views[k] = bodies[k] = "p" + std::to_string(p) + "-" + std::to_string(i + k);
        if (!(*q)->send_batch(views).ok()) return 2;
      }
      return 0;
    }));
  }
  std::vector<std::string> outs;
  for (int c = 0; c < 4; ++c) {
    outs.push_back(dir_ / ("acked-" + std::to_string(c)));
    consumers.push_back(acking_consumer(qdir(), outs.back(), 32, done));
  }
  for (pid_t p : producers) ASSERT_EQ(wait_exit(p), 0);
  std::ofstream(done).put('x');
  for (pid_t c : consumers) ASSERT_EQ(wait_exit(c), 0);

  auto acked = acked_payloads(outs);
  EXPECT_EQ(acked.size(), 2u * kPerProducer) << "every message acked";
  int dups = 0;
  for (auto& [body, n] : acked) dups += n - 1;
  EXPECT_EQ(dups, 0) << "no message acked twice";
  auto st = parent->stats();
  EXPECT_EQ(st->ready + st->in_flight + st->delayed, 0u);
  EXPECT_EQ(st->acked_total, 2u * kPerProducer);
  EXPECT_EQ(parent->check_index(), "");
}

// A child parks inside the critical section (test hook), is killed with SIGKILL there, and
// the others carry on: the next locker gets EOWNERDEAD and rebuilds from the log.
void kill_inside_critical_section(QueueProcessTest* t, const char* hook, bool child_msg_in_log) {
  auto q = t->open();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(q->send("before-" + std::to_string(i)).ok());
  std::string parked = t->qdir() + ".parked";
  pid_t child = spawn([&] {
    ::setenv(hook, parked.c_str(), 1);
    auto cq = Queue::open(t->qdir());
    if (!cq.ok()) return 1;
    (void)(*cq)->send("from the child");
    return 0;
  });
  ASSERT_TRUE(wait_for_file(parked, 10s)) << "child never reached the hook";
  ::kill(child, SIGKILL);
  EXPECT_EQ(wait_exit(child), 128 + SIGKILL);
  ::unlink(parked.c_str());

  ASSERT_TRUE(q->send("after").ok()) << "the lock must not be wedged";
  EXPECT_EQ(q->check_index(), "");
  auto all = q->peek(100);
  ASSERT_TRUE(all.ok());
  std::set<std::string> bodies;
  for (auto& m : *all) bodies.insert(m.payload);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(bodies.count("before-" + std::to_string(i)));
  EXPECT_TRUE(bodies.count("after"));
  EXPECT_EQ(bodies.count("from the child"), child_msg_in_log ? 1u : 0u);
  auto got = q->receive(100);
  ASSERT_TRUE(got.ok());
  for (auto& m : *got) EXPECT_TRUE(q->ack(m.receipt).ok());
  EXPECT_EQ(q->stats()->ready, 0u);
}

TEST_F(QueueProcessTest, HolderKilledRightAfterLockingDoesNotWedgeOthers) {
  kill_inside_critical_section(this, "SPOOL_TEST_PARK_IN_LOCK", false);
}

TEST_F(QueueProcessTest, HolderKilledBetweenLogAppendAndIndexUpdateLosesNothing) {
  kill_inside_critical_section(this, "SPOOL_TEST_PARK_AFTER_APPEND", true);
}

TEST_F(QueueProcessTest, StoppedHolderKeepsItsLock) {
  auto q = open();
  std::string parked = qdir() + ".parked";
  pid_t holder = spawn([&] {
    ::setenv("SPOOL_TEST_PARK_IN_LOCK", parked.c_str(), 1);
    auto cq = Queue::open(qdir());
    return cq.ok() && (*cq)->send("holder").ok() ? 0 : 1;
  });
  ASSERT_TRUE(wait_for_file(parked, 10s));
  ::kill(holder, SIGSTOP);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t other = spawn([&] {
    auto cq = Queue::open(qdir());
    bool ok = cq.ok() && (*cq)->send("other").ok();
    char c = ok ? 'y' : 'n';
    return ::write(fds[1], &c, 1) == 1 ? 0 : 1;
  });
  EXPECT_FALSE(readable(fds[0], 500)) << "nobody may take the lock of a live, stopped holder";
  ::unlink(parked.c_str());
  ::kill(holder, SIGCONT);
  ASSERT_TRUE(readable(fds[0], 10000));
  char c = 0;
  ASSERT_EQ(::read(fds[0], &c, 1), 1);
  EXPECT_EQ(c, 'y');
  EXPECT_EQ(wait_exit(holder), 0);
  EXPECT_EQ(wait_exit(other), 0);
  EXPECT_EQ(q->peek(10)->size(), 2u);
  EXPECT_EQ(q->check_index(), "");
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST_F(QueueProcessTest, ConsumersKilledMidLeaseLoseNothing) {
  constexpr int kMessages = 100, kKills = 100;
  auto q = open();
  for (int i = 0; i < kMessages; ++i) ASSERT_TRUE(q->send(std::to_string(i)).ok());
  std::map<uint64_t, uint32_t> child_count;  // highest receive count a killed child saw
  for (int k = 0; k < kKills; ++k) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pid_t child = spawn([&] {
      auto cq = Queue::open(qdir());
      if (!cq.ok()) return 1;
      auto got = (*cq)->receive(1, 100ms, 2s);
      if (!got.ok()) {
        std::fprintf(stderr, "killed-consumer child: %s\n", got.status().to_string().c_str());
        return 2;
      }
      uint64_t rec[2] = {got->at(0).id, got->at(0).receive_count};
      if (::write(fds[1], rec, sizeof rec) != sizeof rec) return 3;
      ::pause();  // "working" until killed
      return 0;
    });
    uint64_t rec[2] = {0, 0};
    if (!readable(fds[0], 10000)) {
      ::kill(child, SIGKILL);
      FAIL() << "child " << k << " reported nothing; exit " << wait_exit(child);
    }
    ASSERT_EQ(::read(fds[0], rec, sizeof rec), static_cast<ssize_t>(sizeof rec));
    ::kill(child, SIGKILL);
    wait_exit(child);
    ::close(fds[0]);
    ::close(fds[1]);
    child_count[rec[0]] = std::max<uint32_t>(child_count[rec[0]], static_cast<uint32_t>(rec[1]));
  }
  std::set<uint64_t> acked;
  while (acked.size() < kMessages) {
    auto got = q->receive(10, 30s, 1s);
    ASSERT_TRUE(got.ok()) << got.status().to_string() << " after " << acked.size();
    for (auto& m : *got) {
      auto it = child_count.find(m.id);
      uint32_t before = it == child_count.end() ? 0 : it->second;
      EXPECT_EQ(m.receive_count, before + 1) << "message " << m.id;
      ASSERT_TRUE(q->ack(m.receipt).ok());
      acked.insert(m.id);
    }
  }
  EXPECT_EQ(q->stats()->ready, 0u);
  EXPECT_EQ(q->check_index(), "");
}

// One write path: when a call returns, its record is in the log (the page cache), so a
// process killed right after it leaves nothing that only the index knows.
namespace kill_case {

// The CLI ($SPOOL_CLI) runs `args` and is killed at `crashpoint`: a fresh process, because a
// crash point is read once per process.
void run_and_die(const std::vector<std::string>& args, const std::string& crashpoint) {
  const char* cli = std::getenv("SPOOL_CLI");
  ASSERT_NE(cli, nullptr) << "SPOOL_CLI must name the spool binary (meson sets it)";
  std::vector<std::string> argv{cli};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = test::run_program(argv, "", "", {"SPOOL_CRASHPOINT=" + crashpoint});
  ASSERT_EQ(r.code, 128 + SIGKILL) << "spool " << args.front() << " was not killed at " << crashpoint << ": " << r.err;
}

// Records of `type` for message `id` in the log, read apart from any index.
int records_in_log(const std::string& dir, format::RecordType type, uint64_t id) {
  storage::LogOptions lo;
  lo.read_only = true;
  auto log = storage::Log::open(dir + "/segments", lo);
  EXPECT_TRUE(log.ok()) << log.status().to_string();
  if (!log.ok()) return -1;
  int n = 0;
  auto rec = (*log)->recover([&](storage::Pos, const storage::RecordView& r) { n += r.type == type && r.id == id; });
  EXPECT_TRUE(rec.ok() && rec->corrupt.empty());
  return n;
}

// Changes the header of the queue's index file in place (no process has it open).
void change_index_header(const std::string& dir, const std::function<void(index::IndexHeader&)>& change) {
  test::IndexFile f(dir);
  if (f.ok()) change(f.hdr());
}

// What makes a first opener rebuild the index instead of reusing it: no index at all, a seal
// that does not match, counters torn by a process killed in the middle of an update, another
// boot.
struct Damage {
  const char* what;
  std::function<void(const std::string& dir)> apply;
};
std::vector<Damage> damages() {
  return {Damage{"deleted", [](const std::string& d) { std::filesystem::remove(d + "/index"); }},
          Damage{"seal", [](const std::string& d) { change_index_header(d, [](index::IndexHeader& h) { h.ident.seal = 12345; }); }},
          Damage{"counters",
                 [](const std::string& d) { change_index_header(d, [](index::IndexHeader& h) { h.layout.queued = h.layout.count + 1; }); }},
          Damage{"boot", [](const std::string& d) {
                   change_index_header(d, [](index::IndexHeader& h) { ::memset(h.ident.boot_id, '0', 36); });
                 }}};
}

enum class Op { kAck, kNack, kExtend, kReceive };

// In a child: opens the queue, makes `op` on the one message leased by `receipt` (kReceive:
// receives one), tells the parent through `ready` that the call returned, and waits to be
// killed. The parent kills it with SIGKILL.
void change_and_be_killed(const std::string& dir, Op op, const std::string& receipt) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = test::spawn([&] {
    ::close(fds[0]);
    auto q = Queue::open(dir);
    if (!q.ok()) return 1;
    Status s;
    switch (op) {
      case Op::kAck: s = (*q)->ack(receipt); break;
      case Op::kNack: s = (*q)->nack(receipt, 60s); break;
      case Op::kExtend: s = (*q)->extend(receipt, 1s); break;
      case Op::kReceive: {
        auto got = (*q)->receive(1, 60s);
        s = got.ok() && got->size() != 1u ? Status(Code::kEmpty, "nothing") : got.status();
        break;
      }
    }
    char c = s.ok() ? 'y' : 'n';
    if (::write(fds[1], &c, 1) != 1) return 2;
    ::pause();
    return 3;
  });
  ::close(fds[1]);
  char c = 0;
  ASSERT_EQ(::read(fds[0], &c, 1), 1);
  ::close(fds[0]);
  ::kill(pid, SIGKILL);
  ASSERT_EQ(test::wait_exit(pid), 128 + SIGKILL);
  ASSERT_EQ(c, 'y') << "the call failed";
}

}  // namespace kill_case

// Each change made by a process killed right after its call returned survives every kind of
// rebuild of the index: the log holds it, and the index holds nothing the log does not.
TEST_F(QueueProcessTest, AChangeWhoseCallReturnedSurvivesAKillAndAnyRebuildOfTheIndex) {
  using kill_case::Op;
  const std::pair<Op, const char*> ops[] = {
      {Op::kAck, "ack"}, {Op::kNack, "nack"}, {Op::kExtend, "extend"}, {Op::kReceive, "receive"}};
  for (const auto& [op, name] : ops) {
    for (const auto& d : kill_case::damages()) {
      SCOPED_TRACE(std::string(name) + ", index " + d.what);
      std::filesystem::remove_all(qdir());
      Message first;
      {
        auto q = open();
        ASSERT_NE(q, nullptr);
        for (int i = 0; i < 3; ++i) ASSERT_TRUE(q->send("m" + std::to_string(i)).ok());
        if (op != Op::kReceive) {
          auto r = q->receive(1, 60s);
          ASSERT_TRUE(r.ok() && r->size() == 1u);
          first = r->front();
        }
      }
      ASSERT_NO_FATAL_FAILURE(kill_case::change_and_be_killed(qdir(), op, first.receipt));
      d.apply(qdir());
      auto q = open();
      ASSERT_NE(q, nullptr);
      auto st = q->stats();
      ASSERT_TRUE(st.ok());
      switch (op) {
        case Op::kAck:
          EXPECT_EQ(kill_case::records_in_log(qdir(), format::RecordType::kAck, first.id), 1);
          EXPECT_EQ(st->ready + st->in_flight + st->delayed, 2u) << "the acked message came back";
          break;
        case Op::kNack:
          EXPECT_EQ(st->delayed, 1u) << "the nack (60 s delay) was lost";
          EXPECT_EQ(st->in_flight, 0u);
          break;
        case Op::kExtend: {
          // Shortened to 1 s: the message is receivable again long before its first 60 s.
          EXPECT_EQ(st->in_flight, 1u);
          auto back = q->receive(3, 60s, 5s);
          ASSERT_TRUE(back.ok()) << back.status().to_string();
          bool again = false;
          for (auto& m : *back) again = again || (m.id == first.id && m.receive_count == 2);
          if (!again) {
            auto more = q->receive(1, 60s, 5s);
            again = more.ok() && !more->empty() && more->front().id == first.id;
          }
          EXPECT_TRUE(again) << "the extend to 1 s was lost: the message stayed leased for its 60 s";
          break;
        }
        case Op::kReceive:
          EXPECT_EQ(st->in_flight, 1u) << "the lease was lost";
          EXPECT_EQ(st->ready, 2u);
          break;
      }
      EXPECT_EQ(q->check_index(), "");
    }
  }
}

// A queue written by the version before the one write path (index format 10, which listed
// acks and leases in the index before writing them), left by processes killed with a lease
// and an ack listed only there: tests/data/upgrade-index10.tar.gz, made with that version's
// CLI (init --segment-size 64KiB; 300 lines sent; 5 received; 1 and 2 acked, 4 nacked; a
// recv killed at its crash point receive.done, then an ack of 3 killed at ack.deferred).
// This version rebuilds the index from the log: every unacked message is kept, the written
// acks stay, and only the ack that was listed and never written comes back (delivered again).
TEST_F(QueueProcessTest, AQueueOfTheFormerIndexFormatOpensWithEveryUnackedMessage) {
  const char* data = std::getenv("SPOOL_TEST_DATA");
  ASSERT_NE(data, nullptr) << "SPOOL_TEST_DATA must name tests/data (meson sets it)";
  std::filesystem::create_directories(dir_.path());
  auto r = test::run_program({"/bin/tar", "-xzf", std::string(data) + "/upgrade-index10.tar.gz", "-C", dir_.path()}, "", "", {});
  ASSERT_EQ(r.code, 0) << r.err;
  auto q = open();
  ASSERT_NE(q, nullptr);
  auto all = q->list(1000);
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  std::set<uint64_t> ids;
  for (const auto& m : *all) ids.insert(m.id);
  EXPECT_FALSE(ids.contains(1)) << "an ack the old version wrote came back";
  EXPECT_FALSE(ids.contains(2)) << "an ack the old version wrote came back";
  for (uint64_t id = 4; id <= 300; ++id) EXPECT_TRUE(ids.contains(id)) << "message " << id << " was lost";
  EXPECT_EQ(ids.size(), 298u) << "expected ids 3..300 (3: its ack was listed, never written)";
  EXPECT_EQ(q->check_index(), "");
  auto v = q->verify(false);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->ok()) << v->problems.front();
}

TEST_F(QueueProcessTest, ADrainedBacklogGivesTheIndexBackWhileAnotherProcessHasItMapped) {
  constexpr int kBacklog = 100000, kAfter = 1000;
  if (!test::can_punch_holes(dir_.path())) GTEST_SKIP() << "SKIPPED: " << dir_.path() << " cannot punch holes (fallocate)";
  auto q = open();
  ASSERT_TRUE(send_numbered(*q, "old-", 0, kBacklog).ok());
  std::string mapped = dir_ / "mapped", go = dir_ / "go";
  pid_t child = spawn([&] {
    auto cq = Queue::open(qdir());
    if (!cq.ok()) return 1;
    if (!(*cq)->stats().ok()) return 2;  // locks, so maps the whole region
    std::ofstream(mapped).put('x');
    if (!wait_for_file(go, 60s)) return 3;
    for (int i = 0; i < kAfter; ++i) {
      if (!(*cq)->send("new-" + std::to_string(i)).ok()) return 4;
    }
    std::set<std::string> got;
    while (got.size() < kAfter) {
      auto ms = (*cq)->receive(100, 30s);
      if (!ms.ok()) return 5;
      for (auto& m : *ms) {
        if (!got.insert(m.payload).second || m.payload.rfind("new-", 0) != 0) return 6;
        if (!(*cq)->ack(m.receipt).ok()) return 7;
      }
    }
    return (*cq)->check_index().empty() ? 0 : 8;
  });
  ASSERT_TRUE(wait_for_file(mapped, 30s)) << "the child never opened the queue";
  const std::string index = qdir() + "/index";
  struct stat big {}, small {};
  ASSERT_EQ(::stat(index.c_str(), &big), 0);
  ASSERT_NO_FATAL_FAILURE(receive_and_ack(*q, kBacklog));
  ASSERT_TRUE(q->stats().ok());  // shrunk by now: the region is given back at a lock
  ASSERT_EQ(::stat(index.c_str(), &small), 0);
  EXPECT_GE(small.st_size, big.st_size) << "the index file must not get shorter while mapped";
  EXPECT_GT(big.st_blocks * 512, 2 << 20);
  EXPECT_LT(small.st_blocks * 2, big.st_blocks) << "the drained index kept its blocks";
  std::ofstream(go).put('x');
  EXPECT_EQ(wait_exit(child), 0);
  EXPECT_EQ(q->check_index(), "");
  auto st = q->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->acked_total, uint64_t{kBacklog + kAfter});
  EXPECT_EQ(st->ready + st->in_flight + st->delayed, 0u);
}

// Bursts: two producers each send 60,000 messages at once, twice, waiting for the queue to
// drain in between, while three consumers receive and ack throughout. The index grows and
// shrinks under processes that hold stale mappings of it all the time; every message is
// acked exactly once, and the index gives its blocks back.
TEST_F(QueueProcessTest, BurstsGrowAndShrinkTheIndexUnderRunningProcessesWithoutLosingAny) {
  constexpr int kProducers = 2, kConsumers = 3, kRounds = 2, kBurst = 60000;
  if (!test::can_punch_holes(dir_.path())) GTEST_SKIP() << "SKIPPED: " << dir_.path() << " cannot punch holes (fallocate)";
  QueueOptions o;
  o.sync = SyncPolicy::kNever;
  auto parent = open(o);
  std::string done = dir_ / "producers-done";
  std::vector<pid_t> producers, consumers;
  for (int p = 0; p < kProducers; ++p) {
    producers.push_back(spawn([&, p] {
      auto q = Queue::open(qdir());
      if (!q.ok()) return 1;
      for (int round = 0; round < kRounds; ++round) {
        if (!send_numbered(**q, "p" + std::to_string(p) + "-", round * kBurst, kBurst).ok()) return 2;
        for (;;) {  // until the consumers have drained it
          auto st = (*q)->stats();
          if (!st.ok()) return 3;
          if (st->ready + st->in_flight == 0) break;
          std::this_thread::sleep_for(5ms);
        }
      }
      return 0;
    }));
  }
  std::vector<std::string> outs;
  for (int c = 0; c < kConsumers; ++c) {
    outs.push_back(dir_ / ("acked-" + std::to_string(c)));
    consumers.push_back(acking_consumer(qdir(), outs.back(), 64, done));
  }
  // The index file's allocation, sampled: a drop below half its peak counts as a shrink.
  const std::string index = qdir() + "/index";
  int64_t peak = 0;
  int shrinks = 0;
  auto sample = [&] {
    struct stat st {};
    if (::stat(index.c_str(), &st) != 0) return;
    if (st.st_blocks > peak) {
      peak = st.st_blocks;
    } else if (st.st_blocks * 2 < peak) {
      ++shrinks;
      peak = st.st_blocks;  // the next growth starts a new peak
    }
  };
  for (size_t running = producers.size(); running != 0;) {
    sample();
    running = 0;
    for (pid_t& p : producers) {
      if (p == 0) continue;
      int status = 0;
      if (::waitpid(p, &status, WNOHANG) == p) {
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "producer failed: " << status;
        p = 0;
      } else {
        ++running;
      }
    }
    std::this_thread::sleep_for(2ms);
  }
  std::ofstream(done).put('x');
  for (pid_t c : consumers) EXPECT_EQ(wait_exit(c), 0);
  sample();  // the last drain's shrink may come with the producers' last look
  // At least once: how far each round's backlog climbs depends on how fast the consumers
  // keep up, and a region under 1 MiB is not shrunk.
  EXPECT_GE(shrinks, 1) << "the index never gave its blocks back";

  auto acked = acked_payloads(outs);
  EXPECT_EQ(acked.size(), size_t{kProducers} * kRounds * kBurst) << "every message acked";
  int dups = 0;
  for (auto& [body, n] : acked) dups += n - 1;
  EXPECT_EQ(dups, 0) << "no message acked twice";
  EXPECT_EQ(parent->check_index(), "");
  auto st = parent->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->acked_total, uint64_t{kProducers} * kRounds * kBurst);
}

// A process killed in the middle of a shrink (the header has the new geometry, the entries
// are not moved yet) dies holding the lock: the next locker rebuilds from the log, and
// nothing is lost or comes back.
TEST_F(QueueProcessTest, AProcessKilledWhileItShrinksTheIndexLosesNothing) {
  constexpr int kBacklog = 100000, kLeft = 10;
  // No flusher thread: its syncs lock too, and one after the last ack would shrink first.
  QueueOptions o;
  o.sync = SyncPolicy::kNever;
  auto q = open(o);
  ASSERT_TRUE(send_numbered(*q, "m-", 0, kBacklog).ok());
  // The oldest message, leased, holds the window's low end while the rest drains, so that
  // this process does not shrink the index itself.
  auto oldest = q->receive(1, 60s);
  ASSERT_TRUE(oldest.ok() && oldest->size() == 1);
  ASSERT_NO_FATAL_FAILURE(receive_and_ack(*q, kBacklog - 1 - kLeft));
  ASSERT_TRUE(q->ack((*oldest)[0].receipt).ok());
  // Closed, so that no thread of this process (the background spares and compaction the
  // acks' rolls started) locks between the kill and the look at the header below: a lock
  // then rebuilds the index (resizing 0), which a loaded CI run met.
  q.reset();
  // A send shrinks first, when it locks (stats, which only reads, does not): killed there,
  // before its message is appended.
  ASSERT_NO_FATAL_FAILURE(kill_case::run_and_die({"send", qdir(), "never-sent"}, "index.resized"));
  // The index says a resize was cut short (so nothing reads its region, not even the lease
  // bindings a rebuild carries over); the rebuild below mends it.
  uint32_t resizing = 0;
  kill_case::change_index_header(qdir(), [&](index::IndexHeader& h) { resizing = h.layout.resizing; });
  EXPECT_EQ(resizing, 1u);
  q = open(o);
  ASSERT_NE(q, nullptr);
  auto st = q->stats();
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->ready, uint64_t{kLeft});
  EXPECT_EQ(st->in_flight, 0u);
  EXPECT_EQ(st->acked_total, uint64_t{kBacklog - kLeft});
  EXPECT_EQ(q->check_index(), "");
  kill_case::change_index_header(qdir(), [&](index::IndexHeader& h) {
    EXPECT_EQ(h.layout.resizing, 0u);
    EXPECT_LT(h.layout.win_offset, h.layout.capacity);
  });
  auto rest = q->receive(100);
  ASSERT_TRUE(rest.ok());
  std::vector<std::string> got;
  for (auto& m : *rest) got.push_back(m.payload);
  std::vector<std::string> want;
  for (int i = kBacklog - kLeft; i < kBacklog; ++i) want.push_back("m-" + std::to_string(i));
  EXPECT_EQ(got, want);
  // The rebuild replayed the whole backlog into the index; a later lock shrinks it again.
  ASSERT_TRUE(q->stats().ok());
  struct stat after {};
  ASSERT_EQ(::stat((qdir() + "/index").c_str(), &after), 0);
  if (test::can_punch_holes(dir_.path())) {
    EXPECT_LT(after.st_blocks * 512, 1 << 20);
  }
}

// The same cut short in a growth: `spool send --lines` killed in its sixth resize of the
// window (send_batch grows the index before it writes a record) loses no batch that
// returned, and the batch it was in is not half there: the queue holds a prefix of the
// lines, whole batches of 1,000, each once.
TEST_F(QueueProcessTest, ASenderKilledWhileItGrowsTheIndexLosesNoBatchThatReturned) {
  QueueOptions o;
  o.sync = SyncPolicy::kNever;
  auto q = open(o);
  const char* cli = std::getenv("SPOOL_CLI");
  ASSERT_NE(cli, nullptr) << "SPOOL_CLI must name the spool binary (meson sets it)";
  std::string lines;
  for (int i = 0; i < 20000; ++i) lines += "g-" + std::to_string(i) + "\n";
  auto r = test::run_program({cli, "send", qdir(), "--lines"}, lines, "", {"SPOOL_CRASHPOINT=index.resized:6"});
  ASSERT_EQ(r.code, 128 + SIGKILL) << "spool send was not killed in a resize: " << r.err;
  uint32_t resizing = 0;
  kill_case::change_index_header(qdir(), [&](index::IndexHeader& h) { resizing = h.layout.resizing; });
  EXPECT_EQ(resizing, 1u);
  size_t printed = 0;  // the ids that reached the pipe before the kill (stdout is buffered)
  for (char c : r.out) printed += c == '\n';
  auto st = q->stats();
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(q->check_index(), "");
  std::vector<std::string> got;
  for (;;) {
    auto ms = q->receive(1000);
    if (!ms.ok()) {
      ASSERT_EQ(ms.status().code(), Code::kEmpty) << ms.status().to_string();
      break;
    }
    for (auto& m : *ms) {
      got.push_back(m.payload);
      ASSERT_TRUE(q->ack(m.receipt).ok());
    }
  }
  ASSERT_GT(got.size(), 0u) << "the batches before the kill are gone";
  EXPECT_EQ(got.size() % 1000, 0u) << "a batch is half there";
  EXPECT_GE(got.size(), printed);
  EXPECT_LT(got.size(), 20000u);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], "g-" + std::to_string(i)) << "at " << i;
}

// The interval promise: a send that returned is on disk within the interval, whatever other
// processes do meanwhile. The sync path takes no index lock, so a process stopped while it
// holds the lock does not hold back the flusher of another one. With a 1 s interval the
// flusher's first sync comes 1 s after the send, long after the holder parked in the lock;
// the durable watermark must cover the send within the interval + 1.5 s (slack for a loaded machine), while the holder
// is still parked there. Then, traffic stopped, a lone send is covered within the same bound.
TEST_F(QueueProcessTest, TheIntervalSyncCoversALoneSendWhileAnotherProcessHoldsTheIndexLock) {
  QueueOptions o;
  o.sync = SyncPolicy::kInterval;
  o.sync_interval = 1000ms;
  auto q = open(o);
  ASSERT_NE(q, nullptr);
  auto first = q->send("before");
  ASSERT_TRUE(first.ok());
  const std::string parked = dir_ / "parked";
  pid_t holder = spawn([&] {
    ::setenv("SPOOL_TEST_PARK_IN_LOCK", parked.c_str(), 1);
    auto h = Queue::open(qdir());
    if (!h.ok()) return 1;
    (void)(*h)->stats();  // takes the lock and parks in it until `parked` is removed
    return 0;
  });
  ASSERT_TRUE(wait_for_file(parked, 10s)) << "the holder never took the lock";
  ASSERT_LT(q->durable_id(), *first) << "synced before the holder parked: this round proves nothing";
  auto covered_within = [&](uint64_t id) {
    const uint64_t t0 = mono_ns();
    while (q->durable_id() < id && mono_ns() - t0 < 5'000'000'000ull) std::this_thread::sleep_for(1ms);
    return q->durable_id() >= id ? (mono_ns() - t0) / 1'000'000 : UINT64_MAX;
  };
  const uint64_t waited = covered_within(*first);
  EXPECT_LE(waited, 1000u + 1500u) << "the send is not durable while another process holds the lock";
  std::printf("[ interval ] durable %llu ms after the holder parked in the lock\n",
              static_cast<unsigned long long>(waited));
  EXPECT_TRUE(std::filesystem::exists(parked)) << "the holder left the lock before the check";
  std::filesystem::remove(parked);
  ASSERT_EQ(wait_exit(holder), 0);
  auto second = q->send("after");
  ASSERT_TRUE(second.ok());
  const uint64_t again = covered_within(*second);
  EXPECT_LE(again, 1000u + 1500u) << "a lone send was not synced within the interval once traffic stopped";
}

TEST_F(QueueProcessTest, LongPollWakesWithinMillisecondsOfASendFromAnotherProcess) {
  auto q = open();
  for (int round = 0; round < 3; ++round) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pid_t child = spawn([&] {
      auto cq = Queue::open(qdir());
      if (!cq.ok()) return 1;
      uint64_t t = 0;
      if (::write(fds[1], &t, sizeof t) != sizeof t) return 2;
      auto got = (*cq)->receive(1, 10s, 10s);
      t = mono_ns();
      if (!got.ok() || !(*cq)->ack(got->at(0).receipt).ok()) return 3;
      return ::write(fds[1], &t, sizeof t) == sizeof t ? 0 : 4;
    });
    uint64_t t = 0;
    ASSERT_EQ(::read(fds[0], &t, sizeof t), static_cast<ssize_t>(sizeof t));
    // Send only once the child is asleep in its long poll: a send before that would find no
    // waiter, and the receive would return at once without testing the wake.
    auto parked_by = std::chrono::steady_clock::now() + 10s;
    while (!in_timed_futex_wait(child, child)) {
      ASSERT_LT(std::chrono::steady_clock::now(), parked_by) << "round " << round << ": the child never slept in its long poll";
      std::this_thread::sleep_for(1ms);
    }
    uint64_t sent = mono_ns();
    ASSERT_TRUE(q->send("wake up").ok());
    ASSERT_TRUE(readable(fds[0], 5000));
    ASSERT_EQ(::read(fds[0], &t, sizeof t), static_cast<ssize_t>(sizeof t));
    EXPECT_EQ(wait_exit(child), 0);
    // A waiter that was not woken sleeps out its futex slice (kMaxWaitSliceNs, 1 s) before
    // it looks again; 600 ms tells the two apart with room for a loaded CI machine, where
    // a woken waiter has been seen to take 150 ms under ASan.
    const double ms = (t - sent) / 1000000.0;
    std::printf("[ wake ] round %d: %.2f ms from send to the waiter's return\n", round, ms);
    EXPECT_LT(ms, 600.0) << "ms from send to the waiter's return";
    ::close(fds[0]);
    ::close(fds[1]);
  }
}

// kill -9 in the dead-letter hand-off (docs/semantics.md, "Dead letters"): the receive that
// finds a message past max_receives sends it to the DLQ, then logs its DEAD record, inside
// the index lock. Killed between the two (crash point dead_letter.after_send), the message
// is still queued and already in the DLQ; the next receive, after the repair, dead-letters
// it again: a duplicate in the DLQ, never a loss.
TEST_F(QueueProcessTest, AReceiverKilledInTheDeadLetterHandOffLosesNothing) {
  QueueOptions o;
  o.max_receives = 2;
  auto q = open(o);
  ASSERT_NE(q, nullptr);
  ASSERT_TRUE(q->send("poison").ok());
  for (int i = 0; i < 2; ++i) {
    auto m = q->receive(1, 60s);
    ASSERT_TRUE(m.ok() && m->size() == 1u) << m.status().to_string();
    ASSERT_TRUE(q->nack(m->front().receipt).ok());
  }
  pid_t victim = spawn([&] {
    ::setenv("SPOOL_CRASHPOINT", "dead_letter.after_send", 1);
    auto v = Queue::open(qdir());
    if (!v.ok()) return 1;
    (void)(*v)->receive(1, 60s);
    return 2;  // the crash point did not kill it
  });
  ASSERT_EQ(wait_exit(victim), 128 + SIGKILL) << "the receiver did not die at dead_letter.after_send";
  auto dlq = q->dead_letters();
  ASSERT_TRUE(dlq.ok()) << dlq.status().to_string();
  EXPECT_EQ((*dlq)->stats()->ready, 1u) << "the DLQ send made before the kill is gone";
  EXPECT_EQ(q->stats()->ready, 1u) << "no DEAD record was logged: the message must still be queued";
  EXPECT_EQ(q->check_index(), "");
  EXPECT_EQ(q->receive(1, 60s).status().code(), Code::kEmpty) << "the next receive dead-letters it";
  EXPECT_EQ(q->stats()->ready, 0u);
  EXPECT_EQ(q->stats()->dead_lettered_total, 1u);
  auto dead = (*dlq)->peek(10);
  ASSERT_TRUE(dead.ok());
  EXPECT_EQ(dead->size(), 2u) << "at least once: the hand-off repeated, a duplicate in the DLQ";
  for (auto& m : *dead) EXPECT_EQ(m.payload, "poison");
  EXPECT_EQ(q->check_index(), "");
}

// kill -9 inside redrive, between the send of a dead letter back to the queue and its ack
// in the DLQ (crash point redrive.after_send; "send first, then ack"): the message is
// queued again and still in the DLQ (leased by the dead redrive until its lease ends), a
// duplicate, never a loss.
TEST_F(QueueProcessTest, ARedriveKilledBetweenItsSendAndItsAckLosesNothing) {
  QueueOptions o;
  o.max_receives = 1;
  auto q = open(o);
  ASSERT_NE(q, nullptr);
  ASSERT_TRUE(q->send("poison").ok());
  auto m = q->receive(1, 60s);
  ASSERT_TRUE(m.ok() && m->size() == 1u) << m.status().to_string();
  ASSERT_TRUE(q->nack(m->front().receipt).ok());
  ASSERT_EQ(q->receive(1, 60s).status().code(), Code::kEmpty) << "it should have been dead-lettered";
  auto dlq = q->dead_letters();
  ASSERT_TRUE(dlq.ok()) << dlq.status().to_string();
  ASSERT_EQ((*dlq)->stats()->ready, 1u);
  pid_t victim = spawn([&] {
    ::setenv("SPOOL_CRASHPOINT", "redrive.after_send", 1);
    auto v = Queue::open(qdir());
    if (!v.ok()) return 1;
    (void)(*v)->redrive(10);
    return 2;  // the crash point did not kill it
  });
  ASSERT_EQ(wait_exit(victim), 128 + SIGKILL) << "the redrive did not die at redrive.after_send";
  auto back = q->peek(10);
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->size(), 1u) << "the redriven copy is not in the queue";
  EXPECT_EQ(back->front().payload, "poison");
  auto st = (*dlq)->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->ready + st->in_flight, 1u) << "the dead letter was acked before the kill, or lost";
  EXPECT_EQ(q->check_index(), "");
  EXPECT_EQ((*dlq)->check_index(), "");
}

TEST_F(QueueProcessTest, ManyProcessesOpeningAFreshQueueAtOnceAgree) {
  std::vector<pid_t> kids;
  for (int c = 0; c < 8; ++c) {
    kids.push_back(spawn([&, c] {
      auto q = Queue::open(qdir());
      if (!q.ok()) return 1;
      for (int i = 0; i < 100; ++i)
        if (!(*q)->send(std::to_string(c) + "-" + std::to_string(i)).ok()) return 2;
      return 0;
    }));
  }
  for (pid_t k : kids) ASSERT_EQ(wait_exit(k), 0);
  auto q = open();
  auto all = q->peek(10000);
  ASSERT_TRUE(all.ok());
  std::set<std::string> bodies;
  for (auto& m : *all) bodies.insert(m.payload);
  EXPECT_EQ(bodies.size(), 800u);
  EXPECT_EQ(q->check_index(), "");
}

// Issue 48: `spool work` exited on one kCorrupt ("the log end given is behind the log"),
// though the damage is mended before the call returns and a retry succeeds. The worker is
// stopped (SIGSTOP) while three messages are sent and the index's log end is poked behind
// the log; resumed, its receive meets the damage once, and it goes on to run all three.
TEST_F(QueueProcessTest, SpoolWorkRetriesAReceiveThatMetDamageInTheIndex) {
  const char* cli = std::getenv("SPOOL_CLI");
  ASSERT_NE(cli, nullptr) << "SPOOL_CLI must name the spool binary (meson sets it)";
  { ASSERT_TRUE(open()); }
  const std::string out = dir_ / "out", err = dir_ / "err";
  const std::string q = qdir();
  pid_t worker = spawn([&] {
    int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    ::execl(cli, cli, "work", q.c_str(), "--", "sh", "-c", ("cat >> '" + out + "'; echo >> '" + out + "'").c_str(),
            static_cast<char*>(nullptr));
    return 127;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // attached and waiting
  ASSERT_EQ(::kill(worker, SIGSTOP), 0);
  {
    auto qq = open();
    ASSERT_TRUE(qq);
    for (const char* m : {"m1", "m2", "m3"}) ASSERT_TRUE(qq->send(m).ok());
  }
  kill_case::change_index_header(q, [](index::IndexHeader& h) {
    h.cache.log_end = storage::Pos{1, format::kSegmentHeaderSize}.pack();
  });
  ASSERT_EQ(::kill(worker, SIGCONT), 0);
  int lines = 0, status = 0;
  bool exited = false;
  for (int i = 0; i < 200 && lines < 3 && !exited; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream in(out);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    lines = static_cast<int>(std::count(all.begin(), all.end(), '\n'));
    exited = ::waitpid(worker, &status, WNOHANG) == worker;
  }
  std::ifstream e(err);
  std::string said((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(exited) << "spool work exited (status " << status << "): " << said;
  EXPECT_EQ(lines, 3) << "messages run: " << lines << "; stderr: " << said;
  if (!exited) {
    ::kill(worker, SIGTERM);
    ::waitpid(worker, &status, 0);
  }
}

// Issue 48: the CLI ended the "used every segment number" error with "(free disk space, then
// retry)", which does not help there. The queue is given a segment at the next-to-last
// number; `spool send` fills it, fails, and its error says what does help.
TEST_F(QueueProcessTest, TheLastSegmentNumberErrorDoesNotSayFreeDiskSpace) {
  const char* cli = std::getenv("SPOOL_CLI");
  ASSERT_NE(cli, nullptr) << "SPOOL_CLI must name the spool binary (meson sets it)";
  QueueOptions o;
  o.segment_size = format::kMinSegmentSize;
  { ASSERT_TRUE(open(o)); }
  {
    storage::LogOptions lo;
    lo.segment_size = o.segment_size;
    auto log = storage::Log::open(qdir() + "/segments", lo);
    ASSERT_TRUE(log.ok());
    const uint64_t seq = storage::kMaxSegmentSeq - 1;
    ASSERT_TRUE(storage::Segment::create((*log)->io(), (*log)->segment_path(seq), seq, 1, lo.segment_size).ok());
  }
  std::filesystem::remove(qdir() + "/index");
  std::string lines;
  for (int i = 0; i < 200; ++i) lines += "p" + std::to_string(i) + std::string(100, 'x') + "\n";
  auto r = test::run_program({cli, "send", qdir(), "--lines", "--batch", "1"}, lines, "", {});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("every segment number"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("free disk space"), std::string::npos) << r.err;
}

TEST_F(QueueProcessTest, ReadOnlyUserGetsStatsAndPeekButNoChanges) {
  if (::geteuid() != 0) GTEST_SKIP() << "SKIPPED: needs root to switch to an unprivileged user";
  {
    auto q = open();
    ASSERT_TRUE(q->send("x").ok());
  }
  std::filesystem::permissions(dir_.path(), std::filesystem::perms::all);
  pid_t child = spawn([&] {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) return 1;  // nobody
    auto q = Queue::open(qdir());
    if (!q.ok()) {
      std::fprintf(stderr, "read-only open: %s\n", q.status().to_string().c_str());
      return 2;
    }
    if ((*q)->stats()->ready != 1 || (*q)->peek(5)->size() != 1) return 3;
    if ((*q)->send("y").status().code() != Code::kReadOnly) return 4;
    if ((*q)->receive().status().code() != Code::kReadOnly) return 5;
    return 0;
  });
  EXPECT_EQ(wait_exit(child), 0);
}

}  // namespace
}  // namespace spool
