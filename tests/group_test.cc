// Issue 26, ordered groups: the messages of one group are received one at a time, in send
// order; the next only once the one before is acked, dead-lettered or dropped, while a nack
// or an expired lease redelivers the same one first. Different groups and ungrouped
// messages go on in parallel. Across processes, a kill -9 in the lock, index rebuilds and
// compaction copies (docs/semantics.md, "Ordered groups").
#include <fcntl.h>
#include <sys/file.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "fake_clock.h"
#include "proc_util.h"
#include "spool/spool.h"
#include "storage/format.h"
#include "test_util.h"

namespace spool {
namespace {

using namespace std::chrono_literals;
using test::spawn;
using test::wait_exit;

class GroupTest : public test::QueueDirTest {
 protected:
  static uint64_t send(Queue& q, std::string_view payload, std::string group, Millis delay = Millis(0),
                       uint8_t priority = kDefaultPriority) {
    SendOptions o;
    o.group = std::move(group);
    o.delay = delay;
    o.priority = priority;
    auto id = q.send(payload, o);
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    return id.ok() ? *id : 0;
  }
  // The payloads a receive of up to `n` gives now, in order (nothing acked).
  static std::vector<Message> take(Queue& q, size_t n, Millis vis = Millis(0)) {
    auto ms = q.receive(n, vis);
    if (!ms.ok()) {
      EXPECT_EQ(ms.status().code(), Code::kEmpty) << ms.status().to_string();
      return {};
    }
    return std::move(*ms);
  }
  static std::vector<std::string> payloads(const std::vector<Message>& ms) {
    std::vector<std::string> out;
    for (const auto& m : ms) out.push_back(m.payload);
    return out;
  }
  // Receives and acks one message at a time until the queue is empty.
  static std::vector<std::string> drain(Queue& q) {
    std::vector<std::string> out;
    for (;;) {
      auto ms = take(q, 1);
      if (ms.empty()) return out;
      out.push_back(ms.front().payload);
      EXPECT_TRUE(q.ack(ms.front().receipt).ok());
    }
  }
};

TEST_F(GroupTest, AGroupIsReceivedOneAtATimeInSendOrderBesideOthers) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  send(*q, "a1", "a");
  send(*q, "b1", "b");
  send(*q, "a2", "a");
  ASSERT_TRUE(q->send("plain1").ok());
  send(*q, "a3", "a");
  send(*q, "b2", "b");
  ASSERT_TRUE(q->send("plain2").ok());
  auto st = q->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->ready, 4u);
  EXPECT_EQ(st->blocked, 3u);
  // Everything receivable now: each group's first, and every ungrouped message.
  auto got = take(*q, 100);
  EXPECT_EQ(payloads(got), (std::vector<std::string>{"a1", "b1", "plain1", "plain2"}));
  EXPECT_EQ(got[0].group, "a");
  EXPECT_EQ(got[2].group, "");
  EXPECT_TRUE(take(*q, 100).empty()) << "a group's second message was receivable while its first was in flight";
  // Acking b1 lets b2 through, not a2.
  ASSERT_TRUE(q->ack(got[1].receipt).ok());
  auto next = take(*q, 100);
  EXPECT_EQ(payloads(next), (std::vector<std::string>{"b2"}));
  ASSERT_TRUE(q->ack(got[0].receipt).ok());
  EXPECT_EQ(payloads(take(*q, 100)), (std::vector<std::string>{"a2"}));
  EXPECT_EQ(q->check_index(), "");
  st = q->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->blocked, 1u);  // a3
}

