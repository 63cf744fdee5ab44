// The queue API in one process: semantics, fencing, dead letters, restarts, bad input.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "spool/queue.h"
#include "fake_clock.h"
#include "test_util.h"

namespace spool {
namespace {

using namespace std::chrono_literals;

class QueueTest : public test::QueueDirTest {
 protected:
  static Message one(Queue& q, Millis vis = 0ms, Millis wait = 0ms) {
    auto m = q.receive(1, vis, wait);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_EQ(m->size(), 1u);
    return m->at(0);
  }
};

TEST_F(QueueTest, SendReceiveAckRemovesTheMessage) {
  auto q = open();
  auto id = q->send("hello");
  ASSERT_TRUE(id.ok());
  Message m = one(*q);
  EXPECT_EQ(m.id, *id);
  EXPECT_EQ(m.payload, "hello");
  EXPECT_EQ(m.receive_count, 1u);
  EXPECT_FALSE(m.receipt.empty());
  EXPECT_EQ(q->receive().status().code(), Code::kEmpty) << "a leased message is hidden";
  ASSERT_TRUE(q->ack(m.receipt).ok());
  EXPECT_EQ(q->ack(m.receipt).code(), Code::kNotFound);
  auto st = q->stats();
  EXPECT_EQ(st->ready + st->in_flight + st->delayed, 0u);
  EXPECT_EQ(st->acked_total, 1u);
  EXPECT_EQ(q->check_index(), "");
}

// Closed from an exit handler by the test below.
std::unique_ptr<Queue> g_closed_at_exit;

// A program may close its queue from an exit handler or a static destructor, after exit()
// has destroyed the main thread's thread_locals. The close still writes: the releases of the
// leases it bound (ASan once caught a close writing through the freed append buffer, in
// fuzz_receipt).
TEST_F(QueueTest, AQueueClosedFromAnExitHandlerReleasesItsBoundLeases) {
  QueueOptions o;
  o.sync = SyncPolicy::kNever;
  {
    auto q = open(o);
    std::vector<std::string_view> batch = {"acked before exit", "held at exit"};
    ASSERT_TRUE(q->send_batch(batch).ok());
  }
  pid_t child = test::spawn([&] {
    auto q = Queue::open(qdir(), o);
    if (!q.ok()) return 1;
    g_closed_at_exit = std::move(q).value();
    if (!g_closed_at_exit->bind_leases().ok()) return 4;
    // A send of its own on this thread, so the append buffer the exit destroys is the
    // child's (not only one the fork copied from this test's sends).
    if (!g_closed_at_exit->send("sent by the child").ok()) return 3;
    auto m = g_closed_at_exit->receive(1, 60s);
    if (!m.ok() || m->size() != 1u || !g_closed_at_exit->ack(m->front().receipt).ok()) return 2;
    auto held = g_closed_at_exit->receive(1, 60s);
    if (!held.ok() || held->size() != 1u) return 5;
    std::atexit([] { g_closed_at_exit.reset(); });
    std::exit(0);
  });
  ASSERT_EQ(test::wait_exit(child), 0);
  std::filesystem::remove(qdir() + "/index");  // the log alone must hold the release now
  auto q = open(o);
  auto got = q->receive(3);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), 2u) << "the message leased for 60 s was not released by the close, or the ack came back";
  std::set<std::string> payloads{got->at(0).payload, got->at(1).payload};
  EXPECT_EQ(payloads, (std::set<std::string>{"held at exit", "sent by the child"}));
}

TEST_F(QueueTest, IdsIncreaseAndOrderIsFifo) {
  auto q = open();
  std::vector<std::string_view> batch = {"a", "b", "c"};
  auto ids = q->send_batch(batch);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->at(1), ids->at(0) + 1);
  auto got = q->receive(10);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 3u);
  EXPECT_EQ(got->at(0).payload, "a");
  EXPECT_EQ(got->at(2).payload, "c");
}

TEST_F(QueueTest, StaleReceiptAfterRedeliveryIsLeaseLostAndChangesNothing) {
  auto clock = std::make_shared<test::FakeClockEnv>();
  auto q = open(test::on_clock(clock));
  ASSERT_TRUE(q->send("x").ok());
  Message first = one(*q, 30ms);
  clock->advance(29ms);
  EXPECT_EQ(q->receive().status().code(), Code::kEmpty) << "redelivered before its lease ended";
  clock->advance(2ms);
  Message second = one(*q, 10s);
  EXPECT_EQ(second.receive_count, 2u);
  EXPECT_EQ(q->ack(first.receipt).code(), Code::kLeaseLost);
  EXPECT_EQ(q->nack(first.receipt).code(), Code::kLeaseLost);
  EXPECT_EQ(q->extend(first.receipt, 10s).code(), Code::kLeaseLost);
  EXPECT_EQ(q->receive().status().code(), Code::kEmpty) << "the second lease must still hold";
  EXPECT_TRUE(q->ack(second.receipt).ok());
}

TEST_F(QueueTest, ExpiredButNotRedeliveredReceiptStillAcks) {
  auto clock = std::make_shared<test::FakeClockEnv>();
  auto q = open(test::on_clock(clock));
  ASSERT_TRUE(q->send("x").ok());
  Message m = one(*q, 20ms);
  clock->advance(21ms);
  EXPECT_TRUE(q->ack(m.receipt).ok());
  EXPECT_EQ(q->receive().status().code(), Code::kEmpty);
}

// Both bounds: not before the delay, and a long poll (2 s here) wakes at the delay's end,
// not at its own timeout (the margin is for a loaded machine; the poll's timeout is 4x it).
TEST_F(QueueTest, DelayAndNackDelayAreRespected) {
  auto q = open();
  auto sent_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(q->send("later", 150ms).ok());
  EXPECT_EQ(q->receive().status().code(), Code::kEmpty);
  EXPECT_EQ(q->stats()->delayed, 1u);
  Message m = one(*q, 0ms, 2s);
  auto waited = std::chrono::steady_clock::now() - sent_at;
  EXPECT_GE(waited, 150ms);
  EXPECT_LE(waited, 150ms + 700ms) << "the long poll did not wake when the delay ended";
  auto nacked_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(q->nack(m.receipt, 150ms).ok());
  EXPECT_EQ(q->receive().status().code(), Code::kEmpty);
  Message again = one(*q, 0ms, 2s);
  waited = std::chrono::steady_clock::now() - nacked_at;
  EXPECT_EQ(again.receive_count, 2u);
  EXPECT_GE(waited, 150ms);
  EXPECT_LE(waited, 150ms + 700ms) << "the long poll did not wake when the nack's delay ended";
}

