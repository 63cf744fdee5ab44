// Clock steps (issue 23, "Time"; docs/semantics.md "Clocks"). The wall clock a queue reads
// is moved by the test: each queue runs on a WallStepEnv, real clocks whose CLOCK_REALTIME
// (and the coarse one the log clock's drift check reads) the test steps. CLOCK_BOOTTIME is
// left alone, as a real step leaves it. A step must neither drop a message nor hold it
// longer than its lease, delay or age asked for; a lease from an earlier boot ends at once.
#include <xxhash.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "fake_clock.h"
#include "queue/log_clock.h"
#include "storage/log.h"
#include "test_util.h"

namespace spool::test {
namespace {

using namespace std::chrono_literals;
constexpr int64_t kHour = 3600ll * 1'000'000'000;
constexpr int64_t kDay = 24 * kHour;

// How many messages a receive() got: kEmpty is none; any other error fails the test.
size_t got_n(const Result<std::vector<Message>>& r) {
  if (!r.ok()) {
    EXPECT_EQ(r.status().code(), Code::kEmpty) << r.status().to_string();
    return 0;
  }
  return r->size();
}

// The real clocks, but CLOCK_REALTIME and its coarse variant are `step` ns off.
class WallStepEnv : public EnvWrapper {
 public:
  WallStepEnv() : EnvWrapper(make_default_env()) {}
  Now now() override {
    Now n = target().now();
    n.real_coarse += static_cast<uint64_t>(step.load());
    return n;
  }
  uint64_t real_ns() override { return target().real_ns() + static_cast<uint64_t>(step.load()); }
  std::atomic<int64_t> step{0};
};

class ClockStep : public QueueDirTest {
 protected:
  // Every queue of a test is on env_, so a step moves the wall clock all of them read.
  std::unique_ptr<Queue> open(QueueOptions o = {}) {
    o.env = env_;
    return QueueDirTest::open(o);
  }
  // Closes the queue, removes its index and opens it again: the index is rebuilt from the log.
  std::unique_ptr<Queue> rebuilt(std::unique_ptr<Queue> q, const QueueOptions& o = {}) {
    q.reset();
    std::filesystem::remove(qdir() + "/index");
    return open(o);
  }
  void step_wall(int64_t ns) { env_->step = ns; }
  const std::shared_ptr<WallStepEnv> env_ = std::make_shared<WallStepEnv>();
};

// The wall clock a Clocks gives is that of the moment it was read, however late it is asked
// for: conversions take real() - boot as the offset between the clocks. On a fake clock,
// so the answer is exact.
TEST_F(ClockStep, TheWallClockOfClocksIsThatOfTheMomentTheyWereRead) {
  auto h = std::make_unique<index::IndexHeader>();
  h->cache.clock_n = 1;  // an anchor, so that reading the clocks needs no wall clock
  test::FakeClockEnv env;
  const queue::Clocks c = queue::read_clocks(*h, env);
  const uint64_t wall_then = env.real_ns();  // (now() moved the clocks on as it read them)
  env.advance(300ms);
  EXPECT_EQ(c.real(), wall_then) << "real() gave the wall clock of its first call, not of the read";
}

// A step of the wall clock is noticed by the next send (anchor_due() reads the coarse wall
// clock) and anchored in the log: a CLOCK record of the new offset, and the records after
// it store times that follow the wall clock again.
TEST_F(ClockStep, AStepOfTheWallClockIsAnchoredInTheLog) {
  {
    auto q = open();
    ASSERT_TRUE(q);
    ASSERT_TRUE(q->send("before").ok());
    step_wall(2 * kHour);
    ASSERT_TRUE(q->send("after").ok());
  }
  auto log = storage::Log::open(qdir() + "/segments", storage::LogOptions{});
  ASSERT_TRUE(log.ok()) << log.status().to_string();
  std::vector<int64_t> offsets;  // of each anchor: the log clock less CLOCK_BOOTTIME
  std::map<std::string, uint64_t> stored;  // each message's time
  auto rec = (*log)->recover([&](storage::Pos, const storage::RecordView& v) {
    if (v.type == format::RecordType::kClock) {
      const auto off = static_cast<int64_t>(v.t1 - v.t2);
      if (offsets.empty() || offsets.back() != off) offsets.push_back(off);
    }
    if (v.type == format::RecordType::kMsg) stored[std::string(v.payload)] = v.t1;
  });
  ASSERT_TRUE(rec.ok()) << rec.status().to_string();
  ASSERT_EQ(offsets.size(), 2u) << "the step was not anchored";
  EXPECT_NEAR(static_cast<double>(offsets[1] - offsets[0]), static_cast<double>(2 * kHour), 10e9);
  ASSERT_EQ(stored.size(), 2u);
  EXPECT_GE(stored["after"] - stored["before"], static_cast<uint64_t>(2 * kHour - 10'000'000'000))
      << "a message sent after the step is not dated by the stepped wall clock";
}

TEST_F(ClockStep, AForwardStepDoesNotAgeAMessagePastRetention) {
  QueueOptions o;
  o.retention_max_age = 60s;
  auto q = open(o);
  ASSERT_TRUE(q);
  ASSERT_TRUE(q->send("young").ok());
  step_wall(2 * kHour);
  auto got = q->receive(1);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), 1u) << "a 2 h step dropped a message sent a moment ago";
  EXPECT_EQ(got->front().payload, "young");
  const auto wall_now = std::chrono::nanoseconds(env_->real_ns());
  const auto sent_ago = wall_now - got->front().enqueued.time_since_epoch();
  EXPECT_LT(std::chrono::abs(sent_ago), 60s) << "enqueued did not move with the wall clock's step";
  EXPECT_EQ(q->stats()->expired_total, 0u);
}

TEST_F(ClockStep, ABackwardStepDoesNotKeepAMessagePastRetention) {
  QueueOptions o;
  o.retention_max_age = 300ms;
  auto q = open(o);
  ASSERT_TRUE(q);
  ASSERT_TRUE(q->send("old").ok());
  step_wall(-kDay);
  std::this_thread::sleep_for(600ms);
  EXPECT_EQ(got_n(q->receive(1)), 0u) << "a -1 day step kept a message past its 300 ms retention";
  EXPECT_EQ(q->stats()->expired_total, 1u);
}

TEST_F(ClockStep, AfterABackwardStepAndARebuildAnExpiredLeaseEnds) {
  auto q = open();
  ASSERT_TRUE(q);
  ASSERT_TRUE(q->send("m").ok());
  auto first = q->receive(1, 1000ms);
  ASSERT_TRUE(first.ok() && first->size() == 1);
  step_wall(-kDay);
  q = rebuilt(std::move(q));
  ASSERT_TRUE(q);
  std::this_thread::sleep_for(1200ms);
  auto again = q->receive(1);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  ASSERT_EQ(again->size(), 1u) << "a 1 s lease rebuilt after a -1 day step is still in flight";
  EXPECT_EQ(again->front().receive_count, 2u);
}

TEST_F(ClockStep, AfterAForwardStepAndARebuildALeaseHolds) {
  auto q = open();
  ASSERT_TRUE(q);
  ASSERT_TRUE(q->send("m").ok());
  auto first = q->receive(1, 30000ms);
  ASSERT_TRUE(first.ok() && first->size() == 1);
  step_wall(kDay);
  q = rebuilt(std::move(q));
  ASSERT_TRUE(q);
  EXPECT_EQ(got_n(q->receive(1)), 0u) << "a 30 s lease ended early: a +1 day step and a rebuild";
  EXPECT_TRUE(q->ack(first->front().receipt).ok());
}

TEST_F(ClockStep, AfterAForwardStepAndARebuildADelayHolds) {
  auto q = open();
  ASSERT_TRUE(q);
  ASSERT_TRUE(q->send("later", 1000ms).ok());
  step_wall(kDay);
  q = rebuilt(std::move(q));
  ASSERT_TRUE(q);
  EXPECT_EQ(got_n(q->receive(1)), 0u) << "a 1 s delay ended at once: a +1 day step and a rebuild";
  EXPECT_EQ(got_n(q->receive(1, 0ms, 5000ms)), 1u) << "the delayed message never came";
}

TEST_F(ClockStep, ADedupIdOutlivesAForwardStep) {
  auto q = open();
  ASSERT_TRUE(q);
  SendOptions so;
  so.dedup_id = "order-17";
  auto a = q->send("once", so);
  ASSERT_TRUE(a.ok());
  step_wall(2 * kHour);
  auto b = q->send("once", so);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, *b) << "a 2 h step made the 5 min dedup window forget the id";
  q = rebuilt(std::move(q));
  ASSERT_TRUE(q);
  auto c = q->send("once", so);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*a, *c) << "after a rebuild";
  EXPECT_EQ(q->stats()->ready, 1u);
}

