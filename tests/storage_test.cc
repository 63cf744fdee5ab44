// Segment log: round trips, rolls, and recovery from each kind of damage a disk or a crash can
// do to the files. Runs once per I/O backend (SPOOL_IO). Damage goes straight to the segment
// files with plain pread/pwrite, which plays the part of the disk; spool's own Io is the
// thing under test and must not be used to break it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY  // the layout of XXH3_state_t, for smear_stack()
#include <xxhash.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "fault_io.h"
#include "io/io.h"
#include "proc_util.h"
#include "storage/log.h"
#include "storage/segment.h"
#include "sys/sigbus_guard.h"
#include "test_util.h"

namespace spool::storage {
namespace {

using format::kRecordHeaderSize;
using format::record_size;
using test::FaultIo;
using test::TempDir;

std::string payload_for(uint64_t id, size_t len) {
  std::string s(len, '\0');
  for (size_t i = 0; i < len; ++i) s[i] = static_cast<char>('a' + (id * 7 + i) % 26);
  return s;
}

// A record as a test appended it. Unlike Record it owns its payload, so it can outlive the
// append call and be compared with what recovery returns.
struct Rec {
  uint64_t id = 0;
  format::RecordType type = format::RecordType::kMsg;
  std::string payload;

  Record view() const {
    return Record{type, static_cast<uint32_t>(id % 5), id, id * 1000, id * 1000 + 1, payload};
  }
};

// Payload-less records are ACKs, so the type byte is exercised as well as the payload.
Rec make_rec(uint64_t id, size_t len) {
  return Rec{id, len == 0 ? format::RecordType::kAck : format::RecordType::kMsg,
             payload_for(id, len)};
}

// What recover() returned, copied out of the mappings.
struct Seen {
  Pos pos;
  format::RecordType type;
  uint32_t count;
  uint64_t id, t1, t2;
  std::string payload;
};

struct Recovered {
  Recovery info;
  std::vector<Seen> seen;
};

Result<Recovered> recover_all(Log& log) {
  Recovered out;
  auto r = log.recover([&](Pos p, const RecordView& v) {
    out.seen.push_back({p, v.type, v.count, v.id, v.t1, v.t2, std::string(v.payload)});
  });
  if (!r.ok()) return r.status();
  out.info = std::move(r).value();
  return out;
}

::testing::AssertionResult same(const Seen& s, const Rec& r) {
  Record want = r.view();
  if (s.type == want.type && s.count == want.count && s.id == want.id && s.t1 == want.t1 &&
      s.t2 == want.t2 && s.payload == r.payload) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "record at " << s.pos.seq << ":" << s.pos.off << " has id " << s.id << ", type "
         << int(s.type) << ", " << s.payload.size() << " payload bytes; expected id " << r.id
         << ", type " << int(r.type) << ", " << r.payload.size() << " bytes";
}

// `seen` must be exactly `recs` (or its first `n` records), in order.
::testing::AssertionResult same_records(const std::vector<Seen>& seen, const std::vector<Rec>& recs,
                                        size_t n = SIZE_MAX) {
  n = std::min(n, recs.size());
  if (seen.size() != n) {
    return ::testing::AssertionFailure() << seen.size() << " records recovered, expected " << n;
  }
  for (size_t i = 0; i < n; ++i) {
    if (auto r = same(seen[i], recs[i]); !r) return r << " (record #" << i << ")";
  }
  return ::testing::AssertionSuccess();
}

LogOptions opts(uint64_t segment_size, std::shared_ptr<io::Io> io = nullptr) {
  LogOptions o;
  o.segment_size = segment_size;
  o.io = std::move(io);
  return o;
}

std::string read_raw(const std::string& path, uint64_t off, size_t len) {
  std::string s(len, '\0');
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  ssize_t n = ::pread(fd, s.data(), len, static_cast<off_t>(off));
  ::close(fd);
  s.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return s;
}

bool write_raw(const std::string& path, uint64_t off, std::string_view bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  ssize_t n = ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(off));
  ::close(fd);
  return n == static_cast<ssize_t>(bytes.size());
}

std::vector<std::string> temp_files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.find(".tmp.") != std::string::npos) out.push_back(name);
  }
  return out;
}

// Recovery logs every corrupt region at warn level; tests that corrupt hundreds of times on
// purpose would bury the log of a real failure.
class QuietRecovery {
 public:
  QuietRecovery() : was_(spdlog::get_level()) { spdlog::set_level(spdlog::level::err); }
  ~QuietRecovery() { spdlog::set_level(was_); }

 private:
  spdlog::level::level_enum was_;
};

class LogTest : public ::testing::Test {
 protected:
  std::unique_ptr<Log> open_log(uint64_t segment_size = 64 * 1024,
                                std::shared_ptr<io::Io> io = nullptr) {
    auto log = Log::open(dir(), opts(segment_size, std::move(io)));
    EXPECT_TRUE(log.ok()) << log.status().to_string();
    return log.ok() ? std::move(log).value() : nullptr;
  }

  // Appends 3000-byte records, one per call, until the log reaches segment `seq`; adds the
  // spares the rolls took to `*taken`.
  static void append_until(Log& log, uint64_t seq, Pos& end, uint64_t& id, std::vector<std::string>& payloads,
                           uint32_t* taken = nullptr) {
    while (end.seq < seq) {
      payloads.push_back(payload_for(id, 3000));
      Record r{format::RecordType::kMsg, 0, id++, 1, 2, payloads.back()};
      auto res = log.append(end, std::span(&r, 1));
      ASSERT_TRUE(res.ok()) << res.status().to_string();
      if (taken != nullptr) *taken += res->spares_used;
      end = res->end;
    }
  }

  // Appends each of `recs` with its own call, starting at `end`; fills `at`.
  void append_each(Log& log, const std::vector<Rec>& recs, Pos& end, std::vector<Pos>& at) {
    for (const Rec& rec : recs) {
      Record r = rec.view();
      auto res = log.append(end, std::span(&r, 1));
      ASSERT_TRUE(res.ok()) << res.status().to_string();
      at.push_back(res->at[0]);
      end = res->end;
    }
  }

  // Appends `recs` into a fresh log whose first segment must hold them all (its path).
  void append_into_one_segment(const std::vector<Rec>& recs, std::vector<Pos>& at, Pos& end, std::string& path) {
    {
      auto log = open_log();
      ASSERT_NE(log, nullptr);
      ASSERT_NO_FATAL_FAILURE(append_each(*log, recs, end, at));
      path = log->segment_path(1);
    }
    ASSERT_EQ(end.seq, 1u);
  }

  // Payloads of every record recovery returns, checking there was no corruption.
  static std::vector<std::string> recovered(Log& log, Pos* end = nullptr) {
    std::vector<std::string> seen;
    auto rec = log.recover([&](Pos, const RecordView& v) { seen.emplace_back(v.payload); });
    EXPECT_TRUE(rec.ok()) << rec.status().to_string();
    if (rec.ok()) {
      EXPECT_TRUE(rec->corrupt.empty());
      if (end != nullptr) *end = rec->end;
    }
    return seen;
  }

  std::string dir() const { return dir_ / "segments"; }
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
  Pos recovered_end;
  std::vector<std::string> seen = recovered(*again, &recovered_end);
  EXPECT_EQ(recovered_end, end);
  ASSERT_EQ(seen.size(), written.size());
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], written[i].second) << i;
  for (auto& [pos, p] : written) {
    std::shared_ptr<Segment> keep;
    auto v = again->read(pos, &keep);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(v->payload, p);
  }
}

// check_end() gives back a segment its caller already had only while the Log's cache
// generation stands (Queue::Impl::log_tail() keeps the log's tail across sends on that): a
// roll (which may replace a stale segment of the same number) and a compaction's
// forget_below() change it; a lookup does not.
TEST_F(LogTest, TheCacheGenerationChangesWhereASegmentMayBeReplaced) {
  auto log = open_log();
  Pos end;
  uint64_t id = 1;
  std::vector<std::string> payloads;
  ASSERT_NO_FATAL_FAILURE(append_until(*log, 2, end, id, payloads));
  const uint64_t before = log->cache_generation();
  std::shared_ptr<Segment> tail;
  Status s = log->check_end(end, tail);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_NE(tail, nullptr);
  EXPECT_EQ(tail->info().seq, 2u);
  const Segment* known = tail.get();
  s = log->check_end(end, tail);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(tail.get(), known);
  ASSERT_TRUE(log->segment(1).ok());
  EXPECT_EQ(log->cache_generation(), before) << "a lookup changed it";
  ASSERT_NO_FATAL_FAILURE(append_until(*log, 3, end, id, payloads));
  const uint64_t rolled = log->cache_generation();
  EXPECT_NE(rolled, before) << "a roll did not change it";
  s = log->check_end(end, tail);  // it holds segment 2, the end is in 3
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(tail->info().seq, 3u);
  log->forget_below(2);
  EXPECT_NE(log->cache_generation(), rolled) << "forget_below() did not change it";
}