// A lease's end has both bounds too: the message is not redelivered before it, and a long
// poll (2 s) waiting meanwhile wakes at the lease's end, not at its own timeout or its next
// wait slice (kMaxWaitSliceNs, 1 s, from the poll's start); the margin is for a loaded machine.
TEST_F(QueueTest, ALongPollWakesWhenALeaseEndsAndNotBefore) {
  auto q = open();
  ASSERT_TRUE(q->send("x").ok());
  auto leased_at = std::chrono::steady_clock::now();
  Message first = one(*q, 150ms);
  Message again = one(*q, 10s, 2s);
  auto waited = std::chrono::steady_clock::now() - leased_at;
  EXPECT_EQ(again.id, first.id);
  EXPECT_EQ(again.receive_count, 2u);
  EXPECT_GE(waited, 150ms) << "redelivered before its lease ended";
  EXPECT_LE(waited, 150ms + 700ms) << "the long poll did not wake when the lease ended";
  EXPECT_EQ(q->ack(first.receipt).code(), Code::kLeaseLost);
  EXPECT_TRUE(q->ack(again.receipt).ok());
}

TEST_F(QueueTest, ExtendKeepsAMessageHiddenPastItsDeadline) {
  auto clock = std::make_shared<test::FakeClockEnv>();
  auto q = open(test::on_clock(clock));
  ASSERT_TRUE(q->send("long task").ok());
  Message m = one(*q, 80ms);
  for (int i = 0; i < 4; ++i) {
    clock->advance(40ms);
    ASSERT_TRUE(q->extend(m.receipt, 80ms).ok());
  }
  // 160 ms after the receive, twice its visibility: hidden until 80 ms after the last extend.
  clock->advance(79ms);
  EXPECT_EQ(q->receive().status().code(), Code::kEmpty);
  EXPECT_TRUE(q->ack(m.receipt).ok());
}

TEST_F(QueueTest, DeadLettersAfterMaxReceivesAndCountSurvivesRestart) {
  QueueOptions o;
  o.max_receives = 3;
  {
    auto q = open(o);
    ASSERT_TRUE(q->send("poison").ok());
    for (int i = 1; i <= 2; ++i) {
      Message m = one(*q);
      EXPECT_EQ(m.receive_count, static_cast<uint32_t>(i));
      ASSERT_TRUE(q->nack(m.receipt).ok());
    }
  }
  // Every process has closed the queue; the index is rebuilt or reused, the count kept.
  std::filesystem::remove(dir_ / "q/index");
  {
    auto q = open(o);
    Message m = one(*q);
    EXPECT_EQ(m.receive_count, 3u);
    ASSERT_TRUE(q->nack(m.receipt).ok());
    EXPECT_EQ(q->receive().status().code(), Code::kEmpty) << "the 4th delivery goes to the DLQ";
    auto st = q->stats();
    EXPECT_EQ(st->dead, 1u);
    EXPECT_EQ(st->dead_lettered_total, 1u);
    auto dlq = q->dead_letters();
    ASSERT_TRUE(dlq.ok());
    auto dead = (*dlq)->peek(10);
    ASSERT_EQ(dead->size(), 1u);
    EXPECT_EQ(dead->at(0).payload, "poison");
    auto moved = q->redrive(10);
    ASSERT_TRUE(moved.ok());
    EXPECT_EQ(*moved, 1u);
    Message back = one(*q);
    EXPECT_EQ(back.payload, "poison");
    EXPECT_EQ(back.receive_count, 1u);
    EXPECT_EQ(q->stats()->dead, 0u);
  }
}

// remove(id) deletes by id in every state, through the ACK record replay already knows: so
// the removals must survive a rebuild of the index from the log, and a receipt held for a
// removed message must fail as for any message that is gone (kNotFound), changing nothing.
TEST_F(QueueTest, RemoveDeletesAMessageInAnyStateWithoutAReceipt) {
  QueueOptions o;
  std::string held_receipt;
  uint64_t ready_id, leased_id, delayed_id, kept_id, dead_id;
  {
    auto q = open(o);
    leased_id = *q->send("leased");
    ready_id = *q->send("ready");
    delayed_id = *q->send("delayed", 1h);
    kept_id = *q->send("kept");
    Message m = one(*q, 60s);
    ASSERT_EQ(m.id, leased_id);
    held_receipt = m.receipt;
    ASSERT_TRUE(q->send("other").ok());
    // The dead-letter queue is a queue of its own: a dead letter is removed there, by its id
    // there (a message sent to it stands for one dead-lettered).
    auto dlq = q->dead_letters();
    ASSERT_TRUE(dlq.ok());
    ASSERT_TRUE((*dlq)->send("dead").ok());
    auto dead = (*dlq)->peek(10);
    ASSERT_TRUE(dead.ok());
    ASSERT_EQ(dead->size(), 1u);
    dead_id = dead->at(0).id;

    auto st = q->stats();
    EXPECT_EQ(st->ready, 3u);  // ready, kept, other
    EXPECT_EQ(st->in_flight, 1u);
    EXPECT_EQ(st->delayed, 1u);
    EXPECT_EQ(st->dead, 1u);

    EXPECT_TRUE(q->remove(leased_id).ok());
    EXPECT_TRUE(q->remove(ready_id).ok());
    EXPECT_TRUE(q->remove(delayed_id).ok());
    EXPECT_TRUE((*dlq)->remove(dead_id).ok());

    Status again = q->remove(ready_id);
    EXPECT_EQ(again.code(), Code::kNotFound);
    EXPECT_NE(again.message().find("message " + std::to_string(ready_id)), std::string::npos) << again.to_string();
    EXPECT_EQ(q->remove(9999).code(), Code::kNotFound) << "never sent";
    EXPECT_EQ((*dlq)->remove(dead_id).code(), Code::kNotFound);

    Status stale = q->ack(held_receipt);
    EXPECT_EQ(stale.code(), Code::kNotFound) << stale.to_string();

    st = q->stats();
    EXPECT_EQ(st->ready, 2u);
    EXPECT_EQ(st->in_flight, 0u);
    EXPECT_EQ(st->delayed, 0u);
    EXPECT_EQ(st->dead, 0u);
    EXPECT_EQ(st->acked_total, 3u) << "a removal is written, and counted, as an ack";
    EXPECT_EQ(st->bytes, std::string("kept").size() + std::string("other").size());
    EXPECT_EQ(q->check_index(), "");
  }
  // Replay: from the index that was left, then from the log alone.
  for (bool delete_index : {false, true}) {
    if (delete_index) std::filesystem::remove(dir_ / "q/index");
    auto q = open(o);
    auto all = q->peek(100);
    ASSERT_TRUE(all.ok());
    ASSERT_EQ(all->size(), 2u);
    EXPECT_EQ(all->at(0).id, kept_id);
    EXPECT_EQ(all->at(0).payload, "kept");
    EXPECT_EQ(all->at(1).payload, "other");
    auto st = q->stats();
    EXPECT_EQ(st->ready, 2u);
    EXPECT_EQ(st->in_flight + st->delayed + st->dead, 0u);
    EXPECT_EQ(st->acked_total, 3u);
    EXPECT_EQ(q->remove(leased_id).code(), Code::kNotFound);
    EXPECT_EQ(q->ack(held_receipt).code(), Code::kNotFound);
    EXPECT_EQ(q->check_index(), "");
  }
}