TEST_F(GroupTest, ANackOrAnExpiredLeaseRedeliversTheSameMessageFirst) {
  auto clock = std::make_shared<test::FakeClockEnv>();
  auto q = open(test::on_clock(clock));
  ASSERT_NE(q, nullptr);
  send(*q, "a1", "a");
  send(*q, "a2", "a");
  auto m = take(*q, 10);
  ASSERT_EQ(payloads(m), (std::vector<std::string>{"a1"}));
  ASSERT_TRUE(q->nack(m[0].receipt).ok());
  m = take(*q, 10);
  ASSERT_EQ(payloads(m), (std::vector<std::string>{"a1"})) << "a nack let the next one pass";
  EXPECT_EQ(m[0].receive_count, 2u);
  // A nack with a delay holds the group back for as long.
  ASSERT_TRUE(q->nack(m[0].receipt, Millis(300)).ok());
  EXPECT_TRUE(take(*q, 10).empty()) << "the group went on during its first message's nack delay";
  clock->advance(299ms);
  EXPECT_TRUE(take(*q, 10).empty()) << "the nack delay ended early";
  clock->advance(2ms);
  m = take(*q, 10, Millis(200));
  ASSERT_EQ(payloads(m), (std::vector<std::string>{"a1"}));
  // A lease that runs out: the same one again.
  clock->advance(201ms);
  m = take(*q, 10);
  ASSERT_EQ(payloads(m), (std::vector<std::string>{"a1"})) << "an expired lease let the next one pass";
  EXPECT_EQ(m[0].receive_count, 4u);
  ASSERT_TRUE(q->ack(m[0].receipt).ok());
  EXPECT_EQ(drain(*q), (std::vector<std::string>{"a2"}));
  EXPECT_EQ(q->check_index(), "");
}

TEST_F(GroupTest, DelaysAndPrioritiesApplyToAGroupsFirstOnly) {
  auto clock = std::make_shared<test::FakeClockEnv>();
  auto q = open(test::on_clock(clock));
  ASSERT_NE(q, nullptr);
  send(*q, "a1", "a");
  send(*q, "a2", "a", Millis(400));       // delayed: not before its time, even once a1 is gone
  send(*q, "a3", "a", Millis(0), 0);      // most urgent, but behind a2 in its group
  send(*q, "p", "", Millis(0), 200);
  auto m = take(*q, 1);
  ASSERT_EQ(payloads(m), (std::vector<std::string>{"a1"}));
  ASSERT_TRUE(q->ack(m[0].receipt).ok());
  m = take(*q, 10);
  ASSERT_EQ(payloads(m), (std::vector<std::string>{"p"})) << "a2 came before its delay, or a3 passed it";
  ASSERT_TRUE(q->ack(m[0].receipt).ok());
  clock->advance(401ms);
  EXPECT_EQ(drain(*q), (std::vector<std::string>{"a2", "a3"}));
}

// A long poll in another process wakes when an ack releases the next message of a group,
// not at the end of its wait slice (a second).
TEST_F(GroupTest, AnAckThatReleasesTheNextWakesALongPollInAnotherProcess) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  send(*q, "a1", "a");
  send(*q, "a2", "a");
  auto m = take(*q, 1);
  ASSERT_EQ(payloads(m), (std::vector<std::string>{"a1"}));
  const std::string ready = dir_ / "polling";
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t child = spawn([&] {
    auto cq = Queue::open(qdir());
    if (!cq.ok()) return 1;
    std::ofstream(ready).put('x');
    auto got = (*cq)->receive(1, Millis(0), Millis(5000));
    const uint64_t at = test::mono_ns();
    if (!got.ok() || got->size() != 1 || got->front().payload != "a2") return 2;
    return ::write(fds[1], &at, sizeof at) == sizeof at ? 0 : 3;
  });
  ASSERT_TRUE(test::wait_for_file(ready, 10s));
  std::this_thread::sleep_for(200ms);  // the child is asleep in its long poll by now
  const uint64_t acked = test::mono_ns();
  ASSERT_TRUE(q->ack(m[0].receipt).ok());
  EXPECT_EQ(wait_exit(child), 0);
  uint64_t got_at = 0;
  ASSERT_EQ(::read(fds[0], &got_at, sizeof got_at), static_cast<ssize_t>(sizeof got_at));
  ::close(fds[0]);
  ::close(fds[1]);
  EXPECT_LT(got_at - acked, 700'000'000u) << "the long poll was not woken by the ack that released a2";
}

TEST_F(GroupTest, ABlockedMessageCannotBeReceivedByIdAndShowsBlocked) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  const uint64_t a1 = send(*q, "a1", "a");
  const uint64_t a2 = send(*q, "a2", "a");
  auto r = q->receive_id(a2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kEmpty);
  EXPECT_NE(r.status().message().find("waits for message " + std::to_string(a1)), std::string::npos)
      << r.status().to_string();
  auto shown = q->show(a2);
  ASSERT_TRUE(shown.ok()) << shown.status().to_string();
  EXPECT_EQ(shown->second.state, MessageState::kBlocked);
  EXPECT_FALSE(shown->second.ready);
  EXPECT_EQ(shown->first.group, "a");
  auto listed = q->list(10, StateFilter::only(MessageState::kBlocked));
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->front().id, a2);
  listed = q->list(10);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 2u) << "list without a filter shows blocked messages too";
  // Receiving the first by id is allowed, and then the second is next.
  auto first = q->receive_id(a1);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  ASSERT_TRUE(q->ack(first->receipt).ok());
  EXPECT_TRUE(q->receive_id(a2).ok());
}

