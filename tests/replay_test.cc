// Issue 26, replay after ack: QueueOptions::keep_acked keeps acked messages in the log for
// a window, compaction honours it, and Queue::replay() sends the messages acked in a time
// window again (docs/semantics.md, "Replay after ack").
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "spool/queue.h"
#include "test_util.h"

namespace spool::test {
namespace {

using namespace std::chrono_literals;

constexpr Millis kHour{3600 * 1000};

class ReplayTest : public QueueDirTest {
 public:
  QueueOptions keep(Millis k) {
    QueueOptions o;
    o.keep_acked = k;
    return o;
  }
  // Receives and acks everything ready now; returns the ids acked.
  static std::vector<uint64_t> drain(Queue& q) {
    std::vector<uint64_t> ids;
    for (;;) {
      auto got = q.receive(256, Millis(60000));
      if (!got.ok()) {
        EXPECT_EQ(got.status().code(), Code::kEmpty) << got.status().to_string();
        return ids;
      }
      for (const auto& m : *got) {
        EXPECT_TRUE(q.ack(m.receipt).ok());
        ids.push_back(m.id);
      }
    }
  }
  static std::vector<Message> take_all(Queue& q) {
    std::vector<Message> out;
    for (;;) {
      auto got = q.receive(256, Millis(60000));
      if (!got.ok()) return out;
      for (auto& m : *got) out.push_back(std::move(m));
    }
  }
  static std::set<std::string> payloads(const std::vector<Message>& ms) {
    std::set<std::string> s;
    for (const auto& m : ms) s.insert(m.payload);
    return s;
  }
  static ReplayOptions since(Millis s, Millis u = Millis{0}) {
    ReplayOptions o;
    o.since = s;
    o.until = u;
    return o;
  }
  // stats() counts `kept` acks kept for replay, and a replay of the last hour brings back
  // `replayed` messages.
  static void expect_kept_then_replayed(Queue& q, uint64_t kept, uint64_t replayed) {
    auto st = q.stats();
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->kept_acked, kept);
    auto r = q.replay(since(kHour));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->replayed, replayed);
  }
};

TEST_F(ReplayTest, KeepAckedIsStoredAndBounded) {
  {
    auto q = open(keep(Millis(24 * 3600 * 1000)));
    ASSERT_TRUE(q);
    EXPECT_EQ(q->options().keep_acked, Millis(24 * 3600 * 1000));
  }
  auto q = open(keep(Millis(0)));  // a stored setting: what the queue was made with stands
  ASSERT_TRUE(q);
  EXPECT_EQ(q->options().keep_acked, Millis(24 * 3600 * 1000));
  QueueOptions o = keep(Millis(31ll * 24 * 3600 * 1000));
  auto bad = Queue::open(dir_ / "q2", o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("keep_acked_ms"), std::string::npos) << bad.status().message();
  auto off = open_queue(dir_ / "q3");
  ASSERT_TRUE(off);
  EXPECT_EQ(off->options().keep_acked, Millis(0));
}

TEST_F(ReplayTest, AckedMessagesComeBackWithTheirAttributes) {
  auto q = open(keep(kHour));
  ASSERT_TRUE(q);
  SendOptions so;
  so.attributes = {{"tenant", "acme"}, {"spool.replay.original_id", "stale"}};
  auto a = q->send("alpha", so);
  auto b = q->send("beta");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(drain(*q).size(), 2u);
  auto st = q->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->kept_acked, 2u);
  EXPECT_EQ(st->kept_acked_bytes, 9u);

  auto r = q->replay(since(kHour));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->replayed, 2u);
  EXPECT_EQ(r->missing, 0u);
  ASSERT_EQ(r->ids.size(), 2u);
  EXPECT_GT(r->ids[0], *b);

  auto got = take_all(*q);
  ASSERT_EQ(got.size(), 2u);
  const Message& ra = got[0].payload == "alpha" ? got[0] : got[1];
  const Message& rb = got[0].payload == "alpha" ? got[1] : got[0];
  EXPECT_EQ(ra.payload, "alpha");
  EXPECT_EQ(rb.payload, "beta");
  EXPECT_EQ(ra.receive_count, 1u);  // a new message
  EXPECT_EQ(ra.attributes.at("tenant"), "acme");
  EXPECT_EQ(ra.attributes.at("spool.replay.original_id"), std::to_string(*a));
  EXPECT_EQ(rb.attributes.at("spool.replay.original_id"), std::to_string(*b));
  ASSERT_TRUE(rb.attributes.contains("spool.replay.acked_at"));
  const std::string& at = rb.attributes.at("spool.replay.acked_at");
  EXPECT_EQ(at.size(), 24u) << at;  // 2026-12-03T06:14:37.181Z
  EXPECT_EQ(at.back(), 'Z') << at;
  EXPECT_EQ(ra.attributes.size(), 3u);
}