TEST_F(QueueTest, ReopenAfterDeletingTheIndexLosesNothingAndKeepsAcks) {
  std::set<std::string> expect;
  {
    auto q = open();
    for (int i = 0; i < 500; ++i) ASSERT_TRUE(q->send("m" + std::to_string(i)).ok());
    auto got = q->receive(100);
    ASSERT_TRUE(got.ok());
    for (auto& m : *got) ASSERT_TRUE(q->ack(m.receipt).ok());
    for (int i = 100; i < 500; ++i) expect.insert("m" + std::to_string(i));
  }
  for (bool delete_index : {false, true}) {
    if (delete_index) std::filesystem::remove(dir_ / "q/index");
    auto q = open();
    auto st = q->stats();
    EXPECT_EQ(st->ready, 400u) << "depth equals a recount";
    EXPECT_EQ(st->acked_total, 100u);
    auto all = q->peek(1000);
    std::set<std::string> seen;
    for (auto& m : *all) seen.insert(m.payload);
    EXPECT_EQ(seen, expect);
    EXPECT_EQ(q->check_index(), "");
  }
}

TEST_F(QueueTest, LeasesSurviveAllProcessesExiting) {
  std::string receipt;
  {
    auto q = open();
    ASSERT_TRUE(q->send("shell job").ok());
    receipt = one(*q, 10s).receipt;
  }
  auto q = open();
  EXPECT_EQ(q->receive().status().code(), Code::kEmpty) << "the lease outlives the process";
  EXPECT_TRUE(q->ack(receipt).ok());
}

TEST_F(QueueTest, GrowsPastTheInitialIndexCapacity) {
  auto q = open();
  std::vector<std::string> bodies(5000);
  std::vector<std::string_view> views;
  for (size_t i = 0; i < bodies.size(); ++i) views.push_back(bodies[i] = std::to_string(i));
  ASSERT_TRUE(q->send_batch(views).ok());
  EXPECT_EQ(q->check_index(), "");
  auto got = q->receive(2500);
  ASSERT_TRUE(got.ok());
  for (auto& m : *got) ASSERT_TRUE(q->ack(m.receipt).ok());
  EXPECT_EQ(q->check_index(), "");
  EXPECT_EQ(q->stats()->ready, 2500u);
}

// Issue 24: a near-empty queue takes little disk. Its first segment is small, and a message
// larger than that (up to max_payload) still goes in, into a larger segment, and reads back
// after a reopen that rebuilds the index from the log.
TEST_F(QueueTest, SegmentsStartSmallAndAMessageLargerThanTheFirstStillFits) {
  std::string big(1 << 20, 'b');  // the default max_payload
  for (size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<char>('a' + i / 4096 % 26);
  {
    auto q = open();
    ASSERT_TRUE(q->send("tiny").ok());
    struct stat st {};
    ASSERT_EQ(::stat((qdir() + "/segments/00000000000000000001.seg").c_str(), &st), 0);
    EXPECT_LE(static_cast<uint64_t>(st.st_size), 256u << 10) << "the first segment is small";
    EXPECT_LT(q->stats()->bytes_on_disk, 1u << 20);
    ASSERT_TRUE(q->send(big).ok());
    ASSERT_TRUE(q->send("after").ok());
    EXPECT_EQ(q->check_index(), "");
  }
  ASSERT_EQ(::unlink((qdir() + "/index").c_str()), 0);
  auto q = open();
  auto got = q->receive(3);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), 3u);
  EXPECT_EQ(got->at(0).payload, "tiny");
  EXPECT_EQ(got->at(1).payload, big);
  EXPECT_EQ(got->at(2).payload, "after");
  // A sealed segment smaller than segment_size is no damage: its header gives its size.
  auto v = q->verify(false);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_TRUE(v->ok()) << (v->problems.empty() ? "" : v->problems[0]);
}

TEST_F(QueueTest, PurgeRemovesEverythingDurably) {
  {
    auto q = open();
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(q->send("x").ok());
    auto n = q->purge();
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, 10u);
    ASSERT_TRUE(q->send("after").ok());
  }
  std::filesystem::remove(dir_ / "q/index");
  auto q = open();
  auto all = q->peek(100);
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ(all->at(0).payload, "after");
}