TEST_F(ClockStep, MessagesSurviveStepsBothWaysAcrossCompactionAndRebuild) {
  QueueOptions o;
  o.retention_max_age = 3600s;
  o.segment_size = 64 << 10;
  auto q = open(o);
  ASSERT_TRUE(q);
  std::string body(4000, 'x');
  // 80 steps: more than the index keeps anchors for in one boot (64), after which the log
  // clock keeps its last offset.
  for (int i = 0; i < 80; ++i) {
    step_wall((i % 2 == 0 ? 1 : -1) * (i + 1) * kHour);
    ASSERT_TRUE(q->send(body + std::to_string(i)).ok());
  }
  // Three in four acked, the rest nacked: compaction has segments to empty and messages
  // to copy, whose times it must restate.
  std::vector<Message> all;
  while (all.size() < 80) {
    auto got = q->receive(80 - all.size());
    ASSERT_GT(got_n(got), 0u) << "after " << all.size() << " of 80";
    for (auto& m : *got) all.push_back(std::move(m));
  }
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_TRUE((i % 4 == 0 ? q->nack(all[i].receipt) : q->ack(all[i].receipt)).ok());
  }
  auto c = q->compact();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  // The background compaction each roll starts may have done the work before this call
  // (which then finds nothing left): what the test needs is that it was done. Message 0,
  // nacked and so live, was in the first segment: that segment gone means it was copied.
  EXPECT_FALSE(std::filesystem::exists(qdir() + "/segments/00000000000000000001.seg"))
      << "the test needs compaction to remove segments and copy message 0 (removed " << c->segments_removed
      << ", copied " << c->messages_copied << " by this call)";
  step_wall(3 * kDay);
  q = rebuilt(std::move(q), o);
  ASSERT_TRUE(q);
  size_t left = 0;
  for (size_t n; (n = got_n(q->receive(100))) != 0;) left += n;
  EXPECT_EQ(left, 20u) << "wall-clock steps of up to 80 h aged messages of an hour's retention";
  EXPECT_EQ(q->stats()->expired_total, 0u);
}

