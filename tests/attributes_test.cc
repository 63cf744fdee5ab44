// Issue 26, first part: message attributes and deduplication ids, through the library, in
// real processes, across kill -9 and index rebuilds, and on queues written before the
// record format had an extension (docs/format.md "Message extension", docs/semantics.md).
#include <cinttypes>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "fake_clock.h"
#include "index/index.h"
#include "proc_util.h"
#include "spool/spool.h"
#include "storage/format.h"
#include "test_util.h"

// The bounds spool.h states are the ones the format enforces.
static_assert(SPOOL_MAX_ATTRIBUTES == spool::format::kMaxAttributes);
static_assert(SPOOL_MAX_ATTRIBUTE_KEY == spool::format::kMaxAttrKey);
static_assert(SPOOL_MAX_ATTRIBUTE_VALUE == spool::format::kMaxAttrValue);
static_assert(SPOOL_MAX_ATTRIBUTES_TOTAL == spool::format::kMaxAttrTotal);
static_assert(SPOOL_MAX_DEDUP_ID == spool::format::kMaxDedupId);

namespace spool {
namespace {

using namespace std::chrono_literals;
using test::spawn;
using test::wait_exit;

class AttributesTest : public test::QueueDirTest {
 protected:
  // Sends `payload` with `attrs` (and a dedup id); a failure fails the test and gives 0.
  uint64_t send(Queue& q, std::string_view payload, Attributes attrs = {}, std::string dedup = {}) {
    SendOptions o;
    o.attributes = std::move(attrs);
    o.dedup_id = std::move(dedup);
    auto id = q.send(payload, o);
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    return id.ok() ? *id : 0;
  }
  static Status send_error(Queue& q, Attributes attrs, std::string dedup = {}) {
    SendOptions o;
    o.attributes = std::move(attrs);
    o.dedup_id = std::move(dedup);
    auto id = q.send("x", o);
    return id.ok() ? Status() : id.status();
  }
  // The messages of the queue by id.
  static std::map<uint64_t, Message> all(Queue& q) {
    std::map<uint64_t, Message> out;
    auto ms = q.peek(100000);
    EXPECT_TRUE(ms.ok()) << ms.status().to_string();
    if (ms.ok()) {
      for (auto& m : *ms) out.emplace(m.id, std::move(m));
    }
    return out;
  }
  // Closes `q`, removes the index and opens the queue again: the index is rebuilt from the
  // log.
  std::unique_ptr<Queue> rebuilt(std::unique_ptr<Queue> q, const QueueOptions& o = {}) {
    q.reset();
    EXPECT_EQ(::unlink((qdir() + "/index").c_str()), 0);
    auto again = open(o);
    EXPECT_NE(again, nullptr);
    return again;
  }
  // Sends 200 messages of 100 bytes and acks every message of the queue but `spare` (nacked
  // each time it comes), so that a queue of 4 KiB segments has segments to compact.
  static void fill_and_ack(Queue& q, uint64_t spare) {
    for (int i = 0; i < 200; ++i) ASSERT_TRUE(q.send(std::string(100, 'x')).ok());
    for (;;) {
      auto ms = q.receive(100);
      if (!ms.ok()) return;
      for (auto& m : *ms) ASSERT_TRUE((m.id == spare ? q.nack(m.receipt) : q.ack(m.receipt)).ok());
      if (ms->size() == 1 && ms->front().id == spare) return;
    }
  }
};

TEST_F(AttributesTest, AttributesComeBackFromReceivePeekAndViews) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  const Attributes a{{"color", "red"}, {"trace.id", "a-1_b"}, {"empty", ""}};
  uint64_t id = send(*q, "body", a);
  uint64_t plain = send(*q, "plain");
  auto peeked = all(*q);
  EXPECT_EQ(peeked[id].attributes, a);
  EXPECT_EQ(peeked[id].payload, "body") << "the extension leaked into the payload";
  EXPECT_TRUE(peeked[plain].attributes.empty());
  auto views = q->receive_views(1);
  ASSERT_TRUE(views.ok());
  EXPECT_EQ(views->front().attributes, a);
  EXPECT_EQ(views->front().payload, "body");
  auto got = q->receive(1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->front().id, plain);
  EXPECT_TRUE(got->front().attributes.empty());
  uint64_t named = send(*q, "named", a);
  auto by_id = q->receive_id(named);
  ASSERT_TRUE(by_id.ok()) << by_id.status().to_string();
  EXPECT_EQ(by_id->attributes, a) << "receive_id";
  auto info = q->list(10);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->front().size, 4u) << "list counts the payload, not the extension";
}