// Spare segments are taken by the next rolls, in place of new files, and the log reads
// back the same across them; the append reports how many it took.
TEST_F(LogTest, RollsTakeSpareSegmentsFirst) {
  auto log = open_log();
  ASSERT_TRUE(log->make_spare().ok());
  ASSERT_TRUE(log->make_spare().ok());
  EXPECT_EQ(*log->count_spares(), 2u);
  Pos end;
  uint64_t id = 1;
  uint32_t taken = 0;
  std::vector<std::string> payloads;
  while (end.seq < 4) {
    payloads.push_back(payload_for(id, 3000));
    Record r{format::RecordType::kMsg, 0, id, 1, 2, payloads.back()};
    auto res = log->append(end, std::span(&r, 1));
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    taken += res->spares_used;
    end = res->end;
    ++id;
  }
  // Segment 1 was new (the first append), 2 and 3 were the spares, 4 was allocated.
  EXPECT_EQ(taken, 2u);
  EXPECT_EQ(*log->count_spares(), 0u);
  EXPECT_EQ(log->segments()->size(), 4u);
  log.reset();
  auto again = open_log();
  EXPECT_EQ(recovered(*again), payloads);
}

// A spare made ahead (zero_fill, as the background thread makes them) of a log that stores
// through its mappings is zero-filled before it counts: its
// blocks are written ones, not fallocate's unwritten extents, so a store into a page of it
// needs no extent conversion under the index lock, and its sync flushes data only.
TEST_F(LogTest, ASpareOfAMappedLogHasNoUnwrittenExtents) {
  auto log = open_log(1 << 20, io::make_mmap_io());
  ASSERT_TRUE(log);
  ASSERT_TRUE(log->mapped()) << "the test directory's filesystem takes the pwrite backend";
  ASSERT_TRUE(log->make_spare(1 << 20, true).ok());
  std::string spare;
  for (const auto& e : std::filesystem::directory_iterator(dir())) {
    if (e.path().filename().string().starts_with("spare-")) spare = e.path().string();
  }
  ASSERT_FALSE(spare.empty());
  int fd = ::open(spare.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  constexpr unsigned kMax = 64;
  std::vector<uint64_t> buf((sizeof(fiemap) + kMax * sizeof(fiemap_extent)) / sizeof(uint64_t) + 1, 0);
  auto* fm = reinterpret_cast<fiemap*>(buf.data());
  fm->fm_length = FIEMAP_MAX_OFFSET;
  fm->fm_flags = FIEMAP_FLAG_SYNC;
  fm->fm_extent_count = kMax;
  const int r = ::ioctl(fd, FS_IOC_FIEMAP, fm);
  const int err = errno;
  ::close(fd);
  if (r != 0 && (err == EOPNOTSUPP || err == ENOTTY)) {
    GTEST_SKIP() << "*** SKIPPED: the filesystem of " << dir() << " has no FIEMAP, so its extents cannot be seen";
  }
  ASSERT_EQ(r, 0) << std::strerror(err);
  ASSERT_GT(fm->fm_mapped_extents, 0u);
  uint64_t covered = 0;
  for (unsigned i = 0; i < fm->fm_mapped_extents; ++i) {
    EXPECT_EQ(fm->fm_extents[i].fe_flags & FIEMAP_EXTENT_UNWRITTEN, 0u)
        << "extent " << i << " at " << fm->fm_extents[i].fe_logical << " is unwritten";
    covered += fm->fm_extents[i].fe_length;
  }
  EXPECT_GE(covered, uint64_t{1} << 20) << "the spare's blocks are all allocated";
}

// Segments start at the first size and double at each roll up to segment_size; a record
// larger than the next size gets a segment it fits; a spare too small for the record a
// roll is for stays a spare, and a later roll takes it (with its own size).
TEST_F(LogTest, SegmentsGrowFromASmallFirstOneAndFitLargeRecords) {
  const LogOptions o = opts(4 << 20);
  auto made = Log::open(dir(), o);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  auto log = std::move(made).value();
  static_assert(kFirstSegmentSize == 256u << 10);
  EXPECT_EQ(log->first_size(), kFirstSegmentSize);
  EXPECT_EQ(log->next_size(256 << 10), 512u << 10);
  EXPECT_EQ(log->next_size(3 << 20), 4u << 20);
  Pos end;
  uint64_t id = 1;
  std::vector<std::string> payloads;
  auto append = [&](size_t len) {
    payloads.push_back(payload_for(id, len));
    Record r{format::RecordType::kMsg, 0, id++, 1, 2, payloads.back()};
    auto res = log->append(end, std::span(&r, 1));
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    end = res->end;
  };
  auto size_of = [&](uint64_t seq) {
    struct stat st {};
    EXPECT_EQ(::stat(log->segment_path(seq).c_str(), &st), 0);
    return static_cast<uint64_t>(st.st_size);
  };
  ASSERT_NO_FATAL_FAILURE(append(100));
  EXPECT_EQ(size_of(1), 256u << 10);
  while (end.seq < 3) ASSERT_NO_FATAL_FAILURE(append(3000));
  EXPECT_EQ(size_of(2), 512u << 10);
  // Larger than the 2 MiB the next roll would make.
  ASSERT_TRUE(log->make_spare(16 << 10).ok());
  ASSERT_NO_FATAL_FAILURE(append(2560 << 10));
  EXPECT_EQ(end.seq, 4u);
  EXPECT_GE(size_of(4), (2560u << 10) + 64 + 48);
  EXPECT_EQ(*log->count_spares(), 1u) << "the spare too small for that record stays";
  // The next roll takes it, at its size.
  while (end.seq < 5) ASSERT_NO_FATAL_FAILURE(append(3000));
  uint64_t spare_bytes = 1;
  EXPECT_EQ(*log->count_spares(&spare_bytes), 0u);
  EXPECT_EQ(spare_bytes, 0u);
  EXPECT_EQ(size_of(5), 16u << 10);
  while (end.seq < 7) ASSERT_NO_FATAL_FAILURE(append(3000));
  EXPECT_EQ(size_of(6), 256u << 10) << "never smaller than the first";
  log.reset();
  auto again = Log::open(dir(), o);
  ASSERT_TRUE(again.ok());
  Pos recovered_end;
  EXPECT_EQ(recovered(**again, &recovered_end), payloads);
  EXPECT_EQ(recovered_end, end);
  // Sealed segments smaller than segment_size are no damage.
  auto rec = (*again)->recover([](Pos, const RecordView&) {});
  ASSERT_TRUE(rec.ok());
  EXPECT_TRUE(rec->corrupt.empty());
}

// A roll syncs nothing (the index lock is held): a power cut can keep a new segment's name
// and lose its header. Nothing in such a segment was ever durable (the first sync that
// covers it writes the header), so recovery moves it aside and the log ends before it.
TEST_F(LogTest, ALastSegmentWithAZeroHeaderIsMovedAsideAndTheLogEndsBeforeIt) {
  auto log = open_log();
  Pos end;
  uint64_t id = 1;
  std::vector<std::string> payloads;
  ASSERT_NO_FATAL_FAILURE(append_until(*log, 2, end, id, payloads));
  payloads.pop_back();  // the one in segment 2
  ASSERT_TRUE(log->sync_through(Pos{}, end).ok());
  const std::string second = log->segment_path(2);
  log.reset();
  ASSERT_TRUE(write_raw(second, 0, std::string(format::kSegmentHeaderSize, '\0')));
  auto again = open_log();
  Pos recovered_end;
  EXPECT_EQ(recovered(*again, &recovered_end), payloads);
  EXPECT_EQ(recovered_end.seq, 1u);
  EXPECT_FALSE(std::filesystem::exists(second));
  EXPECT_TRUE(std::filesystem::exists(second + ".no-header")) << "the bytes are kept, aside";
  // And the log goes on from there, into a new segment 2.
  Record r{format::RecordType::kMsg, 0, id, 1, 2, "after"};
  while (recovered_end.seq < 2) {
    auto res = again->append(recovered_end, std::span(&r, 1));
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    recovered_end = res->end;
  }
}

// A power cut can also lose a roll's rename and keep the spare's new header (and records
// behind it): such a spare is dropped, never rolled into again.
TEST_F(LogTest, ASpareHoldingASegmentHeaderIsNotRolledInto) {
  auto log = open_log();
  ASSERT_TRUE(log->make_spare(64 << 10).ok());
  std::string spare;
  for (const auto& e : std::filesystem::directory_iterator(dir())) {
    if (e.path().filename().string().starts_with("spare-")) spare = e.path().string();
  }
  ASSERT_FALSE(spare.empty());
  ASSERT_TRUE(write_raw(spare, 0, std::string_view(format::kSegmentMagic, 8)));
  Pos end;
  uint64_t id = 1;
  uint32_t taken = 0;
  std::vector<std::string> payloads;
  ASSERT_NO_FATAL_FAILURE(append_until(*log, 2, end, id, payloads, &taken));
  EXPECT_FALSE(std::filesystem::exists(spare)) << "the spare was dropped";
  EXPECT_EQ(taken, 1u) << "and counted as used up";
  log.reset();
  auto again = open_log();
  auto rec = again->recover([](Pos, const RecordView&) {});
  ASSERT_TRUE(rec.ok());
  EXPECT_TRUE(rec->corrupt.empty());
  EXPECT_EQ(recovered(*again), payloads);
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

// A crash in the middle of writing the last record leaves a prefix of it on disk and the rest
// as whatever was there (zeros of the preallocation) or, on a misbehaving device, garbage.
TEST_F(LogTest, TornTailIsDroppedAndAppendsResumeAtIt) {
  constexpr uint64_t kSegSize = 8192;
  std::vector<Rec> recs;
  for (uint64_t id = 1; id <= 120; ++id) recs.push_back(make_rec(id, id == 120 ? 200 : id % 90));
  std::vector<Pos> at;
  Pos end;
  std::string path;
  {
    auto log = open_log(kSegSize);
    ASSERT_NE(log, nullptr);
    ASSERT_NO_FATAL_FAILURE(append_each(*log, recs, end, at));
    path = log->segment_path(at.back().seq);
  }
  ASSERT_GT(end.seq, 1u) << "the torn record should not be in the first segment";
  const Pos torn = at.back();
  // The bytes the checksum covers; the last record has no pad.
  const std::string original = read_raw(path, torn.off, kRecordHeaderSize + 200);
  ASSERT_EQ(original.size(), kRecordHeaderSize + 200);

  std::vector<uint64_t> cuts;
  for (uint64_t i = 0; i < kRecordHeaderSize; ++i) cuts.push_back(i);
  for (uint64_t i : {0, 1, 2, 7, 8, 63, 100, 150, 198, 199}) cuts.push_back(kRecordHeaderSize + i);
  const Rec next = make_rec(121, 24);  // shorter than the torn record: its tail stays behind
  std::mt19937 rng(12345);
  for (uint64_t cut : cuts) {
    for (bool zeros : {true, false}) {
      SCOPED_TRACE("torn from byte " + std::to_string(cut) + (zeros ? " (zeros)" : " (garbage)"));
      std::string damaged = original;
      for (size_t i = cut; i < damaged.size(); ++i) {
        // XOR with a non-zero byte so every garbled byte really differs from the original.
        damaged[i] = zeros ? '\0' : static_cast<char>(damaged[i] ^ (1 + rng() % 255));
      }
      if (damaged == original) continue;  // the lost bytes were zeros anyway: nothing was torn
      ASSERT_TRUE(write_raw(path, torn.off, damaged));
      {
        auto log = open_log(kSegSize);
        ASSERT_NE(log, nullptr);
        auto got = recover_all(*log);
        ASSERT_TRUE(got.ok()) << got.status().to_string();
        EXPECT_TRUE(got->info.corrupt.empty());
        EXPECT_EQ(got->info.end, torn);
        ASSERT_TRUE(same_records(got->seen, recs, recs.size() - 1));
        Record r = next.view();
        auto res = log->append(got->info.end, std::span(&r, 1));
        ASSERT_TRUE(res.ok()) << res.status().to_string();
        EXPECT_EQ(res->at[0], torn);
      }
      {
        auto log = open_log(kSegSize);
        ASSERT_NE(log, nullptr);
        auto got = recover_all(*log);
        ASSERT_TRUE(got.ok()) << got.status().to_string();
        EXPECT_TRUE(got->info.corrupt.empty());
        EXPECT_EQ(got->info.end, (Pos{torn.seq, torn.off + record_size(24)}));
        ASSERT_EQ(got->seen.size(), recs.size());
        ASSERT_TRUE(same_records(std::vector<Seen>(got->seen.begin(), got->seen.end() - 1), recs,
                                 recs.size() - 1));
        EXPECT_TRUE(same(got->seen.back(), next));
      }
      ASSERT_TRUE(write_raw(path, torn.off, original));
    }
  }
}

// A flipped bit anywhere the checksum covers (header fields, payload, the checksum itself)
// must cost exactly that record: recovery resynchronises on the next one.
TEST_F(LogTest, BitFlipInARecordIsOneCorruptionAndSparesItsNeighbours) {
  std::vector<Rec> recs;
  for (uint64_t id = 1; id <= 21; ++id) recs.push_back(make_rec(id, id == 11 ? 37 : id * 3));
  std::vector<Pos> at;
  Pos end;
  std::string path;
  ASSERT_NO_FATAL_FAILURE(append_into_one_segment(recs, at, end, path));
  const Pos victim = at[10];
  QuietRecovery quiet;
  std::vector<Rec> others = recs;
  others.erase(others.begin() + 10);
  for (uint64_t byte = 0; byte < kRecordHeaderSize + 37; ++byte) {
    const std::string orig = read_raw(path, victim.off + byte, 1);
    ASSERT_EQ(orig.size(), 1u);
    for (int bit = 0; bit < 8; ++bit) {
      SCOPED_TRACE("bit " + std::to_string(bit) + " of byte " + std::to_string(byte));
      ASSERT_TRUE(write_raw(path, victim.off + byte, std::string(1, orig[0] ^ char(1 << bit))));
      auto log = open_log();
      ASSERT_NE(log, nullptr);
      auto got = recover_all(*log);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      ASSERT_EQ(got->info.corrupt.size(), 1u);
      EXPECT_EQ(got->info.corrupt[0].seq, 1u);
      EXPECT_EQ(got->info.corrupt[0].offset, victim.off);
      EXPECT_EQ(got->info.corrupt[0].length, record_size(37));
      EXPECT_EQ(got->info.end, end);
      ASSERT_TRUE(same_records(got->seen, others));
      std::shared_ptr<Segment> keep;
      EXPECT_EQ(log->read(victim, &keep).status().code(), Code::kCorrupt);
    }
    ASSERT_TRUE(write_raw(path, victim.off + byte, orig));
  }
}

// Every record below the end was written before the end moved past it, so a gap between
// valid records is damage whatever it holds: zeros (a lost page) or a torn record. Recovery
// reports it, exactly, and returns the records on both sides.
TEST_F(LogTest, AGapBetweenValidRecordsIsCorruptionWhateverItHolds) {
  std::vector<Rec> recs;
  for (uint64_t id = 1; id <= 800; ++id) recs.push_back(make_rec(id, id == 600 ? 37 : 0));
  std::vector<Pos> at;
  Pos end;
  std::string path;
  ASSERT_NO_FATAL_FAILURE(append_into_one_segment(recs, at, end, path));
  QuietRecovery quiet;
  struct Case {
    const char* what;
    size_t first, count;  // the records zeroed
    size_t keep = 0;      // of the first record, bytes left as they were (a torn write)
  };
  for (Case c : {Case{"three control records zeroed", 10, 3}, Case{"a record of 88 bytes zeroed", 599, 1},
                 Case{"321 records zeroed", 20, 321}, Case{"three records, the first torn 20 bytes in", 10, 3, 20},
                 Case{"one record torn at its checksum (40 bytes kept)", 10, 1, 40}}) {
    SCOPED_TRACE(c.what);
    uint64_t from = at[c.first].off;
    uint64_t to = c.first + c.count < at.size() ? at[c.first + c.count].off : end.off;
    const std::string orig = read_raw(path, from, to - from);
    ASSERT_TRUE(write_raw(path, from, std::string(to - from, '\0')));
    ASSERT_TRUE(write_raw(path, from, orig.substr(0, c.keep)));
    auto log = open_log();
    ASSERT_NE(log, nullptr);
    auto got = recover_all(*log);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    std::vector<Rec> others = recs;
    others.erase(others.begin() + static_cast<long>(c.first), others.begin() + static_cast<long>(c.first + c.count));
    EXPECT_TRUE(same_records(got->seen, others));
    EXPECT_EQ(got->info.end, end);
    ASSERT_EQ(got->info.corrupt.size(), 1u);
    EXPECT_EQ(got->info.corrupt[0].offset, from);
    EXPECT_EQ(got->info.corrupt[0].length, to - from);
    ASSERT_TRUE(write_raw(path, from, orig));
  }
}

// Power loss: whatever was not covered by a successful Log::sync_through may vanish, newest first.
// Under sync=always only synced records were acknowledged, so those must all survive, and
// recovery must never hand back anything that was not appended.
TEST_F(LogTest, PowerCutLosesNoSyncedRecordAndReturnsNothingInvalid) {
  std::mt19937_64 rng(20240607);
  int lost_some = 0, kept_unsynced = 0;  // so the test cannot pass by never cutting anything
  for (int iter = 0; iter < 60; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    TempDir d;
    const std::string dir = d / "segments";
    auto fault = std::make_shared<FaultIo>(io::default_io());
    fault->keep_undo_log(FaultIo::Undo::kPrivate, 64 << 20);
    // Some runs cut writes short, so a power cut can also tear a record in half.
    if (iter % 3 == 2) fault->set_short_writes(1 + rng() % 64);
    auto log = Log::open(dir, opts(4096, fault));
    ASSERT_TRUE(log.ok()) << log.status().to_string();

    std::vector<Rec> recs;
    size_t acked = 0;
    Pos end, synced;
    const size_t n = 10 + rng() % 50;
    while (recs.size() < n) {
      std::vector<Record> batch;
      size_t first = recs.size();
      for (size_t b = 1 + rng() % 3; b > 0 && recs.size() < n; --b) {
        recs.push_back(make_rec(recs.size() + 1, rng() % 4 == 0 ? 0 : rng() % 700));
      }
      for (size_t i = first; i < recs.size(); ++i) batch.push_back(recs[i].view());
      auto res = (*log)->append(end, batch);
      ASSERT_TRUE(res.ok()) << res.status().to_string();
      end = res->end;
      if (rng() % 4 == 0) {
        Status s = (*log)->sync_through(synced, end);  // as a queue syncs: across the rolls since
        ASSERT_TRUE(s.ok()) << s.to_string();
        acked = recs.size();
        synced = end;
      }
    }
    const size_t unsynced = fault->unsynced_writes();
    fault->power_cut(dir, rng() % (unsynced + 1));
    log->reset();

    auto after = Log::open(dir, opts(4096));
    ASSERT_TRUE(after.ok());
    auto got = recover_all(**after);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(got->info.corrupt.empty());
    ASSERT_GE(got->seen.size(), acked) << "a synced record was lost";
    ASSERT_TRUE(same_records(got->seen, recs, got->seen.size()));
    lost_some += got->seen.size() < recs.size();
    kept_unsynced += got->seen.size() > acked;

    // The log must be usable where recovery says it ends.
    const Rec more = make_rec(1000, 50);
    Record r = more.view();
    auto res = (*after)->append(got->info.end, std::span(&r, 1));
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    after->reset();
    auto again = Log::open(dir, opts(4096));
    ASSERT_TRUE(again.ok());
    auto got2 = recover_all(**again);
    ASSERT_TRUE(got2.ok()) << got2.status().to_string();
    EXPECT_TRUE(got2->info.corrupt.empty());
    ASSERT_EQ(got2->seen.size(), got->seen.size() + 1);
    ASSERT_TRUE(same_records(std::vector<Seen>(got2->seen.begin(), got2->seen.end() - 1), recs,
                             got->seen.size()));
    EXPECT_TRUE(same(got2->seen.back(), more));
    EXPECT_EQ(got2->info.end, res->end);
  }
  EXPECT_GT(lost_some, 10);
  EXPECT_GT(kept_unsynced, 10);
}

// Two records that nearly fill a 4 KiB segment, and a 3-record batch after them that needs a
// roll. The batch makes three writes: its first record into segment 1, the header of segment 2,
// its other two records into segment 2.
class RollingBatch {
 public:
  static constexpr uint64_t kSegSize = 4096;
  RollingBatch() {
    for (uint64_t id = 1; id <= 5; ++id) recs.push_back(make_rec(id, 1000));
  }
  std::vector<Record> prefix() const { return {recs[0].view(), recs[1].view()}; }
  std::vector<Record> batch() const { return {recs[2].view(), recs[3].view(), recs[4].view()}; }
  std::vector<Rec> recs;
};

TEST_F(LogTest, WriteErrorFailsAppendAndTheSameEndIsReusable) {
  const RollingBatch rb;
  for (int nth = 1; nth <= 3; ++nth) {
    SCOPED_TRACE("write #" + std::to_string(nth) + " of the batch fails");
    TempDir d;
    auto fault = std::make_shared<FaultIo>(io::default_io());
    auto log = Log::open(d / "segments", opts(RollingBatch::kSegSize, fault));
    ASSERT_TRUE(log.ok());
    auto pre = (*log)->append(Pos{}, rb.prefix());
    ASSERT_TRUE(pre.ok()) << pre.status().to_string();
    const Pos end = pre->end;

    fault->fail(FaultIo::Op::kWrite, nth, EIO);
    auto bad = (*log)->append(end, rb.batch());
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), Code::kIo) << bad.status().to_string();
    EXPECT_NE(bad.status().message().find(d / "segments/0000"), std::string::npos)
        << "the error should name the segment: " << bad.status().to_string();
    EXPECT_TRUE(temp_files_in(d / "segments").empty());

    auto ok = (*log)->append(end, rb.batch());
    ASSERT_TRUE(ok.ok()) << ok.status().to_string();
    EXPECT_EQ(ok->at[0], (Pos{1, end.off}));
    EXPECT_EQ(ok->end.seq, 2u);
    for (size_t i = 0; i < 3; ++i) {
      std::shared_ptr<Segment> keep;
      auto v = (*log)->read(ok->at[i], &keep);
      ASSERT_TRUE(v.ok()) << v.status().to_string();
      EXPECT_EQ(v->payload, rb.recs[i + 2].payload);
    }
    auto again = Log::open(d / "segments", opts(RollingBatch::kSegSize));
    ASSERT_TRUE(again.ok());
    auto got = recover_all(**again);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(got->info.corrupt.empty());
    EXPECT_EQ(got->info.end, ok->end);
    EXPECT_TRUE(same_records(got->seen, rb.recs));
  }
}

