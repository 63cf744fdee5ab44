// What the peers lack (docs/semantics.md): back-pressure limits, durability per call, and
// instant release of a dead process's leases. Deaths are real kill -9s of forked processes.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "index/index.h"
#include "spool/queue.h"
#include "proc_util.h"
#include "test_util.h"

namespace spool {
namespace {

using namespace std::chrono_literals;
using test::mono_ns;
using test::spawn;
using test::wait_exit;
using test::wait_for_file;

class BeyondTest : public test::QueueDirTest {
 public:
  // Forks a process that opens the queue, runs `body` on it, then signals `flag` and
  // sleeps until killed.
  pid_t hold(const std::string& flag, const std::function<bool(Queue&)>& body) {
    return spawn([this, flag, body] {
      auto q = Queue::open(qdir());
      if (!q.ok() || !body(**q)) return 1;
      std::ofstream(flag) << "ok";
      for (;;) ::pause();
    });
  }
  void kill9(pid_t pid) {
    ::kill(pid, SIGKILL);
    EXPECT_EQ(wait_exit(pid), 128 + SIGKILL);
  }
};

// ---- back-pressure ---------------------------------------------------------------------

TEST_F(BeyondTest, MaxReadyRefusesExactlyPastTheLimit) {
  QueueOptions o;
  o.max_ready = 5;
  auto q = open(o);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(q->send("m").ok()) << i;
  auto full = q->send("m");
  ASSERT_EQ(full.status().code(), Code::kQueueFull);
  EXPECT_NE(full.status().message().find("5 messages waiting, max_ready is 5"), std::string::npos)
      << full.status().message();
  // A leased message no longer waits: exactly one more fits.
  auto got = q->receive(1);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(q->send("m").ok());
  EXPECT_EQ(q->send("m").status().code(), Code::kQueueFull);
  // A batch is all or nothing against the limit.
  ASSERT_TRUE(q->ack((*got)[0].receipt).ok());
  std::vector<std::string_view> two{"a", "b"};
  EXPECT_EQ(q->send_batch(two).status().code(), Code::kQueueFull);
  EXPECT_EQ(q->stats()->ready, 5u);
}

TEST_F(BeyondTest, MaxBytesCountsPayloadBytesAndAckMakesRoom) {
  QueueOptions o;
  o.max_bytes = 100;
  auto q = open(o);
  ASSERT_TRUE(q->send(std::string(60, 'x')).ok());
  ASSERT_TRUE(q->send(std::string(40, 'y')).ok());
  auto full = q->send("z");
  ASSERT_EQ(full.status().code(), Code::kQueueFull);
  EXPECT_NE(full.status().message().find("max_bytes is 100"), std::string::npos);
  auto got = q->receive(1);
  ASSERT_TRUE(got.ok());
  // Leased messages still hold their bytes on disk; only the ack frees them.
  EXPECT_EQ(q->send("z").status().code(), Code::kQueueFull);
  ASSERT_TRUE(q->ack((*got)[0].receipt).ok());
  EXPECT_TRUE(q->send(std::string(60, 'z')).ok());
}

TEST_F(BeyondTest, ABatchThatCanNeverFitFailsAtOnceEvenWhenAskedToWait) {
  QueueOptions o;
  o.max_ready = 3;
  auto q = open(o);
  std::vector<std::string_view> four{"a", "b", "c", "d"};
  uint64_t t0 = mono_ns();
  auto r = q->send_batch(four, SendOptions{.wait_for_room = 5s});
  EXPECT_EQ(r.status().code(), Code::kQueueFull);
  EXPECT_NE(r.status().message().find("smaller batches"), std::string::npos);
  EXPECT_LT(mono_ns() - t0, 2'500'000'000u) << "waited for room that can never come (5 s)";
}

TEST_F(BeyondTest, LimitsAreStoredWithTheQueue) {
  QueueOptions o;
  o.max_ready = 2;
  o.max_bytes = 1000;
  open(o).reset();
  auto q = open();  // defaults passed: the stored limits win
  EXPECT_EQ(q->options().max_ready, 2u);
  EXPECT_EQ(q->options().max_bytes, 1000u);
}

// A sender blocked on max_ready is woken by a receive in another process (a leased message
// no longer counts against max_ready; no ack is needed). The receive comes once the sender
// sleeps waiting for room; a sender nobody wakes looks again only after its wait slice
// (kMaxWaitSliceNs, 1 s), so 600 ms from the receive to the send's return tells a wake
// from a timeout, with room for a loaded machine under ASan.
TEST_F(BeyondTest, SenderWaitingForRoomIsWokenByAnotherProcessReceive) {
  QueueOptions o;
  o.max_ready = 1;
  auto q = open(o);
  ASSERT_TRUE(q->send("first").ok());
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t sender = spawn([&] {
    auto s = Queue::open(qdir());
    if (!s.ok()) return 1;
    auto id = (*s)->send("second", SendOptions{.wait_for_room = 20s});
    uint64_t t = mono_ns();
    if (!id.ok()) return 2;
    return ::write(fds[1], &t, sizeof t) == sizeof t ? 0 : 3;
  });
  auto parked_by = std::chrono::steady_clock::now() + 10s;
  while (!test::in_timed_futex_wait(sender, sender)) {
    ASSERT_LT(std::chrono::steady_clock::now(), parked_by) << "the sender never slept waiting for room";
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(q->stats()->ready, 1u) << "the sender got room before the receive";
  const uint64_t received = mono_ns();
  auto m = q->receive(1, 60s);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_TRUE(test::readable(fds[0], 15000)) << "the sender did not get room after the receive";
  uint64_t t = 0;
  ASSERT_EQ(::read(fds[0], &t, sizeof t), static_cast<ssize_t>(sizeof t));
  EXPECT_EQ(wait_exit(sender), 0);
  ::close(fds[0]);
  ::close(fds[1]);
  const double ms = static_cast<double>(t - received) / 1e6;
  std::printf("[ room ] %.2f ms from the receive to the waiting send's return\n", ms);
  EXPECT_LT(ms, 600.0) << "the waiting sender was not woken by the receive, it timed out of its wait slice";
  EXPECT_TRUE(q->ack((*m)[0].receipt).ok());
  EXPECT_EQ(q->stats()->ready, 1u);
}

// A retention drop makes room too (docs/semantics.md: "receives, acks, dead-lettering,
// retention and purge wake waiting senders at once"): the only ready message is past
// retention_max_age when a receive in another process finds it, drops it, and the sender
// waiting for room returns within 600 ms (as above: not at the end of its 1 s wait slice).
TEST_F(BeyondTest, SenderWaitingForRoomIsWokenByARetentionDrop) {
  QueueOptions o;
  o.max_ready = 1;
  o.retention_max_age = 200ms;
  auto q = open(o);
  const uint64_t sent_old = mono_ns();
  ASSERT_TRUE(q->send("old").ok());
  // Past the retention age (a lower bound only) before the sender starts waiting, so its
  // wait slice starts just before the receive below.
  while (mono_ns() - sent_old < 300'000'000ull) std::this_thread::sleep_for(5ms);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t sender = spawn([&] {
    auto s = Queue::open(qdir());
    if (!s.ok()) return 1;
    auto id = (*s)->send("new", SendOptions{.wait_for_room = 20s});
    uint64_t t = mono_ns();
    if (!id.ok()) return 2;
    return ::write(fds[1], &t, sizeof t) == sizeof t ? 0 : 3;
  });
  auto parked_by = std::chrono::steady_clock::now() + 10s;
  while (!test::in_timed_futex_wait(sender, sender)) {
    ASSERT_LT(std::chrono::steady_clock::now(), parked_by) << "the sender never slept waiting for room";
    std::this_thread::sleep_for(1ms);
  }
  const uint64_t received = mono_ns();
  EXPECT_EQ(q->receive(1, 60s).status().code(), Code::kEmpty) << "the old message should have been dropped";
  ASSERT_TRUE(test::readable(fds[0], 15000)) << "the sender did not get room after the drop";
  uint64_t t = 0;
  ASSERT_EQ(::read(fds[0], &t, sizeof t), static_cast<ssize_t>(sizeof t));
  EXPECT_EQ(wait_exit(sender), 0);
  ::close(fds[0]);
  ::close(fds[1]);
  const double ms = static_cast<double>(t - received) / 1e6;
  std::printf("[ room ] %.2f ms from the retention drop to the waiting send's return\n", ms);
  EXPECT_LT(ms, 600.0) << "the waiting sender was not woken by the retention drop";
  EXPECT_EQ(q->stats()->expired_total, 1u);
  auto got = q->receive(1, 60s);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(got->front().payload, "new");
}

TEST_F(BeyondTest, SenderGivesUpAfterItsWait) {
  QueueOptions o;
  o.max_ready = 1;
  auto q = open(o);
  ASSERT_TRUE(q->send("first").ok());
  uint64_t t0 = mono_ns();
  auto id = q->send("second", SendOptions{.wait_for_room = 300ms});
  uint64_t waited_ms = (mono_ns() - t0) / 1'000'000;
  EXPECT_EQ(id.status().code(), Code::kQueueFull);
  EXPECT_GE(waited_ms, 290u);
  EXPECT_LT(waited_ms, 3000u);
}

// ---- durability per call ---------------------------------------------------------------

TEST_F(BeyondTest, SyncedSendRaisesTheDurableWatermarkOnAnIntervalQueue) {
  QueueOptions o;
  o.sync = SyncPolicy::kInterval;
  o.sync_interval = Millis(3600'000);  // the flusher will not get there during the test
  auto q = open(o);
  auto lazy = q->send("lazy");
  ASSERT_TRUE(lazy.ok());
  EXPECT_LT(q->durable_id(), *lazy) << "an interval send must not wait for the disk";
  auto durable = q->send("durable", SendOptions{.durability = Durability::kSync});
  ASSERT_TRUE(durable.ok());
  EXPECT_GE(q->durable_id(), *durable);
  // Another process sees the same watermark.
  auto other = open();
  EXPECT_GE(other->durable_id(), *durable);
  auto m = q->receive(1);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(q->ack((*m)[0].receipt, Durability::kSync).ok());
}

// ---- zero-copy receive ------------------------------------------------------------------

TEST_F(BeyondTest, ViewsPointIntoTheSegmentAndOutliveCompactionOfTheirFile) {
  QueueOptions o;
  o.segment_size = 64 << 10;
  auto q = open(o);
  std::string big(20000, 'a');
  for (int i = 0; i < 12; ++i) {
    big[0] = static_cast<char>('a' + i);
    ASSERT_TRUE(q->send(big).ok());
  }
  auto views = q->receive_views(1, Millis(60'000));
  ASSERT_TRUE(views.ok()) << views.status().to_string();
  MessageView v = std::move((*views)[0]);
  ASSERT_EQ(v.payload.size(), 20000u);
  EXPECT_EQ(v.payload[0], 'a');
  EXPECT_EQ(v.receive_count, 1u);
  // The view is the mapping itself, not a copy: it lies inside the segment file's pages.
  std::ifstream in("/proc/self/maps");
  bool in_segment = false;
  for (std::string line; std::getline(in, line);) {
    unsigned long lo = 0, hi = 0;
    if (line.find("/segments/") == std::string::npos || std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) != 2) continue;
    auto p = reinterpret_cast<unsigned long>(v.payload.data());
    in_segment = in_segment || (p >= lo && p + v.payload.size() <= hi);
  }
  EXPECT_TRUE(in_segment) << "the payload is not inside a mapped segment";
  // Ack everything (the viewed one too), so compaction removes the viewed segment's file.
  ASSERT_TRUE(q->ack(v.receipt).ok());
  while (true) {
    auto rest = q->receive(4);
    if (!rest.ok()) break;
    for (auto& m : *rest) ASSERT_TRUE(q->ack(m.receipt).ok());
  }
  ASSERT_TRUE(q->send("head").ok());
  auto c = q->compact();  // the background compactor may have got there first
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(std::filesystem::exists(qdir() + "/segments/00000000000000000001.seg"))
      << "the viewed message's segment was not removed";
  EXPECT_EQ(v.payload[0], 'a');
  EXPECT_EQ(v.payload.substr(1), std::string(19999, 'a'));
}

// ---- instant release on death ----------------------------------------------------------

TEST_F(BeyondTest, BoundLeaseOfAKilledProcessIsReadyLongBeforeItsLeaseEnds) {
  auto q = open();
  ASSERT_TRUE(q->send("job").ok());
  std::string got = dir_ / "got";
  pid_t worker = hold(got, [](Queue& w) {
    return w.bind_leases().ok() && w.receive(1, Millis(60'000)).ok();
  });
  ASSERT_TRUE(wait_for_file(got, 10s));
  ASSERT_EQ(q->stats()->in_flight, 1u);
  kill9(worker);
  uint64_t t0 = mono_ns();
  auto m = q->receive(1, Millis(0), Millis(5000));
  uint64_t ms = (mono_ns() - t0) / 1'000'000;
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_LT(ms, 3000u) << "the 60 s lease must not have to run out";
  EXPECT_EQ((*m)[0].payload, "job");
  EXPECT_EQ((*m)[0].receive_count, 2u);
  EXPECT_EQ(q->check_index(), "");
  auto report = q->verify(false);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
}

// The index header's log end (packed), read from the file as another process would.
uint64_t log_end_of(const std::string& qdir) {
  test::IndexFile f(qdir);
  return f.ok() ? __atomic_load_n(&f.hdr().cache.log_end, __ATOMIC_ACQUIRE) : 0;
}

// Reading calls write nothing to the log, not even the release of a dead binder's lease:
// stats, list and peek show it in flight; the next change (here the receive) releases it.
TEST_F(BeyondTest, ReadsAfterABinderDiedWriteNothingAndTheNextReceiveReleasesItsLease) {
  auto q = open();
  ASSERT_TRUE(q->send("job").ok());
  std::string got = dir_ / "got";
  pid_t worker = hold(got, [](Queue& w) { return w.bind_leases().ok() && w.receive(1, Millis(60'000)).ok(); });
  ASSERT_TRUE(wait_for_file(got, 10s));
  kill9(worker);
  std::this_thread::sleep_for(300ms);  // past the interval between two looks for dead owners
  const uint64_t end = log_end_of(qdir());
  ASSERT_NE(end, 0u);
  for (int i = 0; i < 3; ++i) {
    auto st = q->stats();
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->in_flight, 1u);
    ASSERT_TRUE(q->list(10).ok());
    ASSERT_TRUE(q->peek(10).ok());
    EXPECT_EQ(q->check_index(), "");
  }
  EXPECT_EQ(log_end_of(qdir()), end) << "a read wrote to the log";
  auto m = q->receive(1, Millis(0), Millis(5000));
  ASSERT_TRUE(m.ok() && m->size() == 1) << m.status().to_string();
  EXPECT_EQ((*m)[0].receive_count, 2u);
  EXPECT_NE(log_end_of(qdir()), end);
}

// A binder killed while it holds the index lock: the repair rebuilds the index from the
// log, which does not record bindings; they must survive it.
TEST_F(BeyondTest, BindingSurvivesTheRepairAfterItsOwnerDiedHoldingTheLock) {
  auto q = open();
  ASSERT_TRUE(q->send("job").ok());
  std::string park = dir_ / "park";
  pid_t worker = spawn([&] {
    auto w = Queue::open(qdir());
    if (!w.ok() || !(*w)->bind_leases().ok() || !(*w)->receive(1, Millis(60'000)).ok()) return 1;
    ::setenv("SPOOL_TEST_PARK_IN_LOCK", park.c_str(), 1);
    auto parked = Queue::open(qdir());  // parks inside the lock at its first locked call
    if (!parked.ok()) return 2;
    (void)(*parked)->stats();
    return 3;
  });
  ASSERT_TRUE(wait_for_file(park, 10s));
  kill9(worker);
  ::unlink(park.c_str());
  uint64_t t0 = mono_ns();
  auto m = q->receive(1, Millis(0), Millis(5000));
  uint64_t ms = (mono_ns() - t0) / 1'000'000;
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_LT(ms, 3000u) << "the binding was lost in the repair";
  EXPECT_EQ((*m)[0].receive_count, 2u);
  EXPECT_EQ(q->check_index(), "");
}

TEST_F(BeyondTest, UnboundLeaseWaitsForItsTimeout) {
  auto q = open();
  ASSERT_TRUE(q->send("job").ok());
  std::string got = dir_ / "got";
  pid_t worker = hold(got, [](Queue& w) { return w.receive(1, Millis(60'000)).ok(); });
  ASSERT_TRUE(wait_for_file(got, 10s));
  kill9(worker);
  EXPECT_EQ(q->receive(1, Millis(0), Millis(1500)).status().code(), Code::kEmpty);
}

TEST_F(BeyondTest, BindingOneReceiptReleasesOnlyThatLease) {
  auto q = open();
  ASSERT_TRUE(q->send("bound").ok());
  ASSERT_TRUE(q->send("loose").ok());
  std::string got = dir_ / "got";
  pid_t worker = hold(got, [](Queue& w) {
    auto m = w.receive(2, Millis(60'000));
    return m.ok() && m->size() == 2 && w.bind((*m)[0].receipt).ok();
  });
  ASSERT_TRUE(wait_for_file(got, 10s));
  kill9(worker);
  auto m = q->receive(2, Millis(0), Millis(1500));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ(m->size(), 1u);
  EXPECT_EQ((*m)[0].payload, "bound");
}

TEST_F(BeyondTest, ALiveBindersLeasesStayWhenADeadOnesSlotIsReused) {
  auto q = open();
  ASSERT_TRUE(q->send("of-the-dead").ok());
  std::string got_a = dir_ / "a", got_b = dir_ / "b";
  pid_t a = hold(got_a, [](Queue& w) { return w.bind_leases().ok() && w.receive(1, Millis(60'000)).ok(); });
  ASSERT_TRUE(wait_for_file(got_a, 10s));
  kill9(a);
  ASSERT_TRUE(q->send("of-the-living").ok());
  // B most likely claims the slot A held, before or after anyone noticed A's death.
  pid_t b = hold(got_b, [](Queue& w) {
    if (!w.bind_leases().ok()) return false;
    auto m = w.receive(1, Millis(60'000), Millis(5000));
    return m.ok() && (*m)[0].payload == "of-the-living";
  });
  // If B's receive took the dead one's message instead, the check in hold() fails and no
  // flag appears.
  ASSERT_TRUE(wait_for_file(got_b, 10s));
  auto m = q->receive(1, Millis(0), Millis(3000));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)[0].payload, "of-the-dead");
  EXPECT_EQ(q->receive(1, Millis(0), Millis(1000)).status().code(), Code::kEmpty)
      << "the living binder's lease was released";
  kill9(b);
}

TEST_F(BeyondTest, AForkedChildDoesNotKeepItsParentsBindingAlive) {
  auto q = open();
  ASSERT_TRUE(q->send("job").ok());
  std::string got = dir_ / "got", child_pid = dir_ / "child";
  pid_t worker = hold(got, [&](Queue& w) {
    if (!w.bind_leases().ok() || !w.receive(1, Millis(60'000)).ok()) return false;
    pid_t c = ::fork();  // outlives its parent: no PDEATHSIG
    if (c == 0) {
      ::sleep(20);
      ::_exit(0);
    }
    std::ofstream(child_pid) << c;
    return true;
  });
  ASSERT_TRUE(wait_for_file(got, 10s));
  pid_t orphan = 0;
  std::ifstream(child_pid) >> orphan;
  ASSERT_GT(orphan, 0);
  kill9(worker);
  auto m = q->receive(1, Millis(0), Millis(3000));
  ::kill(orphan, SIGKILL);
  ASSERT_TRUE(m.ok()) << "the child's copy of the descriptor kept the dead parent's lock";
  EXPECT_EQ((*m)[0].payload, "job");
}

TEST_F(BeyondTest, ClosingABindingQueueReleasesItsLeasesAtOnce) {
  auto q = open();
  ASSERT_TRUE(q->send("job").ok());
  {
    auto w = open();
    ASSERT_TRUE(w->bind_leases().ok());
    ASSERT_TRUE(w->receive(1, Millis(60'000)).ok());
  }
  auto m = q->receive(1);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)[0].receive_count, 2u);
}

// Two binders that are both PID 1, each in a PID namespace of its own: killing one releases
// its lease and not the other's. (PIDs play no part; this proves it.)
TEST_F(BeyondTest, PidNamespacesDoNotConfuseOwners) {
  auto q = open();
  ASSERT_TRUE(q->send("one").ok());
  ASSERT_TRUE(q->send("two").ok());
  auto in_namespace = [&](const std::string& name) {
    return spawn([this, name] {
      if (::unshare(CLONE_NEWPID) != 0) {
        std::ofstream(dir_ / (name + ".eperm")) << std::strerror(errno);
        return 1;
      }
      pid_t inner = ::fork();
      if (inner == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        auto w = Queue::open(qdir());
        if (::getpid() != 1 || !w.ok() || !(*w)->bind_leases().ok()) ::_exit(1);
        auto m = (*w)->receive(1, Millis(60'000));
        if (!m.ok()) ::_exit(2);
        std::ofstream(dir_ / (name + ".payload")) << (*m)[0].payload;
        for (;;) ::pause();
      }
      std::ofstream(dir_ / (name + ".pid")) << inner;
      return wait_exit(inner);
    });
  };
  pid_t a = in_namespace("a");
  if (wait_for_file(dir_ / "a.eperm", 300ms)) {
    wait_exit(a);
    GTEST_SKIP() << "SKIPPED LOUDLY: cannot create a PID namespace here (unshare: EPERM)";
  }
  ASSERT_TRUE(wait_for_file(dir_ / "a.payload", 10s));
  pid_t b = in_namespace("b");
  ASSERT_TRUE(wait_for_file(dir_ / "b.payload", 10s));
  pid_t a_inner = 0;
  std::ifstream(dir_ / "a.pid") >> a_inner;
  std::string a_payload;
  std::ifstream(dir_ / "a.payload") >> a_payload;
  ASSERT_GT(a_inner, 1);
  ::kill(a_inner, SIGKILL);
  EXPECT_EQ(wait_exit(a), 128 + SIGKILL);
  auto m = q->receive(2, Millis(0), Millis(3000));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ(m->size(), 1u);
  EXPECT_EQ((*m)[0].payload, a_payload);
  ::kill(b, SIGKILL);
  wait_exit(b);
}

}  // namespace
}  // namespace spool