TEST_F(AttributesTest, BadAttributesAndDedupIdsAreRefusedNamingTheProblem) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  Attributes many;
  for (int i = 0; i < 17; ++i) many["k" + std::to_string(i)] = "v";
  struct Case {
    Attributes attrs;
    std::string dedup;
    std::string says;
  };
  const std::vector<Case> cases = {
      {many, "", "17 attributes"},
      {{{"bad key", "v"}}, "", "'bad key' may hold only"},
      {{{"", "v"}}, "", "must be 1 to 64 bytes"},
      {{{std::string(65, 'k'), "v"}}, "", "must be 1 to 64 bytes"},
      {{{"k", std::string(1025, 'v')}}, "", "value of 1025 bytes"},
      {{{"a", std::string(1024, 'v')}, {"b", std::string(1024, 'v')}, {"c", std::string(1024, 'v')},
        {"d", std::string(1024, 'v')}},
       "",
       "attributes of 4100 bytes"},
      {{}, std::string(129, 'd'), "dedup id of 129 bytes"},
  };
  for (const Case& c : cases) {
    Status s = send_error(*q, c.attrs, c.dedup);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << c.says;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s.message();
  }
  auto st = q->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->sent_total, 0u) << "a refused send queued something";
  // The bounds themselves are allowed.
  Attributes full;
  for (int i = 0; i < 16; ++i) full["k" + std::to_string(i)] = std::string(200, 'v');
  EXPECT_NE(send(*q, "x", full, std::string(128, 'd')), 0u);
  EXPECT_EQ(all(*q).begin()->second.attributes, full);
}

// "Payload-only sends cost no more than today": the record is byte for byte the version-1
// record (no extension bit, no extension bytes), so the next record follows 56 bytes on.
TEST_F(AttributesTest, APayloadOnlySendWritesTheRecordVersionOneWrote) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  send(*q, "hi");
  send(*q, "hi", {{"k", "v"}});
  q.reset();
  std::ifstream f(qdir() + "/segments/00000000000000000001.seg", std::ios::binary);
  std::string seg((std::istreambuf_iterator<char>(f)), {});
  ASSERT_GT(seg.size(), 300u);
  uint32_t version, len1, len2;
  std::memcpy(&version, seg.data() + 8, 4);
  std::memcpy(&len1, seg.data() + test::kFirstRecordOffset + 4, 4);
  EXPECT_EQ(version, format::kVersion);
  EXPECT_EQ(len1, 2u);
  EXPECT_EQ(static_cast<uint8_t>(seg[test::kFirstRecordOffset + 9]), 0) << "flags of a payload-only record";
  EXPECT_EQ(seg.substr(test::kFirstRecordOffset + 48, 2), "hi");
  std::memcpy(&len2, seg.data() + test::kFirstRecordOffset + 56 + 4, 4);
  EXPECT_EQ(static_cast<uint8_t>(seg[test::kFirstRecordOffset + 56 + 9]), format::kFlagExt) << "the second record follows, extended";
  EXPECT_GT(len2, 2u);
}

TEST_F(AttributesTest, AttributesSurviveReopenRebuildAndCompaction) {
  QueueOptions o;
  o.segment_size = 4096;
  auto q = open(o);
  ASSERT_NE(q, nullptr);
  uint64_t keep = send(*q, "keep", {{"n", "1"}});
  fill_and_ack(*q, keep);  // so that compaction copies `keep` out of segment 1
  auto c = q->compact();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  // (By this call or by the background compaction a roll starts.)
  EXPECT_FALSE(std::filesystem::exists(qdir() + "/segments/00000000000000000001.seg"))
      << "the message was not copied out of the first segment";
  EXPECT_EQ(all(*q)[keep].attributes, (Attributes{{"n", "1"}})) << "after compaction";
  q = rebuilt(std::move(q));
  ASSERT_NE(q, nullptr);
  auto m = all(*q);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[keep].attributes, (Attributes{{"n", "1"}})) << "after a rebuild from the log";
  EXPECT_EQ(m[keep].payload, "keep");
  EXPECT_EQ(q->check_index(), "");
}

