// Subscriptions in the one mutator (issue 46, step 1; docs/format.md, "Views"): how SUB
// records and records of a view change view 0's table and each view's own index, held
// against what the format says a reader must make of them. apply_record() is fed records on
// private indexes (one per view), as a live commit and a replay both do.
#include <gtest/gtest.h>

#include <signal.h>

#include <array>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "index/index.h"
#include "queue/apply.h"
#include "spool/queue.h"
#include "storage/log.h"
#include "test_util.h"

namespace spool::test {
namespace {

using format::RecordType;
using index::SharedIndex;
using index::State;

constexpr uint64_t kNow = 1'000'000'000'000;  // boot and log clock alike: a record's time is its key
constexpr uint64_t kSecond = 1'000'000'000;

class Views {
 public:
  Views() {
    for (auto& x : idx_) {
      EXPECT_TRUE(x.attach("", true, true).ok());
      x.assert_held();
      EXPECT_TRUE(queue::clear_for_replay(x).ok());
    }
    view_ = [this](uint16_t k) -> SharedIndex* { return k < idx_.size() ? &idx_[k] : nullptr; };
    keys_.now.boot = kNow;
    keys_.now.rt = kNow;
    keys_.copies = &copies_;
    keys_.views = &view_;
  }

  // Applies `r` at the next position of a synthetic log; returns that position.
  uint64_t apply(const storage::Record& r) {
    const uint64_t at = storage::Pos{1, format::kSegmentHeaderSize + 64 * n_++}.pack();
    SharedIndex& x = idx_[0];
    x.assert_held();
    Status s = queue::apply_record(x, at, queue::view_of(r), keys_);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return at;
  }
  uint64_t send(uint64_t id, std::string_view body) { return apply(storage::Record{RecordType::kMsg, 0, id, kNow, kNow, body}); }
  uint64_t copy(uint64_t id, std::string_view body) {
    return apply(storage::Record{RecordType::kMsg, 0, id, kNow, kNow, body, format::kFlagCopy});
  }
  uint64_t sub(uint16_t k, bool add, uint64_t from, std::string_view name, uint8_t flags = 0) {
    return apply(storage::Record{RecordType::kSub, add ? 1u : 0u, from, 0, 0, name, flags, {}, k});
  }
  uint64_t state(RecordType type, uint16_t k, uint64_t id, uint32_t count = 0, uint8_t flags = 0, uint64_t t2 = kNow) {
    return apply(storage::Record{type, count, id, kNow, t2, {}, flags, {}, k});
  }

  SharedIndex& view(uint16_t k) {
    idx_[k].assert_held();
    return idx_[k];
  }
  // "none", or the message's state and receive count in view k.
  std::string of(uint16_t k, uint64_t id) {
    SharedIndex& x = view(k);
    x.assert_held();
    const int64_t slot = x.find(id);
    if (slot < 0) return "none";
    const index::Entry& e = x.entry(static_cast<uint32_t>(slot));
    const char* st = e.state == State::kLeased ? "leased" : e.state == State::kBlocked ? "blocked" : "ready";
    return std::string(st) + "/" + std::to_string(e.count);
  }
  uint64_t loc(uint16_t k, uint64_t id) {
    SharedIndex& x = view(k);
    x.assert_held();
    const int64_t slot = x.find(id);
    return slot < 0 ? 0 : x.entry(static_cast<uint32_t>(slot)).loc;
  }
  const index::QueueCache& cache(uint16_t k) { return idx_[k].hdr().cache; }
  std::string check(uint16_t k) {
    SharedIndex& x = view(k);
    x.assert_held();
    return x.check_invariants();
  }

