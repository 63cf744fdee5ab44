// See fault_io.h. Each call does its bookkeeping, then the wrapped Io's.
#include "fault_io.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "sys/crashpoint.h"

namespace spool::test {
namespace {

std::mutex g_mu;  // every FaultIo's state
// A child forked while another thread of the parent held g_mu would wait for it forever.
[[maybe_unused]] const int g_atfork =
    ::pthread_atfork([] { g_mu.lock(); }, [] { g_mu.unlock(); }, [] { g_mu.unlock(); });

// The undo log: a header (FaultIo::Region), then entries back to back, each an Entry and the
// old bytes. Only atomics and offsets, so that it means the same in every process mapping it.
constexpr size_t kRegionHdr = 64;
struct Entry {
  uint64_t dev;  // of the file written; 0 with ino once it is unlinked or replaced
  uint64_t ino;
  uint64_t off;
  uint64_t len;   // bytes of old data that follow
  uint64_t span;  // bytes this entry occupies, header included
  std::atomic<uint32_t> synced;
  uint32_t pad;
};
size_t entry_span(uint64_t len) {
  return sizeof(Entry) + ((len + 7) & ~uint64_t{7});
}

}  // namespace

struct FaultIo::Region {
  std::atomic<uint64_t> count;  // committed entries
  std::atomic<uint64_t> used;   // bytes of entries
  uint64_t capacity;            // bytes available for entries
  std::atomic<uint32_t> overflow;
};

FaultIo::~FaultIo() {
  if (undo_ != nullptr) ::munmap(undo_, undo_bytes_);
}

void FaultIo::fail(Op op, int nth, int err, bool sticky) {
  std::lock_guard lock(g_mu);
  faults_[static_cast<int>(op)] = Fault{nth, err, sticky};
}

void FaultIo::set_short_writes(uint64_t bytes) {
  std::lock_guard lock(g_mu);
  short_writes_ = bytes;
}

void FaultIo::clear() {
  std::lock_guard lock(g_mu);
  for (Fault& f : faults_) f = Fault{};
  short_writes_ = 0;
}

void FaultIo::park_next_sync(const std::string& path) {
  std::lock_guard lock(g_mu);
  park_sync_ = path;
}

void FaultIo::on_sync(std::function<void()> f) {
  std::lock_guard lock(g_mu);
  on_sync_ = std::move(f);
}

void FaultIo::on_rename(std::function<void(const std::string& from, const std::string& to)> f) {
  std::lock_guard lock(g_mu);
  on_rename_ = std::move(f);
}

FaultIo::Counters FaultIo::counters() const {
  std::lock_guard lock(g_mu);
  return counters_;
}

// errno to inject for this call of `op`, or 0. g_mu held.
int FaultIo::injected(Op op) {
  Fault& f = faults_[static_cast<int>(op)];
  if (f.countdown == 0) return 0;
  if (f.countdown > 1) {
    --f.countdown;
    return 0;
  }
  int err = f.err;
  if (!f.sticky) f = Fault{};
  ++counters_.injected;
  return err;
}

// ---- the undo log ----------------------------------------------------------------------------

void FaultIo::keep_undo_log(Undo where, size_t bytes) {
  static_assert(sizeof(Region) <= kRegionHdr);
  std::lock_guard lock(g_mu);
  if (undo_ != nullptr) ::munmap(undo_, undo_bytes_);
  const int sharing = where == Undo::kShared ? MAP_SHARED : MAP_PRIVATE;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, sharing | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
  if (p == MAP_FAILED) {
    std::perror("FaultIo: mmap undo log");
    std::abort();
  }
  undo_ = new (p) Region();
  undo_->capacity = bytes - kRegionHdr;
  undo_bytes_ = bytes;
  recording_ = where == Undo::kPrivate;
}

void FaultIo::start_recording() {
  std::lock_guard lock(g_mu);
  recording_ = undo_ != nullptr;
}

bool FaultIo::undo_log_overflowed() const {
  std::lock_guard lock(g_mu);
  return undo_ != nullptr && undo_->overflow.load() != 0;
}

template <class F>
void FaultIo::for_each_entry(F&& f) const {
  if (undo_ == nullptr) return;
  char* p = reinterpret_cast<char*>(undo_) + kRegionHdr;
  uint64_t n = undo_->count.load(std::memory_order_acquire);
  for (uint64_t i = 0; i < n; ++i) {
    auto* e = reinterpret_cast<Entry*>(p);
    f(*e, reinterpret_cast<char*>(e + 1));
    p += e->span;
  }
}

size_t FaultIo::unsynced_writes() const {
  std::lock_guard lock(g_mu);
  size_t n = 0;
  for_each_entry([&](Entry& e, char*) { n += e.synced.load() == 0; });
  return n;
}

// Saves what [off, off+len) of `fd` holds now, before the write: a child killed during the
// write has its entry. g_mu held, recording.
void FaultIo::save_undo(int fd, uint64_t off, uint64_t len) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return;
  uint64_t used = undo_->used.load();
  if (used + entry_span(len) > undo_->capacity) {
    undo_->overflow.store(1);
    return;
  }
  auto* e = reinterpret_cast<Entry*>(reinterpret_cast<char*>(undo_) + kRegionHdr + used);
  ssize_t got = ::pread(fd, e + 1, len, static_cast<off_t>(off));
  e->dev = st.st_dev;
  e->ino = st.st_ino;
  e->off = off;
  e->len = got > 0 ? static_cast<uint64_t>(got) : 0;  // past EOF there is nothing to put back
  e->span = entry_span(len);
  e->synced.store(0);
  undo_->used.store(used + entry_span(len), std::memory_order_release);
  undo_->count.fetch_add(1, std::memory_order_release);  // commit
}