TEST_F(AttributesTest, ADeadLetterKeepsItsAttributesAndRedriveToo) {
  QueueOptions o;
  o.max_receives = 1;
  auto q = open(o);
  ASSERT_NE(q, nullptr);
  const Attributes a{{"job", "42"}};
  send(*q, "poison", a, "d-1");
  auto first = q->receive(1);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(q->nack(first->front().receipt).ok());
  EXPECT_EQ(q->receive(1).status().code(), Code::kEmpty) << "it should have been dead-lettered";
  auto dlq = q->dead_letters();
  ASSERT_TRUE(dlq.ok());
  auto dead = (*dlq)->peek(10);
  ASSERT_TRUE(dead.ok());
  ASSERT_EQ(dead->size(), 1u);
  EXPECT_EQ(dead->front().payload, "poison");
  EXPECT_EQ(dead->front().attributes.at("job"), "42");
  EXPECT_EQ(dead->front().attributes.at("spool.dead.reason"), "max_receives") << "and its history";
  auto moved = q->redrive(10);
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ(*moved, 1u);
  auto back = all(*q);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back.begin()->second.attributes, a);
}

// A queue written by the previous record format (segment version 1: the index-10 upgrade
// data of queue_process_test): every message opens, an extended send goes into a new
// segment of version 2 (the old one is never written an extension its readers would take
// for payload), and both read back after a rebuild.
TEST_F(AttributesTest, AVersionOneQueueOpensWithEveryMessageAndTakesAttributes) {
  const char* data = std::getenv("SPOOL_TEST_DATA");
  ASSERT_NE(data, nullptr) << "SPOOL_TEST_DATA must name tests/data (meson sets it)";
  std::filesystem::create_directories(dir_.path());
  auto r = test::run_program({"/bin/tar", "-xzf", std::string(data) + "/upgrade-index10.tar.gz", "-C", dir_.path()},
                             "", "", {});
  ASSERT_EQ(r.code, 0) << r.err;
  auto version_of = [&](uint64_t seq) {
    char name[32];
    std::snprintf(name, sizeof name, "%020" PRIu64 ".seg", seq);
    std::ifstream f(qdir() + "/segments/" + name, std::ios::binary);
    char h[12] = {};
    f.read(h, sizeof h);
    uint32_t v = 0;
    std::memcpy(&v, h + 8, 4);
    return v;
  };
  uint64_t last_old = 0;
  for (auto& e : std::filesystem::directory_iterator(qdir() + "/segments")) {
    if (e.path().extension() == ".seg") last_old = std::max<uint64_t>(last_old, std::stoull(e.path().stem()));
  }
  ASSERT_GT(last_old, 0u);
  ASSERT_EQ(version_of(last_old), 1u) << "the upgrade data should be of segment version 1";
  auto q = open();
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(all(*q).size(), 298u);
  uint64_t plain = send(*q, "plain after upgrade");
  uint64_t id = send(*q, "with", {{"k", "v"}});
  EXPECT_EQ(version_of(last_old), 1u);
  EXPECT_EQ(version_of(last_old + 1), format::kVersion) << "the extended send did not roll to a current segment";
  q = rebuilt(std::move(q));
  ASSERT_NE(q, nullptr);
  auto m = all(*q);
  EXPECT_EQ(m.size(), 300u);
  EXPECT_TRUE(m[plain].attributes.empty());
  EXPECT_EQ(m[plain].payload, "plain after upgrade");
  EXPECT_EQ(m[id].attributes, (Attributes{{"k", "v"}}));
  EXPECT_EQ(m[id].payload, "with");
  auto v = q->verify(false);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->ok()) << v->problems.front();
}

// ---- deduplication -------------------------------------------------------------------

TEST_F(AttributesTest, ASecondSendWithTheSameDedupIdReturnsTheFirstIdEvenAfterAck) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  uint64_t a = send(*q, "one", {}, "order-17");
  EXPECT_EQ(send(*q, "two", {}, "order-17"), a);
  uint64_t b = send(*q, "other", {}, "order-18");
  EXPECT_NE(b, a);
  auto st = q->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->sent_total, 2u) << "a duplicate was queued";
  auto got = q->receive(1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->front().payload, "one");
  ASSERT_TRUE(q->ack(got->front().receipt).ok());
  EXPECT_EQ(send(*q, "three", {}, "order-17"), a) << "after the ack, within the window";
  EXPECT_EQ(q->stats()->sent_total, 2u);
  ASSERT_TRUE(q->purge().ok());
  EXPECT_EQ(send(*q, "four", {}, "order-18"), b) << "after a purge, within the window";
}