// The caller of a failed append is told nothing was written, so whatever part of the batch
// did reach the file must not come back as records when the log is recovered (say, after a
// restart that happens before any other append could overwrite it).
TEST_F(LogTest, FailedAppendLeavesNoRecordForRecovery) {
  const RollingBatch rb;
  struct Case {
    const char* name;
    FaultIo::Op op;
    int nth;
    int err;
    Code code;
  };
  for (const Case& c :
       {Case{"roll hits ENOSPC", FaultIo::Op::kAllocate, 1, ENOSPC, Code::kNoSpace},
        Case{"write into new segment fails", FaultIo::Op::kWrite, 3, EIO, Code::kIo}}) {
    SCOPED_TRACE(c.name);
    TempDir d;
    auto fault = std::make_shared<FaultIo>(io::default_io());
    auto log = Log::open(d / "segments", opts(RollingBatch::kSegSize, fault));
    ASSERT_TRUE(log.ok());
    auto pre = (*log)->append(Pos{}, rb.prefix());
    ASSERT_TRUE(pre.ok()) << pre.status().to_string();
    fault->fail(c.op, c.nth, c.err);
    auto bad = (*log)->append(pre->end, rb.batch());
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), c.code) << bad.status().to_string();

    auto again = Log::open(d / "segments", opts(RollingBatch::kSegSize));
    ASSERT_TRUE(again.ok());
    auto got = recover_all(**again);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(got->info.corrupt.empty());
    EXPECT_TRUE(same_records(got->seen, rb.recs, 2)) << "records of the failed append came back";
  }
}