// list, peek and stats read the heap array rather than every entry (queue.cc, lowest_ids):
// the lowest ids first, in order, whatever state and heap position each message is in.
TEST_F(QueueTest, ListPeekAndStatsSeeEveryStateInIdOrder) {
  auto q = open();
  std::vector<uint64_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(*q->send("m" + std::to_string(i), i % 7 == 3 ? 1h : 0ms));
  // Lease the first six (their heap items move to the lease deadline), nack one back with a
  // delay, and ack one, so that the low ids sit in every state.
  auto got = q->receive(6, 60s);
  ASSERT_TRUE(got.ok() && got->size() == 6u);
  ASSERT_TRUE(q->nack(got->at(1).receipt, 1h).ok());
  ASSERT_TRUE(q->ack(got->at(2).receipt).ok());
  std::set<uint64_t> leased{ids[0], ids[3], ids[4], ids[5], ids[6]}, delayed{ids[1]};
  // ids[3] was sent delayed, so the six received are 0, 1, 2, 4, 5, 6.
  leased.erase(ids[3]);
  delayed.insert(ids[3]);
  for (int i = 0; i < 40; ++i)
    if (i % 7 == 3) delayed.insert(ids[i]);
  std::vector<uint64_t> live;
  for (uint64_t id : ids)
    if (id != ids[2]) live.push_back(id);

  auto all = q->list(12);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 12u);
  for (size_t i = 0; i < all->size(); ++i) {
    EXPECT_EQ(all->at(i).id, live[i]) << i;
    bool ready = !leased.count(live[i]) && !delayed.count(live[i]);
    EXPECT_EQ(all->at(i).ready, ready) << "id " << live[i];
  }
  std::vector<uint64_t> ready_ids;
  for (uint64_t id : live)
    if (!leased.count(id) && !delayed.count(id)) ready_ids.push_back(id);
  auto ready = q->list(5, StateFilter::only(MessageState::kReady));
  ASSERT_TRUE(ready.ok());
  ASSERT_EQ(ready->size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(ready->at(i).id, ready_ids[i]) << i;
  EXPECT_EQ(q->list(1000, StateFilter::only(MessageState::kReady))->size(), ready_ids.size());
  EXPECT_EQ(q->list(1000)->size(), live.size());

  auto peeked = q->peek(4);
  ASSERT_TRUE(peeked.ok());
  ASSERT_EQ(peeked->size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(peeked->at(i).id, live[i]) << i;
  EXPECT_EQ(peeked->at(0).payload, "m0");

  auto st = q->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->ready, ready_ids.size());
  EXPECT_EQ(st->in_flight, leased.size());
  EXPECT_EQ(st->delayed, delayed.size());
}

// list() tells each message's state with its lease or delay end and the holder of a bound
// lease, filters by state, and show() gives one message by id; neither receives anything.
TEST_F(QueueTest, ListTellsStatesAndShowGivesOneMessageById) {
  auto q = open();
  ASSERT_TRUE(q->bind_leases().ok());
  SendOptions attr;
  attr.attributes = {{"k", "v"}};
  auto a = q->send("leased");
  auto b = q->send("ready", attr);
  auto c = q->send("delayed", Millis(3'600'000));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const auto before = std::chrono::system_clock::now();
  auto got = q->receive(1, 5s);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->at(0).id, *a);
  const auto after = std::chrono::system_clock::now();

  auto all = q->list(10);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  const MessageInfo& in_flight = all->at(0);
  EXPECT_EQ(in_flight.state, MessageState::kInFlight);
  EXPECT_FALSE(in_flight.ready);
  EXPECT_EQ(in_flight.receive_count, 1u);
  EXPECT_EQ(in_flight.holder_pid, ::getpid()) << "bound to this process";
  EXPECT_GE(in_flight.due, before + 5s - 50ms);
  EXPECT_LE(in_flight.due, after + 5s + 50ms);
  EXPECT_EQ(all->at(1).state, MessageState::kReady);
  EXPECT_TRUE(all->at(1).ready);
  EXPECT_EQ(all->at(1).due, std::chrono::system_clock::time_point{});
  EXPECT_EQ(all->at(1).holder_pid, 0);
  EXPECT_EQ(all->at(2).state, MessageState::kDelayed);
  EXPECT_GE(all->at(2).due, before + 1h - 1s);
  EXPECT_LE(all->at(2).due, after + 1h + 1s);

  auto delayed = q->list(10, StateFilter::only(MessageState::kDelayed));
  ASSERT_TRUE(delayed.ok());
  ASSERT_EQ(delayed->size(), 1u);
  EXPECT_EQ(delayed->at(0).id, *c);
  auto not_ready = q->list(10, StateFilter{false, true, true});
  ASSERT_TRUE(not_ready.ok());
  ASSERT_EQ(not_ready->size(), 2u);
  EXPECT_EQ(not_ready->at(0).id, *a);
  EXPECT_EQ(not_ready->at(1).id, *c);

  auto shown = q->show(*b);
  ASSERT_TRUE(shown.ok()) << shown.status().to_string();
  EXPECT_EQ(shown->first.payload, "ready");
  EXPECT_EQ(shown->first.attributes.at("k"), "v");
  EXPECT_TRUE(shown->first.receipt.empty());
  EXPECT_EQ(shown->second.state, MessageState::kReady);
  auto shown_leased = q->show(*a);
  ASSERT_TRUE(shown_leased.ok());
  EXPECT_EQ(shown_leased->second.state, MessageState::kInFlight);
  EXPECT_EQ(shown_leased->first.payload, "leased");
  EXPECT_EQ(q->show(999).status().code(), Code::kNotFound);
  ASSERT_TRUE(q->ack(got->at(0).receipt).ok());
  EXPECT_EQ(q->show(*a).status().code(), Code::kNotFound) << "acked";

  auto st = q->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->ready, 1u) << "list and show received nothing";
  EXPECT_EQ(st->delayed, 1u);
}

