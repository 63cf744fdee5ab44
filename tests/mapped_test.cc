// The mapped backend (records stored through a writable MAP_SHARED mapping of a preallocated
// segment, docs/durability.md): which directories get it, that fdatasync writes back the pages
// dirtied through the mapping, and that a power cut which keeps only synced pages loses
// nothing a sync=always call acknowledged.
//
// The power cut: the recording child (the process that will be "powered off") opens its
// queue with a ShadowIo in QueueOptions::io (the internal seam every file operation of a
// queue goes through), the mapped backend with two additions: each successful datasync of a
// file under the queue copies the file's contents, as the page cache holds them then (stores
// through the mapping included), into the shadow, and a rename renames the shadow along
// (spool syncs the directory after each rename, so names are durable at once). After the
// child is SIGKILLed, the parent puts every shadowed file back as it was at its last sync:
// what a power cut leaves of files whose unsynced pages never reached the disk. Files never
// synced (the index, the lock files) are the cache and its locks: the index is deleted, the
// worst a cut can do to it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "env/env.h"
#include "io/io.h"
#include "spool/queue.h"
#include "storage/log.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {
// Set in a recording child only.
char g_root[512];
char g_shadow[512];

// The shadow of `path` when it lies under the root, else "".
std::string shadow_of(const char* path) {
  size_t root_len = std::strlen(g_root);
  if (std::strncmp(path, g_root, root_len) != 0 || path[root_len] != '/') return {};
  return std::string(g_shadow) + "/" + (path + root_len + 1);
}

void snapshot(int fd) {
  char link[64], path[1024];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = ::readlink(link, path, sizeof path - 1);
  if (n <= 0) return;
  path[n] = 0;
  std::string dst = shadow_of(path);
  if (dst.empty()) return;
  // Read through a descriptor of its own: the synced one may be write-only (spool.conf's).
  int in = ::open(path, O_RDONLY | O_CLOEXEC);
  if (in < 0) return;
  std::error_code ec;
  fs::create_directories(fs::path(dst).parent_path(), ec);
  std::string tmp = dst + ".tmp";
  int out = ::open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  if (out < 0) {
    ::close(in);
    return;
  }
  std::string buf(1 << 16, '\0');
  for (off_t off = 0;; off += n) {
    n = ::pread(in, buf.data(), buf.size(), off);
    if (n <= 0) break;
    if (::write(out, buf.data(), static_cast<size_t>(n)) != n) break;
  }
  ::close(in);
  ::close(out);
  ::rename(tmp.c_str(), dst.c_str());  // a kill in the middle leaves the previous snapshot
}

// The mapped backend, shadowing what its datasyncs make durable (above).
class ShadowIo final : public spool::io::Io {
 public:
  const char* name() const override { return "mmap"; }
  bool maps_writes() const override { return true; }
  int datasync(int fd) override {
    int r = inner_->datasync(fd);
    if (r == 0 && g_shadow[0] != 0) snapshot(fd);
    return r;
  }
  int allocate(int fd, uint64_t off, uint64_t len) override { return inner_->allocate(fd, off, len); }
  int open(const std::string& path, int flags, mode_t mode) override { return inner_->open(path, flags, mode); }
  int unlink(const std::string& path) override { return inner_->unlink(path); }
  int sync_dir(const std::string& path) override { return inner_->sync_dir(path); }
  int rename(const std::string& from, const std::string& to) override {
    int r = inner_->rename(from, to);
    if (r == 0 && g_shadow[0] != 0) {
      std::string a = shadow_of(from.c_str()), b = shadow_of(to.c_str());
      if (!a.empty() && !b.empty()) {
        std::error_code ec;
        if (fs::exists(a, ec)) {
          fs::rename(a, b, ec);
        } else {
          fs::remove(b, ec);  // a file never synced replaced it
        }
      }
    }
    return r;
  }