// A replayed message keeps the priority it was sent with: acked least urgent first, the
// replays come back most urgent first.
TEST_F(ReplayTest, ReplayKeepsThePriority) {
  auto q = open(keep(kHour));
  ASSERT_TRUE(q);
  SendOptions low, urgent;
  low.priority = 200;
  urgent.priority = 0;
  ASSERT_TRUE(q->send("low", low).ok());
  ASSERT_TRUE(q->send("plain").ok());
  ASSERT_TRUE(q->send("urgent", urgent).ok());
  auto got = q->receive(3, Millis(60000));
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), 3u);
  // Acked in send order, so the replays are sent (and numbered) low, plain, urgent: the id
  // order alone would hand them out that way.
  for (const char* p : {"low", "plain", "urgent"}) {
    auto it = std::find_if(got->begin(), got->end(), [&](const Message& m) { return m.payload == p; });
    ASSERT_NE(it, got->end()) << p;
    ASSERT_TRUE(q->ack(it->receipt).ok());
  }
  auto r = q->replay(since(kHour));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->replayed, 3u);
  std::vector<std::pair<std::string, int>> order;
  for (int i = 0; i < 3; ++i) {
    auto one = q->receive(1, Millis(60000));
    ASSERT_TRUE(one.ok()) << one.status().to_string();
    order.emplace_back((*one)[0].payload, (*one)[0].priority);
  }
  EXPECT_EQ(order, (std::vector<std::pair<std::string, int>>{{"urgent", 0}, {"plain", 128}, {"low", 200}}));
}

// A replayed message is in its ordered group again: the replays of one group come one at a
// time, in the order they were sent again.
TEST_F(ReplayTest, ReplayKeepsTheGroup) {
  auto q = open(keep(kHour));
  ASSERT_TRUE(q);
  SendOptions g;
  g.group = "order-1";
  ASSERT_TRUE(q->send("first", g).ok());
  ASSERT_TRUE(q->send("second", g).ok());
  EXPECT_EQ(drain(*q).size(), 2u);
  auto r = q->replay(since(kHour));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->replayed, 2u);
  auto one = q->receive(10, Millis(60000));
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  ASSERT_EQ(one->size(), 1u) << "both replays of the group were receivable at once";
  EXPECT_EQ((*one)[0].payload, "first");
  EXPECT_EQ((*one)[0].group, "order-1");
}

