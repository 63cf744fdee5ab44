// Segment log: round trips, rolls, recovery. Runs once per I/O backend (SPOOL_IO).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "io/io.h"
#include "storage/log.h"
#include "test_util.h"

namespace spool::storage {
namespace {

using test::TempDir;

std::string payload_for(uint64_t id, size_t len) {
  std::string s(len, '\0');
  for (size_t i = 0; i < len; ++i) s[i] = static_cast<char>('a' + (id * 7 + i) % 26);
  return s;
}

class LogTest : public ::testing::Test {
 protected:
  std::unique_ptr<Log> open_log(uint64_t segment_size = 64 * 1024) {
    LogOptions o;
    o.segment_size = segment_size;
    auto log = Log::open(dir_ / "segments", o);
    EXPECT_TRUE(log.ok()) << log.status().to_string();
    return std::move(log).value();
  }
  TempDir dir_;
};

TEST_F(LogTest, RoundTripAcrossRollsAndReopen) {
  auto log = open_log();
  const uint64_t max = log->max_payload();
  std::vector<size_t> sizes = {0, 1, 7, 8, 9, 100, 4096, 30000, static_cast<size_t>(max)};
  Pos end;
  uint64_t id = 1;
  std::vector<std::pair<Pos, std::string>> written;
  for (int round = 0; round < 20; ++round) {
    for (size_t len : sizes) {
      std::string p = payload_for(id, len);
      Record r{format::RecordType::kMsg, 0, id, 11, 22, p};
      auto res = log->append(end, std::span(&r, 1));
      ASSERT_TRUE(res.ok()) << res.status().to_string();
      written.emplace_back(res->at[0], p);
      end = res->end;
      ++id;
    }
  }
  EXPECT_GT(end.seq, 5u) << "the test should cross many segment rolls";
  log.reset();

  auto again = open_log();
  std::vector<std::string> seen;
  auto rec = again->recover([&](Pos, const RecordView& v) { seen.emplace_back(v.payload); });
  ASSERT_TRUE(rec.ok()) << rec.status().to_string();
  EXPECT_TRUE(rec->corrupt.empty());
  EXPECT_EQ(rec->end, end);
  ASSERT_EQ(seen.size(), written.size());
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], written[i].second) << i;
  for (auto& [pos, p] : written) {
    std::shared_ptr<Segment> keep;
    auto v = again->read(pos, &keep);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(v->payload, p);
  }
}

TEST_F(LogTest, RecordLargerThanSegmentIsTooLargeAndWritesNothing) {
  auto log = open_log();
  std::string big(log->max_payload() + 1, 'x');
  Record r{format::RecordType::kMsg, 0, 1, 0, 0, big};
  auto res = log->append(Pos{}, std::span(&r, 1));
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), Code::kTooLarge);
  EXPECT_TRUE(log->segments()->empty());
}

}  // namespace
}  // namespace spool::storage