 protected:
  int64_t write_some(int fd, const iovec* iov, int iovcnt, uint64_t off) override {
    int r = inner_->write_all(fd, iov, iovcnt, off);
    if (r < 0) return r;
    int64_t n = 0;
    for (int i = 0; i < iovcnt; ++i) n += static_cast<int64_t>(iov[i].iov_len);
    return n;
  }

 private:
  std::unique_ptr<spool::io::Io> inner_ = spool::io::make_mmap_io();
};
}  // namespace

namespace spool {
namespace {

using test::TempDir;
using namespace std::chrono_literals;

bool on_tmpfs(const std::string& dir) {
  struct statfs sf {};
  return ::statfs(dir.c_str(), &sf) == 0 && static_cast<uint64_t>(sf.f_type) == TMPFS_MAGIC;
}

// This process's mappings (/proc/self/smaps) whose header line `ours` picks: where each
// starts, its length, its VmFlags, how much of it is mapped with PMD (huge page) entries,
// and its dirty pages (Shared_Dirty and Private_Dirty, since a page mapped by one process
// only counts as private), in KiB.
struct MapInfo {
  uintptr_t start = 0;
  uint64_t len = 0;
  std::string flags;
  long pmd_kib = 0;
  long dirty_kib = 0;
};
std::vector<MapInfo> mappings(const std::function<bool(const std::string& header)>& ours) {
  std::ifstream in("/proc/self/smaps");
  std::vector<MapInfo> out;
  bool in_ours = false;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) && line.find('-') < 17) {
      in_ours = ours(line);
      if (in_ours) {
        uintptr_t from = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
        uintptr_t to = std::stoull(line.substr(line.find('-') + 1), nullptr, 16);
        out.push_back({from, to - from, "", 0, 0});
      }
    } else if (in_ours && line.starts_with("VmFlags:")) {
      out.back().flags = line.substr(8);
    } else if (in_ours && line.starts_with("FilePmdMapped:")) {
      out.back().pmd_kib = std::stol(line.substr(line.find(':') + 1));
    } else if (in_ours && (line.starts_with("Shared_Dirty:") || line.starts_with("Private_Dirty:"))) {
      out.back().dirty_kib += std::stol(line.substr(line.find(':') + 1));
    }
  }
  return out;
}

// Dirty pages of the mappings of `path` in this process, in KiB.
long dirty_kib(const std::string& path) {
  long kib = 0;
  for (const MapInfo& m : mappings([&](const std::string& header) { return header.ends_with(path); })) {
    kib += m.dirty_kib;
  }
  return kib;
}

TEST(MappedLog, ChosenWhereTheFilesystemAllocatesAtFallocate) {
  TempDir d;
  storage::LogOptions o;
  o.segment_size = 1 << 20;
  o.io = io::make_mmap_io();
  auto mapped = storage::Log::open(d / "m", o);
  ASSERT_TRUE(mapped.ok()) << mapped.status().to_string();
  // The test directory is on ext4 or tmpfs on every machine this suite runs on.
  EXPECT_TRUE((*mapped)->mapped()) << d.path() << " is on a filesystem the log does not map";
  o.io = io::make_pwrite_io();
  auto plain = storage::Log::open(d / "p", o);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE((*plain)->mapped());
  o.io = io::make_mmap_io();
  o.read_only = true;
  auto ro = storage::Log::open(d / "m", o);
  ASSERT_TRUE(ro.ok());
  EXPECT_FALSE((*ro)->mapped()) << "a read-only log stores nothing";
}