 private:
  std::array<SharedIndex, 3> idx_;
  queue::ViewIndex view_;
  queue::Copies copies_;
  queue::Keys keys_;
  uint64_t n_ = 0;
};

// A subscription added "from now" gets the messages sent after it; one added "from start"
// also every message live at its point; each view's receives, acks, nacks and purges are
// its own; a removed subscription's state is gone, and its records change nothing.
TEST(Views, EachSubscriptionHasItsOwnStateFromOneStoredCopy) {
  Views q;
  q.send(1, "a");
  q.sub(1, true, 2, "billing");  // from now: next_id is 2
  EXPECT_EQ(q.cache(0).next_id, 2u) << "a SUB add from now takes no id";
  EXPECT_EQ(q.of(1, 1), "none") << "a subscription from now got an earlier message";
  q.sub(2, true, 0, "audit");  // from start
  EXPECT_EQ(q.of(2, 1), "ready/0");
  EXPECT_EQ(q.cache(0).subs[1].from, 1u) << "from start: its first id is the lowest it got";
  EXPECT_EQ(std::string(q.cache(0).subs[0].name, q.cache(0).subs[0].name_len), "billing");
  const uint64_t at2 = q.send(2, "bb");
  q.send(3, "ccc");
  for (uint16_t k : {0, 1, 2}) {
    EXPECT_EQ(q.of(k, 2), "ready/0") << "view " << k;
    EXPECT_EQ(q.loc(k, 2), at2) << "every view names the one stored record";
    EXPECT_EQ(q.cache(k).next_id, 4u) << "view " << k;
  }
  q.state(RecordType::kLease, 1, 2, 1, 0, kNow + 30 * kSecond);
  EXPECT_EQ(q.of(1, 2), "leased/1");
  EXPECT_EQ(q.of(0, 2), "ready/0") << "a lease of view 1 leased view 0's message";
  q.state(RecordType::kAck, 0, 2);
  EXPECT_EQ(q.of(0, 2), "none");
  EXPECT_EQ(q.of(1, 2), "leased/1") << "an ack of view 0 dropped view 1's message";
  EXPECT_EQ(q.of(2, 2), "ready/0");
  q.state(RecordType::kRelease, 2, 3, 1, format::kFlagNack, kNow + kSecond);
  EXPECT_EQ(q.cache(2).nacked_total, 1u);
  EXPECT_EQ(q.cache(0).nacked_total, 0u);
  q.state(RecordType::kPurge, 2, 3);
  EXPECT_EQ(q.of(2, 1), "none");
  EXPECT_EQ(q.of(2, 3), "none");
  EXPECT_EQ(q.of(0, 3), "ready/0") << "a purge of view 2 purged view 0";
  q.state(RecordType::kPause, 1, 0, 1);
  EXPECT_EQ(q.cache(1).paused, 1u);
  EXPECT_EQ(q.cache(0).paused, 0u);
  EXPECT_EQ(q.cache(0).sent_total, 3u);
  EXPECT_EQ(q.cache(1).sent_total, 2u);
  EXPECT_EQ(q.cache(2).sent_total, 3u);
  EXPECT_EQ(q.cache(0).acked_total, 1u);
  EXPECT_EQ(q.cache(1).acked_total, 0u);

  q.sub(2, false, 0, "audit");
  EXPECT_EQ(q.cache(0).subs[1].active, 0u);
  EXPECT_EQ(q.cache(2).sent_total, 0u) << "a removed subscription keeps its state";
  q.send(4, "d");
  EXPECT_EQ(q.of(2, 4), "none") << "a removed subscription still gets messages";
  EXPECT_EQ(q.of(1, 4), "ready/0");
  q.state(RecordType::kLease, 2, 4, 1);
  EXPECT_EQ(q.of(2, 4), "none");
  for (uint16_t k : {0, 1, 2}) EXPECT_EQ(q.check(k), "") << "view " << k;
}

// A MSG flagged kFlagOneView (a redrive or replay of one view's messages) goes into the
// view its record names only: a subscription's into it alone, view 0's into view 0 alone,
// one of a subscription not active into none.
TEST(Views, AMessageForOneViewGoesIntoThatViewOnly) {
  Views q;
  q.sub(1, true, 1, "billing");
  q.sub(2, true, 1, "audit");
  auto one = [&](uint64_t id, uint16_t k) {
    return q.apply(storage::Record{RecordType::kMsg, 0, id, kNow, kNow, "x", format::kFlagOneView, {}, k});
  };
  one(1, 1);
  one(2, 0);
  one(3, 3);  // subscription 3 was never added
  q.send(4, "every view");
  EXPECT_EQ(q.of(1, 1), "ready/0");
  EXPECT_EQ(q.of(0, 1), "none") << "view 1's message went to view 0";
  EXPECT_EQ(q.of(2, 1), "none") << "view 1's message went to view 2";
  EXPECT_EQ(q.of(0, 2), "ready/0");
  EXPECT_EQ(q.of(1, 2), "none") << "view 0's message went to view 1";
  EXPECT_EQ(q.of(2, 2), "none") << "view 0's message went to view 2";
  for (uint16_t k : {0, 1, 2}) {
    EXPECT_EQ(q.of(k, 3), "none") << "a message of an inactive view went to view " << k;
    EXPECT_EQ(q.of(k, 4), "ready/0") << "view " << k;
    EXPECT_EQ(q.cache(k).next_id, 5u) << "view " << k;
    EXPECT_EQ(q.check(k), "") << "view " << k;
  }
  EXPECT_EQ(q.cache(1).sent_total, 2u);
  EXPECT_EQ(q.cache(0).sent_total, 2u);
}

// Compaction copies with subscriptions: a copy is of no view by itself; each view's LEASE
// or RELEASE after it moves that view's entry to the copy, or (the original gone with the
// segments compaction removed) inserts it there. A view with no record after the copy does
// not get the message back (view 0 acked it while view 1 held it).
TEST(Views, ACopyGoesOnlyIntoTheViewsWhoseRecordsFollowIt) {
  Views q;
  q.sub(1, true, 1, "billing");
  q.send(1, "a");
  q.send(2, "b");
  q.state(RecordType::kLease, 1, 1, 1, 0, kNow + 60 * kSecond);
  q.state(RecordType::kAck, 0, 1);
  // A compaction: message 1 only view 1 holds (leased), message 2 both.
  const uint64_t c1 = q.copy(1, "a");
  EXPECT_EQ(q.of(0, 1), "none") << "a copy went into a view by itself";
  q.state(RecordType::kLease, 1, 1, 1, 0, kNow + 60 * kSecond);
  const uint64_t c2 = q.copy(2, "b");
  q.state(RecordType::kRelease, 0, 2);
  q.state(RecordType::kRelease, 1, 2);
  EXPECT_EQ(q.of(0, 1), "none") << "view 0's acked message came back";
  EXPECT_EQ(q.loc(1, 1), c1);
  EXPECT_EQ(q.of(1, 1), "leased/1");
  EXPECT_EQ(q.loc(0, 2), c2);
  EXPECT_EQ(q.loc(1, 2), c2) << "view 1's entry stayed at the original the compaction removes";

  // What a replay of the log after that compaction reads: the restated SUB, the copies and
  // their records, nothing of the originals.
  Views r;
  r.sub(1, true, 1, "billing", format::kFlagRestated);
  EXPECT_EQ(r.cache(1).sent_total, 0u);
  const uint64_t r1 = r.copy(1, "a");
  r.state(RecordType::kLease, 1, 1, 1, 0, kNow + 60 * kSecond);
  const uint64_t r2 = r.copy(2, "b");
  r.state(RecordType::kRelease, 0, 2);
  r.state(RecordType::kRelease, 1, 2);
  EXPECT_EQ(r.of(0, 1), "none");
  EXPECT_EQ(r.of(1, 1), "leased/1");
  EXPECT_EQ(r.loc(1, 1), r1);
  EXPECT_EQ(r.of(0, 2), "ready/0");
  EXPECT_EQ(r.of(1, 2), "ready/0");
  EXPECT_EQ(r.loc(0, 2), r2);
  EXPECT_EQ(r.loc(1, 2), r2);
  for (uint16_t k : {0, 1}) EXPECT_EQ(r.check(k), "") << "view " << k;
}

// Every segment opens with a SUB add flagged RESTATED per active view. Of a view active
// with that `from` it changes nothing (the log from its start); of a view not active (a
// replay from a segment whose earlier ones compaction removed, the real add with them) it
// activates the view empty, with that `from`: no "from start" fill, and the MSGs after it
// fan out to it as to any view.
TEST(Views, ARestatedAddKeepsAnActiveViewAndStartsAMissingOneEmpty) {
  Views q;
  q.send(1, "a");
  const uint64_t added = q.sub(1, true, 0, "billing");  // from start: gets message 1
  q.state(RecordType::kLease, 1, 1, 1, 0, kNow + 60 * kSecond);
  q.sub(1, true, 1, "billing", format::kFlagRestated);
  EXPECT_EQ(q.of(1, 1), "leased/1") << "a restatement of an active view emptied it";
  EXPECT_EQ(q.cache(0).subs[0].added, added) << "a restatement moved the add's position";
  EXPECT_EQ(q.cache(1).received_total, 1u);

  Views r;  // the same log from a later segment on: message 1 is in view 0 only
  r.send(1, "a");
  r.sub(1, true, 2, "billing", format::kFlagRestated);
  EXPECT_EQ(r.cache(0).subs[0].active, 1u);
  EXPECT_EQ(r.cache(0).subs[0].from, 2u);
  EXPECT_EQ(std::string(r.cache(0).subs[0].name, r.cache(0).subs[0].name_len), "billing");
  EXPECT_EQ(r.of(1, 1), "none") << "a restated add filled the view as a from-start add";
  r.send(2, "b");
  EXPECT_EQ(r.of(1, 2), "ready/0") << "a message after the restatement missed the view";
  EXPECT_EQ(r.of(0, 2), "ready/0");
  EXPECT_EQ(r.cache(1).next_id, 3u);
  for (uint16_t k : {0, 1}) EXPECT_EQ(r.check(k), "") << "view " << k;
}

// A view's index file (no process attached), field by field: its totals and its entries.
std::map<std::string, std::string> view_file(const std::string& path) {
  std::map<std::string, std::string> out;
  SharedIndex x;
  Status st = x.attach(path, false);
  EXPECT_TRUE(st.ok()) << path << ": " << st.to_string();
  if (!st.ok()) return out;
  x.assert_held();  // nobody else is attached
  EXPECT_TRUE(x.refresh().ok());
  EXPECT_EQ(x.check_invariants(), "") << path;
  const auto& h = x.hdr();
  for (const auto& [k, v] : std::map<std::string, uint64_t>{{"count", h.layout.count},
                                                            {"leased", h.layout.leased},
                                                            {"next_id", h.cache.next_id},
                                                            {"purged_through", h.cache.purged_through},
                                                            {"sent_total", h.cache.sent_total},
                                                            {"acked_total", h.cache.acked_total},
                                                            {"received_total", h.cache.received_total},
                                                            {"bytes_live", h.cache.bytes_live},
                                                            {"paused", h.cache.paused}}) {
    out[k] = std::to_string(v);
  }
  for (uint32_t k = 0; k < index::kSubscriptions; ++k) {
    const index::Subscription& sub = h.cache.subs[k];
    if (sub.active == 0) continue;
    out["sub." + std::to_string(k + 1)] = std::string(sub.name, sub.name_len) + " from " + std::to_string(sub.from);
  }
  x.for_each_entry([&](uint32_t, uint64_t id, const index::Entry& e) {
    out["msg." + std::to_string(id)] = std::string(e.state == State::kLeased ? "leased" : "ready") + " count " +
                                       std::to_string(e.count) + " loc " + std::to_string(e.loc) + " len " +
                                       std::to_string(e.len);
  });
  return out;
}

class SubscriptionQueue : public ::testing::Test {
 public:  // (also for the helpers of several tests)
  // Subscription `sub`'s handle.
  std::unique_ptr<Queue> open(const std::string& sub) {
    QueueOptions o;
    o.subscription = sub;
    return open(o);
  }
  // The queue's own handle (or the subscription `o` names).
  std::unique_ptr<Queue> open(QueueOptions o = {}) {
    o.sync = SyncPolicy::kNever;
    o.segment_size = 16 << 10;
    auto q = Queue::open(qdir(), o);
    EXPECT_TRUE(q.ok()) << q.status().to_string();
    return q.ok() ? std::move(q).value() : nullptr;
  }
  std::string qdir() const { return dir_ / "q"; }
  // With every handle closed: deletes the index files and reopens; each view must come back
  // from the log alone as the live calls left it.
  void expect_same_after_rebuild() {
    const auto live = files();
    std::filesystem::remove(qdir() + "/index");
    for (const char* k : {"1", "2"}) std::filesystem::remove(qdir() + "/subs/" + k + ".index");
    auto q = open();
    ASSERT_NE(q, nullptr);
    q.reset();
    EXPECT_EQ(files(), live) << "the log replays into other views than the live calls left";
  }
  std::map<std::string, std::map<std::string, std::string>> files() {
    std::map<std::string, std::map<std::string, std::string>> out;
    out["index"] = view_file(qdir() + "/index");
    for (const char* k : {"1", "2"}) {
      if (std::filesystem::exists(qdir() + "/subs/" + k + ".index")) out[k] = view_file(qdir() + "/subs/" + k + ".index");
    }
    return out;
  }
  test::TempDir dir_;
};

std::string names(const std::vector<SubscriptionInfo>& subs) {
  std::string out;
  for (const auto& s : subs) {
    out += s.name + " from " + std::to_string(s.from) + " messages " + std::to_string(s.messages) + ";";
  }
  return out;
}

// Through the library: subscriptions added from now and from start get their messages
// from the one stored copy, view 0's acks leave them alone, bad names and unknown ones are
// refused, and every view's index comes back the same from the log alone (the index files
// deleted), and a lost subscription index alone is rebuilt too.
TEST_F(SubscriptionQueue, AddRemoveListAndEveryViewRebuiltFromTheLog) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  ASSERT_TRUE(q->send("one").ok());
  ASSERT_TRUE(q->add_subscription("billing").ok());
  ASSERT_TRUE(q->send("two").ok());
  ASSERT_TRUE(q->send("three").ok());
  ASSERT_TRUE(q->add_subscription("audit", true).ok());
  ASSERT_TRUE(q->send("four").ok());
  EXPECT_EQ(q->add_subscription("billing").code(), Code::kInvalidArgument) << "a name added twice";
  EXPECT_EQ(q->add_subscription("default").code(), Code::kInvalidArgument);
  EXPECT_EQ(q->add_subscription("has space").code(), Code::kInvalidArgument);
  EXPECT_EQ(q->add_subscription(std::string(49, 'a')).code(), Code::kInvalidArgument);
  EXPECT_EQ(q->remove_subscription("nope").code(), Code::kNotFound);
  ASSERT_TRUE(q->add_subscription("gone").ok());
  ASSERT_TRUE(q->remove_subscription("gone").ok());
  auto got = q->receive(2, std::chrono::seconds(60));
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 2u);
  for (const auto& m : *got) ASSERT_TRUE(q->ack(m.receipt).ok());
  auto subs = q->subscriptions();
  ASSERT_TRUE(subs.ok()) << subs.status().to_string();
  EXPECT_EQ(names(*subs), "billing from 2 messages 3;audit from 1 messages 4;");
  auto st = q->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->acked_total, 2u);
  auto c = q->compact();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->segments_removed, 0u) << "compaction removed segments while subscriptions are active";
  q.reset();

  const auto live = files();
  EXPECT_EQ(live.at("index").at("sub.1"), "billing from 2");
  EXPECT_EQ(live.at("2").at("sent_total"), "4");
  EXPECT_EQ(live.at("1").count("msg.1"), 0u);
  EXPECT_EQ(live.at("2").at("msg.1").substr(0, 13), "ready count 0");
  std::filesystem::remove(qdir() + "/index");
  std::filesystem::remove(qdir() + "/subs/1.index");
  std::filesystem::remove(qdir() + "/subs/2.index");
  q = open();  // the first opener rebuilds every view from the log
  ASSERT_NE(q, nullptr);
  q.reset();
  EXPECT_EQ(files(), live) << "a rebuild from the log made other views";

  {
    // Damage while nobody had the queue open: view 1's count off by 5 (its invariants
    // broken). The first opener rebuilds every view.
    SharedIndex x;
    Status at = x.attach(qdir() + "/subs/1.index", false);
    ASSERT_TRUE(at.ok()) << at.to_string();
    x.hdr().layout.count += 5;
  }
  q = open();
  ASSERT_NE(q, nullptr);
  q.reset();
  EXPECT_EQ(files(), live) << "a damaged subscription index was trusted";

  std::filesystem::remove(qdir() + "/subs/2.index");
  q = open();
  ASSERT_NE(q, nullptr);
  (void)q->subscriptions();  // finds view 2's index missing: rebuilt before the unlock
  subs = q->subscriptions();
  ASSERT_TRUE(subs.ok());
  EXPECT_EQ(names(*subs), "billing from 2 messages 3;audit from 1 messages 4;");
  q.reset();
  EXPECT_EQ(files(), live) << "a lost subscription index was not rebuilt";
}