TEST_F(GroupTest, ADeadLetterLetsTheNextThroughAndKeepsItsGroupForRedrive) {
  QueueOptions o;
  o.max_receives = 1;
  auto q = open(o);
  ASSERT_NE(q, nullptr);
  send(*q, "a1", "a");
  send(*q, "a2", "a");
  auto m = take(*q, 10);
  ASSERT_EQ(payloads(m), (std::vector<std::string>{"a1"}));
  ASSERT_TRUE(q->nack(m[0].receipt).ok());
  // Past max_receives a1 is dead-lettered by this receive, which then takes a2.
  m = take(*q, 10);
  ASSERT_EQ(payloads(m), (std::vector<std::string>{"a2"})) << "the dead letter did not release its group";
  auto dlq = q->dead_letters();
  ASSERT_TRUE(dlq.ok());
  auto dead = (*dlq)->peek(10);
  ASSERT_TRUE(dead.ok());
  ASSERT_EQ(dead->size(), 1u);
  EXPECT_EQ(dead->front().group, "a");
  // Redriven while a2 is in flight: a1 goes behind it in its group.
  send(*q, "a3", "a");
  auto n = q->redrive(10);
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(*n, 1u);
  EXPECT_TRUE(take(*q, 10).empty());
  ASSERT_TRUE(q->ack(m[0].receipt).ok());
  EXPECT_EQ(drain(*q), (std::vector<std::string>{"a3", "a1"}));
}

TEST_F(GroupTest, RetentionAndPurgeReleaseOrDropBlockedMessages) {
  QueueOptions o;
  o.retention_max_bytes = 300;
  auto q = open(o);
  ASSERT_NE(q, nullptr);
  send(*q, std::string(100, '1'), "a");
  send(*q, std::string(100, '2'), "a");
  send(*q, std::string(100, '3'), "a");
  send(*q, std::string(100, '4'), "a");  // over 300 bytes: the oldest ready one (1) goes
  auto order = drain(*q);
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[0][0], '2');
  EXPECT_EQ(order[2][0], '4');
  send(*q, "x", "a");
  send(*q, "y", "a");
  ASSERT_TRUE(q->purge().ok());
  EXPECT_EQ(q->check_index(), "");
  send(*q, "z", "a");
  EXPECT_EQ(drain(*q), (std::vector<std::string>{"z"})) << "a purged group still held its order";
}

// Compaction copies a group's first messages to the log end, after the later ones; a
// rebuild from that log must still put them first, in id order. Here a1 and a2 are copied
// and a3..a5 are not: a replay meets a3..a5, then a1 (before the first), then a2 (between).
TEST_F(GroupTest, ARebuildAfterCompactionKeepsTheSendOrder) {
  QueueOptions o;
  o.segment_size = 4096;
  auto q = open(o);
  ASSERT_NE(q, nullptr);
  send(*q, "a1", "a");
  send(*q, "b1", "b");
  send(*q, "a2", "a");
  // Filler that rolls the log on: a1..a2's segment is sealed.
  for (int round = 0; round < 4; ++round) {
    const std::vector<std::string> bodies(10, std::string(100, 'f'));
    const std::vector<std::string_view> fill(bodies.begin(), bodies.end());
    ASSERT_TRUE(q->send_batch(std::span<const std::string_view>(fill)).ok());
  }
  // The filler is acked while this test holds compaction's lock, so that no background
  // compaction copies a1..a2 before a3..a5 are written.
  const int lock_fd = ::open((qdir() + "/compact.lock").c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(lock_fd, 0);
  ASSERT_EQ(::flock(lock_fd, LOCK_EX), 0);
  for (;;) {
    auto ms = take(*q, 50);
    bool any = false;
    for (auto& m : ms) {
      if (m.group.empty()) {
        ASSERT_TRUE(q->ack(m.receipt).ok());
        any = true;
      } else {
        ASSERT_TRUE(q->nack(m.receipt).ok());
      }
    }
    if (!any) break;
  }
  send(*q, "a3", "a");
  send(*q, "a4", "a");
  send(*q, "b2", "b");
  send(*q, "a5", "a");
  ::close(lock_fd);
  auto c = q->compact();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  // (By this call or by the background compaction a roll starts.)
  ASSERT_FALSE(std::filesystem::exists(qdir() + "/segments/00000000000000000001.seg"))
      << "a1 and a2 were not copied out of the first segment; the test proves nothing";
  q.reset();
  ASSERT_EQ(::unlink((qdir() + "/index").c_str()), 0);
  q = open(o);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->check_index(), "");
  auto st = q->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->blocked, 5u);
  std::vector<std::string> a, b;
  for (auto& p : drain(*q)) (p[0] == 'a' ? a : b).push_back(p.substr(0, 2));
  EXPECT_EQ(a, (std::vector<std::string>{"a1", "a2", "a3", "a4", "a5"})) << "after compaction and a rebuild";
  EXPECT_EQ(b, (std::vector<std::string>{"b1", "b2"}));
}