// The file at `path` is about to go (unlinked, or replaced by a rename): its entries no longer
// name it, nor a later file that gets its inode number.
void FaultIo::forget(const std::string& path) {
  struct stat st {};
  std::lock_guard lock(g_mu);
  if (!recording_ || ::lstat(path.c_str(), &st) != 0) return;
  for_each_entry([&](Entry& e, char*) {
    if (e.dev == st.st_dev && e.ino == st.st_ino) e.dev = e.ino = 0;
  });
}

FaultIo::CutReport FaultIo::power_cut(const std::string& root, std::mt19937_64& rng) {
  size_t n = unsynced_writes();
  return power_cut(root, n == 0 ? 0 : rng() % (n + 1), &rng);
}

FaultIo::CutReport FaultIo::power_cut(const std::string& root, size_t keep, std::mt19937_64* tear) {
  std::lock_guard lock(g_mu);
  CutReport rep;
  if (undo_ == nullptr) return rep;
  std::map<std::pair<uint64_t, uint64_t>, std::string> paths;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      paths[{st.st_dev, st.st_ino}] = it->path().string();
    }
  }
  struct Undone {
    std::string path;  // "": the file is gone (a compacted segment, a temp file)
    uint64_t off;
    const char* old;
    uint64_t len;
  };
  std::vector<Undone> unsynced;
  for_each_entry([&](Entry& e, char* data) {
    if (e.synced.load() != 0) return;
    auto it = paths.find({e.dev, e.ino});
    unsynced.push_back({it == paths.end() ? "" : it->second, e.off, data, e.len});
  });
  rep.unsynced = unsynced.size();
  rep.kept = std::min(keep, unsynced.size());
  for (size_t i = unsynced.size(); i-- > rep.kept;) {
    const Undone& u = unsynced[i];
    ++rep.undone;
    if (u.path.empty()) {
      ++rep.missing;
      continue;
    }
    uint64_t from = 0;
    if (tear != nullptr && i == rep.kept && u.len > 512 && (*tear)() % 2 == 0) {
      from = 512 * (1 + (*tear)() % ((u.len - 1) / 512));
      rep.torn = true;
    }
    if (from >= u.len) continue;
    // Straight to the file: restoring is the simulated disk, not an operation under test.
    int fd = ::open(u.path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (::pwrite(fd, u.old + from, u.len - from, static_cast<off_t>(u.off + from)) < 0) {
      std::perror("FaultIo: restore");
    }
    ::close(fd);
  }
  undo_->count.store(0);
  undo_->used.store(0);
  undo_->overflow.store(0);
  return rep;
}