TEST_F(ReplayTest, OnlyConsumerAcksInsideTheWindow) {
  QueueOptions o = keep(kHour);
  o.max_receives = 5;
  auto q = open(o);
  ASSERT_TRUE(q);
  ASSERT_TRUE(q->send("purged").ok());
  ASSERT_TRUE(q->purge().ok());
  ASSERT_TRUE(q->send("early").ok());
  EXPECT_EQ(drain(*q).size(), 1u);
  const uint64_t early_acked = mono_ns();  // the early ack was before this
  std::this_thread::sleep_for(1500ms);
  const uint64_t later_from = mono_ns();  // the later acks are after this
  ASSERT_TRUE(q->send("late").ok());
  EXPECT_EQ(drain(*q).size(), 1u);
  auto removed = q->send("removed");
  ASSERT_TRUE(removed.ok());
  ASSERT_TRUE(q->remove(*removed).ok());  // an operator's delete: gone, not replayable
  ASSERT_TRUE(q->send("ready").ok());     // never acked
  ASSERT_TRUE(q->send("dead").ok());
  ASSERT_TRUE(q->send("nacked").ok());
  auto got = q->receive(3, Millis(60000));
  ASSERT_TRUE(got.ok());
  for (auto& m : *got) {
    if (m.payload == "dead") {
      ASSERT_TRUE(q->dead_letter(m.receipt).ok());
    }
    if (m.payload == "nacked") {
      ASSERT_TRUE(q->nack(m.receipt).ok());
    }
    // "ready" stays leased, unacked
  }

  // The window's edge between the early ack and the later ones, as an age at the call: the
  // midpoint of the 1.5 s between them. Not a fixed age: the calls since the later acks (the
  // first dead letter creates the dead-letter queue, and syncs) can take a second on a
  // machine busy with other tests' I/O, which put the later acks past a fixed 1 s.
  auto edge = [&] { return Millis((mono_ns() - (early_acked + later_from) / 2) / 1'000'000); };
  auto recent = q->replay(since(edge()));
  ASSERT_TRUE(recent.ok()) << recent.status().to_string();
  EXPECT_EQ(recent->replayed, 1u);
  auto older = q->replay(since(Millis(60000), edge()));
  ASSERT_TRUE(older.ok()) << older.status().to_string();
  EXPECT_EQ(older->replayed, 1u);

  // What came back: the late one, then the early one; the nacked one is there as it was
  // (ready), the dead one is in the DLQ, "ready" is leased, the removed one is gone.
  auto back = take_all(*q);
  std::multiset<std::string> seen;
  for (const auto& m : back) seen.insert(m.payload);
  EXPECT_EQ(seen, (std::multiset<std::string>{"late", "early", "nacked"}));

  EXPECT_FALSE(q->replay(since(Millis(0))).ok());
  EXPECT_FALSE(q->replay(since(Millis(1000), Millis(1000))).ok());
}

// A retention drop is an ACK record too, flagged EXPIRED: not a consumer's ack.
TEST_F(ReplayTest, RetentionDropsAreNotReplayed) {
  QueueOptions o = keep(kHour);
  o.retention_max_bytes = 10;
  auto q = open(o);
  ASSERT_TRUE(q);
  ASSERT_TRUE(q->send("dropped!").ok());
  ASSERT_TRUE(q->send("acked-me").ok());  // over 10 bytes: the oldest is dropped
  auto st = q->stats();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->expired_total, 1u);
  EXPECT_EQ(drain(*q).size(), 1u);
  auto r = q->replay(since(kHour));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->replayed, 1u);
  EXPECT_EQ(payloads(take_all(*q)), std::set<std::string>{"acked-me"});
}

// Issue 43: a message deleted by id (Queue::remove, spool delete) is gone: replay does not
// send it again, before or after an index rebuild, and keep_acked does not keep it.
TEST_F(ReplayTest, DeletedMessagesAreNotReplayed) {
  {
    auto q = open(keep(kHour));
    ASSERT_TRUE(q);
    auto ready = q->send("deleted-ready");
    ASSERT_TRUE(ready.ok());
    ASSERT_TRUE(q->send("deleted-leased").ok());
    ASSERT_TRUE(q->send("acked").ok());
    ASSERT_TRUE(q->remove(*ready).ok());
    auto got = q->receive(2, Millis(60000));
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(got->size(), 2u);
    for (auto& m : *got) {
      if (m.payload == "acked") {
        ASSERT_TRUE(q->ack(m.receipt).ok());
      } else {
        ASSERT_TRUE(q->remove(m.id).ok());
      }
    }
    expect_kept_then_replayed(*q, 1, 1);
    EXPECT_EQ(drain(*q).size(), 1u);  // the replayed "acked", acked again
  }
  ASSERT_EQ(::unlink((qdir() + "/index").c_str()), 0);  // the same from the log alone
  auto q = open();
  ASSERT_TRUE(q);
  expect_kept_then_replayed(*q, 2, 2);  // the two acks of "acked"
  auto back = take_all(*q);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(payloads(back), std::set<std::string>{"acked"});
}