// list(max, states, after) pages: 250 messages in every state (queued, leased, delayed,
// redelivered, of another priority, blocked in a group), listed 30 at a time, each page
// starting after the last id of the one before, visit each message exactly once, in id
// order; count(states, after) says how many each page left. Each row carries the priority,
// group and send time of its message.
TEST_F(QueueTest, ListPagesWithAfterAndCountsWhatIsLeft) {
  auto q = open();
  const auto before = std::chrono::system_clock::now();
  std::vector<uint64_t> ids;
  for (int i = 0; i < 250; ++i) {
    SendOptions o;
    if (i % 11 == 4) o.priority = 7;
    if (i % 13 == 6) o.group = "g" + std::to_string(i % 2);
    if (i % 17 == 9) o.delay = 1h;
    auto id = q->send("m" + std::to_string(i), o);
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    ids.push_back(*id);
  }
  auto got = q->receive(20, 60s);
  ASSERT_TRUE(got.ok());
  for (size_t i = 0; i < got->size(); i += 3) ASSERT_TRUE(q->nack(got->at(i).receipt).ok());  // redelivered
  for (StateFilter states : {StateFilter{}, StateFilter::only(MessageState::kReady), StateFilter{false, true, true, true}}) {
    auto all = q->list(1000, states);
    ASSERT_TRUE(all.ok());
    auto total = q->count(states);
    ASSERT_TRUE(total.ok());
    EXPECT_EQ(*total, all->size());
    std::vector<uint64_t> paged;
    uint64_t after = 0;
    for (int pages = 0; pages < 100; ++pages) {
      auto page = q->list(30, states, after);
      ASSERT_TRUE(page.ok()) << page.status().to_string();
      if (page->empty()) break;
      for (const MessageInfo& m : *page) paged.push_back(m.id);
      after = page->back().id;
      auto left = q->count(states, after);
      ASSERT_TRUE(left.ok());
      EXPECT_EQ(*left, all->size() - paged.size()) << "after " << after;
    }
    ASSERT_EQ(paged.size(), all->size());
    for (size_t i = 0; i < paged.size(); ++i) EXPECT_EQ(paged[i], all->at(i).id) << i;
  }
  auto every = q->list(1000);
  ASSERT_TRUE(every.ok());
  ASSERT_EQ(every->size(), 250u);
  EXPECT_EQ(q->count(StateFilter{}, ids.back()).value(), 0u);
  EXPECT_EQ(q->count(StateFilter{}, UINT64_MAX).value(), 0u);
  EXPECT_TRUE(q->list(10, StateFilter{}, UINT64_MAX)->empty());
  for (size_t i = 0; i < every->size(); ++i) {
    const MessageInfo& m = every->at(i);
    EXPECT_EQ(m.id, ids[i]);
    EXPECT_EQ(m.priority, i % 11 == 4 ? 7 : kDefaultPriority) << i;
    EXPECT_EQ(m.group, i % 13 == 6 ? "g" + std::to_string(i % 2) : "") << i;
    EXPECT_GE(m.enqueued, before - 1s) << i;
    EXPECT_LE(m.enqueued, std::chrono::system_clock::now() + 1s) << i;
    EXPECT_EQ(m.original_id, 0u);
  }
}

// A dead letter keeps its history: its attributes, the original id, enqueue time, receive
// count and the reason; redrive sends it back without that history.
TEST_F(QueueTest, ADeadLetterKeepsItsHistory) {
  QueueOptions o;
  o.max_receives = 1;
  o.visibility = Millis(100);
  auto clock = std::make_shared<test::FakeClockEnv>();
  auto q = open(test::on_clock(clock, o));
  SendOptions attr;
  attr.attributes = {{"k", "v"}};
  const auto before = std::chrono::system_clock::now();
  auto id = q->send("poison", attr);
  const auto after = std::chrono::system_clock::now();
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(q->receive(1).ok());
  clock->advance(101ms);
  EXPECT_EQ(q->receive(1).status().code(), Code::kEmpty) << "delivered past max_receives";
  auto dlq = q->dead_letters();
  ASSERT_TRUE(dlq.ok());
  auto dead = (*dlq)->peek(10);
  ASSERT_TRUE(dead.ok());
  ASSERT_EQ(dead->size(), 1u);
  const Attributes& a = dead->at(0).attributes;
  EXPECT_EQ(dead->at(0).payload, "poison");
  EXPECT_EQ(a.at("k"), "v");
  EXPECT_EQ(a.at("spool.dead.reason"), "max_receives");
  EXPECT_EQ(a.at("spool.dead.original_id"), std::to_string(*id));
  auto listed = (*dlq)->list(10);
  ASSERT_TRUE(listed.ok() && listed->size() == 1u);
  EXPECT_EQ(listed->at(0).original_id, *id) << "list() names the dead letter's original id";
  EXPECT_EQ(a.at("spool.dead.receive_count"), "1");
  // ISO 8601 of the send, to the millisecond; its minute is that of the clock read before
  // the send or of the one after (they differ when the send was at a minute's turn).
  const std::string at = a.at("spool.dead.enqueued_at");
  ASSERT_EQ(at.size(), 24u) << at;
  auto minute_of = [](std::chrono::system_clock::time_point t) {
    char want[32];
    const time_t secs = std::chrono::system_clock::to_time_t(t);
    tm utc{};
    ::gmtime_r(&secs, &utc);
    std::strftime(want, sizeof want, "%Y-%m-%dT%H:%M", &utc);
    return std::string(want);
  };
  EXPECT_TRUE(at.substr(0, 16) == minute_of(before) || at.substr(0, 16) == minute_of(after))
      << at << " is not of the minute of the send, " << minute_of(before);
  EXPECT_EQ(q->stats()->dead_lettered_total, 1u);

  ASSERT_EQ(*q->redrive(10), 1u);
  auto back = q->peek(10);
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ(back->at(0).attributes, (Attributes{{"k", "v"}})) << "the history stays behind";
}

// A consumer dead-letters a message it can never handle, with its own attributes; the
// message's attributes always go whole, the history only where the bounds leave room.
TEST_F(QueueTest, AConsumerDeadLettersAMessageWithItsReasons) {
  auto q = open();
  auto id = q->send("bad input");
  ASSERT_TRUE(id.ok());
  auto got = q->receive(1, 30s);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(q->dead_letter(got->at(0).receipt, {{"bad key!", "x"}}).code(), Code::kInvalidArgument);
  ASSERT_TRUE(q->dead_letter(got->at(0).receipt, {{"why", "cannot parse"}}).ok());
  EXPECT_EQ(q->ack(got->at(0).receipt).code(), Code::kNotFound) << "it left the queue";
  EXPECT_EQ(q->dead_letter(got->at(0).receipt).code(), Code::kNotFound);
  auto dead = (*q->dead_letters())->peek(10);
  ASSERT_TRUE(dead.ok());
  ASSERT_EQ(dead->size(), 1u);
  EXPECT_EQ(dead->at(0).attributes.at("why"), "cannot parse");
  EXPECT_EQ(dead->at(0).attributes.at("spool.dead.reason"), "consumer");
  EXPECT_EQ(dead->at(0).attributes.at("spool.dead.original_id"), std::to_string(*id));

  SendOptions full;
  for (int i = 0; i < 16; ++i) full.attributes["a" + std::to_string(i)] = "v";
  ASSERT_TRUE(q->send("full", full).ok());
  auto f = q->receive(1, 30s);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(q->dead_letter(f->at(0).receipt).ok());
  dead = (*q->dead_letters())->peek(10);
  ASSERT_TRUE(dead.ok());
  ASSERT_EQ(dead->size(), 2u);
  EXPECT_EQ(dead->at(1).attributes, full.attributes) << "16 attributes leave no room for the history";
  EXPECT_EQ(q->stats()->dead_lettered_total, 2u);
}