// A handle opened with QueueOptions::subscription receives, acks and nacks that
// subscription's messages and leaves the queue's own alone; a receipt of the other view is
// refused; calls not there yet for a subscription say so; every view's state comes back the
// same from the log (a rebuild after the index files are deleted).
TEST_F(SubscriptionQueue, ASubscriptionsHandleReceivesAcksAndNacksItsOwnMessages) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  ASSERT_TRUE(q->add_subscription("billing").ok());
  QueueOptions o;
  o.sync = SyncPolicy::kNever;
  o.subscription = "nope";
  EXPECT_EQ(Queue::open(qdir(), o).status().code(), Code::kNotFound);
  o.subscription = "billing";
  auto opened = Queue::open(qdir(), o);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  auto b = std::move(opened).value();
  for (const char* m : {"one", "two", "three"}) ASSERT_TRUE(q->send(m).ok());
  auto got = b->receive(2, std::chrono::seconds(60));
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[0].payload, "one");
  ASSERT_TRUE(b->ack((*got)[0].receipt).ok());
  ASSERT_TRUE(b->nack((*got)[1].receipt).ok());
  auto mine = q->receive(10, std::chrono::seconds(60), std::chrono::milliseconds(0));
  ASSERT_TRUE(mine.ok()) << mine.status().to_string();
  EXPECT_EQ(mine->size(), 3u) << "the subscription's receives took the queue's own messages";
  EXPECT_EQ(b->ack((*mine)[2].receipt).code(), Code::kInvalidArgument) << "a receipt of view 0 acked in view 1";
  EXPECT_EQ(q->ack((*got)[1].receipt).code(), Code::kInvalidArgument) << "a receipt of view 1 acked in view 0";
  ASSERT_TRUE(q->ack((*mine)[0].receipt).ok());
  auto again = b->receive(10, std::chrono::seconds(60), std::chrono::milliseconds(0));
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  ASSERT_EQ(again->size(), 2u);
  // (A redelivery is ordered by the time it became ready again: after "three".)
  std::map<std::string, uint32_t> counts;
  for (const auto& m : *again) counts[m.payload] = m.receive_count;
  EXPECT_EQ(counts, (std::map<std::string, uint32_t>{{"three", 1}, {"two", 2}})) << "the nacked message's count";
  EXPECT_EQ(b->purge().status().code(), Code::kInvalidArgument);
  auto bs = b->stats();
  ASSERT_TRUE(bs.ok()) << bs.status().to_string();
  EXPECT_EQ(bs->in_flight, 2u);
  EXPECT_EQ(bs->ready, 0u);
  EXPECT_EQ(bs->sent_total, 3u);
  EXPECT_EQ(bs->acked_total, 1u);
  EXPECT_EQ(bs->nacked_total, 1u);
  EXPECT_EQ(bs->received_total, 4u);
  auto qs = q->stats();
  ASSERT_TRUE(qs.ok());
  EXPECT_EQ(qs->in_flight, 2u) << "view 0's stats";
  EXPECT_EQ(qs->acked_total, 1u);
  EXPECT_EQ(qs->nacked_total, 0u);
  EXPECT_EQ(qs->received_total, 3u);
  b.reset();
  q.reset();
  const auto live = files();
  EXPECT_EQ(live.at("1").at("count"), "2");
  EXPECT_EQ(live.at("1").at("leased"), "2");
  EXPECT_EQ(live.at("1").at("acked_total"), "1");
  EXPECT_EQ(live.at("index").at("count"), "2");
  std::filesystem::remove(qdir() + "/index");
  std::filesystem::remove(qdir() + "/subs/1.index");
  q = open();
  ASSERT_NE(q, nullptr);
  q.reset();
  auto replayed = files();
  // (A lease's deadline is a key of the replay's clock; the entries name state and count.)
  EXPECT_EQ(replayed, live) << "a rebuild from the log made other views";
}