// A queue that never syncs maps its segments 2 MiB-aligned with MADV_HUGEPAGE (a store into
// a fresh 4 KiB page costs microseconds on a VM with shadow paging); one that syncs does not
// (a sync would write each dirty 2 MiB folio whole).
TEST(MappedLog, OnlyAQueueThatNeverSyncsMapsForHugePages) {
  const bool thp = std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled");
  if (!thp) {
    std::fprintf(stderr, "\n*** this kernel has no transparent huge pages: only the alignment is checked, "
                         "NOT the MADV_HUGEPAGE advice ***\n");
  }
  for (SyncPolicy sync : {SyncPolicy::kNever, SyncPolicy::kInterval}) {
    TempDir d;
    QueueOptions o;
    o.sync = sync;
    o.segment_size = 8 << 20;
    const std::string dir = d / "q";
    auto q = Queue::open(dir, o);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    // Segments start at 256 KiB and double: about 4 MiB of records reach one of 2 MiB or more.
    std::string payload(1000, 'h');
    std::vector<std::string_view> batch(100, payload);
    for (int i = 0; i < 45; ++i) ASSERT_TRUE((*q)->send_batch(batch).ok());
    auto peeked = (*q)->peek(1);  // a read maps the segments too
    ASSERT_TRUE(peeked.ok());
    // The segments' mappings (not a spare's, which the background thread maps while it makes
    // one). Read again for a while if one is wrong: the background thread may be between a
    // segment's mmap and its madvise.
    int large = 0;
    long pmd_kib = 0;
    std::string wrong;
    for (int round = 0; round < 40; ++round, std::this_thread::sleep_for(std::chrono::milliseconds(25))) {
      large = 0;
      pmd_kib = 0;
      wrong.clear();
      const std::string under = dir + "/segments/";
      for (const MapInfo& m : mappings([&](const std::string& header) {
             const size_t at = header.find(under);
             return at != std::string::npos && header.find(".seg", at) != std::string::npos;
           })) {
        if (m.len < (2u << 20)) continue;
        ++large;
        pmd_kib += m.pmd_kib;
        const bool hg = m.flags.find(" hg") != std::string::npos;
        std::ostringstream why;
        if (sync == SyncPolicy::kNever && m.start % (2u << 20) != 0) {
          why << "a segment of a never-syncing queue mapped at " << std::hex << m.start << "; ";
        } else if (sync == SyncPolicy::kNever && thp && !hg) {
          why << "no MADV_HUGEPAGE on a segment mapping: VmFlags" << m.flags << "; ";
        } else if (sync != SyncPolicy::kNever && hg) {
          why << "a segment of a syncing queue advised MADV_HUGEPAGE: VmFlags" << m.flags << "; ";
        }
        wrong += why.str();
      }
      if (wrong.empty()) break;
    }
    EXPECT_EQ(wrong, "");
    EXPECT_GE(large, 1) << "no segment of 2 MiB or more is mapped";
    std::printf("[figures] sync %s: %d segment mappings of 2 MiB or more, %ld KiB of them PMD-mapped\n",
                sync == SyncPolicy::kNever ? "never" : "interval", large, pmd_kib);
  }
}

// The share of `path`'s pages in the page cache (mincore through a mapping of our own).
double resident_share(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  ::fstat(fd, &st);
  const size_t len = static_cast<size_t>(st.st_size);
  void* m = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return -1;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((len + page - 1) / page);
  double share = -1;
  if (::mincore(m, len, in.data()) == 0) {
    size_t n = 0;
    for (unsigned char c : in) n += c & 1;
    share = static_cast<double>(n) / static_cast<double>(in.size());
  }
  ::munmap(m, len);
  return share;
}

// A log of `segment_size` segments under `dir`, with the mapped backend (kNotAQueue if the
// filesystem does not get it).
Result<std::unique_ptr<storage::Log>> mapped_log(const std::string& dir, uint64_t segment_size) {
  storage::LogOptions o;
  o.segment_size = segment_size;
  o.io = io::make_mmap_io();
  auto log = storage::Log::open(dir, o);
  if (log.ok() && !(*log)->mapped()) return Status(Code::kNotAQueue, dir + " is on a filesystem the log does not map");
  return log;
}