// fsyncgate: after a failed fdatasync the kernel may have dropped the dirty pages and marked
// them clean, so a retry would "succeed" over lost data. The failure must stick.
TEST_F(LogTest, SyncErrorIsStickyForItsSegment) {
  auto fault = std::make_shared<FaultIo>(io::default_io());
  auto log = open_log(4096, fault);
  ASSERT_NE(log, nullptr);
  std::vector<Rec> recs;
  for (uint64_t id = 1; id <= 6; ++id) recs.push_back(make_rec(id, 1000));
  std::vector<Pos> at;
  Pos end;
  ASSERT_NO_FATAL_FAILURE(append_each(*log, recs, end, at));
  ASSERT_EQ(end.seq, 2u);

  fault->fail(FaultIo::Op::kSync, 1, EIO);
  Status first = log->sync(2);
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.code(), Code::kIo);
  EXPECT_NE(first.message().find(log->segment_path(2)), std::string::npos) << first.to_string();

  fault->clear();  // the device would now report success
  Status second = log->sync(2);
  EXPECT_FALSE(second.ok()) << "a retried fdatasync must not turn a lost write into a success";
  EXPECT_EQ(second.code(), Code::kIo);
  EXPECT_FALSE(log->sync(2).ok());
  EXPECT_TRUE(log->sync(1).ok()) << "only the segment whose sync failed is poisoned";
}

