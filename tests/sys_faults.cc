// See sys_faults.h. The Io at the bottom makes the calls; everything else is its bookkeeping.
#include "sys_faults.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "io/io.h"
#include "sys/crashpoint.h"

namespace spool::test::sysfaults {
namespace {

struct Fault {
  int countdown = 0;  // 0: none
  int err = 0;
  bool sticky = false;
};

std::mutex g_mu;  // faults, counters, recording
Fault g_faults[3];
size_t g_short = 0;
Counters g_counters;
bool g_recording = false;
std::string g_park_sync;
std::function<void()> g_on_sync;
std::function<void(const std::string&, const std::string&)> g_on_rename;

// The undo log: a header, then entries back to back.
struct Region {
  std::atomic<uint64_t> count;  // committed entries
  std::atomic<uint64_t> used;   // bytes of entries
  uint64_t capacity;            // bytes available for entries
  std::atomic<uint32_t> overflow;
};
struct EntryHdr {
  uint64_t dev;
  uint64_t ino;
  uint64_t off;
  uint64_t len;   // bytes of old data that follow
  uint64_t span;  // bytes this entry occupies, header included
  std::atomic<uint32_t> synced;
  uint32_t pad;
};
constexpr size_t kRegionHdr = 64;
Region* g_region = nullptr;

char* entries_base() { return reinterpret_cast<char*>(g_region) + kRegionHdr; }
size_t entry_span(uint64_t len) { return sizeof(EntryHdr) + ((len + 7) & ~uint64_t{7}); }

// -errno to inject for this call of `op`, or 0. Counts the call. g_mu held.
int injected(Op op) {
  Fault& f = g_faults[static_cast<int>(op)];
  if (f.countdown == 0) return 0;
  if (f.countdown > 1) {
    --f.countdown;
    return 0;
  }
  int err = f.err;
  if (!f.sticky) f = Fault{};
  ++g_counters.injected;
  return err;
}

// Saves what [off, off+len) of `fd` holds now. g_mu held, recording.
void save_undo(int fd, uint64_t off, uint64_t len) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return;
  uint64_t used = g_region->used.load();
  if (used + entry_span(len) > g_region->capacity) {
    g_region->overflow.store(1);
    return;
  }
  auto* e = reinterpret_cast<EntryHdr*>(entries_base() + used);
  char* data = reinterpret_cast<char*>(e + 1);
  ssize_t got = ::pread(fd, data, len, static_cast<off_t>(off));
  e->dev = st.st_dev;
  e->ino = st.st_ino;
  e->off = off;
  e->len = got > 0 ? static_cast<uint64_t>(got) : 0;  // past EOF there is nothing to put back
  e->span = entry_span(len);
  e->synced.store(0);
  g_region->used.store(used + entry_span(len), std::memory_order_release);
  g_region->count.fetch_add(1, std::memory_order_release);  // commit
}

template <class F>
void for_each_entry(F&& f) {
  char* p = entries_base();
  uint64_t n = g_region->count.load(std::memory_order_acquire);
  for (uint64_t i = 0; i < n; ++i) {
    auto* e = reinterpret_cast<EntryHdr*>(p);
    f(*e, reinterpret_cast<char*>(e + 1));
    p += e->span;
  }
}

void mark_synced(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return;
  bool all = true;
  for_each_entry([&](EntryHdr& e, char*) {
    if (e.dev == st.st_dev && e.ino == st.st_ino) e.synced.store(1);
    all = all && e.synced.load() != 0;
  });
  if (all) {  // nothing left to undo: reuse the space
    g_region->count.store(0, std::memory_order_release);
    g_region->used.store(0, std::memory_order_release);
  }
}

}  // namespace

void fail(Op op, int nth, int err, bool sticky) {
  std::lock_guard lock(g_mu);
  g_faults[static_cast<int>(op)] = Fault{nth, err, sticky};
}

void short_writes(size_t bytes) {
  std::lock_guard lock(g_mu);
  g_short = bytes;
}

void clear() {
  std::lock_guard lock(g_mu);
  for (Fault& f : g_faults) f = Fault{};
  g_short = 0;
}

void on_sync(std::function<void()> f) {
  std::lock_guard lock(g_mu);
  g_on_sync = std::move(f);
}

void on_rename(std::function<void(const std::string& from, const std::string& to)> f) {
  std::lock_guard lock(g_mu);
  g_on_rename = std::move(f);
}

void park_next_sync(const std::string& path) {
  std::lock_guard lock(g_mu);
  g_park_sync = path;
}

Counters counters() {
  std::lock_guard lock(g_mu);
  return g_counters;
}

void init_undo_log(size_t bytes) {
  if (g_region != nullptr) {
    g_region->count.store(0);
    g_region->used.store(0);
    g_region->overflow.store(0);
    return;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("sys_faults: mmap undo log");
    std::abort();
  }
  g_region = new (p) Region();
  g_region->capacity = bytes - kRegionHdr;
}

namespace {
// A child forked while another thread of the parent held g_mu would wait for it forever.
[[maybe_unused]] const int g_atfork = ::pthread_atfork([] { g_mu.lock(); }, [] { g_mu.unlock(); },
                                                       [] { g_mu.unlock(); });
}  // namespace