TEST_F(AttributesTest, SendBatchDedupsPerMessageAndWithinTheBatch) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  uint64_t earlier = send(*q, "earlier", {}, "e");
  std::vector<SendItem> items = {{"a", {}, "x"}, {"b", {{"k", "v"}}, ""}, {"c", {}, "x"}, {"d", {}, "e"}, {"f", {}, "y"}};
  auto ids = q->send_batch(items);
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  ASSERT_EQ(ids->size(), 5u);
  EXPECT_EQ((*ids)[2], (*ids)[0]) << "a duplicate within the batch";
  EXPECT_EQ((*ids)[3], earlier) << "a duplicate of an earlier send";
  EXPECT_EQ((*ids)[1], (*ids)[0] + 1) << "new messages get consecutive ids";
  EXPECT_EQ((*ids)[4], (*ids)[0] + 2);
  auto m = all(*q);
  EXPECT_EQ(m.size(), 4u);
  EXPECT_EQ(m[(*ids)[0]].payload, "a");
  EXPECT_EQ(m[(*ids)[1]].attributes, (Attributes{{"k", "v"}}));
  // All duplicates: nothing is written.
  auto again = q->send_batch(std::vector<SendItem>{{"z", {}, "x"}, {"z", {}, "y"}});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, (std::vector<uint64_t>{(*ids)[0], (*ids)[4]}));
  EXPECT_EQ(q->stats()->sent_total, 4u);
  // One dedup id for a batch of payloads is refused.
  std::vector<std::string_view> ps = {"p", "q"};
  SendOptions o;
  o.dedup_id = "shared";
  EXPECT_EQ(q->send_batch(ps, o).status().code(), Code::kInvalidArgument);
}

// The overloads with a duplicate flag tell a dedup hit from a new message: for send(), with
// and without a dedup id, also once the first message is acked and after an index rebuild;
// for a batch, per item, whether it repeats an earlier send or an earlier item.
TEST_F(AttributesTest, TheDuplicateFlagTellsADedupHitFromANewMessage) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  SendOptions o;
  o.dedup_id = "order-17";
  bool dup = true;
  auto first = q->send("one", o, &dup);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_FALSE(dup);
  auto second = q->send("two", o, &dup);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, *first);
  EXPECT_TRUE(dup);
  dup = true;
  ASSERT_TRUE(q->send("plain", SendOptions{}, &dup).ok());
  EXPECT_FALSE(dup) << "no dedup id";
  o.dedup_id = "order-18";
  dup = true;
  ASSERT_TRUE(q->send("new", o, &dup).ok());
  EXPECT_FALSE(dup) << "another dedup id";

  auto got = q->receive(10);
  ASSERT_TRUE(got.ok());
  for (const auto& m : *got) ASSERT_TRUE(q->ack(m.receipt).ok());
  q = rebuilt(std::move(q));
  ASSERT_NE(q, nullptr);
  o.dedup_id = "order-17";
  dup = false;
  auto after = q->send("three", o, &dup);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, *first);
  EXPECT_TRUE(dup) << "acked, and the index rebuilt: still a duplicate within the window";

  std::vector<SendItem> items = {{"a", {}, "x"}, {"b", {}, ""}, {"c", {}, "x"}, {"d", {}, "order-18"}};
  std::vector<bool> dups = {true};
  auto ids = q->send_batch(items, {}, &dups);
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  EXPECT_EQ(dups, (std::vector<bool>{false, false, true, true}));
  auto again = q->send_batch(std::vector<SendItem>{{"e", {}, "x"}, {"f", {}, "y"}}, {}, &dups);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(dups, (std::vector<bool>{true, false}));
  ASSERT_TRUE(q->send_batch(std::span<const SendItem>(), {}, &dups).ok());
  EXPECT_TRUE(dups.empty());
  EXPECT_EQ(q->stats()->sent_total, 6u);  // one, plain, new, a, b, f
}