// A pause is the queue's: a subscription's handle gets nothing (receive and receive by id)
// until resume, and its long poll ends with the resume.
TEST_F(SubscriptionQueue, APauseHoldsBackEverySubscription) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  ASSERT_TRUE(q->add_subscription("audit").ok());
  auto a = open("audit");
  ASSERT_NE(a, nullptr);
  auto id = q->send("held");
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(q->pause().ok());
  EXPECT_EQ(a->pause().code(), Code::kInvalidArgument) << "a pause on a subscription's handle";
  auto none = a->receive(1, std::chrono::seconds(60), std::chrono::milliseconds(0));
  EXPECT_EQ(none.status().code(), Code::kEmpty) << "a paused queue's subscription delivered";
  EXPECT_EQ(a->receive_id(*id, std::chrono::seconds(60)).status().code(), Code::kEmpty);
  std::thread resumer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(q->resume().ok());
  });
  auto got = a->receive(1, std::chrono::seconds(60), std::chrono::seconds(10));
  resumer.join();
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), 1u) << "the long poll did not end with the resume";
  EXPECT_EQ((*got)[0].payload, "held");
}

// Long polls of every view sleep on one futex word: a send wakes a subscription's poll
// even while the queue's own view has pollers that slept first (a send used to wake one
// sleeper, the first, and the subscription's poll slept out its 1 s slice).
TEST_F(SubscriptionQueue, ASendWakesASubscriptionsLongPollAtOnce) {
  auto s = open();
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->add_subscription("audit").ok());
  std::vector<std::unique_ptr<Queue>> own;
  for (int i = 0; i < 2; ++i) own.push_back(open());
  auto a = open("audit");
  ASSERT_NE(a, nullptr);
  std::vector<std::thread> polls;
  for (auto& q : own) {
    polls.emplace_back([&q] { (void)q->receive(1, std::chrono::seconds(60), std::chrono::seconds(3)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  std::chrono::steady_clock::time_point got_at{};
  std::thread audit([&] {
    auto got = a->receive(1, std::chrono::seconds(60), std::chrono::seconds(3));
    got_at = std::chrono::steady_clock::now();
    EXPECT_TRUE(got.ok() && got->size() == 1) << got.status().to_string();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // every poll asleep
  const auto sent_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(s->send("for everyone").ok());
  audit.join();
  ASSERT_TRUE(s->send("for the other poll").ok());
  for (auto& t : polls) t.join();
  // Its slice would end about 900 ms after the send.
  EXPECT_LT(got_at - sent_at, std::chrono::milliseconds(450)) << "the subscription's poll slept through the send";
}

// The model test: random sends, receives, acks, nacks and extends across the queue's own
// view and two subscriptions (one added from start mid-stream), and compactions, held
// against a model of each view (which messages it holds, leased or ready, with what
// receive count): every receive gets exactly as many messages as the view has ready, each
// one the model says is ready there, with the next receive count and its payload; stats
// agree; then a rebuild from the log alone gives every view's index field by field.
TEST_F(SubscriptionQueue, RandomStreamsAcrossThreeViewsMatchAModelAndTheLog) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::filesystem::remove_all(qdir());
    std::mt19937 rng(seed);
    auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
    struct Held {
      bool leased = false;
      uint32_t count = 0;
      std::string receipt;
    };
    std::array<std::map<uint64_t, Held>, 3> model;  // by view: 0, "a" (from now), "b" (from start, later)
    std::array<std::unique_ptr<Queue>, 3> h;
    std::map<uint64_t, std::string> bodies;
    h[0] = open();
    ASSERT_NE(h[0], nullptr);
    ASSERT_TRUE(h[0]->add_subscription("a").ok());
    auto open_sub = [&](const char* name) {
      QueueOptions o;
      o.sync = SyncPolicy::kNever;
      o.segment_size = 16 << 10;
      o.subscription = name;
      auto q = Queue::open(qdir(), o);
      EXPECT_TRUE(q.ok()) << q.status().to_string();
      return q.ok() ? std::move(q).value() : nullptr;
    };
    h[1] = open_sub("a");
    ASSERT_NE(h[1], nullptr);
    const int kOps = 400;
    uint64_t removed = 0;  // segments compaction removed: the log replayed below lacks its prefix
    for (int op = 0; op < kOps; ++op) {
      if (op == kOps / 3) {
        // "From start": every message any view holds now, ready, count 0.
        ASSERT_TRUE(h[0]->add_subscription("b", true).ok());
        h[2] = open_sub("b");
        ASSERT_NE(h[2], nullptr);
        for (size_t k = 0; k < 2; ++k) {
          for (const auto& [id, m] : model[k]) model[2][id] = Held{};
        }
      }
      const size_t views = h[2] != nullptr ? 3 : 2;
      const size_t k = pick(views);
      const size_t what = pick(10);
      if (what < 4) {
        const std::string body = "m" + std::to_string(op) + std::string(pick(200), 'x');
        auto id = h[pick(views)]->send(body);
        ASSERT_TRUE(id.ok()) << id.status().to_string();
        bodies[*id] = body;
        for (size_t v = 0; v < views; ++v) model[v][*id] = Held{};
      } else if (what < 6) {
        size_t ready = 0;
        for (const auto& [id, m] : model[k]) ready += m.leased ? 0 : 1;
        const size_t want = 1 + pick(3);
        auto got = h[k]->receive(want, std::chrono::hours(1), std::chrono::milliseconds(0));
        if (ready == 0) {
          ASSERT_EQ(got.status().code(), Code::kEmpty) << "view " << k;
          continue;
        }
        ASSERT_TRUE(got.ok()) << got.status().to_string();
        ASSERT_EQ(got->size(), std::min(want, ready)) << "view " << k;
        for (const auto& m : *got) {
          auto it = model[k].find(m.id);
          ASSERT_TRUE(it != model[k].end() && !it->second.leased) << "view " << k << " delivered " << m.id;
          EXPECT_EQ(m.receive_count, it->second.count + 1);
          EXPECT_EQ(m.payload, bodies[m.id]);
          it->second = Held{true, m.receive_count, m.receipt};
        }
      } else {
        std::vector<uint64_t> leased;
        for (const auto& [id, m] : model[k]) {
          if (m.leased) leased.push_back(id);
        }
        if (leased.empty()) continue;
        const uint64_t id = leased[pick(leased.size())];
        Held& m = model[k][id];
        if (what < 8) {
          ASSERT_TRUE(h[k]->ack(m.receipt).ok());
          model[k].erase(id);
        } else if (what < 9) {
          ASSERT_TRUE(h[k]->nack(m.receipt).ok());
          m.leased = false;
        } else {
          ASSERT_TRUE(h[k]->extend(m.receipt, std::chrono::hours(2)).ok());
        }
      }
      if (op % 100 == 98) {
        // Each view takes and acks what it has, but for a few messages it keeps leased or
        // ready: the segments before become mostly dead, and compaction copies what one view
        // or several still hold.
        for (size_t v = 0; v < views; ++v) {
          auto got = h[v]->receive(1000, std::chrono::hours(1), std::chrono::milliseconds(0));
          ASSERT_TRUE(got.ok() || got.status().code() == Code::kEmpty) << got.status().to_string();
          for (const auto& m : got.ok() ? *got : std::vector<Message>{}) {
            auto it = model[v].find(m.id);
            ASSERT_TRUE(it != model[v].end() && !it->second.leased) << "view " << v << " delivered " << m.id;
            EXPECT_EQ(m.receive_count, it->second.count + 1);
            it->second = Held{true, m.receive_count, m.receipt};
          }
          // In one ack_batch (LIST records of runs of ids, by delivery number).
          std::vector<std::string> receipts;
          for (auto it = model[v].begin(); it != model[v].end();) {
            if (it->first % 7 == v) {
              ++it;
              continue;
            }
            receipts.push_back(it->second.receipt);
            it = model[v].erase(it);
          }
          const std::vector<std::string_view> rs(receipts.begin(), receipts.end());
          auto acked = h[v]->ack_batch(rs);
          ASSERT_TRUE(acked.ok()) << acked.status().to_string();
          for (const Status& s : *acked) ASSERT_TRUE(s.ok()) << s.to_string();
          for (auto& [id, m] : model[v]) {
            if (m.leased && id % 2 == 0) {
              ASSERT_TRUE(h[v]->nack(m.receipt).ok());
              m.leased = false;
            }
          }
        }
      }
      if (op % 50 == 49) {
        auto c = h[0]->compact();
        ASSERT_TRUE(c.ok()) << c.status().to_string();
        removed += c->segments_removed;
        for (size_t v = 0; v < views; ++v) {
          auto st = h[v]->stats();
          ASSERT_TRUE(st.ok());
          uint64_t leased = 0;
          for (const auto& [id, m] : model[v]) leased += m.leased ? 1 : 0;
          EXPECT_EQ(st->in_flight, leased) << "view " << v;
          EXPECT_EQ(st->ready, model[v].size() - leased) << "view " << v;
        }
      }
    }
    EXPECT_GT(removed, 0u) << "compaction removed nothing while subscriptions existed";
    for (auto& q : h) q.reset();
    const auto live = files();
    ASSERT_EQ(live.at("1").at("count"), std::to_string(model[1].size()));
    ASSERT_EQ(live.at("2").at("count"), std::to_string(model[2].size()));
    std::filesystem::remove(qdir() + "/index");
    std::filesystem::remove(qdir() + "/subs/1.index");
    std::filesystem::remove(qdir() + "/subs/2.index");
    h[0] = open();
    ASSERT_NE(h[0], nullptr);
    h[0].reset();
    EXPECT_EQ(files(), live) << "the log replays into other views than the live calls left";
  }
}

// kill -9 at each step of a compaction with two subscriptions (after the copies, after
// their sync, after the checkpoint, after the first unlink), then the index kept and the
// index deleted: every view holds what it held before, in the same state, with the same
// totals; a compaction after it completes the same way.
TEST_F(SubscriptionQueue, KillNineAtEachCompactionStepKeepsEveryView) {
  // Every view's file without the records' positions (compaction moves them).
  auto logical = [&] {
    auto out = files();
    for (auto& [file, fields] : out) {
      for (auto& [k, v] : fields) {
        if (k.rfind("msg.", 0) == 0) v = v.substr(0, v.find(" loc ")) + v.substr(v.find(" len "));
      }
    }
    return out;
  };
  auto drain = [](Queue& q, uint64_t keep_mod) {
    auto got = q.receive(1000, std::chrono::hours(1), std::chrono::milliseconds(0));
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    for (const auto& m : *got) {
      if (m.id % keep_mod != 0) {
        ASSERT_TRUE(q.ack(m.receipt).ok());
      }
    }
  };
  uint64_t removed = 0;
  for (const char* point : {"compact.after_copy", "compact.after_sync", "compact.after_checkpoint", "compact.after_unlink"}) {
    SCOPED_TRACE(point);
    std::filesystem::remove_all(qdir());
    auto q = open();
    ASSERT_NE(q, nullptr);
    ASSERT_TRUE(q->add_subscription("a").ok());
    for (int i = 0; i < 300; ++i) {
      if (i == 100) {
        ASSERT_TRUE(q->add_subscription("b").ok());
      }
      ASSERT_TRUE(q->send("m" + std::to_string(i) + std::string(100, 'x')).ok());
    }
    std::array<std::unique_ptr<Queue>, 2> subs;
    for (size_t k = 0; k < 2; ++k) {
      QueueOptions o;
      o.sync = SyncPolicy::kNever;
      o.segment_size = 16 << 10;
      o.subscription = k == 0 ? "a" : "b";
      auto s = Queue::open(qdir(), o);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      subs[k] = std::move(s).value();
    }
    drain(*q, 5);
    drain(*subs[0], 3);
    drain(*subs[1], 4);
    subs = {};
    q.reset();
    const auto before = logical();
    ASSERT_EQ(before.count("2"), 1u);
    const pid_t child = test::spawn([&] {
      ::setenv("SPOOL_CRASHPOINT", point, 1);
      auto c = open();
      if (c == nullptr) return 2;
      (void)c->compact();
      return 3;
    });
    ASSERT_EQ(test::wait_exit(child), 128 + SIGKILL) << "the compaction did not reach " << point;
    q = open();
    ASSERT_NE(q, nullptr);
    q.reset();
    EXPECT_EQ(logical(), before) << "after kill -9 at " << point;
    for (const char* f : {"/index", "/subs/1.index", "/subs/2.index"}) std::filesystem::remove(qdir() + f);
    q = open();
    ASSERT_NE(q, nullptr);
    auto c = q->compact();
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    removed += c->segments_removed;
    q.reset();
    EXPECT_EQ(logical(), before) << "rebuilt after kill -9 at " << point << ", then compacted";
    for (const char* f : {"/index", "/subs/1.index", "/subs/2.index"}) std::filesystem::remove(qdir() + f);
    q = open();
    q.reset();
    EXPECT_EQ(logical(), before) << "rebuilt after the compaction that followed the kill at " << point;
  }
  EXPECT_GT(removed, 0u) << "no compaction removed a segment: the test tested nothing";
}

// Retention reaches a subscription that receives nothing: with s1 and view 0 draining and
// s2 stalled, retention (by age: `age`; else by bytes: at most `bytes`) drops s2's messages
// without a receive in s2 (at a send, and at compaction's start), compaction then removes
// the segments, and a rebuild from the log alone gives every view back the same.
void retention_reaches_a_stalled_subscription(SubscriptionQueue& t, std::chrono::milliseconds age, uint64_t bytes) {
  QueueOptions o;
  o.retention_max_age = age;
  o.retention_max_bytes = bytes;
  auto q = t.open(o);
  ASSERT_NE(q, nullptr);
  ASSERT_TRUE(q->add_subscription("s1").ok());
  ASSERT_TRUE(q->add_subscription("s2").ok());
  o.subscription = "s1";
  auto s1 = t.open(o);
  o.subscription = "s2";
  auto s2 = t.open(o);
  ASSERT_NE(s1, nullptr);
  ASSERT_NE(s2, nullptr);
  const std::string body(1000, 'm');
  constexpr int kSent = 60;  // about 4 segments of 16 KiB
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kSent; ++i) {
    ASSERT_TRUE(q->send(body).ok());
    for (Queue* r : {q.get(), s1.get()}) {
      auto got = r->receive(1, std::chrono::seconds(60), std::chrono::milliseconds(0));
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      ASSERT_EQ(got->size(), 1u);
      ASSERT_TRUE(r->ack(got->front().receipt).ok());
    }
  }
  auto held = [&]() {
    auto subs = q->subscriptions();
    EXPECT_TRUE(subs.ok());
    return subs.ok() && subs->size() == 2 ? (*subs)[1].messages : UINT64_MAX;
  };
  auto before = q->stats();
  ASSERT_TRUE(before.ok());
  uint64_t expect_held = 0;
  if (age.count() != 0) {
    // (A slow run, sanitizers on a loaded machine, may pass the age while sending.)
    if (std::chrono::steady_clock::now() - start < age / 2) {
      EXPECT_EQ(held(), uint64_t{kSent}) << "dropped before the age";
    }
    std::this_thread::sleep_for(age + std::chrono::milliseconds(50));
    ASSERT_TRUE(q->send(body).ok());  // the send's sweep drops the old ones: the new one stays
    expect_held = 1;
  } else {
    expect_held = bytes / body.size();
  }
  EXPECT_EQ(held(), expect_held) << "retention did not reach the stalled subscription";
  auto s2_stats = s2->stats();
  ASSERT_TRUE(s2_stats.ok());
  EXPECT_EQ(s2_stats->expired_total, kSent + (age.count() != 0 ? 1 : 0) - expect_held) << "s2's losses to retention";
  // (The background compaction at each roll may have removed some already.)
  auto c = q->compact();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto after = q->stats();
  ASSERT_TRUE(after.ok());
  EXPECT_LE(after->segments, 3u) << "the stalled subscription kept its segments (" << before->segments << " before)";
  s1.reset();
  s2.reset();
  q.reset();
  const auto live = t.files();
  EXPECT_EQ(live.at("2").at("count"), std::to_string(expect_held));
  std::filesystem::remove(t.qdir() + "/index");
  std::filesystem::remove(t.qdir() + "/subs/1.index");
  std::filesystem::remove(t.qdir() + "/subs/2.index");
  o.subscription.clear();
  q = t.open(o);
  ASSERT_NE(q, nullptr);
  q.reset();
  EXPECT_EQ(t.files(), live) << "a rebuild from the log made other views";
}

TEST_F(SubscriptionQueue, RetentionByAgeReachesAStalledSubscription) {
  retention_reaches_a_stalled_subscription(*this, std::chrono::milliseconds(400), 0);
}

TEST_F(SubscriptionQueue, RetentionByBytesReachesAStalledSubscription) {
  retention_reaches_a_stalled_subscription(*this, std::chrono::milliseconds(0), 8000);
}

// Back-pressure counts the fullest view: with the queue's own readers drained, a stalled
// subscription at max_ready refuses the next send, naming itself; once it reads, there is
// room. With a retention limit set, retention drops its oldest instead and sends go on.
TEST_F(SubscriptionQueue, AStalledSubscriptionHoldsTheProducerBackUnlessRetentionIsOn) {
  QueueOptions o;
  o.max_ready = 5;
  auto q = open(o);
  ASSERT_NE(q, nullptr);
  ASSERT_TRUE(q->add_subscription("slow").ok());
  auto drain = [](Queue& r) {
    auto got = r.receive(10, std::chrono::seconds(60), std::chrono::milliseconds(0));
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    for (const auto& m : *got) ASSERT_TRUE(r.ack(m.receipt).ok());
  };
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(q->send("m").ok());
    drain(*q);
  }
  auto full = q->send("m");
  ASSERT_EQ(full.status().code(), Code::kQueueFull) << "the stalled subscription did not hold the producer back";
  EXPECT_NE(full.status().message().find("subscription 'slow'"), std::string::npos) << full.status().message();
  o.subscription = "slow";
  auto slow = open(o);
  ASSERT_NE(slow, nullptr);
  drain(*slow);
  EXPECT_TRUE(q->send("m").ok()) << "no room once the subscription read";
  slow.reset();
  // Another queue, as the settings are stored at creation.
  o.subscription.clear();
  o.sync = SyncPolicy::kNever;
  o.retention_max_bytes = 1 << 20;  // (set: retention wins over back-pressure)
  auto opened = Queue::open(dir_ / "r", o);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  q = std::move(opened).value();
  ASSERT_TRUE(q->add_subscription("slow").ok());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(q->send("m").ok());
    drain(*q);
  }
  EXPECT_TRUE(q->send("m").ok()) << "with retention on, only the queue's own readers count";
}

