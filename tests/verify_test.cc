// verify: planted damage of each kind is found; repair leaves a queue verify accepts.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <filesystem>

#include "index/index.h"
#include "spool/queue.h"
#include "test_util.h"

namespace spool {
namespace {

using test::TempDir;
using namespace std::chrono_literals;

bool mentions(const VerifyReport& r, const std::string& what) {
  for (const auto& p : r.problems)
    if (p.find(what) != std::string::npos) return true;
  return false;
}

class VerifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    QueueOptions o;
    o.segment_size = 64 << 10;
    o.max_payload = 1024;
    auto q = Queue::open(dir_ / "q", o);
    ASSERT_TRUE(q.ok());
    q_ = std::move(q).value();
    for (int i = 0; i < 1000; ++i) ASSERT_TRUE(q_->send("message " + std::to_string(i) + std::string(200, '.')).ok());
    // Opened again, so that no compaction by policy (a thread the sends' rolls started)
    // takes the lock between a test's tamper() and its verify() and repairs the damage first.
    q_.reset();
    q = Queue::open(dir_ / "q", o);
    ASSERT_TRUE(q.ok());
    q_ = std::move(q).value();
    auto got = q_->receive(10, 60s);
    ASSERT_TRUE(got.ok());
  }
  // Maps the shared index and applies `f` to its header and slots, as damage would.
  void tamper(const std::function<void(index::IndexHeader&, index::Entry*)>& f) {
    test::IndexFile file(dir_ / "q");
    ASSERT_TRUE(file.ok());
    f(file.hdr(), file.window());
  }
  TempDir dir_;
  std::unique_ptr<Queue> q_;
};

TEST_F(VerifyTest, HealthyQueuePasses) {
  auto r = q_->verify(false);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->ok()) << (r->problems.empty() ? "" : r->problems[0]);
  EXPECT_EQ(r->messages, 1000u);
  EXPECT_GT(r->segments, 2u);
}

TEST_F(VerifyTest, FindsACorruptRecordByFileAndOffset) {
  std::string seg = dir_ / "q/segments/00000000000000000001.seg";
  int fd = ::open(seg.c_str(), O_RDWR);
  char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, test::kFirstRecordOffset + 48 + 3), 1);  // inside the first message's payload
  c ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &c, 1, test::kFirstRecordOffset + 48 + 3), 1);
  ::close(fd);
  auto r = q_->verify(false);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(mentions(*r, "00000000000000000001.seg")) << "names the file";
  EXPECT_TRUE(mentions(*r, "offset " + std::to_string(test::kFirstRecordOffset))) << "and the offset";
}

TEST_F(VerifyTest, FindsAMissingSegment) {
  std::filesystem::remove(dir_ / "q/segments/00000000000000000002.seg");
  auto r = q_->verify(false);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(mentions(*r, "missing"));
}

TEST_F(VerifyTest, FindsAWrongReceiveCountAndRepairFixesIt) {
  tamper([](index::IndexHeader& h, index::Entry* slots) {
    slots[(500 + h.layout.win_offset) % h.layout.capacity].count = 7;  // the window holds every id: nothing was acked
  });
  auto r = q_->verify(false);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(mentions(*r, "message 500 has receive count 7"));
  auto fixed = q_->verify(true);
  ASSERT_TRUE(fixed.ok());
  EXPECT_FALSE(fixed->repairs.empty());
  EXPECT_TRUE(fixed->ok());
  EXPECT_TRUE(q_->verify(false)->ok());
}

TEST_F(VerifyTest, FindsCounterDriftAndRepairFixesIt) {
  tamper([](index::IndexHeader& h, index::Entry*) { h.cache.sent_total += 5; });
  auto r = q_->verify(false);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(mentions(*r, "sent total"));
  auto fixed = q_->verify(true);
  ASSERT_TRUE(fixed.ok());
  EXPECT_TRUE(fixed->ok());
  EXPECT_EQ(q_->stats()->sent_total, 1000u);
  EXPECT_EQ(q_->check_index(), "");
}

// A count that breaks the header's invariants is damage that every lock checks for: the
// lock verify takes finds it and rebuilds the index first, and verify says so.
TEST_F(VerifyTest, ReportsDepthDriftThatItsLockRebuilt) {
  tamper([](index::IndexHeader& h, index::Entry*) {
    h.cache.sent_total += 5;
    h.layout.count -= 1;  // depth drift (and a broken invariant)
  });
  auto r = q_->verify(false);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(mentions(*r, "counts: 999 live"));
  EXPECT_FALSE(r->repairs.empty());
  auto fixed = q_->verify(true);
  ASSERT_TRUE(fixed.ok());
  EXPECT_TRUE(fixed->ok());
  EXPECT_EQ(q_->stats()->sent_total, 1000u);
  EXPECT_EQ(q_->check_index(), "");
}

}  // namespace
}  // namespace spool