// A spare is made without touching its pages (most spares are room kept for a drain, and
// reading them in would fill the page cache with zeros); the ones the next rolls take are
// read in off the lock, so that the stores under it find their pages there.
TEST(MappedLog, OnlyTheSparesTheNextRollsTakeAreReadIn) {
  TempDir d;
  const std::string dir = d / "s";
  auto log = mapped_log(dir, 4 << 20);
  ASSERT_TRUE(log.ok()) << log.status().to_string();
  struct statfs sf {};
  ASSERT_EQ(::statfs(dir.c_str(), &sf), 0);
  // tmpfs allocates, and so holds, every page of a file at fallocate.
  const bool allocates_pages = sf.f_type == TMPFS_MAGIC;
  if (allocates_pages) {
    std::fprintf(stderr, "\n*** %s is tmpfs, which holds a spare's pages from its fallocate on: only the "
                         "warmed spares are checked, NOT that the others stay out of the page cache ***\n",
                 dir.c_str());
  }
  const size_t n = storage::Log::kWarmSpares + 2;
  for (size_t i = 0; i < n; ++i) ASSERT_TRUE((*log)->make_spare(0, false).ok());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().starts_with("spare-")) names.push_back(e.path().string());
  }
  std::sort(names.begin(), names.end());
  ASSERT_EQ(names.size(), n);
  if (!allocates_pages) {
    for (const std::string& s : names) EXPECT_LT(resident_share(s), 0.05) << s << " was read in when it was made";
  }
  (*log)->warm_next_spares();
  for (size_t i = 0; i < n; ++i) {
    const double share = resident_share(names[i]);
    if (i < storage::Log::kWarmSpares) {
      EXPECT_GT(share, 0.95) << names[i] << ", spare " << i
                             << " in the order rolls take them, is not in the page cache";
    } else if (!allocates_pages) {
      EXPECT_LT(share, 0.05) << names[i] << ", spare " << i << ", was read in: only the next "
                             << storage::Log::kWarmSpares << " are";
    }
  }
}

// A file put among the spares, larger than any segment (a roll takes a segment's size of
// it), is read in only as far as a roll would use it, not whole.
TEST(MappedLog, ALargeFileAmongTheSparesIsReadInOnlyAsFarAsARollUsesIt) {
  TempDir d;
  const std::string dir = d / "s";
  auto log = mapped_log(dir, 1 << 20);
  ASSERT_TRUE(log.ok()) << log.status().to_string();
  const std::string big = dir + "/spare-00000000000000000000-1";  // first in the order rolls take
  {
    int fd = ::open(big.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 64 << 20), 0);  // sparse: nothing in the page cache yet
    ::close(fd);
  }
  ASSERT_LT(resident_share(big), 0.01);
  (*log)->warm_next_spares();
  const double share = resident_share(big);
  EXPECT_GT(share, 0.0) << "nothing of the spare the next roll takes was read in";
  // The kernel's readahead may take some MiB beyond the 1 MiB asked for; not the whole file.
  EXPECT_LT(share, 0.5) << "a 64 MiB file among the spares of a log of 1 MiB segments was read in far beyond "
                           "the 1 MiB a roll uses";
}