// A queue that never had a subscription makes no subscription files.
// Dead letters go back to the view they died in (redrive): subscription s1's to s1 only, the
// queue's own to view 0 only, never to s2. Replay after ack on s2's handle replays s2's acks
// back to s2 alone. The same after a rebuild from the log (index files deleted), after a
// compaction that copies them, and, the subscriptions removed, view 0 never gets theirs.
TEST_F(SubscriptionQueue, RedriveAndReplayGoBackToTheViewTheyCameFrom) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  ASSERT_TRUE(q->add_subscription("s1").ok());
  ASSERT_TRUE(q->add_subscription("s2").ok());
  auto handle = [&](const char* name) {
    QueueOptions o;
    o.sync = SyncPolicy::kNever;
    o.subscription = name;
    auto h = Queue::open(qdir(), o);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    return h.ok() ? std::move(h).value() : nullptr;
  };
  auto s1 = handle("s1"), s2 = handle("s2");
  ASSERT_NE(s1, nullptr);
  ASSERT_NE(s2, nullptr);
  // Takes `n` messages of `h` (each `want`, if given) and acks or dead-letters them.
  auto take = [&](Queue& h, size_t n, const std::string& want, bool dead) {
    auto got = h.receive(n, std::chrono::seconds(60), std::chrono::milliseconds(0));
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->size(), n);
    for (const auto& m : *got) {
      if (!want.empty()) {
        EXPECT_EQ(m.payload, want);
      }
      ASSERT_TRUE((dead ? h.dead_letter(m.receipt) : h.ack(m.receipt)).ok());
    }
  };
  // The payloads a view holds, in id order.
  auto held = [&](Queue& h) {
    std::string out;
    auto p = h.peek(100);
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    if (p.ok()) {
      for (const auto& m : *p) out += m.payload + ";";
    }
    return out;
  };
  ASSERT_TRUE(q->send("x").ok());
  take(*s1, 1, "x", true);
  take(*q, 1, "x", false);
  take(*s2, 1, "x", false);
  ASSERT_TRUE(q->send("y").ok());
  take(*s1, 1, "y", false);
  take(*q, 1, "y", true);
  take(*s2, 1, "y", false);
  auto moved = q->redrive(10, "nope");
  ASSERT_TRUE(moved.ok()) << moved.status().to_string();
  EXPECT_EQ(*moved, 0u) << "dead letters of no subscription 'nope' were redriven";
  auto dlq = q->dead_letters();
  ASSERT_TRUE(dlq.ok());
  auto ready = (*dlq)->count(StateFilter::only(MessageState::kReady));
  ASSERT_TRUE(ready.ok()) << ready.status().to_string();
  EXPECT_EQ(*ready, 2u) << "skipped dead letters stayed leased";
  moved = q->redrive(10);
  ASSERT_TRUE(moved.ok()) << moved.status().to_string();
  EXPECT_EQ(*moved, 2u);
  EXPECT_EQ(held(*s1), "x;");
  EXPECT_EQ(held(*q), "y;");
  EXPECT_EQ(held(*s2), "") << "a redrive reached a subscription the dead letters were not of";
  auto replayed = s2->replay(ReplayOptions{.since = std::chrono::hours(1)});
  ASSERT_TRUE(replayed.ok()) << replayed.status().to_string();
  EXPECT_EQ(replayed->replayed, 2u) << "s2's acks";
  EXPECT_EQ(held(*s2), "x;y;");
  EXPECT_EQ(held(*s1), "x;") << "s2's replay reached s1";
  EXPECT_EQ(held(*q), "y;") << "s2's replay reached the queue's own view";

  // Compaction copies them (fillers acked by every view, received first: more urgent).
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(q->send(std::string(1000, 'f'), SendOptions{.priority = 0}).ok());
  for (Queue* h : {q.get(), s1.get(), s2.get()}) take(*h, 30, std::string(1000, 'f'), false);
  auto c = q->compact();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  // (The background compaction of the process that rolled may have done it first.)
  const std::string first_segment = qdir() + "/segments/" + std::string(19, '0') + "1.seg";
  EXPECT_FALSE(std::filesystem::exists(first_segment)) << "the segment of the redriven and replayed messages stayed";
  EXPECT_EQ(held(*s1), "x;");
  EXPECT_EQ(held(*q), "y;");
  EXPECT_EQ(held(*s2), "x;y;");
  s1.reset();
  s2.reset();
  q.reset();
  const auto live = files();
  std::filesystem::remove(qdir() + "/index");
  std::filesystem::remove(qdir() + "/subs/1.index");
  std::filesystem::remove(qdir() + "/subs/2.index");
  q = open();
  ASSERT_NE(q, nullptr);
  q.reset();
  EXPECT_EQ(files(), live) << "a rebuild from the log made other views";

  // Without subscriptions (the path of a copy with none left): view 0 keeps its own only.
  q = open();
  ASSERT_NE(q, nullptr);
  ASSERT_TRUE(q->remove_subscription("s1").ok());
  ASSERT_TRUE(q->remove_subscription("s2").ok());
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(q->send(std::string(1000, 'f'), SendOptions{.priority = 0}).ok());
  take(*q, 30, std::string(1000, 'f'), false);
  c = q->compact();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(held(*q), "y;");
  q.reset();
  std::filesystem::remove(qdir() + "/index");
  q = open();
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(held(*q), "y;") << "a subscription's message came back in view 0 after a rebuild";
}

