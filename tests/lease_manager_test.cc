// LeaseManager: one timer thread keeping hundreds of leases alive on a real queue, against
// competing consumers in this process and in a forked one.
#include "spool/lease_manager.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "spool/queue.h"
#include "test_util.h"

namespace spool {
namespace {

using namespace std::chrono_literals;
using Clock = LeaseManager::Clock;
using State = LeaseManager::LeaseState;

class LeaseManagerTest : public test::QueueDirTest {
 protected:
  // Sends `n` messages and receives them all with `visibility`; each comes with the time
  // its lease ends no earlier than (taken before the receive).
  struct Held {
    std::vector<Message> msgs;
    Clock::time_point lease_end;
  };
  static Held send_and_receive(Queue& q, int n, Millis visibility) {
    std::vector<std::string> bodies;
    for (int i = 0; i < n; ++i) bodies.push_back("task " + std::to_string(i));
    std::vector<std::string_view> views(bodies.begin(), bodies.end());
    EXPECT_TRUE(q.send_batch(views).ok());
    Held h;
    h.lease_end = Clock::now() + visibility;
    while (h.msgs.size() < static_cast<size_t>(n)) {
      auto got = q.receive(static_cast<size_t>(n) - h.msgs.size(), visibility);
      EXPECT_TRUE(got.ok()) << got.status().to_string();
      if (!got.ok()) break;
      for (Message& m : *got) h.msgs.push_back(std::move(m));
    }
    return h;
  }

  static std::unique_ptr<LeaseManager> manager(Queue& q, LeaseManager::Options o) {
    auto m = LeaseManager::start(q, std::move(o));
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    return m.ok() ? std::move(*m) : nullptr;
  }

  // Renewals to 300 ms from then, 150 ms before a lease ends: the leases live a 300 ms
  // visibility at a time, as a worker's would.
  static LeaseManager::Options short_leases() {
    LeaseManager::Options o;
    o.extend_by = 300ms;
    o.margin = 150ms;
    o.min_remaining = 100ms;
    o.max_lifetime = 60s;
    return o;
  }

  // The queue, a second handle on it (another consumer) and a manager on the first.
  struct Rig {
    std::unique_ptr<Queue> q, other;
    std::unique_ptr<LeaseManager> lm;
    bool ok() const { return q && other && lm; }
  };
  Rig rig(LeaseManager::Options o) {
    Rig r{open(), open(), nullptr};
    if (r.q) r.lm = manager(*r.q, std::move(o));
    return r;
  }

  // Adds every lease of `h`; false (and a test failure) if one is refused.
  static bool add_all(LeaseManager& lm, const Held& h) {
    for (const Message& m : h.msgs) {
      Status s = lm.add(m.receipt, h.lease_end);
      EXPECT_TRUE(s.ok()) << s.to_string();
      if (!s.ok()) return false;
    }
    return true;
  }

  // Receives from `q` for `d`, every 20 ms, with a 10 s lease; how many messages it got.
  static int steal_for(Queue& q, Clock::duration d) {
    int got = 0;
    for (auto until = Clock::now() + d; Clock::now() < until; std::this_thread::sleep_for(20ms)) {
      auto m = q.receive(10, 10s);
      if (m.ok()) got += static_cast<int>(m->size());
    }
    return got;
  }
};

// 300 leases of 300 ms held for 1.5 s (five visibility periods) by one manager: a forked
// consumer receiving all the while gets none of them.
TEST_F(LeaseManagerTest, NoOtherProcessGetsHundredsOfRenewedLeases) {
  auto q = open();
  ASSERT_TRUE(q);
  auto lm = manager(*q, short_leases());
  ASSERT_TRUE(lm);
  Held h = send_and_receive(*q, 300, 300ms);
  ASSERT_EQ(h.msgs.size(), 300u);
  ASSERT_TRUE(add_all(*lm, h));
  EXPECT_EQ(lm->size(), 300u);
  const std::string dir = qdir();
  pid_t child = test::spawn([&] {
    auto other = Queue::open(dir);
    if (!other.ok()) return 100;
    return std::min(steal_for(**other, 1500ms), 99);
  });
  EXPECT_EQ(test::wait_exit(child), 0) << "the forked consumer received messages the manager held";
  for (const Message& m : h.msgs) {
    auto st = lm->status(m.receipt);
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    EXPECT_EQ(st->state, State::kRenewing) << m.receipt << ": " << st->error.to_string();
    EXPECT_GE(st->renewals, 4u) << m.receipt << " held 1.5 s on 300 ms leases";
  }
  for (const Message& m : h.msgs) ASSERT_TRUE(lm->ack(m.receipt).ok());
  EXPECT_EQ(lm->size(), 0u);
  auto s = q->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->acked_total, 300u);
  EXPECT_EQ(s->ready + s->in_flight, 0u);
}

// After max_lifetime (700 ms) renewal stops: every lease shows kExpired, on_stop told of
// each, and the messages come back to another consumer once their last lease (300 ms) ran
// out, not before the lifetime ended.
TEST_F(LeaseManagerTest, MaxLifetimeStopsRenewalAndTheMessagesComeBack) {
  auto q = open();
  auto other = open();
  ASSERT_TRUE(q && other);
  std::atomic<int> expired{0};
  auto o = short_leases();
  o.max_lifetime = 700ms;
  o.on_stop = [&](const std::string&, const LeaseManager::LeaseInfo& info) {
    if (info.state == State::kExpired) ++expired;
  };
  auto lm = manager(*q, std::move(o));
  ASSERT_TRUE(lm);
  Held h = send_and_receive(*q, 50, 300ms);
  const auto added = Clock::now();
  ASSERT_TRUE(add_all(*lm, h));
  std::map<uint64_t, int> back;
  while (back.size() < h.msgs.size() && Clock::now() < added + 10s) {
    auto got = other->receive(50, 10s, 100ms);
    if (!got.ok()) continue;
    EXPECT_GE(Clock::now() - added, 700ms) << "a message came back before its lease's lifetime ended";
    for (const Message& m : *got) ++back[m.id];
  }
  EXPECT_EQ(back.size(), h.msgs.size()) << "the leases were renewed past max_lifetime";
  EXPECT_LT(Clock::now() - added, 700ms + 300ms + 1500ms) << "came back long after lifetime + lease";
  EXPECT_EQ(expired.load(), 50);
  for (const Message& m : h.msgs) {
    auto st = lm->status(m.receipt);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->state, State::kExpired);
    EXPECT_TRUE(st->error.ok());
  }
  EXPECT_EQ(lm->ack(h.msgs[0].receipt).code(), Code::kLeaseLost) << "received again by the other consumer";
  EXPECT_EQ(lm->size(), 49u) << "ack forgets the lease whatever the queue said";
}