// The CLOCK records of the segments in `dir`, rewritten as another boot's.
int mark_clock_records_as_another_boot(const std::string& dir) {
  int marked = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir + "/segments")) {
    const std::string name = f.path().filename();
    if (f.path().extension() != ".seg") continue;
    std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(io)), {});
    uint64_t salt = 0;
    std::memcpy(&salt, data.data() + 16, 8);
    for (size_t off = 64; off + 48 <= data.size();) {
      uint32_t magic = 0, len = 0;
      std::memcpy(&magic, data.data() + off, 4);
      std::memcpy(&len, data.data() + off + 4, 4);
      if (magic != 0x31525053) break;
      if (data[off + 8] == 8 && len == 8) {  // CLOCK: its payload names the boot
        uint64_t boot = 0;
        std::memcpy(&boot, data.data() + off + 48, 8);
        boot ^= 0x5a5a5a5a5a5a5a5aull;
        std::memcpy(data.data() + off + 48, &boot, 8);
        XXH3_state_t* st = XXH3_createState();
        XXH3_64bits_reset_withSeed(st, salt);
        XXH3_64bits_update(st, data.data() + off, 40);
        XXH3_64bits_update(st, data.data() + off + 48, len);
        uint64_t sum = XXH3_64bits_digest(st);
        XXH3_freeState(st);
        std::memcpy(data.data() + off + 40, &sum, 8);
        ++marked;
      }
      off += 48 + ((len + 7) & ~size_t{7});
    }
    io.seekp(0);
    io.write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  return marked;
}