TEST_F(AttributesTest, TheWindowEndsAndAnExpiredIdIsNotRebuilt) {
  QueueOptions o;
  // On a fake clock: the window ends when the test says, however slow the machine.
  o.dedup_window = 3000ms;
  auto clock = std::make_shared<test::FakeClockEnv>();
  o = test::on_clock(clock, o);
  auto q = open(o);
  ASSERT_NE(q, nullptr);
  auto remembered = [&] {
    auto st = q->stats();
    EXPECT_TRUE(st.ok()) << st.status().to_string();
    return st.ok() ? st->dedup_ids : UINT64_MAX;
  };
  EXPECT_EQ(remembered(), 0u) << "no dedup id sent yet";
  uint64_t a = send(*q, "one", {}, "w");
  EXPECT_EQ(send(*q, "again", {}, "w"), a);
  send(*q, "other", {}, "w2");
  EXPECT_EQ(remembered(), 2u);
  clock->advance(2999ms);
  EXPECT_EQ(send(*q, "still", {}, "w"), a) << "forgotten inside the window";
  clock->advance(2ms);
  EXPECT_EQ(remembered(), 0u) << "Stats::dedup_ids counts only ids inside the window";
  uint64_t b = send(*q, "later", {}, "w");
  EXPECT_NE(b, a) << "the window has passed";
  q = rebuilt(std::move(q), o);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(remembered(), 1u) << "the rebuild remembers the id inside the window";
  EXPECT_EQ(send(*q, "rebuilt", {}, "w"), b) << "the id still inside the window was rebuilt";
  clock->advance(3001ms);
  q = rebuilt(std::move(q), o);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(remembered(), 0u);
  EXPECT_NE(send(*q, "after", {}, "w"), b) << "an expired id was rebuilt from the log";
}

TEST_F(AttributesTest, DedupHoldsAcrossCloseReopenAndAnIndexDeletedWhileClosed) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  uint64_t a = send(*q, "one", {{"k", "v"}}, "persist");
  q.reset();
  q = open();
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(send(*q, "two", {}, "persist"), a) << "after close and reopen";
  q = rebuilt(std::move(q));
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(send(*q, "three", {}, "persist"), a) << "after an index rebuild";
  EXPECT_EQ(all(*q).size(), 1u);
  EXPECT_EQ(q->check_index(), "");
}

// Processes that send one dedup id at once queue it once and all get its id.
TEST_F(AttributesTest, ConcurrentProcessesSendingOneDedupIdQueueItOnce) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  constexpr int kProcs = 4, kIds = 50;
  const std::string out = dir_ / "ids";
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    kids.push_back(spawn([&, p] {
      auto cq = Queue::open(qdir());
      if (!cq.ok()) return 1;
      std::ofstream f(out + std::to_string(p));
      for (int i = 0; i < kIds; ++i) {
        SendOptions o;
        o.dedup_id = "job-" + std::to_string(i);
        auto id = (*cq)->send("from " + std::to_string(p), o);
        if (!id.ok()) return 2;
        f << i << " " << *id << "\n";
      }
      return 0;
    }));
  }
  for (pid_t k : kids) EXPECT_EQ(wait_exit(k), 0);
  std::map<int, std::set<uint64_t>> seen;
  for (int p = 0; p < kProcs; ++p) {
    std::ifstream f(out + std::to_string(p));
    int i;
    uint64_t id;
    while (f >> i >> id) seen[i].insert(id);
  }
  ASSERT_EQ(seen.size(), static_cast<size_t>(kIds));
  for (auto& [i, ids] : seen) EXPECT_EQ(ids.size(), 1u) << "job-" << i << " got several ids";
  auto st = q->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->sent_total, static_cast<uint64_t>(kIds)) << "a duplicate was queued by another process";
  EXPECT_EQ(q->check_index(), "");
}

// A sender killed with the index lock held: the next locker rebuilds the index from the log
// (EOWNERDEAD), and the dedup ids sent before are still remembered.
TEST_F(AttributesTest, DedupHoldsAfterAProcessIsKilledHoldingTheLock) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  uint64_t a = send(*q, "one", {}, "kill-me");
  const std::string parked = dir_ / "parked";
  pid_t child = spawn([&] {
    ::setenv("SPOOL_TEST_PARK_IN_LOCK", parked.c_str(), 1);
    auto cq = Queue::open(qdir());
    if (!cq.ok()) return 1;
    SendOptions o;
    o.dedup_id = "in-child";
    (void)(*cq)->send("child", o);  // parks inside the lock until killed
    return 2;
  });
  ASSERT_TRUE(test::wait_for_file(parked, 10s)) << "the child never took the lock";
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  EXPECT_EQ(wait_exit(child), 128 + SIGKILL);
  EXPECT_EQ(send(*q, "two", {}, "kill-me"), a) << "forgotten after the repair";
  uint64_t b = send(*q, "new", {}, "in-child");
  EXPECT_NE(b, a);
  EXPECT_EQ(send(*q, "new again", {}, "in-child"), b);
  EXPECT_EQ(q->check_index(), "");
}