// ack deletes and forgets; nack makes the message ready at once and forgets; release
// forgets without either, so the lease then runs out on its own.
TEST_F(LeaseManagerTest, AckNackAndReleaseForgetTheLease) {
  Rig r = rig(short_leases());
  ASSERT_TRUE(r.ok());
  auto& [q, other, lm] = r;
  Held h = send_and_receive(*q, 10, 300ms);
  ASSERT_TRUE(add_all(*lm, h));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(lm->ack(h.msgs[i].receipt).ok());
  for (int i = 5; i < 7; ++i) ASSERT_TRUE(lm->nack(h.msgs[i].receipt).ok());
  const auto released = Clock::now();
  for (int i = 7; i < 10; ++i) ASSERT_TRUE(lm->release(h.msgs[i].receipt).ok());
  EXPECT_EQ(lm->size(), 0u);
  for (const Message& m : h.msgs) EXPECT_EQ(lm->status(m.receipt).status().code(), Code::kNotFound);
  EXPECT_EQ(lm->release(h.msgs[7].receipt).code(), Code::kNotFound);
  auto s = q->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->acked_total, 5u);
  auto nacked = other->receive(10, 10s);
  ASSERT_TRUE(nacked.ok());
  EXPECT_EQ(nacked->size(), 2u) << "the nacked two are ready at once, the released three still leased";
  std::set<uint64_t> late;
  while (late.size() < 3 && Clock::now() < released + 5s) {
    auto got = other->receive(10, 10s, 100ms);
    if (got.ok()) {
      for (const Message& m : *got) late.insert(m.id);
    }
  }
  EXPECT_EQ(late, (std::set<uint64_t>{h.msgs[7].id, h.msgs[8].id, h.msgs[9].id}))
      << "released leases run out on their own";
  EXPECT_LT(Clock::now() - released, 2s) << "a released lease was still renewed";
}

// A receipt made stale behind the manager's back (nacked and received by another
// consumer): its next renewal fails, the lease shows kLost with kLeaseLost, on_stop says
// so; the others go on renewing.
TEST_F(LeaseManagerTest, AFailedRenewalMarksThatLeaseLost) {
  auto q = open();
  auto other = open();
  ASSERT_TRUE(q && other);
  std::mutex mu;
  std::vector<std::string> lost;
  auto o = short_leases();
  o.on_stop = [&](const std::string& receipt, const LeaseManager::LeaseInfo& info) {
    std::lock_guard lock(mu);
    if (info.state == State::kLost) lost.push_back(receipt);
  };
  auto lm = manager(*q, std::move(o));
  ASSERT_TRUE(lm);
  Held h = send_and_receive(*q, 3, 300ms);
  ASSERT_TRUE(add_all(*lm, h));
  ASSERT_TRUE(q->nack(h.msgs[1].receipt).ok());
  auto thief = other->receive(1, 10s);
  ASSERT_TRUE(thief.ok());
  ASSERT_EQ(thief->at(0).id, h.msgs[1].id);
  auto until = Clock::now() + 5s;
  while (lm->status(h.msgs[1].receipt)->state != State::kLost && Clock::now() < until) {
    std::this_thread::sleep_for(10ms);
  }
  auto st = lm->status(h.msgs[1].receipt);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state, State::kLost);
  EXPECT_EQ(st->error.code(), Code::kLeaseLost) << st->error.to_string();
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(lost, std::vector<std::string>{h.msgs[1].receipt});
  }
  std::this_thread::sleep_for(400ms);  // past the 300 ms the others were received for
  for (int i : {0, 2}) {
    auto ok = lm->status(h.msgs[i].receipt);
    ASSERT_TRUE(ok.ok());
    EXPECT_EQ(ok->state, State::kRenewing);
    EXPECT_GE(ok->renewals, 1u);
  }
  EXPECT_EQ(other->receive().status().code(), Code::kEmpty) << "the other two are still held";
  EXPECT_EQ(lm->ack(h.msgs[1].receipt).code(), Code::kLeaseLost);
  EXPECT_TRUE(other->ack(thief->at(0).receipt).ok());
}