// A subscription's own max_receives (stored in its SUB record): its second delivery
// dead-letters there, while the queue's own view (max_receives 0) keeps redelivering; it
// comes back from the log alone (index files deleted).
TEST_F(SubscriptionQueue, ASubscriptionsOwnMaxReceives) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  ASSERT_TRUE(q->add_subscription("s", false, 1).ok());
  QueueOptions o;
  o.sync = SyncPolicy::kNever;
  o.subscription = "s";
  auto opened = Queue::open(qdir(), o);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  auto s = std::move(opened).value();
  ASSERT_TRUE(q->send("m").ok());
  for (Queue* h : {q.get(), s.get()}) {
    auto got = h->receive(1, std::chrono::seconds(60), std::chrono::milliseconds(0));
    ASSERT_TRUE(got.ok() && got->size() == 1u);
    ASSERT_TRUE(h->nack(got->front().receipt).ok());
  }
  auto again = s->receive(1, std::chrono::seconds(60), std::chrono::milliseconds(0));
  EXPECT_TRUE(!again.ok() || again->empty()) << "a second delivery past the subscription's max_receives 1";
  auto mine = q->receive(1, std::chrono::seconds(60), std::chrono::milliseconds(0));
  ASSERT_TRUE(mine.ok()) << mine.status().to_string();
  EXPECT_EQ(mine->size(), 1u) << "the queue's own view (max_receives 0) dead-lettered";
  auto dlq = q->dead_letters();
  ASSERT_TRUE(dlq.ok());
  auto dead = (*dlq)->count();
  ASSERT_TRUE(dead.ok());
  EXPECT_EQ(*dead, 1u);
  s.reset();
  q.reset();
  std::filesystem::remove(qdir() + "/index");
  std::filesystem::remove(qdir() + "/subs/1.index");
  q = open();
  ASSERT_NE(q, nullptr);
  auto subs = q->subscriptions();
  ASSERT_TRUE(subs.ok() && subs->size() == 1u);
  EXPECT_EQ(subs->front().max_receives, 1u) << "not back from the log";
}