void start_recording() {
  std::lock_guard lock(g_mu);
  g_recording = g_region != nullptr;
}

bool undo_log_overflowed() { return g_region != nullptr && g_region->overflow.load() != 0; }

CutReport power_cut(const std::string& root, std::mt19937_64& rng) {
  CutReport rep;
  std::map<std::pair<uint64_t, uint64_t>, std::string> paths;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      paths[{st.st_dev, st.st_ino}] = it->path().string();
    }
  }
  struct Undo {
    std::string path;
    uint64_t off;
    const char* old;
    uint64_t len;
  };
  std::vector<Undo> unsynced;
  size_t missing = 0;
  for_each_entry([&](EntryHdr& e, char* data) {
    if (e.synced.load() != 0) return;
    auto it = paths.find({e.dev, e.ino});
    if (it == paths.end()) {
      ++missing;  // unlinked since (a compacted segment, a temp file): nothing to restore
      unsynced.push_back({"", e.off, data, e.len});
      return;
    }
    unsynced.push_back({it->second, e.off, data, e.len});
  });
  rep.unsynced = unsynced.size();
  rep.kept = unsynced.empty() ? 0 : rng() % (unsynced.size() + 1);
  auto restore = [&](const Undo& u, uint64_t from) {
    if (u.path.empty() || from >= u.len) return;
    int fd = ::open(u.path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return;
    if (::pwrite(fd, u.old + from, u.len - from, static_cast<off_t>(u.off + from)) < 0) {
      std::perror("sys_faults: restore");
    }
    ::close(fd);
  };
  for (size_t i = unsynced.size(); i-- > rep.kept;) {
    const Undo& u = unsynced[i];
    ++rep.undone;
    if (u.path.empty()) ++rep.missing;
    uint64_t from = 0;
    // The oldest write rolled back may have been torn: its first sectors reached the disk.
    if (i == rep.kept && u.len > 512 && rng() % 2 == 0) {
      from = 512 * (1 + rng() % ((u.len - 1) / 512));
      rep.torn = true;
    }
    restore(u, from);
  }
  (void)missing;
  g_region->count.store(0);
  g_region->used.store(0);
  g_region->overflow.store(0);
  return rep;
}

// ---- the Io ------------------------------------------------------------------------------

namespace {

// The pwrite backend's calls, each first through the bookkeeping above.
class SysFaultIo final : public io::Io {
  static void called_on_sync() {
    std::function<void()> f;
    {
      std::lock_guard lock(g_mu);
      f = g_on_sync;
    }
    if (f) f();
  }

 public:
  const char* name() const override { return "pwrite"; }

  int sync_dir(const std::string& path) override {
    called_on_sync();
    return io::Io::sync_dir(path);
  }

  int datasync(int fd) override {
    called_on_sync();
    std::string park;
    {
      std::lock_guard lock(g_mu);
      ++g_counters.syncs;
      if (int err = injected(Op::kSync)) return -err;
      park = std::exchange(g_park_sync, {});
    }
    if (!park.empty()) spool::park(park);
    if (::fdatasync(fd) != 0) return -errno;
    std::lock_guard lock(g_mu);
    if (g_recording) mark_synced(fd);
    return 0;
  }

  int rename(const std::string& from, const std::string& to) override {
    std::function<void(const std::string&, const std::string&)> f;
    {
      std::lock_guard lock(g_mu);
      f = g_on_rename;
    }
    if (f) f(from, to);
    return io::Io::rename(from, to);
  }

  int allocate(int fd, uint64_t off, uint64_t len) override {
    {
      std::lock_guard lock(g_mu);
      ++g_counters.allocates;
      if (int err = injected(Op::kAllocate)) return -err;
    }
    return ::fallocate(fd, 0, static_cast<off_t>(off), static_cast<off_t>(len)) == 0 ? 0 : -errno;
  }

 protected:
  int64_t write_some(int fd, const iovec* iov, int iovcnt, uint64_t off) override {
    std::vector<iovec> cut;
    {
      std::lock_guard lock(g_mu);
      ++g_counters.writes;
      if (int err = injected(Op::kWrite)) return -err;
      uint64_t total = 0;
      for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
      if (g_short != 0 && total > g_short) {
        uint64_t left = g_short;
        for (int i = 0; i < iovcnt && left > 0; ++i) {
          cut.push_back({iov[i].iov_base, std::min<size_t>(iov[i].iov_len, left)});
          left -= cut.back().iov_len;
        }
        total = g_short;
        ++g_counters.shortened;
      }
      if (g_recording) save_undo(fd, off, total);
    }
    const iovec* v = cut.empty() ? iov : cut.data();
    const int n = cut.empty() ? std::min(iovcnt, IOV_MAX) : static_cast<int>(cut.size());
    ssize_t done = ::pwritev(fd, v, n, static_cast<off_t>(off));
    return done >= 0 ? done : -errno;
  }
};

}  // namespace

std::shared_ptr<io::Io> io() {
  // Never destroyed: queues opened by static destructors or exit handlers may still use it.
  static auto* const shared = new std::shared_ptr<io::Io>(std::make_shared<SysFaultIo>());
  return *shared;
}

}  // namespace spool::test::sysfaults