// ---- the Io ----------------------------------------------------------------------------------

void FaultIo::called_on_sync() {
  std::function<void()> f;
  {
    std::lock_guard lock(g_mu);
    f = on_sync_;
  }
  if (f) f();
}

int FaultIo::datasync(int fd) {
  called_on_sync();
  std::string park;
  {
    std::lock_guard lock(g_mu);
    ++counters_.syncs;
    if (int err = injected(Op::kSync)) return -err;
    park = std::exchange(park_sync_, {});
  }
  if (!park.empty()) spool::park(park);
  int r = inner_->datasync(fd);
  struct stat st {};
  std::lock_guard lock(g_mu);
  if (r != 0 || !recording_ || ::fstat(fd, &st) != 0) return r;
  bool all = true;
  for_each_entry([&](Entry& e, char*) {
    if (e.dev == st.st_dev && e.ino == st.st_ino) e.synced.store(1);
    all = all && e.synced.load() != 0;
  });
  if (all) {  // nothing left to undo: reuse the space
    undo_->count.store(0, std::memory_order_release);
    undo_->used.store(0, std::memory_order_release);
  }
  return 0;
}

int FaultIo::sync_dir(const std::string& path) {
  called_on_sync();
  return inner_->sync_dir(path);
}

int FaultIo::allocate(int fd, uint64_t off, uint64_t len) {
  {
    std::lock_guard lock(g_mu);
    ++counters_.allocates;
    if (int err = injected(Op::kAllocate)) return -err;
  }
  return inner_->allocate(fd, off, len);
}

int FaultIo::open(const std::string& path, int flags, mode_t mode) {
  {
    std::lock_guard lock(g_mu);
    if (int err = injected(Op::kOpen)) return -err;
  }
  return inner_->open(path, flags, mode);
}

int FaultIo::rename(const std::string& from, const std::string& to) {
  std::function<void(const std::string&, const std::string&)> f;
  {
    std::lock_guard lock(g_mu);
    f = on_rename_;
  }
  if (f) f(from, to);
  forget(to);
  return inner_->rename(from, to);
}

int FaultIo::unlink(const std::string& path) {
  forget(path);
  return inner_->unlink(path);
}

int64_t FaultIo::write_some(int fd, const iovec* iov, int iovcnt, uint64_t off) {
  std::vector<iovec> cut(iov, iov + iovcnt);
  uint64_t total = 0;
  {
    std::lock_guard lock(g_mu);
    ++counters_.writes;
    if (int err = injected(Op::kWrite)) return -err;
    for (const iovec& v : cut) total += v.iov_len;
    if (short_writes_ != 0 && total > short_writes_) {
      uint64_t left = short_writes_;
      size_t n = 0;
      for (; n < cut.size() && left > 0; ++n) {
        cut[n].iov_len = std::min<uint64_t>(cut[n].iov_len, left);
        left -= cut[n].iov_len;
      }
      cut.resize(n);
      total = short_writes_;
      ++counters_.shortened;
    }
    if (recording_) save_undo(fd, off, total);
  }
  // The whole (maybe cut) write, through the wrapped Io's own resumption of short writes.
  int r = inner_->write_all(fd, cut.data(), static_cast<int>(cut.size()), off);
  return r < 0 ? r : static_cast<int64_t>(total);
}

}  // namespace spool::test