TEST_F(ReplayTest, ToAnotherQueue) {
  auto q = open(keep(kHour));
  ASSERT_TRUE(q);
  auto other = open_queue(dir_ / "other");
  ASSERT_TRUE(other);
  ASSERT_TRUE(q->send("x").ok());
  drain(*q);
  ReplayOptions ro = since(kHour);
  ro.to = dir_ / "other";
  auto r = q->replay(ro);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->replayed, 1u);
  EXPECT_EQ(payloads(take_all(*other)), std::set<std::string>{"x"});
  EXPECT_TRUE(take_all(*q).empty());
  ro.to = dir_ / "none";
  auto missing = q->replay(ro);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(dir_ / "none"), std::string::npos) << missing.status().message();
}

// The log is the truth: replay and the kept-acked accounting survive an index rebuild
// (the index deleted while nothing is attached) and a kill -9 right after an ack.
TEST_F(ReplayTest, SurvivesIndexRebuildAndKillNine) {
  {
    auto q = open(keep(kHour));
    ASSERT_TRUE(q);
    ASSERT_TRUE(q->send("before").ok());
    drain(*q);
  }
  ASSERT_EQ(::unlink((qdir() + "/index").c_str()), 0);
  const std::string marker = dir_ / "acked";
  pid_t child = spawn([&] {
    auto q = Queue::open(qdir());
    if (!q.ok()) return 2;
    if (!(*q)->send("killed").ok()) return 3;
    auto m = (*q)->receive(1, Millis(60000));
    if (!m.ok() || (*m)[0].payload != "killed") return 4;
    if (!(*q)->ack((*m)[0].receipt).ok()) return 5;
    std::FILE* f = std::fopen(marker.c_str(), "w");
    if (f != nullptr) std::fclose(f);
    ::pause();
    return 0;
  });
  ASSERT_TRUE(wait_for_file(marker, 30s));
  ::kill(child, SIGKILL);
  EXPECT_EQ(wait_exit(child), 128 + SIGKILL);
  ASSERT_EQ(::unlink((qdir() + "/index").c_str()), 0);
  auto q = open();
  ASSERT_TRUE(q);
  expect_kept_then_replayed(*q, 2, 2);
  EXPECT_EQ(payloads(take_all(*q)), (std::set<std::string>{"before", "killed"}));
}

// Another process acks while this one replays: every ack before the call is replayed, no
// ack is replayed twice in one call, and nothing is missing (keep_acked covers them all),
// while the log rolls and compacts under the scan.
TEST_F(ReplayTest, WhileAnotherProcessAcks) {
  QueueOptions o = keep(kHour);
  o.segment_size = 16 << 10;
  auto q = open(o);
  ASSERT_TRUE(q);
  auto other = open_queue(dir_ / "other");
  ASSERT_TRUE(other);
  const std::string stop = dir_ / "stop";
  pid_t child = spawn([&] {
    auto cq = Queue::open(qdir());
    if (!cq.ok()) return 2;
    while (::access(stop.c_str(), F_OK) != 0) {
      for (int i = 0; i < 20; ++i) {
        if (!(*cq)->send(std::string(100, 'p') + std::to_string(i)).ok()) return 3;
      }
      auto got = (*cq)->receive(20, Millis(60000));
      if (!got.ok()) return 4;
      for (const auto& m : *got) {
        if (!(*cq)->ack(m.receipt).ok()) return 5;
      }
    }
    return 0;
  });
  uint64_t last = 0;
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(200ms);
    auto before = q->stats();
    ASSERT_TRUE(before.ok());
    ReplayOptions ro = since(kHour);
    ro.to = dir_ / "other";
    auto r = q->replay(ro);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    auto after = q->stats();
    ASSERT_TRUE(after.ok());
    EXPECT_GE(r->replayed, before->acked_total);
    EXPECT_LE(r->replayed, after->acked_total);
    EXPECT_EQ(r->missing, 0u);
    EXPECT_GE(r->replayed, last);
    last = r->replayed;
  }
  std::FILE* f = std::fopen(stop.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  EXPECT_EQ(wait_exit(child), 0);
  EXPECT_GT(last, 0u);
  auto st = other->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_GE(st->sent_total, last);
  EXPECT_EQ(q->check_index(), "");
}