// A receive that fails after it took some messages (here: the next one's move to a full
// dead-letter queue) hands out nothing and leaves nothing leased: the leases it had applied
// were not yet in the log, and the index the unlock rebuilds from the log has none.
TEST_F(QueueTest, AReceiveThatFailsHalfwayLeavesNothingLeased) {
  QueueOptions o;
  o.max_receives = 1;
  o.max_ready = 3;  // the dead-letter queue takes the queue's options: it is full at 3
  auto q = open(o);
  ASSERT_TRUE(q);
  for (const char* p : {"a", "b", "c"}) ASSERT_TRUE(q->send(p).ok());
  auto abc = q->receive(3, 60s);
  ASSERT_TRUE(abc.ok() && abc->size() == 3u);
  for (const Message& m : *abc) ASSERT_TRUE(q->dead_letter(m.receipt).ok());
  auto m1 = q->send("m1");
  auto m2 = q->send("m2");
  ASSERT_TRUE(m1.ok() && m2.ok());
  auto two = q->receive_id(*m2, 60s);
  ASSERT_TRUE(two.ok()) << two.status().to_string();
  ASSERT_TRUE(q->nack(two->receipt).ok());  // delivered once: the next receive dead-letters it
  // Takes m1 (first in line), then fails on m2: the dead-letter queue refuses it.
  auto got = q->receive(10, 60s);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Code::kQueueFull) << got.status().to_string();
  auto st = q->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->in_flight, 0u) << "m1 leased by a receive that returned nothing";
  EXPECT_EQ(st->ready, 2u);
  EXPECT_EQ(st->received_total, 4u) << "a, b, c and m2's one delivery";
  EXPECT_EQ(q->check_index(), "");
}

TEST_F(QueueTest, ReceiveByIdLeasesExactlyThatMessage) {
  auto q = open();
  auto ids = q->send_batch(std::vector<std::string_view>{"a", "b", "c"});
  ASSERT_TRUE(ids.ok());
  auto m = q->receive_id(ids->at(1), 10s);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->payload, "b");
  EXPECT_EQ(m->receive_count, 1u);
  EXPECT_EQ(q->receive_id(ids->at(1)).status().code(), Code::kEmpty) << "leased";
  EXPECT_EQ(q->receive_id(999).status().code(), Code::kNotFound);
  auto ready = q->list(10, StateFilter::only(MessageState::kReady));
  ASSERT_TRUE(ready.ok());
  ASSERT_EQ(ready->size(), 2u);
  EXPECT_EQ(ready->at(0).id, ids->at(0));
  EXPECT_EQ(ready->at(1).id, ids->at(2));
  EXPECT_EQ(q->list(10)->size(), 3u);
  ASSERT_TRUE(q->ack(m->receipt).ok());
  EXPECT_EQ(q->receive_id(ids->at(1)).status().code(), Code::kNotFound);
}

TEST_F(QueueTest, RetentionByAgeDropsOldReadyMessagesDurably) {
  QueueOptions o;
  o.retention_max_age = 100ms;
  auto clock = std::make_shared<test::FakeClockEnv>();
  o = test::on_clock(clock, o);
  {
    auto q = open(o);
    ASSERT_TRUE(q->send_batch(std::vector<std::string_view>{"old1", "old2", "old3"}).ok());
    auto leased = q->receive(1, 60s);  // leased messages are never dropped
    ASSERT_TRUE(leased.ok());
    clock->advance(99ms);
    EXPECT_EQ(q->stats()->expired_total, 0u) << "dropped before retention_max_age";
    clock->advance(2ms);
    ASSERT_TRUE(q->send("new").ok());
    auto got = q->receive(10, 60s);
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(got->size(), 1u);
    EXPECT_EQ(got->at(0).payload, "new");
    EXPECT_EQ(q->stats()->expired_total, 2u);
    EXPECT_TRUE(q->ack(leased->at(0).receipt).ok());
  }
  std::filesystem::remove(dir_ / "q/index");
  auto q = open(o);
  auto st = q->stats();
  EXPECT_EQ(st->expired_total, 2u) << "the drops are durable and counted apart from acks";
  EXPECT_EQ(st->acked_total, 1u);
  EXPECT_EQ(st->in_flight, 1u);
}

TEST_F(QueueTest, RetentionByBytesKeepsTheNewestReadyMessages) {
  QueueOptions o;
  o.retention_max_bytes = 1000;
  auto q = open(o);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(q->send(std::string(200, static_cast<char>('a' + i))).ok());
  auto st = q->stats();
  EXPECT_EQ(st->ready, 5u);
  EXPECT_EQ(st->expired_total, 5u);
  auto left = q->peek(10);
  ASSERT_EQ(left->size(), 5u);
  EXPECT_EQ(left->at(0).payload[0], 'f') << "the oldest went first";
  EXPECT_EQ(q->check_index(), "");
}

// Retention is a setting of the queue (docs/format.md, spool.conf), not of the opener: a
// later open with the defaults keeps the stored limits, and they keep acting.
TEST_F(QueueTest, RetentionIsStoredWithTheQueue) {
  QueueOptions o;
  o.retention_max_age = 3600s;
  o.retention_max_bytes = 1000;
  open(o).reset();
  auto q = open();  // defaults passed: the stored limits win
  EXPECT_EQ(q->options().retention_max_age, Millis(3600s));
  EXPECT_EQ(q->options().retention_max_bytes, 1000u);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(q->send(std::string(200, 'r')).ok());
  EXPECT_EQ(q->stats()->ready, 5u) << "the stored retention_max_bytes does not act";
  EXPECT_EQ(q->stats()->expired_total, 5u);
}