TEST(MappedLog, SyncWritesBackThePagesDirtiedThroughTheMapping) {
  TempDir d;
  if (on_tmpfs(d.path())) {
    GTEST_SKIP() << "\n*** SKIPPED: " << d.path() << " is tmpfs, where fdatasync writes nothing back; "
                 << "writeback of mapped stores is NOT covered by this run ***";
  }
  storage::LogOptions o;
  o.segment_size = 1 << 20;
  o.io = io::make_mmap_io();
  auto log = storage::Log::open(d / "log", o);
  ASSERT_TRUE(log.ok());
  ASSERT_TRUE((*log)->mapped());
  std::string payload(1000, 'p');
  std::vector<storage::Record> recs(200, storage::Record{format::RecordType::kMsg, 0, 1, 0, 0, payload});
  for (size_t i = 0; i < recs.size(); ++i) recs[i].id = i + 1;
  auto r = (*log)->append({}, recs, 1);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::string seg = (*log)->segment_path(1);
  long before = dirty_kib(seg);
  EXPECT_GE(before, 150) << "200 KiB stored through the mapping, yet " << before << " KiB of it dirty";
  ASSERT_TRUE((*log)->sync(1).ok());
  EXPECT_EQ(dirty_kib(seg), 0) << "pages still dirty after fdatasync (" << before << " KiB before)";
  // And the records are in the file, for a reader that does not use the mapping.
  auto again = storage::Log::open(d / "log", [] {
    storage::LogOptions p;
    p.segment_size = 1 << 20;
    p.io = io::make_pwrite_io();
    p.read_only = true;
    return p;
  }());
  ASSERT_TRUE(again.ok());
  uint64_t n = 0;
  ASSERT_TRUE((*again)->recover([&](storage::Pos, const storage::RecordView& v) { n += v.payload == payload; }).ok());
  EXPECT_EQ(n, recs.size());
}

// ---- power cut ----------------------------------------------------------------------------

// What the child journalled: sends that returned, acks begun (before the call: a kill can
// land between the call's return and its line) and acks that returned.
struct Journal {
  std::set<uint64_t> sent, acking, acked;
};

Journal read_journal(const std::string& path) {
  Journal j;
  std::ifstream in(path);
  char kind;
  uint64_t id;
  while (in >> kind >> id) (kind == 's' ? j.sent : kind == 'r' ? j.acking : j.acked).insert(id);
  return j;
}

// Puts every shadowed file back as it was at its last sync and deletes the queue's index.
void power_cut(const std::string& root, const std::string& shadow) {
  for (const auto& e : fs::recursive_directory_iterator(shadow)) {
    if (!e.is_regular_file() || e.path().extension() == ".tmp") continue;
    fs::path dst = fs::path(root) / fs::relative(e.path(), shadow);
    if (fs::exists(dst)) fs::copy_file(e.path(), dst, fs::copy_options::overwrite_existing);
  }
  // A segment never synced (a roll syncs nothing: its first sync does) keeps its name and
  // size (the directory and the allocation are taken as durable here) and loses every byte
  // written to it, its header included.
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file() || e.path().extension() != ".seg") continue;
    if (fs::exists(fs::path(shadow) / fs::relative(e.path(), root))) continue;
    const auto size = fs::file_size(e.path());
    fs::resize_file(e.path(), 0);
    fs::resize_file(e.path(), size);
  }
  EXPECT_TRUE(fs::remove(fs::path(root) / "q" / "index")) << "no index to delete";
}

// A child that sends (and, with `acks`, acks every third message) as fast as it can on a
// sync=`policy` queue, journalling each call, until it is SIGKILLed. Returns once the child
// has journalled its first call (its first send creates the segment and spares, slow on a
// loaded machine), or after 10 s.
pid_t start_recording_child(const std::string& root, const std::string& shadow, const std::string& journal,
                            SyncPolicy policy, bool acks) {
  pid_t pid = test::spawn([=] {
    std::snprintf(g_root, sizeof g_root, "%s", root.c_str());
    std::snprintf(g_shadow, sizeof g_shadow, "%s", shadow.c_str());
    QueueOptions o;
    o.env = make_default_env(std::make_shared<ShadowIo>());
    o.sync = policy;
    o.segment_size = 256 << 10;
    o.max_receives = 0;
    auto q = Queue::open(root + "/q", o);
    if (!q.ok()) return 2;
    std::ofstream out(journal);
    for (uint64_t i = 0;; ++i) {
      auto id = (*q)->send("m" + std::to_string(i) + std::string(100, 'x'));
      if (!id.ok()) return 3;
      out << "s " << *id << "\n" << std::flush;
      if (acks && i % 3 == 2) {
        auto got = (*q)->receive(1, 60s);
        if (!got.ok()) return 4;
        for (auto& m : *got) {
          out << "r " << m.id << "\n" << std::flush;
          if (!(*q)->ack(m.receipt).ok()) return 5;
          out << "a " << m.id << "\n" << std::flush;
        }
      }
    }
  });
  std::error_code ec;
  for (int i = 0; i < 1000 && (!fs::exists(journal) || fs::file_size(journal, ec) == 0); ++i) {
    std::this_thread::sleep_for(10ms);
  }
  return pid;
}