TEST_F(LogTest, ShortWritesStillRoundTrip) {
  auto fault = std::make_shared<FaultIo>(io::default_io());
  fault->keep_undo_log(FaultIo::Undo::kPrivate, 64 << 20);  // its entries count the writes
  fault->set_short_writes(5);
  auto log = open_log(8192, fault);
  ASSERT_NE(log, nullptr);
  std::vector<Rec> recs;
  uint64_t id = 1;
  recs.push_back(make_rec(id++, 1000));
  for (int round = 0; round < 4; ++round) {
    for (size_t len : {0, 1, 4, 5, 6, 13, 100, 1000, 3001}) recs.push_back(make_rec(id++, len));
  }
  Pos end;
  std::vector<Pos> at;
  Record first = recs[0].view();
  auto one = log->append(end, std::span(&first, 1));
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_GE(fault->unsynced_writes(), record_size(1000) / 5) << "writes were not cut short";
  end = one->end;
  at.push_back(one->at[0]);
  // Batches too, so that one write_all carries several records across the cuts.
  for (size_t i = 1; i < recs.size(); i += 3) {
    std::vector<Record> batch;
    for (size_t j = i; j < std::min(i + 3, recs.size()); ++j) batch.push_back(recs[j].view());
    auto res = log->append(end, batch);
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    at.insert(at.end(), res->at.begin(), res->at.end());
    end = res->end;
  }
  EXPECT_GT(end.seq, 2u);
  for (size_t i = 0; i < recs.size(); ++i) {
    std::shared_ptr<Segment> keep;
    auto v = log->read(at[i], &keep);
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    EXPECT_EQ(v->payload, recs[i].payload);
  }
  log.reset();
  auto again = open_log(8192);
  ASSERT_NE(again, nullptr);
  auto got = recover_all(*again);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(got->info.corrupt.empty());
  EXPECT_EQ(got->info.end, end);
  EXPECT_TRUE(same_records(got->seen, recs));
}

// ENOSPC comes from fallocate when a segment is created; the same checks as the tmpfs test
// below, but runnable without root.
TEST_F(LogTest, InjectedEnospcAtRollIsNoSpaceAndLeavesNoTempFile) {
  const RollingBatch rb;
  auto fault = std::make_shared<FaultIo>(io::default_io());
  auto log = open_log(RollingBatch::kSegSize, fault);
  ASSERT_NE(log, nullptr);
  auto pre = log->append(Pos{}, rb.prefix());
  ASSERT_TRUE(pre.ok()) << pre.status().to_string();
  fault->fail(FaultIo::Op::kAllocate, 1, ENOSPC);
  auto bad = log->append(pre->end, rb.batch());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kNoSpace);
  EXPECT_NE(bad.status().message().find(log->segment_path(2)), std::string::npos)
      << bad.status().to_string();
  EXPECT_TRUE(temp_files_in(dir()).empty());
  EXPECT_EQ(*log->segments(), std::vector<uint64_t>{1});

  auto ok = log->append(pre->end, rb.batch());
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  log.reset();
  auto again = open_log(RollingBatch::kSegSize);
  ASSERT_NE(again, nullptr);
  auto got = recover_all(*again);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(got->info.corrupt.empty());
  EXPECT_EQ(got->info.end, ok->end);
  EXPECT_TRUE(same_records(got->seen, rb.recs));
}

// A real full filesystem: a 1 MiB tmpfs. Mounting needs root (CAP_SYS_ADMIN).
class FullDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "\n*** SKIPPED: mounting a 1 MiB tmpfs needs root; ENOSPC on a really "
                      "full filesystem is NOT covered by this run (the injected-ENOSPC test "
                      "still is). Run the suite as root to cover it. ***";
    }
    mnt_ = dir_ / "mnt";
    ASSERT_EQ(::mkdir(mnt_.c_str(), 0700), 0) << std::strerror(errno);
    if (::mount("tmpfs", mnt_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=1m") != 0) {
      GTEST_SKIP() << "\n*** SKIPPED: mount -t tmpfs -o size=1m failed even as root ("
                   << std::strerror(errno)
                   << "; a container without CAP_SYS_ADMIN?); ENOSPC on a really full "
                      "filesystem is NOT covered by this run. ***";
    }
    mounted_ = true;
  }
  void TearDown() override {
    // Lazily if something still holds it, so a failing test never leaves a mount behind.
    if (mounted_ && ::umount(mnt_.c_str()) != 0) ::umount2(mnt_.c_str(), MNT_DETACH);
  }

  TempDir dir_;
  std::string mnt_;
  bool mounted_ = false;
};

TEST_F(FullDiskTest, FullFilesystemIsNoSpaceNotSigbusAndRecoversAfterFreeing) {
  constexpr uint64_t kSegSize = 256 * 1024;
  // Space that has nothing to do with the log, freed later to get out of ENOSPC.
  const std::string filler = mnt_ + "/filler";
  ASSERT_TRUE(write_raw(filler, 0, std::string(320 * 1024, 'f')));
  const std::string dir = mnt_ + "/segments";
  auto log = Log::open(dir, opts(kSegSize));
  ASSERT_TRUE(log.ok()) << log.status().to_string();

  // A small record leads each batch, so that the batch which meets the full disk has written
  // something into the old segment before its roll fails.
  std::vector<Rec> recs;
  auto add_batch = [&] {
    for (size_t len : {100, 5000, 5000}) recs.push_back(make_rec(recs.size() + 1, len));
  };
  auto batch_of = [&](size_t first) {
    std::vector<Record> b;
    for (size_t i = first; i < first + 3; ++i) b.push_back(recs[i].view());
    return b;
  };
  Pos end;
  size_t appended = 0;  // records in recs[0, appended) were appended successfully
  Status full;
  for (int i = 0; i < 1000 && full.ok(); ++i) {
    add_batch();
    auto res = (*log)->append(end, batch_of(appended));
    if (!res.ok()) {
      full = res.status();
      break;
    }
    end = res->end;
    appended += 3;
  }
  ASSERT_FALSE(full.ok()) << "never ran out of space";
  EXPECT_EQ(full.code(), Code::kNoSpace) << full.to_string();
  EXPECT_NE(full.message().find(dir + "/"), std::string::npos) << full.to_string();
  EXPECT_NE(full.message().find(".seg"), std::string::npos) << full.to_string();
  EXPECT_TRUE(temp_files_in(dir).empty());
  EXPECT_GE(end.seq, 2u);
  EXPECT_LE(end.off + record_size(100), kSegSize) << "the failing batch wrote nothing; the test "
                                                     "no longer covers a roll failing mid-batch";

  // Still full: still the same clean error, and nothing of the failed batches is recovered.
  auto still = (*log)->append(end, batch_of(appended));
  ASSERT_FALSE(still.ok());
  EXPECT_EQ(still.status().code(), Code::kNoSpace);
  {
    auto peek = Log::open(dir, opts(kSegSize));
    ASSERT_TRUE(peek.ok());
    auto got = recover_all(**peek);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(same_records(got->seen, recs, appended));
  }

  ASSERT_EQ(::unlink(filler.c_str()), 0);
  for (int i = 0; i < 5; ++i) {
    if (i > 0) add_batch();
    auto res = (*log)->append(end, batch_of(appended));
    ASSERT_TRUE(res.ok()) << "after freeing space: " << res.status().to_string();
    end = res->end;
    appended += 3;
  }
  log->reset();

  auto again = Log::open(dir, opts(kSegSize));
  ASSERT_TRUE(again.ok());
  auto got = recover_all(**again);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(got->info.corrupt.empty());
  EXPECT_EQ(got->info.end, end);
  EXPECT_TRUE(same_records(got->seen, recs, appended));
}

// Files that are not (whole, current) segments.
class SegmentOpenTest : public ::testing::Test {
 protected:
  std::string seg_path(uint64_t seq = 1) const {
    char name[32];
    std::snprintf(name, sizeof name, "%020llu.seg", static_cast<unsigned long long>(seq));
    return dir_ / name;
  }
  io::Io& io() { return *io_; }

  TempDir dir_;
  std::shared_ptr<io::Io> io_ = io::default_io();
};

TEST_F(SegmentOpenTest, TextFileIsNotAQueue) {
  std::mt19937 rng(99);
  std::string text;
  while (text.size() < 4000) text += "lorem ipsum " + std::to_string(rng()) + "\n";
  ASSERT_TRUE(write_raw(seg_path(), 0, text));
  for (bool writable : {false, true}) {
    auto seg = Segment::open(io(), seg_path(), writable);
    ASSERT_FALSE(seg.ok());
    EXPECT_EQ(seg.status().code(), Code::kNotAQueue) << seg.status().to_string();
    EXPECT_NE(seg.status().message().find(seg_path()), std::string::npos)
        << seg.status().to_string();
  }
  // The log refuses it too instead of treating it as an empty segment to write over.
  auto log = Log::open(dir_.path(), LogOptions{});
  ASSERT_TRUE(log.ok());
  auto rec = (*log)->recover([](Pos, const RecordView&) {});
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.status().code(), Code::kNotAQueue);
  EXPECT_EQ(read_raw(seg_path(), 0, 8000), text);
}

