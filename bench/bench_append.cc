// Append throughput of storage::Log for 100 B and 4 KiB records, under the three sync
// policies a queue offers (emulated here with Log::sync) and on both I/O backends, next to
// ceilings that leave the log out: memcpy into a shared mapping and a bare pwrite loop,
// both of the log's on-disk record size into preallocated files. The gap between a log row
// and its ceiling is what the log costs; the gap between policies is what durability costs.
//
// Files go to a directory under /var/tmp (SPOOL_BENCH_DIR overrides), which must be a disk:
// on tmpfs fdatasync is free and the sync rows mean nothing. Every benchmark call gets a
// fresh directory with 64 MiB segments, removed when the call ends.
//
// Timing is wall-clock (UseRealTime): waiting for the disk is the cost being measured and
// shows up as little CPU time. One iteration is one append call (1 or 32 records).
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "io/io.h"
#include "storage/format.h"
#include "storage/log.h"

namespace {

namespace fs = std::filesystem;
using spool::storage::Log;
using spool::storage::LogOptions;
using spool::storage::Pos;
using spool::storage::Record;

constexpr uint64_t kSegmentSize = 64ull << 20;
// Per benchmark; 22 benchmarks at about twice this each keep a run near a minute.
constexpr double kMinTimeSeconds = 1.0;
constexpr size_t kBatch = 32;
constexpr uint64_t kIntervalRecords = 1000;
constexpr auto kIntervalTime = std::chrono::milliseconds(50);

enum class Backend { kUring, kPwrite };
enum class Policy { kNever, kInterval, kAlways, kAlwaysBatch };

const char* backend_name(Backend b) { return b == Backend::kUring ? "io_uring" : "pwrite"; }
const char* policy_name(Policy p) {
  switch (p) {
    case Policy::kNever: return "never";
    case Policy::kInterval: return "interval";
    case Policy::kAlways: return "always";
    case Policy::kAlwaysBatch: return "always_batch32";
  }
  return "?";
}

std::string g_root;  // this run's directory, made by main()

// A per-call scratch directory. Syncing the file system first keeps writeback left over
// from the previous benchmark (whose files are gone, but whose journal may not be) out of
// this one's timing.
class Scratch {
 public:
  Scratch() {
    static int serial = 0;
    path_ = g_root + "/" + std::to_string(serial++);
    fs::create_directories(path_);
    spool::bench::sync_fs(path_);
  }
  ~Scratch() { spool::bench::remove_dir(path_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void report(benchmark::State& state, uint64_t records, size_t payload, uint64_t syncs) {
  using benchmark::Counter;
  // Rates print as "records=...k/s". MB are decimal and count payload only, so every row
  // measures the same user data whatever framing it writes.
  state.counters["records"] = Counter(static_cast<double>(records), Counter::kIsRate);
  state.counters["MB"] = Counter(static_cast<double>(records * payload) / 1e6, Counter::kIsRate);
  state.counters["syncs"] = Counter(static_cast<double>(syncs), Counter::kIsRate);
}

void bm_log_append(benchmark::State& state, Backend backend, Policy policy, size_t payload) {
  std::string why;
  std::shared_ptr<spool::io::Io> io;
  if (backend == Backend::kUring) {
    io = spool::io::make_uring_io(&why);
  } else {
    io = spool::io::make_pwrite_io();
  }
  if (!io) {
    state.SkipWithError(("io_uring unavailable: " + why).c_str());
    return;
  }
  Scratch dir;
  LogOptions opts;
  opts.segment_size = kSegmentSize;
  opts.io = io;
  auto log = Log::open(dir.path(), opts);
  if (!log.ok()) {
    state.SkipWithError(log.status().to_string().c_str());
    return;
  }
  // An empty append creates segment 1, so its fallocate and fsyncs stay out of the timing;
  // later rolls are timed, since a real writer pays for them.
  auto first = (*log)->append(Pos{}, {});
  if (!first.ok()) {
    state.SkipWithError(first.status().to_string().c_str());
    return;
  }
  Pos end = first->end;
  Pos synced{};  // nothing synced yet, not even segment 1's header

  std::string body(payload, '\0');
  for (size_t i = 0; i < payload; ++i) body[i] = static_cast<char>('a' + i % 26);
  const size_t batch = policy == Policy::kAlwaysBatch ? kBatch : 1;
  const uint64_t now_ns = 1700000000000000000ull;
  const Record proto{spool::format::RecordType::kMsg, 0, 0, now_ns, now_ns, body};
  std::vector<Record> recs(batch, proto);

  uint64_t id = 1, records = 0, syncs = 0, unsynced = 0;
  auto last_sync = std::chrono::steady_clock::now();
  for (auto _ : state) {
    for (Record& r : recs) r.id = id++;
    auto res = (*log)->append(end, recs);
    if (!res.ok()) {
      state.SkipWithError(res.status().to_string().c_str());
      break;
    }
    end = res->end;
    records += batch;
    unsynced += batch;
    bool sync = policy == Policy::kAlways || policy == Policy::kAlwaysBatch;
    if (policy == Policy::kInterval) {
      auto now = std::chrono::steady_clock::now();
      sync = unsynced >= kIntervalRecords || now - last_sync >= kIntervalTime;
      if (sync) last_sync = now;
    }
    if (sync) {
      // As a queue does: everything since the last sync, across any roll in between.
      if (auto s = (*log)->sync_through(synced, end); !s.ok()) {
        state.SkipWithError(s.to_string().c_str());
        break;
      }
      unsynced = 0;
      synced = end;
      ++syncs;
    }
  }
  report(state, records, payload, syncs);
}

// A preallocated file of kSegmentSize bytes, as Segment::create leaves one (minus the
// header), optionally mapped writable.
class Prealloc {
 public:
  Prealloc(const std::string& path, bool map) {
    fd_ = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      error_ = "open " + path + ": " + std::strerror(errno);
      return;
    }
    if (int r = ::posix_fallocate(fd_, 0, kSegmentSize); r != 0) {
      error_ = "fallocate " + path + ": " + std::strerror(r);
      return;
    }
    if (map) {
      void* p = ::mmap(nullptr, kSegmentSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
      if (p == MAP_FAILED) {
        error_ = "mmap " + path + ": " + std::strerror(errno);
        return;
      }
      base_ = static_cast<char*>(p);
    }
  }
  ~Prealloc() {
    if (base_ != nullptr) ::munmap(base_, kSegmentSize);
    if (fd_ >= 0) ::close(fd_);
  }
  Prealloc(const Prealloc&) = delete;
  Prealloc& operator=(const Prealloc&) = delete;
  const std::string& error() const { return error_; }
  int fd() const { return fd_; }
  char* base() const { return base_; }

 private:
  int fd_ = -1;
  char* base_ = nullptr;
  std::string error_;
};

enum class Ceiling { kMmap, kPwrite, kPwriteSync };

const char* ceiling_name(Ceiling c) {
  switch (c) {
    case Ceiling::kMmap: return "memcpy_mmap";
    case Ceiling::kPwrite: return "pwrite";
    case Ceiling::kPwriteSync: return "pwrite+fdatasync";
  }
  return "?";
}

// Writes records of the log's on-disk size (header + payload + pad) back to back, moving to
// a fresh preallocated file when one is full, as the log rolls segments.
void bm_ceiling(benchmark::State& state, Ceiling kind, size_t payload) {
  Scratch dir;
  const size_t rec_size = spool::format::record_size(payload);
  std::string src(rec_size, 'r');
  int files = 0;
  auto next_file = [&] {
    return std::make_unique<Prealloc>(dir.path() + "/" + std::to_string(files++),
                                      kind == Ceiling::kMmap);
  };
  auto file = next_file();
  if (!file->error().empty()) {
    state.SkipWithError(file->error().c_str());
    return;
  }
  uint64_t off = 0, records = 0, syncs = 0;
  for (auto _ : state) {
    if (off + rec_size > kSegmentSize) {
      file = next_file();
      if (!file->error().empty()) {
        state.SkipWithError(file->error().c_str());
        break;
      }
      off = 0;
    }
    if (kind == Ceiling::kMmap) {
      std::memcpy(file->base() + off, src.data(), rec_size);
      benchmark::ClobberMemory();
    } else {
      ssize_t n = ::pwrite(file->fd(), src.data(), rec_size, static_cast<off_t>(off));
      if (n != static_cast<ssize_t>(rec_size)) {
        state.SkipWithError("short or failed pwrite");
        break;
      }
      if (kind == Ceiling::kPwriteSync) {
        if (::fdatasync(file->fd()) != 0) {
          state.SkipWithError("fdatasync failed");
          break;
        }
        ++syncs;
      }
    }
    off += rec_size;
    ++records;
  }
  report(state, records, payload, syncs);
}

// Builds benchmark names by appending; GCC 12 at -O3 flags `"/" + std::to_string(n)` with a
// false -Wrestrict (GCC bug 105651), and -Werror makes that fatal.
std::string join(std::initializer_list<std::string_view> parts) {
  std::string s;
  for (std::string_view p : parts) s.append(p);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  g_root = spool::bench::make_root("spool-bench", "bench_append: ");
  if (g_root.empty()) return 1;
  if (spool::bench::is_tmpfs(g_root)) {
    std::fprintf(stderr, "bench_append: warning: %s is tmpfs; sync figures will be meaningless\n", g_root.c_str());
  }
  benchmark::AddCustomContext("scratch_dir", g_root);
  benchmark::AddCustomContext("segment_size", std::to_string(kSegmentSize));

  for (size_t payload : {size_t{100}, size_t{4096}}) {
    const std::string size = std::to_string(payload);
    for (Ceiling c : {Ceiling::kMmap, Ceiling::kPwrite, Ceiling::kPwriteSync}) {
      std::string name = join({"ceiling/", ceiling_name(c), "/", size});
      benchmark::RegisterBenchmark(name.c_str(), bm_ceiling, c, payload)
          ->UseRealTime()
          ->MinTime(kMinTimeSeconds);
    }
    for (Backend b : {Backend::kUring, Backend::kPwrite}) {
      for (Policy p : {Policy::kNever, Policy::kInterval, Policy::kAlways, Policy::kAlwaysBatch}) {
        std::string name = join({"log/", backend_name(b), "/", policy_name(p), "/", size});
        benchmark::RegisterBenchmark(name.c_str(), bm_log_append, b, p, payload)
            ->UseRealTime()
            ->MinTime(kMinTimeSeconds);
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  spool::bench::remove_dir(g_root);
  return 0;
}
