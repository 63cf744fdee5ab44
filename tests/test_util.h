// Helpers shared by the tests: a temporary directory that removes itself, a queue opened in
// one.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "index/index.h"
#include "spool/queue.h"

namespace spool::test {

// Where a queue's first record goes in a segment: after the 64-byte header and the CLOCK
// record (48 + 8 bytes) that opens every segment a queue writes (docs/format.md, "Time").
inline constexpr uint64_t kFirstRecordOffset = 64 + 56;

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Whether the file system under `dir` punches holes (fallocate FALLOC_FL_PUNCH_HOLE): the
// index gives a drained backlog's blocks back that way, and the tests that count them skip,
// saying why, where it cannot.
bool can_punch_holes(const std::string& dir);

// Queue::open for a test: a failure is a test failure (EXPECT, so the caller decides whether
// to go on) and gives nullptr.
std::unique_ptr<Queue> open_queue(const std::string& dir, const QueueOptions& o = {});

// A fixture whose queue lives in a fresh directory of its own (dir_/q).
class QueueDirTest : public ::testing::Test {
 public:
  std::string qdir() const { return dir_ / "q"; }
  std::unique_ptr<Queue> open(const QueueOptions& o = {}) { return open_queue(qdir(), o); }
  TempDir dir_;
};

}  // namespace spool::test

namespace spool::test {

// Multiplier for data-heavy tests (SPOOL_TEST_SCALE, default 1): the sanitizer run uses a
// fraction, so the same test proves the same behaviour at a size ASan can afford.
double scale();
inline int scaled(int n) { return std::max(1, static_cast<int>(n * scale())); }

}  // namespace spool::test

namespace spool::test {

// Runs `child` in a forked process that exits with its return value (99 if it throws) and
// dies with the test process (PR_SET_PDEATHSIG), so a failed assertion leaves no orphans.
pid_t spawn(const std::function<int()>& child);
// Reaps `pid`: its exit status, or 128 + the signal that killed it.
int wait_exit(pid_t pid);
uint64_t mono_ns();
// Polls for `path` to exist, up to `limit`.
bool wait_for_file(const std::string& path, std::chrono::milliseconds limit);

// QUEUE/index as another process that may write the queue sees it: the whole file mapped
// read-write and shared, so what a test changes is what every attached process reads. For
// tests that damage the index or read its header by hand. A file that cannot be opened or
// mapped is a test failure (ok() is false, and nothing may be read through it then).
class IndexFile {
 public:
  explicit IndexFile(const std::string& qdir);
  ~IndexFile();
  IndexFile(const IndexFile&) = delete;
  IndexFile& operator=(const IndexFile&) = delete;
  bool ok() const { return base_ != nullptr; }
  index::IndexHeader& hdr() { return *reinterpret_cast<index::IndexHeader*>(base_); }
  // The window's slots, in slot order, and the entry of window id `id`.
  index::Entry* window();
  index::Entry& entry_of(uint64_t id);
  index::OvfEntry* overflow();
  index::DedupSlot* dedup();

 private:
  int fd_ = -1;
  size_t len_ = 0;
  char* base_ = nullptr;
};

}  // namespace spool::test