class ReplayCompactTest : public ReplayTest {
 public:
  static constexpr int kMessages = 300;
  // Small segments, so that the acked messages fill many of them.
  QueueOptions small(Millis k) {
    QueueOptions o = keep(k);
    o.segment_size = 16 << 10;
    return o;
  }
  static void fill_and_ack(Queue& q) {
    for (int i = 0; i < kMessages; ++i) ASSERT_TRUE(q.send(std::string(200, 'a' + i % 26) + std::to_string(i)).ok());
    EXPECT_EQ(drain(q).size(), static_cast<size_t>(kMessages));
  }
};

TEST_F(ReplayCompactTest, CompactionKeepsWhatKeepAckedCovers) {
  auto q = open(small(kHour));
  ASSERT_TRUE(q);
  fill_and_ack(*q);
  auto c = q->compact();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->segments_removed, 0u);
  auto r = q->replay(since(kHour));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->replayed, static_cast<uint64_t>(kMessages));
  EXPECT_EQ(r->missing, 0u);
}

TEST_F(ReplayCompactTest, CompactionKeepsThemAfterAnIndexRebuild) {
  {
    auto q = open(small(kHour));
    ASSERT_TRUE(q);
    fill_and_ack(*q);
  }
  ASSERT_EQ(::unlink((qdir() + "/index").c_str()), 0);
  auto q = open();
  ASSERT_TRUE(q);
  auto c = q->compact();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->segments_removed, 0u);
  auto r = q->replay(since(kHour));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->replayed, static_cast<uint64_t>(kMessages));
}

TEST_F(ReplayCompactTest, WithoutKeepAckedCompactionRemovesThem) {
  auto q = open(small(Millis(0)));
  ASSERT_TRUE(q);
  fill_and_ack(*q);
  auto c = q->compact();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  // Automatic compaction, at a roll during the drain, may have removed them before this
  // call: so the first segment is checked, not this call's count.
  EXPECT_FALSE(std::filesystem::exists(qdir() + "/segments/00000000000000000001.seg"));
  auto r = q->replay(since(kHour));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // Those whose MSG record went are missing; those whose ACK record went too are not even
  // seen. Either way they are not replayed. Which of the two depends on where the segments
  // ended, and that on whether a spare segment (made in the background) was ready at a roll:
  // so no count of missing is asserted, only that fewer came back.
  EXPECT_LT(r->replayed, static_cast<uint64_t>(kMessages));
  EXPECT_LE(r->replayed + r->missing, static_cast<uint64_t>(kMessages));
  auto st = q->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->kept_acked, 0u);
}

TEST_F(ReplayCompactTest, PastTheWindowCompactionRemovesThem) {
  auto q = open(small(Millis(3000)));
  ASSERT_TRUE(q);
  const uint64_t start = mono_ns();
  fill_and_ack(*q);
  auto early = q->compact();
  ASSERT_TRUE(early.ok());
  // Still inside the 3 s window (unless filling took most of it: a slow sanitizer run).
  if (mono_ns() - start < 2'000'000'000) {
    EXPECT_EQ(early->segments_removed, 0u);
  }
  std::this_thread::sleep_for(3500ms);  // the window, and its 1/30 step, have passed
  auto st = q->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->kept_acked, 0u);
  auto c = q->compact();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  // Not this call's count: a fill slower than the window lets a roll's compaction do it.
  EXPECT_FALSE(std::filesystem::exists(qdir() + "/segments/00000000000000000001.seg"));
  auto r = q->replay(since(kHour));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_LT(r->replayed, static_cast<uint64_t>(kMessages));  // as above: missing may be 0
}

}  // namespace
}  // namespace spool::test