TEST_F(ClockStep, ALeaseFromAnEarlierBootEndsAtOnce) {
  auto q = open();
  ASSERT_TRUE(q);
  ASSERT_TRUE(q->send("from before the reboot").ok());
  auto first = q->receive(1, 3600000ms);
  ASSERT_TRUE(first.ok() && first->size() == 1);
  q.reset();
  ASSERT_GE(mark_clock_records_as_another_boot(qdir()), 1) << "no CLOCK record in the log";
  std::filesystem::remove(qdir() + "/index");
  q = open();
  ASSERT_TRUE(q);
  auto again = q->receive(1);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  ASSERT_EQ(again->size(), 1u) << "an hour's lease of an earlier boot is still in flight";
  EXPECT_EQ(again->front().receive_count, 2u);
}

TEST_F(ClockStep, ADelayFromAnEarlierBootIsNotStretchedByAWallClockThatWentBack) {
  auto q = open();
  ASSERT_TRUE(q);
  ASSERT_TRUE(q->send("soon", 1000ms).ok());
  q.reset();
  ASSERT_GE(mark_clock_records_as_another_boot(qdir()), 1);
  std::filesystem::remove(qdir() + "/index");
  step_wall(-kDay);  // this boot's wall clock is a day behind the last one's
  q = open();
  ASSERT_TRUE(q);
  EXPECT_EQ(got_n(q->receive(1, 0ms, 5000ms)), 1u) << "a 1 s delay of an earlier boot was held for a day";
}

// Replay after ack (issue 26): an ack's age is measured on the boot clock within a boot, so
// a wall-clock step either way neither hides a fresh ack from replay nor lets compaction
// drop it; before and after an index rebuild.
TEST_F(ClockStep, AReplayWindowIgnoresWallClockSteps) {
  QueueOptions o;
  o.keep_acked = Millis(3600 * 1000);
  for (int64_t step : {2 * kHour, -2 * kHour}) {
    step_wall(0);
    std::filesystem::remove_all(qdir());
    auto q = open(o);
    ASSERT_TRUE(q);
    ASSERT_TRUE(q->send("fresh").ok());
    auto m = q->receive(1, 60000ms);
    ASSERT_TRUE(m.ok() && m->size() == 1);
    ASSERT_TRUE(q->ack(m->front().receipt).ok());
    step_wall(step);
    for (int pass = 0; pass < 2; ++pass) {
      ReplayOptions ro;
      ro.since = Millis(60 * 1000);
      auto r = q->replay(ro);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      EXPECT_EQ(r->replayed, 1u) << "step " << step / kHour << " h, pass " << pass;
      EXPECT_EQ(q->stats()->kept_acked, 1u) << "step " << step / kHour << " h, pass " << pass;
      ASSERT_TRUE(q->purge().ok());  // the replayed copy; the ack stays in the log
      q = rebuilt(std::move(q), o);
      ASSERT_TRUE(q);
    }
  }
}

// An ack of an earlier boot is dated by the wall clock (no common clock across a reboot).
TEST_F(ClockStep, AnAckFromAnEarlierBootIsDatedByTheWallClock) {
  QueueOptions o;
  o.keep_acked = Millis(24 * 3600 * 1000);
  auto q = open(o);
  ASSERT_TRUE(q);
  ASSERT_TRUE(q->send("before the reboot").ok());
  auto m = q->receive(1, 60000ms);
  ASSERT_TRUE(m.ok() && m->size() == 1);
  ASSERT_TRUE(q->ack(m->front().receipt).ok());
  q.reset();
  ASSERT_GE(mark_clock_records_as_another_boot(qdir()), 1);
  std::filesystem::remove(qdir() + "/index");
  step_wall(2 * kHour);  // the reboot took two hours, by the wall clock
  q = open(o);
  ASSERT_TRUE(q);
  ReplayOptions ro;
  ro.since = Millis(3600 * 1000);
  auto recent = q->replay(ro);
  ASSERT_TRUE(recent.ok()) << recent.status().to_string();
  EXPECT_EQ(recent->replayed, 0u) << "acked two hours ago by the wall clock";
  ro.since = Millis(3 * 3600 * 1000);
  auto older = q->replay(ro);
  ASSERT_TRUE(older.ok()) << older.status().to_string();
  EXPECT_EQ(older->replayed, 1u);
}

}  // namespace
}  // namespace spool::test