TEST_F(SegmentOpenTest, NewerVersionIsIncompatible) {
  {
    auto seg = Segment::create(io(), seg_path(), 1, 0, 4096);
    ASSERT_TRUE(seg.ok()) << seg.status().to_string();
  }
  std::string h = read_raw(seg_path(), 0, 64);
  ASSERT_EQ(h.size(), 64u);
  const uint32_t version = 99;
  std::memcpy(h.data() + 8, &version, sizeof version);
  // A consistent header from a newer spool, not a corrupt one.
  const uint64_t sum = XXH3_64bits(h.data(), 56);
  std::memcpy(h.data() + 56, &sum, sizeof sum);
  ASSERT_TRUE(write_raw(seg_path(), 0, h));

  auto seg = Segment::open(io(), seg_path(), false);
  ASSERT_FALSE(seg.ok());
  EXPECT_EQ(seg.status().code(), Code::kIncompatible) << seg.status().to_string();
  EXPECT_NE(seg.status().message().find(seg_path()), std::string::npos);
  EXPECT_NE(seg.status().message().find("99"), std::string::npos);

  // Never written to: an append at its end is refused and leaves the bytes alone.
  const std::string before = read_raw(seg_path(), 0, 4096);
  auto log = Log::open(dir_.path(), opts(4096));
  ASSERT_TRUE(log.ok());
  const Rec r = make_rec(1, 10);
  Record rv = r.view();
  auto res = (*log)->append(Pos{1, 64}, std::span(&rv, 1));
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), Code::kIncompatible);
  EXPECT_EQ(read_raw(seg_path(), 0, 4096), before);
}

// Sets segment `path`'s header version to `version` (a consistent header, its checksum
// redone): records written for a newer version, read under an older one's rules.
void set_header_version(const std::string& path, uint32_t version) {
  std::string h = read_raw(path, 0, 64);
  ASSERT_EQ(h.size(), 64u);
  std::memcpy(h.data() + 8, &version, sizeof version);
  const uint64_t sum = XXH3_64bits(h.data(), 56);
  std::memcpy(h.data() + 56, &sum, sizeof sum);
  ASSERT_TRUE(write_raw(path, 0, h));
}

// Version 4's view field (bytes 10-11 of the record header) and SUB records: written and
// read back; refused where a reader of the segment's version would not take them (a view
// or a SUB in a segment before version 4, a view past the last subscription, a view on a
// record that is the queue's).
TEST_F(SegmentOpenTest, TheViewFieldAndSubRecordsAreReadOnlyWhereTheSegmentsVersionHasThem) {
  using format::RecordType;
  const std::string name = "orders";
  const std::string checkpoint(80, '\0');
  const std::string clock(8, '\1');
  // LIST payloads (runs of ids): sound ones, and ones that break a rule.
  auto runs = [](std::vector<std::pair<uint64_t, uint64_t>> rs) {
    std::string out;
    for (auto [first, last] : rs) {
      out.append(reinterpret_cast<const char*>(&first), 8);
      out.append(reinterpret_cast<const char*>(&last), 8);
    }
    return out;
  };
  const std::vector<uint64_t> ids_a{3, 4, 5, 9};
  const std::string list_a = storage::encode_list(ids_a);
  const std::string list_b = runs({{1, 1}, {4, 6}});
  const std::string overlap = runs({{1, 4}, {4, 6}});
  const std::string too_many = runs({{1, format::kMaxListIds + 1}});
  constexpr uint8_t kList = format::kFlagList;
  struct Case {
    Record rec;
    bool valid_v4;  // a valid record in a version-4 segment (none of these is in version 3, but view 0 ones)
  };
  const std::vector<Case> cases = {
      {Record{RecordType::kMsg, 0, 1, 10, 10, "body"}, true},
      {Record{RecordType::kSub, 1, 2, 0, 0, name, 0, {}, 3}, true},
      {Record{RecordType::kLease, 1, 1, 11, 99, {}, 0, {}, 3}, true},
      {Record{RecordType::kRelease, 1, 1, 12, 13, {}, format::kFlagNack, {}, format::kMaxSubscriptions}, true},
      {Record{RecordType::kAck, 1, 1, 0, 0, {}, 0, {}, 0}, true},
      {Record{RecordType::kDead, 1, 1, 0, 0, {}, 0, {}, 2}, true},
      {Record{RecordType::kPurge, 0, 1, 0, 0, {}, 0, {}, 2}, true},
      {Record{RecordType::kPause, 1, 0, 0, 0, {}, 0, {}, 1}, true},
      {Record{RecordType::kSub, 0, 2, 0, 0, name, 0, {}, 3}, true},
      {Record{RecordType::kLease, 1, 1, 11, 99, {}, 0, {}, format::kMaxSubscriptions + 1}, false},
      {Record{RecordType::kMsg, 0, 5, 10, 10, "x", 0, {}, 1}, false},
      {Record{RecordType::kCheckpoint, 0, 0, 0, 0, checkpoint, 0, {}, 1}, false},
      {Record{RecordType::kClock, 0, 0, 1, 1, clock, 0, {}, 1}, false},
      {Record{RecordType::kLease, 1, 9, 11, 99, list_a, kList, {}, 2}, true},
      {Record{RecordType::kAck, 1, 6, 0, 0, list_b, kList, {}, 0}, true},
      {Record{RecordType::kAck, 1, 7, 0, 0, list_b, kList, {}, 0}, false},  // its id is not the last listed
      {Record{RecordType::kAck, 1, 6, 0, 0, overlap, kList, {}, 0}, false},
      {Record{RecordType::kAck, 1, format::kMaxListIds + 1, 0, 0, too_many, kList, {}, 0}, false},
      {Record{RecordType::kAck, 1, 6, 0, 0, {}, kList, {}, 0}, false},                 // no list
      {Record{RecordType::kRelease, 1, 6, 1, 1, list_b, kList, {}, 0}, false},         // not a LEASE or ACK
  };
  std::vector<uint64_t> at;
  {
    auto seg = Segment::create(io(), seg_path(), 1, 0, 8192);
    ASSERT_TRUE(seg.ok()) << seg.status().to_string();
    ASSERT_EQ((*seg)->info().version, format::kVersion);
    ASSERT_EQ(format::kVersion, format::kFirstViewVersion);
    std::string buf;
    for (const Case& c : cases) {
      at.push_back(format::kSegmentHeaderSize + buf.size());
      (*seg)->encode(c.rec, buf);
    }
    ASSERT_TRUE(write_raw(seg_path(), format::kSegmentHeaderSize, buf));
  }
  for (uint32_t version : {format::kVersion, format::kFirstViewVersion - 1}) {
    if (version != format::kVersion) set_header_version(seg_path(), version);
    auto seg = Segment::open(io(), seg_path(), false);
    ASSERT_TRUE(seg.ok()) << seg.status().to_string();
    ASSERT_EQ((*seg)->info().version, version);
    for (size_t i = 0; i < cases.size(); ++i) {
      const Record& want = cases[i].rec;
      const bool valid = version >= format::kFirstViewVersion ? cases[i].valid_v4
                                                              : want.view == 0 && want.type != RecordType::kSub &&
                                                                    (want.flags & format::kFlagList) == 0;
      auto got = (*seg)->record_at(at[i]);
      ASSERT_EQ(got.has_value(), valid) << "record #" << i << " (type " << int(want.type) << ", view " << want.view
                                        << ") in a version-" << version << " segment";
      if (!got) continue;
      EXPECT_EQ(got->type, want.type);
      EXPECT_EQ(got->view, want.view) << "record #" << i;
      EXPECT_EQ(got->count, want.count);
      EXPECT_EQ(got->id, want.id);
      EXPECT_EQ(got->payload, want.payload);
    }
  }
}

// The log never writes a view's record or a SUB into a segment of a version before views,
// whose readers would take it for damage: it rolls to a new (current) segment first, and a
// default-view record still goes where it always did.
TEST_F(LogTest, AViewRecordRollsASegmentOfAnOlderVersion) {
  Pos end;
  {
    auto log = open_log();
    ASSERT_NE(log, nullptr);
    Record m{format::RecordType::kMsg, 0, 1, 1, 1, "m"};
    auto res = log->append(end, std::span(&m, 1));
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    end = res->end;
  }
  ASSERT_NO_FATAL_FAILURE(set_header_version(dir() + "/00000000000000000001.seg", format::kFirstViewVersion - 1));
  auto log = open_log();
  ASSERT_NE(log, nullptr);
  auto rec = recover_all(*log);
  ASSERT_TRUE(rec.ok()) << rec.status().to_string();
  ASSERT_EQ(rec->seen.size(), 1u);
  end = rec->info.end;
  Record plain{format::RecordType::kLease, 1, 1, 2, 3, {}};
  Record sub{format::RecordType::kSub, 1, 0, 0, 0, "s", 0, {}, 1};
  Record viewed{format::RecordType::kLease, 1, 1, 2, 3, {}, 0, {}, 1};
  auto res = log->append(end, std::array{plain, sub, viewed});
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_EQ(res->at[0].seq, 1u) << "a default-view record stays in the version-3 segment";
  EXPECT_EQ(res->at[1].seq, 2u) << "a SUB record went into a segment before views";
  EXPECT_EQ(res->at[2].seq, 2u);
  log.reset();
  log = open_log();
  std::vector<uint16_t> views;
  auto again = log->recover([&](Pos, const RecordView& v) { views.push_back(v.view); });
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_TRUE(again->corrupt.empty());
  EXPECT_EQ(views, (std::vector<uint16_t>{0, 0, 1, 1}));
}