// A sender killed -9 while it holds the index lock: the next locker rebuilds, and the
// groups keep their order and their one-at-a-time rule.
TEST_F(GroupTest, AKillInTheLockKeepsTheGroups) {
  { ASSERT_NE(open(), nullptr); }
  const std::string parked = dir_ / "parked";
  pid_t child = spawn([&] {
    {
      auto cq = Queue::open(qdir());
      if (!cq.ok()) return 1;
      for (int i = 0; i < 20; ++i) {
        SendOptions so;
        so.group = "g" + std::to_string(i % 3);
        if (!(*cq)->send(so.group + ":" + std::to_string(i / 3), so).ok()) return 1;
      }
    }
    ::setenv("SPOOL_TEST_PARK_IN_LOCK", parked.c_str(), 1);
    auto cq = Queue::open(qdir());
    if (!cq.ok()) return 1;
    (void)(*cq)->receive(1);
    return 2;
  });
  ASSERT_TRUE(test::wait_for_file(parked, 10s)) << "the child never took the lock";
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  EXPECT_EQ(wait_exit(child), 128 + SIGKILL);
  auto q = open();
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->check_index(), "");
  auto firsts = take(*q, 100);
  EXPECT_EQ(payloads(firsts), (std::vector<std::string>{"g0:0", "g1:0", "g2:0"}));
  for (auto& m : firsts) ASSERT_TRUE(q->ack(m.receipt).ok());
  std::map<std::string, std::vector<std::string>> per;
  for (auto& p : drain(*q)) per[p.substr(0, 2)].push_back(p.substr(3));
  EXPECT_EQ(per["g0"], (std::vector<std::string>{"1", "2", "3", "4", "5", "6"}));
  EXPECT_EQ(per["g2"], (std::vector<std::string>{"1", "2", "3", "4", "5"}));
}