// add() refuses what it cannot keep, saying why: too little life left, a receipt added
// twice, a stale receipt; start() refuses options that cannot work.
TEST_F(LeaseManagerTest, AddRefusesLeasesItCannotKeep) {
  auto q = open();
  ASSERT_TRUE(q);
  auto o = short_leases();
  o.min_remaining = 500ms;
  auto lm = manager(*q, o);
  ASSERT_TRUE(lm);
  Held h = send_and_receive(*q, 2, 300ms);
  Status s = lm->add(h.msgs[0].receipt, h.lease_end);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("less than min_remaining (500 ms)"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(h.msgs[0].receipt), std::string::npos) << s.message();
  EXPECT_EQ(lm->size(), 0u);

  ASSERT_TRUE(lm->add(h.msgs[1].receipt, Clock::now() + 10s).ok());
  s = lm->add(h.msgs[1].receipt, Clock::now() + 10s);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("added already"), std::string::npos) << s.message();

  ASSERT_TRUE(q->nack(h.msgs[0].receipt).ok());
  auto again = q->receive(1, 10s);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(lm->add(h.msgs[0].receipt, Clock::now() + 10s).code(), Code::kLeaseLost) << "a stale receipt";
  EXPECT_EQ(lm->add("nonsense", Clock::now() + 10s).code(), Code::kInvalidArgument);

  auto bad = short_leases();
  bad.margin = bad.extend_by;
  auto refused = LeaseManager::start(*q, bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("margin must be at least 0 and below extend_by"), std::string::npos)
      << refused.status().message();
  bad = short_leases();
  bad.extend_by = 0ms;
  EXPECT_EQ(LeaseManager::start(*q, bad).status().code(), Code::kInvalidArgument);
}

// A worker pool whose every task (350 ms) takes longer than the visibility (300 ms): 200
// messages received up front, registered, processed by 40 threads and acked through the
// manager, while a competing consumer receives all the while. Each message is delivered
// once and acked once.
TEST_F(LeaseManagerTest, APoolWithTasksLongerThanTheVisibilityHasNoDuplicates) {
  Rig r = rig(short_leases());
  ASSERT_TRUE(r.ok());
  Queue& q = *r.q;
  Queue& rival = *r.other;
  LeaseManager& lm = *r.lm;
  Held h = send_and_receive(q, 200, 300ms);
  ASSERT_EQ(h.msgs.size(), 200u);
  ASSERT_TRUE(add_all(lm, h));
  std::deque<Message> todo(h.msgs.begin(), h.msgs.end());
  std::mutex mu;
  std::map<uint64_t, int> delivered;  // id -> deliveries to the pool and the rival
  std::atomic<int> acked{0}, failed{0};
  std::atomic<bool> done{false};
  std::thread rival_thread([&] {
    while (!done) {
      auto got = rival.receive(10, 10s, 20ms);
      if (!got.ok()) continue;
      std::lock_guard lock(mu);
      for (const Message& m : *got) ++delivered[m.id];
    }
  });
  std::vector<std::thread> pool;
  for (int t = 0; t < 40; ++t) {
    pool.emplace_back([&] {
      for (;;) {
        Message m;
        {
          std::lock_guard lock(mu);
          if (todo.empty()) return;
          m = std::move(todo.front());
          todo.pop_front();
          ++delivered[m.id];
        }
        std::this_thread::sleep_for(350ms);  // the task
        auto st = lm.status(m.receipt);
        if (!st.ok() || st->state != State::kRenewing) ++failed;
        if (lm.ack(m.receipt).ok()) ++acked;
      }
    });
  }
  for (auto& t : pool) t.join();
  done = true;
  rival_thread.join();
  EXPECT_EQ(acked.load(), 200);
  EXPECT_EQ(failed.load(), 0) << "leases lost or expired while their tasks ran";
  EXPECT_EQ(delivered.size(), 200u);
  int twice = 0;
  for (const auto& [id, n] : delivered) twice += n > 1;
  EXPECT_EQ(twice, 0) << "messages delivered more than once";
  EXPECT_EQ(lm.size(), 0u);
  auto s = q.stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->acked_total, 200u);
  EXPECT_EQ(s->ready + s->in_flight + s->delayed, 0u);
}

}  // namespace
}  // namespace spool
