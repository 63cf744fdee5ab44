// Issue 26, priorities: receive takes the most urgent ready message first, oldest first
// within a priority; nacked, delayed and expired messages keep theirs; across processes, a
// kill -9 of a process holding the lock, index rebuilds, compaction and the dead-letter
// queue (docs/semantics.md, "Priorities").
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "fake_clock.h"
#include "proc_util.h"
#include "spool/spool.h"
#include "test_util.h"

namespace spool {
namespace {

using namespace std::chrono_literals;
using test::spawn;
using test::wait_exit;

class PriorityTest : public test::QueueDirTest {
 protected:
  static uint64_t send(Queue& q, std::string_view payload, uint8_t priority, Millis delay = Millis(0)) {
    SendOptions o;
    o.priority = priority;
    o.delay = delay;
    auto id = q.send(payload, o);
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    return id.ok() ? *id : 0;
  }
  // Receives one message at a time until the queue is empty; the payloads in order.
  static std::vector<std::string> drain(Queue& q) {
    std::vector<std::string> out;
    for (;;) {
      auto ms = q.receive(1);
      if (!ms.ok()) {
        EXPECT_EQ(ms.status().code(), Code::kEmpty) << ms.status().to_string();
        return out;
      }
      if (ms->empty()) return out;
      out.push_back(ms->front().payload);
      EXPECT_TRUE(q.ack(ms->front().receipt).ok());
    }
  }
  // Sends the fixed mix the order tests use: its payloads name their priority and rank.
  static void send_mix(Queue& q) {
    send(q, "d1", kDefaultPriority);
    send(q, "p200a", 200);
    send(q, "p5a", 5);
    send(q, "d2", kDefaultPriority);
    send(q, "p0a", 0);
    send(q, "p5b", 5);
    send(q, "p200b", 200);
    send(q, "d3", kDefaultPriority);
    send(q, "p0b", 0);
  }
  static std::vector<std::string> mix_order() {
    return {"p0a", "p0b", "p5a", "p5b", "d1", "d2", "d3", "p200a", "p200b"};
  }
};

TEST_F(PriorityTest, ReceiveTakesTheMostUrgentFirstAndTheOldestFirstWithinAPriority) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  send_mix(*q);
  EXPECT_EQ(drain(*q), mix_order());
  EXPECT_EQ(q->check_index(), "");
  // A batch receive takes them in the same order.
  send_mix(*q);
  auto ms = q->receive(100);
  ASSERT_TRUE(ms.ok()) << ms.status().to_string();
  std::vector<std::string> got;
  for (auto& m : *ms) {
    got.push_back(m.payload);
    EXPECT_EQ(m.priority, m.payload[0] == 'd' ? kDefaultPriority : std::stoi(m.payload.substr(1)));
  }
  EXPECT_EQ(got, mix_order());
  EXPECT_EQ(q->check_index(), "");
}

TEST_F(PriorityTest, ABatchGivesEachItemItsPriorityAndPeekShowsIt) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  std::vector<SendItem> items{{"late", {}, {}, 250}, {"urgent", {}, {}, 1}, {"plain", {}, {}}};
  ASSERT_TRUE(q->send_batch(std::span<const SendItem>(items)).ok());
  SendOptions all;
  all.priority = 3;
  std::vector<std::string_view> payloads{"b1", "b2"};
  ASSERT_TRUE(q->send_batch(std::span<const std::string_view>(payloads), all).ok());
  auto peeked = q->peek(10);
  ASSERT_TRUE(peeked.ok());
  std::map<std::string, int> pri;
  for (auto& m : *peeked) pri[m.payload] = m.priority;
  EXPECT_EQ(pri, (std::map<std::string, int>{{"late", 250}, {"urgent", 1}, {"plain", 128}, {"b1", 3}, {"b2", 3}}));
  EXPECT_EQ(drain(*q), (std::vector<std::string>{"urgent", "b1", "b2", "plain", "late"}));
  // A batch of items cannot also take a priority from its options.
  auto bad = q->send_batch(std::span<const SendItem>(items), all);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("priorities"), std::string::npos) << bad.status().to_string();
}