// A kill -9 right after a send's append (the record is in the log, the index never saw it):
// the rebuild finds it, and the dedup id with it.
TEST_F(AttributesTest, DedupHoldsForASendKilledAfterItsAppend) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  q.reset();
  const std::string parked = dir_ / "parked";
  pid_t child = spawn([&] {
    ::setenv("SPOOL_TEST_PARK_AFTER_APPEND", parked.c_str(), 1);
    auto cq = Queue::open(qdir());
    if (!cq.ok()) return 1;
    SendOptions o;
    o.dedup_id = "half";
    (void)(*cq)->send("written", o);
    return 2;
  });
  ASSERT_TRUE(test::wait_for_file(parked, 10s)) << "the child never appended";
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  EXPECT_EQ(wait_exit(child), 128 + SIGKILL);
  q = open();
  ASSERT_NE(q, nullptr);
  auto m = all(*q);
  ASSERT_EQ(m.size(), 1u) << "the appended send was lost";
  EXPECT_EQ(send(*q, "retry", {}, "half"), m.begin()->first) << "the retry after the crash was queued again";
  EXPECT_EQ(all(*q).size(), 1u);
}

// The table grows past its first size and still remembers every id.
TEST_F(AttributesTest, TheDedupTableGrowsAndForgetsNothingInTheWindow) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  constexpr int kN = 3000;  // > 3/4 of index::kMinDedup, twice over
  std::vector<SendItem> items;
  std::vector<std::string> names;
  for (int i = 0; i < kN; ++i) names.push_back("g-" + std::to_string(i));
  for (int i = 0; i < kN; ++i) items.push_back(SendItem{"m", {}, names[i]});
  auto ids = q->send_batch(std::span(items).first(kN / 2));
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  auto more = q->send_batch(std::span(items).subspan(kN / 2));
  ASSERT_TRUE(more.ok()) << more.status().to_string();
  ids->insert(ids->end(), more->begin(), more->end());
  auto again = q->send_batch(items);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *ids);
  EXPECT_EQ(q->stats()->sent_total, static_cast<uint64_t>(kN));
  EXPECT_EQ(q->check_index(), "");
}

// Compaction keeps the segment of a SEND whose dedup id is still inside the window (it is
// what the id is confirmed against and rebuilt from), even when its message was acked.
TEST_F(AttributesTest, CompactionKeepsTheRecordOfADedupIdInTheWindow) {
  QueueOptions o;
  o.segment_size = 4096;
  auto q = open(o);
  ASSERT_NE(q, nullptr);
  uint64_t a = send(*q, "first", {}, "keep-me");
  fill_and_ack(*q, 0);
  auto c = q->compact();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(std::filesystem::exists(qdir() + "/segments/00000000000000000001.seg"))
      << "compaction removed the segment holding a dedup id inside the window";
  EXPECT_EQ(send(*q, "dup", {}, "keep-me"), a);
  q = rebuilt(std::move(q), o);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(send(*q, "dup after rebuild", {}, "keep-me"), a);
  EXPECT_TRUE(all(*q).empty());
}

// The table holds only a hash: a different id with the same hash must be queued. The slot's
// hash is rewritten to that of another id; a send with that id finds the slot, reads the
// record, sees another id and queues its message.
TEST_F(AttributesTest, AHashMatchIsConfirmedAgainstTheRecord) {
  auto q = open();
  ASSERT_NE(q, nullptr);
  uint64_t a = send(*q, "one", {}, "real-id");
  ASSERT_NE(a, 0u);
  {
    test::IndexFile file(qdir());
    ASSERT_TRUE(file.ok());
    index::IndexHeader* h = &file.hdr();
    ASSERT_GE(h->layout.dedup_cap, index::kMinDedup);
    index::DedupSlot* slots = file.dedup();
    const std::string other = "colliding-id";
    const uint64_t want = XXH3_64bits(other.data(), other.size());
    int changed = 0;
    // Re-placed where a probe for the other hash starts, so the lookup meets it.
    for (uint64_t s = 0; s < h->layout.dedup_cap; ++s) {
      if (slots[s].hash == 0) continue;
      index::DedupSlot d = slots[s];
      slots[s] = {};
      d.hash = want;
      slots[want & (h->layout.dedup_cap - 1)] = d;
      ++changed;
      break;
    }
    ASSERT_EQ(changed, 1);
  }
  uint64_t b = send(*q, "two", {}, "colliding-id");
  EXPECT_NE(b, a) << "a different dedup id with the same hash was taken for a duplicate";
  EXPECT_EQ(all(*q).size(), 2u);
}

}  // namespace
}  // namespace spool