// A receive of many and an ack_batch write one LEASE and one ACK per view and delivery
// number, listing runs of ids (format LIST), not one each per message; ack_batch gives each
// receipt its own outcome (stale, twice, malformed, another view's), and every view's index
// comes back the same from the log alone.
TEST_F(SubscriptionQueue, AReceiveOfManyAndAnAckBatchWriteOneRecordPerDelivery) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  ASSERT_TRUE(q->add_subscription("s").ok());
  auto s = open("s");
  ASSERT_NE(s, nullptr);
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(q->send("m" + std::to_string(i)).ok());
  // Records of `type` and the ids they are of, per view, in the log (read apart from any index).
  auto records = [&](RecordType type) {
    storage::LogOptions lo;
    lo.read_only = true;
    auto log = storage::Log::open(qdir() + "/segments", lo);
    EXPECT_TRUE(log.ok());
    std::map<uint16_t, std::pair<int, uint64_t>> out;  // view -> (records, ids)
    auto rec = (*log)->recover([&](storage::Pos, const storage::RecordView& r) {
      if (r.type != type) return;
      uint64_t n = 1;
      if ((r.flags & format::kFlagList) != 0) {
        n = 0;
        for (const auto& run : storage::list_runs(r.payload)) n += run.last - run.first + 1;
      }
      out[r.view].first += 1;
      out[r.view].second += n;
    });
    EXPECT_TRUE(rec.ok() && rec->corrupt.empty());
    return out;
  };
  std::vector<Message> gq, gs;
  for (auto [h, out] : {std::pair{q.get(), &gq}, std::pair{s.get(), &gs}}) {
    auto got = h->receive(30, std::chrono::seconds(60), std::chrono::milliseconds(0));
    ASSERT_TRUE(got.ok() && got->size() == 30u);
    *out = std::move(*got);
  }
  auto leases = records(RecordType::kLease);
  EXPECT_EQ(leases[0], std::make_pair(1, uint64_t{30})) << "view 0's 30 leases";
  EXPECT_EQ(leases[1], std::make_pair(1, uint64_t{30})) << "the subscription's 30 leases";

  // The subscription's first message nacked and received again (delivery 2): its first
  // receipt is stale.
  ASSERT_TRUE(s->nack(gs[0].receipt).ok());
  auto re = s->receive_id(gs[0].id, std::chrono::seconds(60));
  ASSERT_TRUE(re.ok() && re->receive_count == 2u) << re.status().to_string();
  std::vector<std::string_view> rs;
  for (size_t i = 1; i < gs.size(); ++i) rs.push_back(gs[i].receipt);
  rs.push_back(gs[0].receipt);  // stale, before the good receipt of the same message
  rs.push_back(re->receipt);
  rs.push_back(gs[5].receipt);  // twice
  rs.push_back("garbage");
  rs.push_back(gq[0].receipt);  // view 0's
  auto acked = s->ack_batch(rs);
  ASSERT_TRUE(acked.ok()) << acked.status().to_string();
  ASSERT_EQ(acked->size(), rs.size());
  for (size_t i = 0; i < 29; ++i) EXPECT_TRUE((*acked)[i].ok()) << i << ": " << (*acked)[i].to_string();
  EXPECT_EQ((*acked)[29].code(), Code::kLeaseLost) << (*acked)[29].to_string();
  EXPECT_TRUE((*acked)[30].ok()) << "the good receipt after a stale one of its message: " << (*acked)[30].to_string();
  EXPECT_EQ((*acked)[31].code(), Code::kNotFound) << (*acked)[31].to_string();
  EXPECT_EQ((*acked)[32].code(), Code::kInvalidArgument) << (*acked)[32].to_string();
  EXPECT_EQ((*acked)[33].code(), Code::kInvalidArgument) << (*acked)[33].to_string();
  std::vector<std::string_view> rq;
  for (const Message& m : gq) rq.push_back(m.receipt);
  acked = q->ack_batch(rq);
  ASSERT_TRUE(acked.ok());
  for (const Status& st : *acked) EXPECT_TRUE(st.ok()) << st.to_string();
  auto acks = records(RecordType::kAck);
  EXPECT_EQ(acks[0], std::make_pair(1, uint64_t{30})) << "view 0: one ACK of 30";
  EXPECT_EQ(acks[1], std::make_pair(2, uint64_t{30})) << "the subscription: one ACK per delivery number";
  for (Queue* h : {q.get(), s.get()}) {
    auto st = h->stats();
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->acked_total, 30u);
    EXPECT_EQ(st->ready, 10u);
    EXPECT_EQ(st->in_flight, 0u);
  }
  q.reset();
  s.reset();
  expect_same_after_rebuild();
}