TEST_F(PriorityTest, NackedDelayedAndExpiredMessagesKeepTheirPriority) {
  auto clock = std::make_shared<test::FakeClockEnv>();
  auto q = open(test::on_clock(clock));
  ASSERT_NE(q, nullptr);
  // Nacked: the urgent one comes back before the older plain ones.
  send(*q, "d1", kDefaultPriority);
  send(*q, "urgent", 0);
  auto m = q->receive(1);
  ASSERT_TRUE(m.ok() && m->size() == 1);
  ASSERT_EQ(m->front().payload, "urgent");
  ASSERT_TRUE(q->nack(m->front().receipt).ok());
  send(*q, "d2", kDefaultPriority);
  m = q->receive(1);
  ASSERT_TRUE(m.ok() && m->size() == 1);
  EXPECT_EQ(m->front().payload, "urgent") << "a nack lost the priority";
  EXPECT_EQ(m->front().receive_count, 2u);
  ASSERT_TRUE(q->ack(m->front().receipt).ok());
  // A plain message nacked goes behind an urgent one sent after it, and behind a plain one
  // that was ready before the nack.
  m = q->receive(1);
  ASSERT_TRUE(m.ok() && m->size() == 1);
  ASSERT_EQ(m->front().payload, "d1");
  ASSERT_TRUE(q->nack(m->front().receipt).ok());
  send(*q, "urgent2", 1);
  EXPECT_EQ(drain(*q), (std::vector<std::string>{"urgent2", "d2", "d1"}));

  // Delayed: not before its time, then before every plain message.
  send(*q, "late-urgent", 0, Millis(300));
  send(*q, "d3", kDefaultPriority);
  m = q->receive(1);
  ASSERT_TRUE(m.ok() && m->size() == 1);
  EXPECT_EQ(m->front().payload, "d3") << "a delayed message came early";
  ASSERT_TRUE(q->nack(m->front().receipt).ok());
  clock->advance(301ms);
  send(*q, "d4", kDefaultPriority);
  EXPECT_EQ(drain(*q), (std::vector<std::string>{"late-urgent", "d3", "d4"}));

  // A lease that expires: the message is ready again with its priority.
  send(*q, "short-lease", 2);
  m = q->receive(1, Millis(200));
  ASSERT_TRUE(m.ok() && m->size() == 1);
  ASSERT_EQ(m->front().payload, "short-lease");
  send(*q, "d5", kDefaultPriority);
  clock->advance(201ms);
  send(*q, "d6", kDefaultPriority);
  EXPECT_EQ(drain(*q), (std::vector<std::string>{"short-lease", "d5", "d6"}));
  EXPECT_EQ(q->check_index(), "");
}

// Another process sends the mix and is killed while it holds the index lock: the next
// locker rebuilds the index from the log, priorities included; so does an opener that finds
// no index, and compaction's copies keep them.
TEST_F(PriorityTest, PrioritiesSurviveAKillInTheLockARebuildAndCompaction) {
  QueueOptions o;
  o.segment_size = 4096;
  { ASSERT_NE(open(o), nullptr); }
  const std::string parked = dir_ / "parked";
  pid_t child = spawn([&] {
    {
      auto cq = Queue::open(qdir());
      if (!cq.ok()) return 1;
      send_mix(**cq);
    }
    ::setenv("SPOOL_TEST_PARK_IN_LOCK", parked.c_str(), 1);
    auto cq = Queue::open(qdir());  // parks in its first lock until killed
    if (!cq.ok()) return 1;
    (void)(*cq)->send("never");
    return 2;
  });
  ASSERT_TRUE(test::wait_for_file(parked, 10s)) << "the child never took the lock";
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  EXPECT_EQ(wait_exit(child), 128 + SIGKILL);
  auto q = open(o);
  ASSERT_NE(q, nullptr);
  // Filler that is acked, so that compaction has segments to remove and copies the mix.
  // Each is received by its id: a receive would take the mix first, and a nack would
  // change its order.
  std::vector<uint64_t> fillers;
  for (int i = 0; i < 100; ++i) fillers.push_back(send(*q, std::string(100, 'f'), 255));
  auto peeked = q->peek(1000);
  ASSERT_TRUE(peeked.ok());
  ASSERT_EQ(peeked->size(), 109u);
  for (uint64_t id : fillers) {
    auto m = q->receive_id(id, 60s);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    ASSERT_TRUE(q->ack(m->receipt).ok());
  }
  auto c = q->compact();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  // By this call or by the background compaction a roll started: the mix, in the first
  // segment, was copied out of it.
  ASSERT_FALSE(std::filesystem::exists(qdir() + "/segments/00000000000000000001.seg"))
      << "the mix was not copied by a compaction";
  q.reset();
  ASSERT_EQ(::unlink((qdir() + "/index").c_str()), 0);
  q = open(o);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(drain(*q), mix_order()) << "after a kill in the lock, compaction and a rebuild";
  EXPECT_EQ(q->check_index(), "");
}