// An empty segment an older spool left at the end: a segment's opener (the restated
// subscriptions) does not go into it, where its readers would refuse the SUB records and
// take the rest of the segment for damage.
TEST_F(LogTest, AnOpenerWithSubscriptionsRollsAnEmptySegmentOfAnOlderVersion) {
  {
    auto log = open_log();
    ASSERT_NE(log, nullptr);
    auto res = log->append(Pos{}, std::span<const Record>{});  // segment 1, no record
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    ASSERT_EQ(res->end.seq, 1u);
  }
  ASSERT_NO_FATAL_FAILURE(set_header_version(dir() + "/00000000000000000001.seg", format::kFirstViewVersion - 1));
  auto log = open_log();
  ASSERT_NE(log, nullptr);
  auto rec = recover_all(*log);
  ASSERT_TRUE(rec.ok()) << rec.status().to_string();
  const Pos end = rec->info.end;
  ASSERT_EQ(end.seq, 1u);
  ASSERT_EQ(end.off, format::kSegmentHeaderSize);
  Record sub{format::RecordType::kSub, 1, 1, 0, 0, "s", format::kFlagRestated, {}, 1};
  Record msg{format::RecordType::kMsg, 0, 1, 1, 1, "m"};
  auto res = log->append(end, std::span(&msg, 1), 1, std::span(&sub, 1));
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_EQ(res->at[0].seq, 2u) << "the opener went into a segment before views";
  log.reset();
  log = open_log();
  std::vector<std::pair<format::RecordType, uint16_t>> seen;
  auto again = log->recover([&](Pos, const RecordView& v) { seen.emplace_back(v.type, v.view); });
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_TRUE(again->corrupt.empty());
  EXPECT_EQ(seen, (std::vector<std::pair<format::RecordType, uint16_t>>{{format::RecordType::kSub, 1},
                                                                        {format::RecordType::kMsg, 0}}));
}

TEST_F(SegmentOpenTest, TruncatedHeaderIsNotAQueue) {
  {
    auto seg = Segment::create(io(), seg_path(), 1, 0, 4096);
    ASSERT_TRUE(seg.ok()) << seg.status().to_string();
  }
  ASSERT_EQ(::truncate(seg_path().c_str(), 30), 0);
  auto seg = Segment::open(io(), seg_path(), false);
  ASSERT_FALSE(seg.ok());
  EXPECT_EQ(seg.status().code(), Code::kNotAQueue) << seg.status().to_string();
  EXPECT_NE(seg.status().message().find("truncated"), std::string::npos);
  EXPECT_NE(seg.status().message().find(seg_path()), std::string::npos);
  // Empty is the extreme case of the same.
  ASSERT_EQ(::truncate(seg_path().c_str(), 0), 0);
  auto empty = Segment::open(io(), seg_path(), false);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), Code::kNotAQueue) << empty.status().to_string();
}

// A segment cut short (a copy that stopped, a filesystem that lost the tail) must never be
// read past its end through the mapping, which would be SIGBUS.
TEST_F(SegmentOpenTest, TruncatedSegmentRecoversRecordsBeforeTheCut) {
  std::vector<Rec> recs;
  for (uint64_t id = 1; id <= 50; ++id) recs.push_back(make_rec(id, 100 + id));
  std::vector<Pos> at;
  Pos end;
  {
    auto log = Log::open(dir_.path(), opts(64 * 1024));
    ASSERT_TRUE(log.ok());
    for (const Rec& rec : recs) {
      Record r = rec.view();
      auto res = (*log)->append(end, std::span(&r, 1));
      ASSERT_TRUE(res.ok()) << res.status().to_string();
      at.push_back(res->at[0]);
      end = res->end;
    }
  }
  ASSERT_EQ(end.seq, 1u);
  const uint64_t cut = at[30].off + 21;  // inside record 31's header, not 8-aligned
  ASSERT_EQ(::truncate(seg_path().c_str(), static_cast<off_t>(cut)), 0);

  auto seg = Segment::open(io(), seg_path(), false);
  ASSERT_TRUE(seg.ok()) << seg.status().to_string();
  EXPECT_EQ((*seg)->info().size, cut);
  EXPECT_FALSE((*seg)->record_at(at[30].off));
  EXPECT_EQ((*seg)->resync(at[30].off), cut);

  const Rec next = make_rec(51, 100);
  Pos next_end;
  {
    auto log = Log::open(dir_.path(), opts(64 * 1024));
    ASSERT_TRUE(log.ok());
    auto got = recover_all(**log);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(got->info.corrupt.empty());
    EXPECT_EQ(got->info.end, at[30]);
    EXPECT_TRUE(same_records(got->seen, recs, 30));
    // There is no room left before the cut, so the append must move on, not write into (and
    // extend) the truncated file beyond what its mapping covers.
    Record r = next.view();
    auto res = (*log)->append(got->info.end, std::span(&r, 1));
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    EXPECT_EQ(res->at[0], (Pos{2, 64}));
    next_end = res->end;
  }
  auto log = Log::open(dir_.path(), opts(64 * 1024));
  ASSERT_TRUE(log.ok());
  auto got = recover_all(**log);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(got->info.end, next_end);
  ASSERT_EQ(got->seen.size(), 31u);
  EXPECT_TRUE(same_records(std::vector<Seen>(got->seen.begin(), got->seen.begin() + 30), recs, 30));
  EXPECT_TRUE(same(got->seen[30], next));
}

// Leaves the stack below the caller holding what a reused stack slot can hold: an XXH3 state
// seeded with `salt` whose seed-derived secret has since been overwritten. XXH3 trusts a
// state whose seed already matches and skips deriving the secret, so a checksum computed in an
// uninitialised state here comes out wrong.
[[gnu::noinline]] void smear_stack(uint64_t salt) {
  constexpr size_t kSeedAt = offsetof(XXH3_state_t, seed) % 64;
  constexpr size_t kExtSecretAt = offsetof(XXH3_state_t, extSecret) % 64;
  alignas(64) volatile unsigned char junk[32 << 10];
  for (size_t block = 0; block < sizeof junk; block += 64) {
    for (size_t i = 0; i < 64; ++i) junk[block + i] = 0x5a;
    for (size_t i = 0; i < 8; ++i) {
      junk[block + kSeedAt + i] = static_cast<unsigned char>(salt >> (8 * i));
      junk[block + kExtSecretAt + i] = 0;
    }
  }
}

// Records longer than 240 bytes are where XXH3 uses the secret it derives from the seed.
TEST_F(SegmentOpenTest, LongRecordChecksumDoesNotDependOnStaleStack) {
  auto seg = Segment::create(io(), seg_path(), 1, 0, 64 * 1024);
  ASSERT_TRUE(seg.ok()) << seg.status().to_string();
  const uint64_t salt = (*seg)->info().salt;
  const Rec rec = make_rec(1, 1000);
  std::string buf;
  smear_stack(salt);
  (*seg)->encode(rec.view(), buf);
  std::string covered = buf.substr(0, format::kChecksumOffset) + rec.payload;
  uint64_t want = XXH3_64bits_withSeed(covered.data(), covered.size(), salt);
  uint64_t got = 0;
  std::memcpy(&got, buf.data() + format::kChecksumOffset, sizeof got);
  EXPECT_EQ(got, want) << "encode() wrote a wrong checksum: the record is lost when read";

  ASSERT_TRUE(write_raw(seg_path(), 64, buf));
  smear_stack(salt);
  auto view = (*seg)->record_at(64);
  EXPECT_TRUE(view.has_value()) << "record_at() rejected a valid record";
}