// Ids held by the queue after the cut (ready, leased or delayed alike).
std::set<uint64_t> held(Queue& q) {
  std::set<uint64_t> ids;
  auto l = q.list(SIZE_MAX);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  if (l.ok()) {
    for (auto& m : *l) ids.insert(m.id);
  }
  return ids;
}

TEST(MappedPowerCut, SyncAlwaysLosesNothingAcknowledged) {
  std::mt19937_64 rng(std::random_device{}());
  const int rounds = test::scaled(8);
  uint64_t total_sent = 0;
  for (int round = 0; round < rounds; ++round) {
    TempDir d;
    std::string root = d / "root", shadow = d / "shadow", journal = d / "journal";
    fs::create_directories(root);
    fs::create_directories(shadow);
    pid_t pid = start_recording_child(root, shadow, journal, SyncPolicy::kAlways, true);
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 300));
    ::kill(pid, SIGKILL);
    int rc = test::wait_exit(pid);
    ASSERT_EQ(rc, 128 + SIGKILL) << "the recording child ended on its own";
    power_cut(root, shadow);
    Journal j = read_journal(journal);
    ASSERT_FALSE(j.sent.empty()) << "round " << round << ": the child sent nothing before the kill";
    QueueOptions o;
    o.create = false;
    auto q = Queue::open(root + "/q", o);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    std::set<uint64_t> have = held(**q);
    for (uint64_t id : j.sent) {
      if (!j.acking.contains(id)) {
        EXPECT_TRUE(have.contains(id)) << "round " << round << ": message " << id << " was sent (synced) and lost";
      }
    }
    for (uint64_t id : j.acked) {
      EXPECT_FALSE(have.contains(id)) << "round " << round << ": message " << id << " was acked (synced) and is back";
    }
    total_sent += j.sent.size();
  }
  std::printf("[ power cut ] %d rounds, %llu acknowledged sends, none lost\n", rounds,
              static_cast<unsigned long long>(total_sent));
}

// The control: the cut really drops what was not synced. With sync=never and no acks (which
// would start a compaction, and it syncs), nothing in the segments is synced, so every send
// is gone.
TEST(MappedPowerCut, TheCutDropsWhatWasNotSynced) {
  TempDir d;
  std::string root = d / "root", shadow = d / "shadow", journal = d / "journal";
  fs::create_directories(root);
  fs::create_directories(shadow);
  pid_t pid = start_recording_child(root, shadow, journal, SyncPolicy::kNever, false);
  std::this_thread::sleep_for(20ms);
  ::kill(pid, SIGKILL);
  ASSERT_EQ(test::wait_exit(pid), 128 + SIGKILL);
  Journal j = read_journal(journal);
  ASSERT_FALSE(j.sent.empty());
  // Before the cut the page cache holds every send that returned and was not acked.
  const size_t unacked = j.sent.size() - j.acking.size();
  {
    QueueOptions o;
    o.create = false;
    auto q = Queue::open(root + "/q", o);
    ASSERT_TRUE(q.ok());
    EXPECT_GE(held(**q).size(), unacked);
  }
  power_cut(root, shadow);
  QueueOptions o;
  o.create = false;
  auto q = Queue::open(root + "/q", o);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_LT(held(**q).size(), unacked)
      << "a power cut kept every unsynced send: the simulation drops nothing";
}

}  // namespace
}  // namespace spool