TEST_F(PriorityTest, ADeadLetterKeepsItsPriorityAndRedriveToo) {
  QueueOptions o;
  o.max_receives = 1;
  auto q = open(o);
  ASSERT_NE(q, nullptr);
  send(*q, "doomed", 7);
  auto m = q->receive(1);
  ASSERT_TRUE(m.ok() && m->size() == 1);
  ASSERT_TRUE(q->nack(m->front().receipt).ok());
  m = q->receive(1);  // past max_receives: dead-lettered
  ASSERT_TRUE(!m.ok() && m.status().code() == Code::kEmpty) << m.status().to_string();
  auto dlq = q->dead_letters();
  ASSERT_TRUE(dlq.ok()) << dlq.status().to_string();
  auto dead = (*dlq)->peek(10);
  ASSERT_TRUE(dead.ok()) << dead.status().to_string();
  ASSERT_EQ(dead->size(), 1u);
  EXPECT_EQ(dead->front().priority, 7);
  send(*q, "plain", kDefaultPriority);
  auto n = q->redrive(10);
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  ASSERT_EQ(*n, 1u);
  m = q->receive(1);
  ASSERT_TRUE(m.ok() && m->size() == 1);
  EXPECT_EQ(m->front().payload, "doomed") << "redrive lost the priority";
  EXPECT_EQ(m->front().priority, 7);
}

// A byte retention limit drops the oldest ready message, not the most urgent one (the one a
// receive would take).
TEST_F(PriorityTest, RetentionByBytesDropsTheOldestNotTheMostUrgent) {
  QueueOptions o;
  o.retention_max_bytes = 300;
  auto q = open(o);
  ASSERT_NE(q, nullptr);
  send(*q, std::string(100, 'a'), kDefaultPriority);
  send(*q, std::string(100, 'u'), 0);
  send(*q, std::string(100, 'c'), kDefaultPriority);
  send(*q, std::string(100, 'd'), kDefaultPriority);  // 400 bytes: one must go
  auto order = drain(*q);
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[0][0], 'u') << "the urgent message was dropped";
  EXPECT_EQ(order[1][0], 'c');
  EXPECT_EQ(order[2][0], 'd');
}

// Random sends, receives, nacks and acks against a model: every receive takes a message of
// the most urgent priority ready, and plain messages that were never nacked come in send
// order.
TEST_F(PriorityTest, EveryReceiveTakesTheMostUrgentReadyMessage) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  std::mt19937 rng(26);
  std::map<uint64_t, int> ready;  // id -> priority
  std::map<uint64_t, std::string> held;
  uint64_t last_fresh_plain = 0;
  std::set<uint64_t> nacked;
  const uint8_t pris[] = {0, 1, 7, 128, 128, 128, 200, 255};
  for (int step = 0; step < test::scaled(4000); ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 4) {
      const uint8_t p = pris[rng() % std::size(pris)];
      uint64_t id = send(*q, "m", p);
      ready[id] = p;
    } else if (op < 7) {
      auto ms = q->receive(1);
      if (ready.empty()) {
        EXPECT_TRUE(!ms.ok() || ms->empty());
        continue;
      }
      ASSERT_TRUE(ms.ok() && ms->size() == 1) << ms.status().to_string();
      const Message& m = ms->front();
      int best = 256;
      for (auto& [id, p] : ready) best = std::min(best, p);
      ASSERT_EQ(ready.count(m.id), 1u) << "message " << m.id << " was not ready";
      ASSERT_EQ(ready[m.id], best) << "step " << step << ": took priority " << ready[m.id] << " with " << best
                                   << " ready";
      EXPECT_EQ(m.priority, best);
      if (best == kDefaultPriority && !nacked.count(m.id)) {
        EXPECT_GT(m.id, last_fresh_plain) << "plain messages out of send order";
        last_fresh_plain = m.id;
      }
      ready.erase(m.id);
      held[m.id] = m.receipt;
    } else if (!held.empty()) {
      auto it = std::next(held.begin(), static_cast<long>(rng() % held.size()));
      if (op < 9) {
        ASSERT_TRUE(q->ack(it->second).ok());
      } else {
        ASSERT_TRUE(q->nack(it->second).ok());
        auto m = q->peek(1000000);
        ASSERT_TRUE(m.ok());
        for (auto& x : *m) {
          if (x.id == it->first) ready[x.id] = x.priority;
        }
        nacked.insert(it->first);
      }
      held.erase(it);
    }
  }
  EXPECT_EQ(q->check_index(), "");
}

}  // namespace
}  // namespace spool