// A subscription added "from start" gets the queue's messages with their ordered groups: in
// it, each group's lowest id is its first and the rest wait behind it (whatever another view
// had leased), as after a rebuild from the log.
TEST_F(SubscriptionQueue, FromStartKeepsOrderedGroups) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  SendOptions g;
  g.group = "g";
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(q->send("g" + std::to_string(i), g).ok());  // 1, 2, 3
  ASSERT_TRUE(q->send("free").ok());                                                 // 4
  auto first = q->receive(1, std::chrono::seconds(60), std::chrono::milliseconds(0));
  ASSERT_TRUE(first.ok() && first->front().id == 1u);
  ASSERT_TRUE(q->add_subscription("late", true).ok());
  auto check = [&](const char* when) {
    SCOPED_TRACE(when);
    auto s = open("late");
    ASSERT_NE(s, nullptr);
    auto got = s->receive(10, std::chrono::seconds(60), std::chrono::milliseconds(0));
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    std::vector<uint64_t> ids;
    for (const Message& m : *got) ids.push_back(m.id);
    std::sort(ids.begin(), ids.end());
    EXPECT_EQ(ids, (std::vector<uint64_t>{1, 4})) << "2 and 3 wait behind 1, the group's first here";
    EXPECT_EQ(got->front().group, got->front().id == 1u ? "g" : "");
    for (const Message& m : *got) ASSERT_TRUE(s->nack(m.receipt).ok());
  };
  check("live");
  q.reset();
  expect_same_after_rebuild();
  check("rebuilt from the log");
}

TEST_F(SubscriptionQueue, AQueueWithoutSubscriptionsHasNoViewFiles) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  ASSERT_TRUE(q->send("x").ok());
  auto got = q->receive(1, std::chrono::seconds(60));
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(q->ack(got->front().receipt).ok());
  q.reset();
  EXPECT_FALSE(std::filesystem::exists(qdir() + "/subs"));
}

}  // namespace
}  // namespace spool::test