// Root opens a mode-000 file anyway, so as root (CI) this case runs itself again as nobody
// (uid/gid 65534, through setpriv) with TMPDIR a directory nobody owns, and passes only if
// that run passed this one case.
TEST_F(SegmentOpenTest, UnreadableSegmentIsAnErrorNotACrash) {
  if (::geteuid() == 0) {
    ASSERT_EQ(std::getenv("SPOOL_TEST_AS_NOBODY"), nullptr) << "setpriv left the run as nobody with uid 0";
    ASSERT_EQ(::access("/usr/bin/setpriv", X_OK), 0)
        << "/usr/bin/setpriv (util-linux) is needed to run this case as an unprivileged user";
    std::string exe = std::filesystem::read_symlink("/proc/self/exe");
    std::string tmp = dir_ / "nobody-tmp";
    ASSERT_EQ(::mkdir(tmp.c_str(), 0700), 0);
    ASSERT_EQ(::chown(tmp.c_str(), 65534, 65534), 0);
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0711), 0);
    auto res = test::run_program({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", exe,
                                  "--gtest_filter=SegmentOpenTest.UnreadableSegmentIsAnErrorNotACrash"},
                                 "", "/", {"TMPDIR=" + tmp, "SPOOL_TEST_AS_NOBODY=1"});
    EXPECT_EQ(res.code, 0) << "the run as nobody failed:\n" << res.out << res.err;
    EXPECT_NE(res.out.find("[  PASSED  ] 1 test."), std::string::npos) << "the run as nobody:\n" << res.out << res.err;
    EXPECT_EQ(res.out.find("SKIPPED"), std::string::npos) << "the run as nobody:\n" << res.out << res.err;
    return;
  }
  {
    auto seg = Segment::create(io(), seg_path(), 1, 0, 4096);
    ASSERT_TRUE(seg.ok()) << seg.status().to_string();
  }
  ASSERT_EQ(::chmod(seg_path().c_str(), 0), 0);
  for (bool writable : {false, true}) {
    auto seg = Segment::open(io(), seg_path(), writable);
    ASSERT_FALSE(seg.ok());
    EXPECT_EQ(seg.status().code(), Code::kReadOnly) << seg.status().to_string();
    EXPECT_NE(seg.status().message().find(seg_path()), std::string::npos);
  }
  auto log = Log::open(dir_.path(), LogOptions{});
  ASSERT_TRUE(log.ok());
  auto rec = (*log)->recover([](Pos, const RecordView&) {});
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.status().code(), Code::kReadOnly) << rec.status().to_string();
}

// A store through the mapping that stops in the middle (here a read-only page stops it; a
// kill -9 does the same between two instructions) leaves a prefix of the records: whole
// records, then one whose first word is zero. With one memcpy of the batch, glibc stored
// the batch's first bytes last, and the first record was the headless one.
TEST(StoreRecords, AStoreStoppedInTheMiddleLeavesWholeRecordsThenAHeadlessOne) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  // A batch of 2 KiB, below the size where glibc's memcpy turns to `rep movsb` (which
  // stores forwards); record 4 reaches the read-only page.
  constexpr uint64_t kPayload = 200, kCount = 8;
  const uint64_t size = record_size(kPayload);
  const uint64_t kStart = 2 * page - 4 * size - 16;
  void* m = ::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* dst = static_cast<uint8_t*>(m);
  std::string src(kCount * size, '\0');
  for (uint64_t i = 0; i < kCount; ++i) {
    uint8_t* h = reinterpret_cast<uint8_t*>(src.data()) + i * size;
    const uint32_t magic = format::kRecordMagic, len = kPayload;
    std::memcpy(h, &magic, 4);
    std::memcpy(h + 4, &len, 4);
    std::memset(h + 8, static_cast<int>('a' + i), size - 8);
  }
  ASSERT_EQ(::mprotect(dst + 2 * page, page, PROT_READ), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    store_records(dst + kStart, reinterpret_cast<const uint8_t*>(src.data()), src.size());
    ::_exit(0);  // not reached: the store into the read-only page faults
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_FALSE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "the store was not stopped by the read-only page";
  const uint64_t stopped = (2 * page - kStart) / size;  // the record that reaches the page
  for (uint64_t i = 0; i < stopped; ++i) {
    EXPECT_EQ(std::memcmp(dst + kStart + i * size, src.data() + i * size, size), 0) << "record " << i << " is not whole";
  }
  uint64_t first = 1;
  std::memcpy(&first, dst + kStart + stopped * size, 8);
  EXPECT_EQ(first, 0u) << "the record the store stopped in has its first word";
  ::munmap(m, 3 * page);
}


// Zeroing a failed batch (unwrite) stopped in the middle leaves a prefix of it: whole
// records, then at most one partly zero, then zeros; never a zeroed record before a whole
// one, which replay would skip to. Here a read-only page stops it, at the batch's end and
// at its start; memset, forwards, zeroed the first records before the page stopped it.
TEST(StoreRecords, AnUnstoreStoppedInTheMiddleLeavesAPrefixOfTheRecords) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  constexpr uint64_t kPayload = 200, kCount = 8;
  const uint64_t size = record_size(kPayload);
  for (const bool read_only_at_end : {true, false}) {
    SCOPED_TRACE(read_only_at_end ? "the read-only page holds the last records" : "it holds the first ones");
    void* m = ::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(m, MAP_FAILED);
    auto* dst = static_cast<uint8_t*>(m);
    const uint64_t start = 2 * page - 4 * size - 16;  // records 4 to 7 reach into page 2
    for (uint64_t i = 0; i < kCount; ++i) {
      uint8_t* h = dst + start + i * size;
      const uint32_t magic = format::kRecordMagic, len = kPayload;
      std::memcpy(h, &magic, 4);
      std::memcpy(h + 4, &len, 4);
      std::memset(h + 8, static_cast<int>('a' + i), size - 8);
    }
    const std::string before(reinterpret_cast<const char*>(dst + start), kCount * size);
    // At the end: page 2 (records 4 to 7); at the start: page 1 (records 0 to 3, and 4's head).
    ASSERT_EQ(::mprotect(dst + (read_only_at_end ? 2 : 1) * page, page, PROT_READ), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      unstore_records(dst + start, kCount * size);
      ::_exit(0);  // not reached: a store into the read-only page faults
    }
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    ASSERT_FALSE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "the read-only page did not stop the zeroing";
    uint64_t whole = 0;
    while (whole < kCount && std::memcmp(dst + start + whole * size, before.data() + whole * size, size) == 0) ++whole;
    for (uint64_t i = whole + 1; i < kCount; ++i) {
      uint64_t first = 1;
      std::memcpy(&first, dst + start + i * size, 8);
      EXPECT_EQ(first, 0u) << "record " << i << " keeps its first word after record " << whole << ", which is not whole";
    }
    // From the end back to the read-only page: record 4 has its head there, its body zeroed.
    EXPECT_EQ(whole, read_only_at_end ? kCount : 4u);
    ::munmap(m, 3 * page);
  }
}

// A misaligned access (BUS_ADRALN, on armhf) in a guarded mapping is not a cut file: zero
// pages would not cure it, and the retried access faulted again, forever. The guard passes
// it on (to the handler before it: the default, or a sanitizer's, which may end the child)
// and leaves the mapping alone; a fault past a file's end (BUS_ADRERR) it takes. The mapping
// and the guard's flag are shared with the parent, which reads what the child's guard did.
TEST(SigbusGuard, OnlyAFaultPastTheFileIsTakenForACutFile) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (const int code : {BUS_ADRALN, BUS_ADRERR}) {
    SCOPED_TRACE(code == BUS_ADRALN ? "BUS_ADRALN" : "BUS_ADRERR");
    void* m = ::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(m, MAP_FAILED);
    auto* data = static_cast<volatile char*>(m);
    auto* cut = new (static_cast<char*>(m) + page) std::atomic<bool>(false);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      if (!sys::guard_mapping(m, page, PROT_READ | PROT_WRITE, cut)) ::_exit(11);
      // As the kernel sends a fault: a process may queue itself a signal with any si_code.
      siginfo_t si{};
      si.si_signo = SIGBUS;
      si.si_code = code;
      si.si_addr = static_cast<char*>(m) + 1;
      if (::syscall(SYS_rt_tgsigqueueinfo, ::getpid(), ::gettid(), SIGBUS, &si) != 0) ::_exit(12);
      data[2] = 'y';  // reaches the parent only through the mapping as it was
      ::_exit(0);
    }
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    ASSERT_FALSE(WIFEXITED(st) && WEXITSTATUS(st) > 10) << "the child could not set up: " << WEXITSTATUS(st);
    if (code == BUS_ADRALN) {
      EXPECT_FALSE(cut->load()) << "a misaligned access was taken for a cut file";
      if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        EXPECT_EQ(data[2], 'y') << "the mapping was replaced";
      }
    } else {
      ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "a fault past the file's end was not caught";
      EXPECT_TRUE(cut->load()) << "the mapping was not flagged cut";
      EXPECT_NE(data[2], 'y') << "the mapping was not replaced by zero pages";
    }
    ::munmap(m, 2 * page);
  }
}

}  // namespace
}  // namespace spool::storage