// Competing consumer processes on many groups: every process logs each receive after it
// returns and each ack before it is made, appending to one file; for every group the log
// must show its messages received and acked strictly in send order, never two in flight.
TEST_F(GroupTest, CompetingProcessesNeverHoldTwoOfAGroupAndAckInSendOrder) {
  { ASSERT_NE(open(), nullptr); }
  const int kGroups = 8, kPer = test::scaled(60);
  {
    auto q = open();
    ASSERT_NE(q, nullptr);
    std::vector<SendItem> items;
    std::vector<std::string> bodies;
    bodies.reserve(kGroups * kPer);
    for (int i = 0; i < kPer; ++i) {
      for (int g = 0; g < kGroups; ++g) bodies.push_back(std::to_string(g) + " " + std::to_string(i));
    }
    for (size_t i = 0; i < bodies.size(); ++i) {
      SendItem it{bodies[i]};
      it.group = "g" + bodies[i].substr(0, bodies[i].find(' '));
      if (i % 5 == 0) it.priority = static_cast<uint8_t>(i % 7);
      items.push_back(it);
    }
    ASSERT_TRUE(q->send_batch(std::span<const SendItem>(items)).ok());
    for (int i = 0; i < 30; ++i) ASSERT_TRUE(q->send("plain").ok());
  }
  const std::string log = dir_ / "log";
  std::vector<pid_t> kids;
  for (int k = 0; k < 3; ++k) {
    kids.push_back(spawn([&, k] {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      auto cq = Queue::open(qdir());
      if (fd < 0 || !cq.ok()) return 1;
      std::mt19937 rng(static_cast<unsigned>(k));
      int idle = 0;
      while (idle < 20) {
        auto ms = (*cq)->receive(1 + rng() % 4, Millis(0), Millis(50));
        if (!ms.ok() || ms->empty()) {
          ++idle;
          continue;
        }
        idle = 0;
        for (auto& m : *ms) {
          if (m.group.empty()) {
            (void)(*cq)->ack(m.receipt);
            continue;
          }
          std::string line = "recv " + m.payload + "\n";
          if (::write(fd, line.data(), line.size()) < 0) return 1;
          if (rng() % 6 == 0) {
            line = "nack " + m.payload + "\n";
            if (::write(fd, line.data(), line.size()) < 0) return 1;
            if (!(*cq)->nack(m.receipt).ok()) return 3;
            continue;
          }
          line = "ack " + m.payload + "\n";
          if (::write(fd, line.data(), line.size()) < 0) return 1;
          if (!(*cq)->ack(m.receipt).ok()) return 4;
        }
      }
      return 0;
    }));
  }
  for (pid_t k : kids) EXPECT_EQ(wait_exit(k), 0);
  std::ifstream in(log);
  std::string op, g, i;
  std::map<std::string, int> acked;       // group -> messages acked so far
  std::map<std::string, int> in_flight;   // group -> the one received and not yet acked/nacked, or -1
  uint64_t lines = 0;
  while (in >> op >> g >> i) {
    ++lines;
    const int n = std::stoi(i);
    if (!in_flight.count(g)) in_flight[g] = -1;
    if (op == "recv") {
      ASSERT_EQ(in_flight[g], -1) << "group " << g << ": message " << n << " received while " << in_flight[g]
                                  << " was in flight";
      ASSERT_EQ(n, acked[g]) << "group " << g << ": received message " << n << " before " << acked[g];
      in_flight[g] = n;
    } else {
      ASSERT_EQ(in_flight[g], n) << op << " of a message not in flight";
      in_flight[g] = -1;
      if (op == "ack") ++acked[g];
    }
  }
  EXPECT_GE(lines, static_cast<uint64_t>(2 * kGroups * kPer));
  for (int gi = 0; gi < kGroups; ++gi) EXPECT_EQ(acked[std::to_string(gi)], kPer) << "group " << gi;
  auto q = open();
  ASSERT_NE(q, nullptr);
  auto st = q->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->ready + st->in_flight + st->blocked, 0u);
  EXPECT_EQ(q->check_index(), "");
}

// A group send into a queue whose active segment an older build wrote (version 2, which
// would skip the GROUP entry) goes to a new segment of the current version.
TEST_F(GroupTest, AGroupSendIntoAnOlderSegmentRollsFirst) {
  {
    auto q = open();
    ASSERT_NE(q, nullptr);
    ASSERT_TRUE(q->send("old").ok());
  }
  const std::string seg = qdir() + "/segments/00000000000000000001.seg";
  {
    int fd = ::open(seg.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    unsigned char h[64];
    ASSERT_EQ(::pread(fd, h, 64, 0), 64);
    const uint32_t v2 = 2;
    std::memcpy(h + 8, &v2, 4);
    const uint64_t sum = XXH3_64bits(h, 56);
    std::memcpy(h + 56, &sum, 8);
    ASSERT_EQ(::pwrite(fd, h, 64, 0), 64);
    ::close(fd);
  }
  ASSERT_EQ(::unlink((qdir() + "/index").c_str()), 0);
  auto q = open();
  ASSERT_NE(q, nullptr);
  send(*q, "grouped", "a");
  q.reset();
  auto version = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    char h[12] = {};
    f.read(h, sizeof h);
    uint32_t v;
    std::memcpy(&v, h + 8, 4);
    return v;
  };
  EXPECT_EQ(version(seg), 2u);
  EXPECT_EQ(version(qdir() + "/segments/00000000000000000002.seg"), format::kVersion);
  q = open();
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(drain(*q), (std::vector<std::string>{"old", "grouped"}));
}

TEST_F(GroupTest, AGroupKeyLongerThan128BytesIsRefused) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  SendOptions o;
  o.group = std::string(129, 'g');
  auto r = q->send("x", o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("group key of 129 bytes"), std::string::npos) << r.status().to_string();
  o.group = std::string(128, 'g');
  EXPECT_TRUE(q->send("x", o).ok());
}

}  // namespace
}  // namespace spool