TEST_F(QueueTest, BadInputGetsClearErrors) {
  QueueOptions o;
  o.max_payload = 1000;
  auto q = open(o);
  auto big = q->send(std::string(1001, 'x'));
  EXPECT_EQ(big.status().code(), Code::kTooLarge);
  EXPECT_NE(big.status().message().find("1000"), std::string::npos);
  EXPECT_EQ(q->ack("nonsense").code(), Code::kInvalidArgument);
  EXPECT_EQ(q->ack("5.1.00000000").code(), Code::kInvalidArgument) << "receipt of another queue";

  std::filesystem::create_directories(dir_ / "notq");
  std::ofstream(dir_ / "notq/file.txt") << "mine";
  auto nq = Queue::open(dir_ / "notq");
  EXPECT_EQ(nq.status().code(), Code::kNotAQueue);
  EXPECT_TRUE(std::filesystem::exists(dir_ / "notq/file.txt")) << "nothing of the user's is touched";
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_ / "notq"), {}), 1)
      << "and nothing is left behind";
  std::ofstream(dir_ / "plainfile") << "x";
  EXPECT_EQ(Queue::open(dir_ / "plainfile").status().code(), Code::kNotAQueue);
  QueueOptions none;
  none.create = false;
  EXPECT_EQ(Queue::open(dir_ / "missing", none).status().code(), Code::kNotAQueue);
  QueueOptions bad;
  bad.segment_size = 4096;
  bad.max_payload = 8192;
  EXPECT_EQ(Queue::open(dir_ / "bad", bad).status().code(), Code::kInvalidArgument);
}

// A roll takes a spare (or makes a segment); the process's background thread then makes the
// spare the queue will want next, so that sends do not pay for the next segment's
// allocation. Here nothing stays queued, so the drain reserve alone never asks for a spare,
// and every spare seen was made ahead of need.
TEST_F(QueueTest, ARollIsFollowedByASpareMadeInTheBackground) {
  QueueOptions o;
  o.segment_size = 1 << 20;
  o.sync = SyncPolicy::kNever;
  auto q = open(o);
  ASSERT_TRUE(q);
  const std::string segs = qdir() + "/segments";
  auto count = [&](std::string_view prefix) {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(segs)) n += e.path().filename().string().starts_with(prefix);
    return n;
  };
  // The rolls are told by the number of the last segment, not by how many segment files
  // there are: the compaction each roll starts in the background removes the acked ones
  // behind it, mostly before the next roll, so three files exist at once only when it
  // falls behind (on tmpfs, where nothing slows it, that took up to 28 s of sends).
  auto last_segment = [&] {
    uint64_t last = 0;
    for (const auto& e : std::filesystem::directory_iterator(segs)) {
      if (e.path().extension() != ".seg") continue;
      last = std::max<uint64_t>(last, std::stoull(e.path().stem()));
    }
    return last;
  };
  const std::string body(4000, 'x');
  while (last_segment() < 3) {
    ASSERT_TRUE(q->send(body).ok());
    Message m = one(*q);
    ASSERT_TRUE(q->ack(m.receipt).ok());
  }
  EXPECT_EQ(q->stats()->ready, 0u);
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  while (count("spare-") == 0 && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(10ms);
  EXPECT_GE(count("spare-"), 1u) << "no spare was made after the log rolled twice";
  // And the next roll takes it: the log goes on across it.
  const uint64_t before = last_segment();
  while (last_segment() == before) {
    ASSERT_TRUE(q->send(body).ok());
    ASSERT_TRUE(q->ack(one(*q).receipt).ok());
  }
  EXPECT_EQ(q->check_index(), "");
}

}  // namespace
}  // namespace spool

#include "spool/lease_keeper.h"

namespace spool {
namespace {

class LeaseKeeperTest : public QueueTest {};

TEST_F(LeaseKeeperTest, RenewsUntilStoppedThenTheLeaseRunsOut) {
  auto q = open();
  ASSERT_TRUE(q->send("long").ok());
  auto received = std::chrono::steady_clock::now();
  Message m = one(*q, 100ms);
  {
    // Each renewal extends by 1 s (not 100 ms): a keeper thread the loaded machine runs
    // late must not lose the lease. Without renewals it runs out at 100 ms. Waited for, not
    // slept for: 400 ms past the receive and two renewals (due at 30 and 60 ms), whichever
    // comes last, up to 10 s.
    LeaseKeeper keeper(*q, m.receipt, {30ms, 1000ms, 10s});
    auto give_up = received + 10s;
    while ((keeper.renewals() < 2 || std::chrono::steady_clock::now() < received + 400ms) &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_GE(keeper.renewals(), 2u) << "the keeper did not renew twice in 10 s";
    EXPECT_EQ(q->receive().status().code(), Code::kEmpty) << "kept past its 100 ms lease";
    EXPECT_TRUE(keeper.status().ok());
  }
  Message again = one(*q, 10s, 3s);
  EXPECT_EQ(again.id, m.id);
  EXPECT_EQ(again.receive_count, 2u);
}

// Leases and renewals of 1 s (renewed every 30 ms), so a keeper thread the loaded machine
// runs late still keeps the lease (with a 100 ms lease, a renewal 70 ms late lost it: seen
// once with the pwrite backend). Renewals stop at the 1.5 s lifetime and the lease runs out
// within 1 s of the last one; a keeper that renewed past its lifetime would keep it through
// the whole 6 s poll.
TEST_F(LeaseKeeperTest, StopsRenewingAtMaxLifetime) {
  auto q = open();
  ASSERT_TRUE(q->send("hung task").ok());
  Message m = one(*q, 1000ms);
  auto t0 = std::chrono::steady_clock::now();
  LeaseKeeper keeper(*q, m.receipt, {30ms, 1000ms, 1500ms});
  Message again = one(*q, 10s, 6s);
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(again.id, m.id);
  EXPECT_GE(waited, 1500ms) << "the lease ran out before the keeper's lifetime ended";
  EXPECT_LT(waited, 1500ms + 1000ms + 1000ms) << "renewed past its 1.5 s lifetime";
}

TEST_F(LeaseKeeperTest, ReportsLeaseLost) {
  auto q = open();
  ASSERT_TRUE(q->send("x").ok());
  Message m = one(*q, 30ms);
  std::this_thread::sleep_for(50ms);
  Message other = one(*q, 10s);  // someone else has it now
  LeaseKeeper keeper(*q, m.receipt, {10ms, 100ms, 10s});
  // Its first renewal (10 ms in) fails; a loaded machine may run that thread late, so
  // wait for the report up to 5 s (a keeper that never reports keeps OK throughout).
  auto give_up = std::chrono::steady_clock::now() + 5s;
  while (keeper.status().ok() && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(keeper.status().code(), Code::kLeaseLost);
  EXPECT_TRUE(q->ack(other.receipt).ok());
}

}  // namespace
// The one mutator: every kind of record a live call writes (MSG, delayed MSG, LEASE,
// RELEASE by nack, LEASE by extend, ACK, ACK by remove, DEAD, PURGE, and the checkpoint a
// compaction writes) leaves the index, totals included, as a rebuild from the same log does.
TEST_F(QueueTest, EveryKindOfRecordLeavesTheIndexThatAReplayOfTheLogMakes) {
  QueueOptions o;
  o.max_receives = 1;
  auto q = open(o);
  ASSERT_TRUE(q);
  for (int i = 1; i <= 10; ++i) ASSERT_TRUE(q->send("m" + std::to_string(i)).ok());
  ASSERT_TRUE(q->send("later", Millis(3'600'000)).ok());
  auto got = q->receive(4, Millis(60'000));
  ASSERT_TRUE(got.ok() && got->size() == 4);
  ASSERT_TRUE(q->ack((*got)[0].receipt).ok());
  ASSERT_TRUE(q->nack((*got)[1].receipt).ok());
  ASSERT_TRUE(q->extend((*got)[2].receipt, Millis(120'000)).ok());
  ASSERT_TRUE(q->nack((*got)[3].receipt, Millis(3'600'000)).ok());
  ASSERT_TRUE(q->remove(5).ok());
  // Takes 6 to 10; message 2, nacked after its one delivery, goes to the DLQ.
  ASSERT_TRUE(q->receive(8, Millis(60'000)).ok());
  auto live = q->stats();
  ASSERT_TRUE(live.ok());
  EXPECT_EQ(live->dead_lettered_total, 1u);
  EXPECT_EQ(q->check_index(), "");
  auto compare = [&](const char* when) {
    auto live_now = q->stats();
    ASSERT_TRUE(live_now.ok());
    q.reset();
    ASSERT_EQ(::unlink((qdir() + "/index").c_str()), 0);
    q = open(o);
    ASSERT_TRUE(q);
    auto rebuilt = q->stats();
    ASSERT_TRUE(rebuilt.ok());
    SCOPED_TRACE(when);
    EXPECT_EQ(rebuilt->ready, live_now->ready);
    EXPECT_EQ(rebuilt->in_flight, live_now->in_flight);
    EXPECT_EQ(rebuilt->delayed, live_now->delayed);
    EXPECT_EQ(rebuilt->sent_total, live_now->sent_total);
    EXPECT_EQ(rebuilt->acked_total, live_now->acked_total);
    EXPECT_EQ(rebuilt->dead_lettered_total, live_now->dead_lettered_total);
    EXPECT_EQ(rebuilt->nacked_total, live_now->nacked_total);
    EXPECT_EQ(rebuilt->received_total, live_now->received_total);
    EXPECT_EQ(rebuilt->redelivered_total, live_now->redelivered_total);
    EXPECT_EQ(rebuilt->bytes, live_now->bytes);
    EXPECT_EQ(rebuilt->next_id, live_now->next_id);
  };
  compare("after sends, receives, nacks, an extend, acks, a remove and a dead letter");
  EXPECT_EQ(q->stats()->received_total, 9u);  // 1 to 4, then 6 to 10 (2 went to the DLQ untaken)
  EXPECT_EQ(q->stats()->redelivered_total, 0u);
  EXPECT_EQ(q->stats()->acked_total, 2u);  // the ack and the remove
  EXPECT_EQ(q->stats()->nacked_total, 2u);
  EXPECT_EQ(q->stats()->in_flight, 6u);  // 3 (extended) and 6 to 10
  EXPECT_EQ(q->stats()->delayed, 2u);    // 4 (nacked with a delay) and 11
  ASSERT_TRUE(q->purge().ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(q->send("after the purge").ok());
  ASSERT_TRUE(q->compact().ok());
  compare("after a purge, sends and a compaction");
  EXPECT_EQ(q->stats()->ready, 3u);
}


// Deliveries and redeliveries are counted by the LEASEs that raise a receive count (an
// extend's does not), survive a rebuild from the log and a compaction (the CHECKPOINT
// carries them), and never go backwards.
TEST_F(QueueTest, ReceivedAndRedeliveredTotalsCountDeliveriesAndSurviveRebuildAndCompaction) {
  QueueOptions o;
  o.segment_size = 64 << 10;
  auto q = open(o);
  ASSERT_TRUE(q);
  ASSERT_TRUE(q->send("a").ok());
  ASSERT_TRUE(q->send("b").ok());
  auto got = q->receive(2, Millis(60'000));
  ASSERT_TRUE(got.ok() && got->size() == 2);
  ASSERT_TRUE(q->extend((*got)[0].receipt, Millis(120'000)).ok());
  ASSERT_TRUE(q->nack((*got)[1].receipt).ok());
  auto again = q->receive(1, Millis(60'000));
  ASSERT_TRUE(again.ok() && again->size() == 1 && (*again)[0].receive_count == 2u);
  auto st = q->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->received_total, 3u);
  EXPECT_EQ(st->redelivered_total, 1u);
  ASSERT_TRUE(q->ack((*got)[0].receipt).ok());
  ASSERT_TRUE(q->ack((*again)[0].receipt).ok());
  // Enough traffic to roll segments, then a compaction that removes the records above.
  const std::string big(8000, 'x');
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(q->send(big).ok());
    auto m = q->receive(1, Millis(60'000));
    ASSERT_TRUE(m.ok() && m->size() == 1);
    ASSERT_TRUE(q->ack((*m)[0].receipt).ok());
  }
  auto c = q->compact();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(std::filesystem::exists(qdir() + "/segments/00000000000000000001.seg")) << "segment 1 was compacted";
  q.reset();
  ASSERT_EQ(::unlink((qdir() + "/index").c_str()), 0);
  q = open(o);
  ASSERT_TRUE(q);
  st = q->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->received_total, 43u) << "the checkpoint carried the deliveries of the removed segments";
  EXPECT_EQ(st->redelivered_total, 1u);
}

}  // namespace spool
