#include "storage/log.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "logging.h"
#include "sys/clock.h"
#include "sys/mapping.h"
#include "sys/no_follow.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14 (uapi asm-generic/mman-common.h)
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace spool::storage {
namespace {

// Whether the file is at least a segment header long and that header is all zeros. Not a
// FIFO planted under a segment's name: O_NONBLOCK so that opening it does not wait for a
// writer (issue 48: every opener hung here, holding the gate), and then not a regular file.
bool zero_header(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return false;
  }
  uint8_t h[format::kSegmentHeaderSize] = {};
  const ssize_t n = ::pread(fd, h, sizeof h, 0);
  ::close(fd);
  return n == static_cast<ssize_t>(sizeof h) && std::all_of(h, h + n, [](uint8_t b) { return b == 0; });
}

// Bytes [from, to) of a segment that an append wrote, or tried to write. A plain pointer:
// the append holds every segment it writes into until it returns, and a reference count
// is an atomic operation per send.
struct Written {
  Segment* seg;
  uint64_t from;
  uint64_t to;
};

// Zeroes what a failed append wrote past the caller's end. The caller is told nothing was
// appended, yet complete records of the batch may be on disk, and recover() would return them
// after a restart that comes before another append overwrites them. Best effort: when the
// device keeps failing they stay, as they would after a crash in the middle of an append.
void unwrite(io::Io& io, const std::vector<Written>& written) {
  static const char zeros[4096] = {};  // no destructor: usable from exit handlers
  for (const Written& w : written) {
    if (uint8_t* m = w.seg->wdata()) {
      unstore_records(m + w.from, w.to - w.from);
      continue;
    }
    // Backwards too, one page per write: a write killed in its middle stops between pages
    // (the kernel checks for a fatal signal there), and forwards that left the batch's
    // first records zero before whole ones, as memset could.
    for (uint64_t end = w.to; end > w.from;) {
      const uint64_t from = std::max(w.from, (end - 1) & ~uint64_t{sizeof zeros - 1});
      iovec iov{const_cast<char*>(zeros), static_cast<size_t>(end - from)};
      if (io.write_all(w.seg->fd(), &iov, 1, from) < 0) break;
      end = from;
    }
  }
}

// Whether every block a store through a shared mapping can touch is allocated by fallocate,
// so that writeback never needs a new one (which fails with SIGBUS on a full disk). Copy-on-
// write filesystems allocate at writeback; network and FUSE filesystems may not honour it.
bool allocates_at_fallocate(const std::string& dir, std::string* fs) {
  struct statfs sf {};
  if (::statfs(dir.c_str(), &sf) != 0) {
    *fs = std::string("unknown (statfs: ") + std::strerror(errno) + ")";
    return false;
  }
  switch (static_cast<uint64_t>(sf.f_type)) {
    case EXT4_SUPER_MAGIC: *fs = "ext4"; return true;  // also ext2 and ext3
    case XFS_SUPER_MAGIC: *fs = "xfs"; return true;
    case TMPFS_MAGIC: *fs = "tmpfs"; return true;
    default:
      *fs = fmt::format("type {:#x}", static_cast<unsigned long long>(sf.f_type));
      return false;
  }
}

// The append buffer, one per thread and reused: a fresh buffer per call made the allocator
// grow and shrink the heap for every batch (page faults and TLB shootdowns). exit()
// destroys the main thread's thread_locals before it runs exit handlers and static
// destructors, where a Queue may still be closed (and append the releases of its bound
// leases): the flag, which has no destructor, tells append() to use a buffer of its own then.
thread_local bool scratch_gone = false;
struct Scratch {
  std::string buf;
  std::vector<Written> written;  // likewise: a vector per call was an allocation per send
  std::vector<Pos> at;           // AppendResult::at
  ~Scratch() { scratch_gone = true; }
};
thread_local Scratch scratch;

}  // namespace

Result<std::unique_ptr<Log>> Log::open(const std::string& dir, LogOptions opts) {
  if (!opts.io) opts.io = io::default_io();
  if (opts.segment_size < format::kMinSegmentSize || opts.segment_size >= (1ull << 40)) {
    return Status(Code::kInvalidArgument, "segment size must be between 4 KiB and 1 TiB");
  }
  // Every segment is mapped whole, and a 32-bit process has 3 GiB or so of address space:
  // at most half of what a size_t can count there (2 GiB), which leaves room for a few.
  if (opts.segment_size > std::numeric_limits<size_t>::max() / 2) {
    return Status(Code::kInvalidArgument, "segment size " + std::to_string(opts.segment_size) +
                                              " is more than a 32-bit process can map (less than 2 GiB)");
  }
  bool made = false;
  if (!opts.read_only) {
    made = ::mkdir(dir.c_str(), 0777) == 0;
    if (!made && errno != EEXIST) return errno_status(errno, "create " + dir);
  }
  // Never through a link: one planted as a queue's segments directory (by whoever may write
  // the queue) would have a purge or compaction by another user, root say, empty the
  // queue it points at (docs/security.md, "Planted links").
  struct stat st {};
  sys::Fd dir_fd = sys::open_dir(dir, false, &st);
  if (!dir_fd.ok()) return sys::queue_dir_error(errno, "open log directory", dir);
  if (made && opts.dir_mode != 0 && sys::set_dir_owner_mode(dir_fd.get(), static_cast<gid_t>(-1), opts.dir_mode) != 0) {
    return errno_status(errno, "set the mode of " + dir);
  }
  bool mapped = false;
  if (!opts.read_only && opts.io->maps_writes()) {
    std::string fs;
    mapped = allocates_at_fallocate(dir, &fs);
    if (mapped) {
      spool::log().debug("{}: records stored through the mapping ({})", dir, fs);
    } else {
      spool::log().info("{}: records written with pwrite: the filesystem ({}) may allocate at "
                        "writeback, where a mapped store could fail with SIGBUS", dir, fs);
    }
  }
  return std::unique_ptr<Log>(new Log(dir, std::move(opts), mapped));
}

void Log::prefault(int fd, uint64_t len, bool write) const {
  // fallocate leaves the blocks "unwritten": the first store into each page then faults
  // and the filesystem converts the extent under that fault (ext4: a journal handle per
  // page), and an fdatasync after it commits the conversion. Both would happen under the
  // index lock, for every page of every segment. Faulting the whole spare in for writing
  // dirties it with zeros, which the spare's own fdatasync (after this, still outside
  // any lock) writes, so the blocks are written ones: a later store is a plain page cache
  // write, and a sync of it flushes data only (PostgreSQL zero-fills new WAL files for the
  // same reason). A read populate (warm_next_spares(), or a kernel without the write
  // advice, before 5.14) at least leaves the pages in the page cache, zeroed off the lock.
  // Through a huge-page mapping, the faults make 2 MiB folios, which later mappings of the
  // segment can map whole.
  void* m = sys::map_shared(fd, len, PROT_READ | PROT_WRITE, 0, opts_.huge_pages);
  if (m == MAP_FAILED) return;
  if (!write || ::madvise(m, len, MADV_POPULATE_WRITE) != 0) (void)::madvise(m, len, MADV_POPULATE_READ);
  ::munmap(m, len);
}

void Log::warm_next_spares() {
  if (!mapped_ || opts_.read_only) return;
  std::vector<std::string> all = spares();
  all.resize(std::min<size_t>(all.size(), kWarmSpares));
  for (const std::string& spare : all) {
    {
      sys::MutexLock lock(mu_);
      if (std::find(warmed_.begin(), warmed_.end(), spare) != warmed_.end()) continue;
      warmed_.push_back(spare);
      if (warmed_.size() > 2 * kWarmSpares) warmed_.erase(warmed_.begin());
    }
    int fd = opts_.io->open(spare, O_RDWR | O_NOFOLLOW, 0);
    if (fd < 0) continue;  // taken by a roll, or removed
    // No more than a roll uses of it: a larger file put there is not read in whole.
    struct stat st {};
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
      prefault(fd, std::min<uint64_t>(static_cast<uint64_t>(st.st_size), opts_.segment_size), false);
    }
    ::close(fd);
  }
}

int Log::put(const Segment& seg, uint64_t off, const void* p, uint64_t len) {
  if (uint8_t* m = seg.wdata()) {
    store_records(m + off, static_cast<const uint8_t*>(p), len);
    return 0;
  }
  iovec iov{const_cast<void*>(p), static_cast<size_t>(len)};  // within a segment: fits (Log::open)
  return opts_.io->write_all(seg.fd(), &iov, 1, off);
}

std::string Log::segment_path(uint64_t seq) const { return fmt::format("{}/{:020}.seg", dir_, seq); }

uint64_t Log::max_payload() const {
  uint64_t capacity = (opts_.segment_size - format::kSegmentHeaderSize) & ~uint64_t{format::kRecordAlign - 1};
  uint64_t fits = capacity - format::kRecordHeaderSize;
  return opts_.max_payload != 0 ? std::min(opts_.max_payload, fits) : fits;
}

Result<std::vector<uint64_t>> Log::segments() const {
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) return errno_status(errno, "list " + dir_);
  std::vector<uint64_t> seqs;
  while (dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (name.size() != 24 || !name.ends_with(".seg") ||
        !std::all_of(name.begin(), name.begin() + 20, [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    // Twenty digits can exceed 2^64: parsed without exceptions, which would be thrown out of
    // every opener. A number the log cannot have written is not a segment of it.
    uint64_t seq = 0;
    auto [end, ec] = std::from_chars(name.data(), name.data() + 20, seq);
    if (ec != std::errc() || end != name.data() + 20 || seq == 0 || seq > kMaxSegmentSeq) {
      sys::MutexLock lock(mu_);
      if (warned_names_.emplace(name).second) {
        spool::log().warn("{}/{}: ignored: not a segment of this log (a segment number is 1 to {})", dir_,
                          name, kMaxSegmentSeq);
      }
      continue;
    }
    seqs.push_back(seq);
  }
  ::closedir(d);
  std::sort(seqs.begin(), seqs.end());
  return seqs;
}

void Log::remove_leftovers() {
  if (opts_.read_only) return;
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    // A segment whose creator crashed before the rename; it was never part of the log.
    // Segments are created under the index lock, spares without it: a spare's is left
    // while its process lives (it may be making it now).
    bool dead_spare = false;
    if (name.starts_with("spare.tmp.")) {
      const char* p = name.c_str() + std::strlen("spare.tmp.");
      const pid_t pid = static_cast<pid_t>(std::strtol(p, nullptr, 10));
      dead_spare = pid <= 0 || (::kill(pid, 0) != 0 && errno == ESRCH);
    }
    if (name.find(".seg.tmp.") != std::string::npos || dead_spare) {
      (void)opts_.io->unlink(dir_ + "/" + name);
    }
  }
  ::closedir(d);
}

Result<std::shared_ptr<Segment>> Log::segment(uint64_t seq) {
  {
    sys::MutexLock lock(mu_);
    if (auto it = cache_.find(seq); it != cache_.end()) return it->second;
  }
  auto seg = Segment::open(*opts_.io, segment_path(seq), !opts_.read_only, mapped_, opts_.huge_pages);
  if (!seg.ok()) return seg.status();
  if ((*seg)->info().seq != seq) {
    return Status(Code::kCorrupt, segment_path(seq) + ": header names segment " +
                                      std::to_string((*seg)->info().seq));
  }
  (*seg)->set_max_payload(max_payload());
  sys::MutexLock lock(mu_);
  return cache_.emplace(seq, *seg).first->second;
}

void Log::forget_below(uint64_t seq) {
  sys::MutexLock lock(mu_);
  cache_.erase(cache_.begin(), cache_.lower_bound(seq));
  cache_gen_.fetch_add(1, std::memory_order_release);
}

uint64_t Log::first_size() const { return std::min(kFirstSegmentSize, opts_.segment_size); }

uint64_t Log::next_size(uint64_t prev) const {
  return std::max(first_size(), prev > opts_.segment_size / 2 ? opts_.segment_size : 2 * prev);
}

Result<std::shared_ptr<Segment>> Log::roll(uint64_t seq, uint64_t prev, uint64_t need, uint64_t base_id,
                                           AppendResult* res) {
  if (opts_.read_only) return Status(Code::kReadOnly, dir_ + ": log opened read-only");
  if (seq > kMaxSegmentSeq) {
    // A Pos keeps 24 bits of segment number: one more segment would wrap the log end to
    // segment 0 and the next roll would replace a live segment.
    return Status(Code::kNoSpace, dir_ + ": the log has used every segment number (1 to " +
                                      std::to_string(kMaxSegmentSeq) +
                                      "); nothing more can be appended. Drain the queue into a new one "
                                      "(a larger segment_size makes the limit further away)");
  }
  // A segment of this number that holds records is live: the end we were given is behind
  // the log (a damaged index), and the rename below would replace it. One with none was
  // created by an append that failed, and is replaced.
  if (auto live = Segment::open(*opts_.io, segment_path(seq), false); live.ok() &&
                                                                       (*live)->record_at(format::kSegmentHeaderSize)) {
    return Status(Code::kCorrupt, segment_path(seq) + " holds records already: the log end given is behind the log");
  }
  auto create = [&](uint64_t size, const std::string* spare) {
    return Segment::create(*opts_.io, segment_path(seq), seq, base_id, size, spare, mapped_, opts_.file_mode,
                           opts_.huge_pages);
  };
  Result<std::shared_ptr<Segment>> seg = Status(Code::kNoSpace, "no spare");
  for (const std::string& spare : spares()) {
    struct stat st {};
    const bool sized = ::lstat(spare.c_str(), &st) == 0;
    if (sized && S_ISREG(st.st_mode)) {
      // The spare's reservation is counted by its size (the caller's spare_bytes): the new
      // segment takes that size, not next_size(), so the room counted is the room there is.
      // One too small for the record stays a spare, for a later roll.
      const uint64_t size = std::min<uint64_t>(static_cast<uint64_t>(st.st_size), opts_.segment_size);
      if (size < need) continue;
      seg = create(size, &spare);
      if (seg.ok()) {
        ++res->spares_used;
        res->spare_bytes_used += static_cast<uint64_t>(st.st_size);
        break;
      }
    } else {
      seg = Status(Code::kCorrupt, spare + (sized ? ": not a regular file" : ": cannot stat it"));
    }
    // A spare that cannot serve (not a file, unreadable) is dropped; the count kept by the
    // caller is re-read at the next repair.
    spool::log().warn("{}: spare segment not used: {}", dir_, seg.status().message());
    if (opts_.io->unlink(spare) == 0) {
      ++res->spares_used;
      res->spare_bytes_used += sized ? static_cast<uint64_t>(st.st_size) : 0;
    }
  }
  if (!seg.ok()) {
    // A page multiple, unless the largest size is not one.
    seg = create(std::min(opts_.segment_size, std::max(next_size(prev), (need + 4095) & ~uint64_t{4095})),
                 nullptr);
  }
  if (!seg.ok()) return seg.status();
  (*seg)->set_max_payload(max_payload());
  sys::MutexLock lock(mu_);
  cache_[seq] = *seg;  // replaces a stale, never-published segment of the same number
  cache_gen_.fetch_add(1, std::memory_order_release);
  return *seg;
}

std::vector<std::string> Log::spares() const {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir_.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name.starts_with("spare-")) out.push_back(dir_ + "/" + name);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<uint64_t> Log::count_spares(uint64_t* bytes) const {
  if (::access(dir_.c_str(), R_OK) != 0) return errno_status(errno, "list " + dir_);
  std::vector<std::string> all = spares();
  if (bytes != nullptr) {
    *bytes = 0;
    for (const std::string& spare : all) {
      struct stat st {};
      if (::lstat(spare.c_str(), &st) == 0 && S_ISREG(st.st_mode)) *bytes += static_cast<uint64_t>(st.st_size);
    }
  }
  return all.size();
}

Status Log::make_spare(uint64_t size, bool zero_fill) {
  size = size == 0 ? opts_.segment_size : std::clamp(size, format::kMinSegmentSize, opts_.segment_size);
  if (opts_.read_only) return Status(Code::kReadOnly, dir_ + ": log opened read-only");
  // Allocated under a temporary name and renamed, so a spare is never short; the name only
  // has to be unique among spares. Spares are made without the index lock, by any thread:
  // the temporary name carries the pid (remove_leftovers() spares a live process's) and a
  // count of this process's.
  static std::atomic<uint64_t> made{0};
  std::string tmp = dir_ + "/spare.tmp." + std::to_string(::getpid()) + "." + std::to_string(made++);
  (void)opts_.io->unlink(tmp);
  int fd = opts_.io->open(tmp, O_CREAT | O_EXCL | O_NOFOLLOW | O_RDWR, 0666);
  if (fd < 0) return errno_status(-fd, "create spare segment " + tmp);
  if (opts_.file_mode != 0) (void)::fchmod(fd, opts_.file_mode);
  // Synced, file and directory, before it counts as reserved: an unsynced spare comes back
  // from a power cut as an empty file, which the next roll drops, and with it the room kept
  // for draining a full disk.
  int r = opts_.io->allocate(fd, 0, size);
  if (r == 0 && mapped_ && zero_fill) prefault(fd, size, true);
  if (r == 0) r = opts_.io->datasync(fd);
  ::close(fd);
  const std::string name = fmt::format("{}/spare-{:020}-{}", dir_, sys::real_ns(), ::getpid());
  if (r == 0) r = opts_.io->rename(tmp, name);
  if (r == 0) r = opts_.io->sync_dir(dir_);
  if (r < 0) {
    (void)opts_.io->unlink(tmp);
    return errno_status(-r, "preallocate a spare segment in " + dir_);
  }
  return {};
}

Result<Recovery> Log::recover(const std::function<void(Pos, const RecordView&)>& visit) {
  auto seqs = segments();
  if (!seqs.ok()) return seqs.status();
  // The last segments, when their headers are all zeros: rolls whose names reached the disk
  // and whose headers did not (a power cut before the first sync that covers them,
  // Segment::create). Nothing in them or after them was ever durable (a sync covers every
  // segment from the durable end on, in order), so the log ends before the first of them.
  // Renamed aside, not removed: a header zeroed by anything else leaves records behind it
  // that this cannot read without the header's salt, and nothing is deleted unseen. (One
  // inside the log, before a segment with a header, is damage: skipped and reported below.)
  while (!seqs->empty() && zero_header(segment_path(seqs->back()))) {
    const std::string path = segment_path(seqs->back());
    const std::string aside = path + ".no-header";
    spool::log().warn("{}: its header is all zeros (a roll a power cut cut short, or damage); moved "
                      "aside to {}, the log ends before it", path, aside);
    if (!opts_.read_only) (void)opts_.io->rename(path, aside);
    {
      sys::MutexLock lock(mu_);
      cache_.erase(seqs->back());
      cache_gen_.fetch_add(1, std::memory_order_release);
    }
    seqs->pop_back();
  }
  Recovery rec;
  for (size_t i = 0; i < seqs->size(); ++i) {
    const uint64_t seq = (*seqs)[i];
    const bool sealed = i + 1 < seqs->size();
    auto seg = segment(seq);
    if (!seg.ok()) {
      // A sealed segment whose header is damaged costs its own records, not the queue.
      // (The active one is where appends go: that stays an error.)
      if (!sealed || (seg.status().code() != Code::kCorrupt && seg.status().code() != Code::kNotAQueue)) {
        return seg.status();
      }
      spool::log().error("{}: skipped: {}", segment_path(seq), seg.status().message());
      struct stat st {};
      const uint64_t len = ::stat(segment_path(seq).c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
      rec.corrupt.push_back(Corruption{seq, 0, len});
      continue;
    }
    ScanResult r = scan(**seg, format::kSegmentHeaderSize,
                        [&](const RecordView& v) { visit(Pos{seq, v.offset}, v); }, sealed);
    for (const auto& c : r.corrupt) {
      spool::log().warn("{}: skipped {} corrupt bytes at offset {}", segment_path(seq), c.length,
                   c.offset);
    }
    rec.records += r.records;
    rec.corrupt.insert(rec.corrupt.end(), r.corrupt.begin(), r.corrupt.end());
    rec.end = Pos{seq, r.end};
  }
  return rec;
}

Result<AppendResult> Log::append(Pos end, std::span<const Record> recs, uint64_t base_id,
                                 std::span<const Record> opener, Segment* at_end) {
  uint64_t opener_size = 0;
  for (const Record& o : opener) opener_size += format::record_size(o.ext.size() + o.payload.size());
  if (opener_size + format::kSegmentHeaderSize >= opts_.segment_size) {
    return Status(Code::kTooLarge, "the records that open a segment (" + std::to_string(opener_size) +
                                       " bytes) do not fit a segment of " + std::to_string(opts_.segment_size) + " bytes");
  }
  const uint64_t capacity = opts_.segment_size - format::kSegmentHeaderSize - opener_size;
  for (const auto& r : recs) {
    const uint64_t len = r.ext.size() + r.payload.size();
    if (format::record_size(len) > capacity || len > max_payload()) {
      return Status(Code::kTooLarge, "record of " + std::to_string(len) +
                                         " bytes does not fit a segment of " +
                                         std::to_string(opts_.segment_size) + " bytes");
    }
  }
  AppendResult res;
  Segment* seg = nullptr;  // the segment appended into
  // Hold what this call looked up or rolled into (the caller holds `at_end`).
  std::vector<std::shared_ptr<Segment>> held;
  if (end.seq == 0) {
    const uint64_t first = recs.empty() ? 0 : format::record_size(recs.front().ext.size() + recs.front().payload.size());
    auto s = roll(1, 0, format::kSegmentHeaderSize + opener_size + first, recs.empty() ? base_id : recs.front().id,
                  &res);
    if (!s.ok()) return s.status();
    seg = held.emplace_back(std::move(*s)).get();
    end = {1, format::kSegmentHeaderSize};
  } else if (at_end != nullptr && at_end->info().seq == end.seq) {
    seg = at_end;
  } else {
    auto s = segment(end.seq);
    if (!s.ok()) return s.status();
    seg = held.emplace_back(std::move(*s)).get();
  }
  std::vector<Pos>& at = scratch_gone ? res.own : scratch.at;
  if (at.capacity() > (1u << 20)) std::vector<Pos>().swap(at);  // as buf
  at.clear();
  at.reserve(recs.size());
  std::string exiting;
  std::string& buf = scratch_gone ? exiting : scratch.buf;
  if (buf.capacity() > (16u << 20)) std::string().swap(buf);  // do not pin a huge batch's memory
  buf.clear();
  auto open = [&] {
    for (const Record& o : opener) seg->encode(o, buf);
  };
  // Whether `r` may not go into a segment of `version`: an extended record never goes into
  // a segment of a version before extensions, whose readers would take the extension for
  // payload; likewise a GROUP entry (an order older readers would not keep); and a record
  // of a subscription (a view, SUB, or a MSG for one view). Such a segment is sealed first.
  auto too_new_for = [](const Record& r, uint32_t version) {
    return (!r.ext.empty() && (version < format::kFirstExtVersion ||
                               (version < format::kFirstGroupVersion && storage::ext_entry(r.ext, format::ExtType::kGroup)))) ||
           (version < format::kFirstViewVersion &&
            (r.view != 0 || r.type == format::RecordType::kSub ||
             (r.type == format::RecordType::kMsg && (r.flags & format::kFlagOneView) != 0) ||
             (r.flags & format::kFlagList) != 0));
  };
  std::vector<Written> written_exiting;
  std::vector<Written>& written = scratch_gone ? written_exiting : scratch.written;
  written.clear();
  auto fail = [&](Status s) {
    unwrite(*opts_.io, written);
    return s;
  };
  if (end.off == format::kSegmentHeaderSize && !recs.empty()) {
    // An empty segment an older spool made at the end: the opener's restated subscriptions
    // would be records its readers refuse (and take the rest of the segment for damage).
    const uint32_t version = seg->info().version;
    if (std::any_of(opener.begin(), opener.end(), [&](const Record& o) { return too_new_for(o, version); })) {
      const uint64_t first = format::record_size(recs.front().ext.size() + recs.front().payload.size());
      auto next = roll(end.seq + 1, seg->info().size, format::kSegmentHeaderSize + opener_size + first, recs.front().id, &res);
      if (!next.ok()) return next.status();
      seg = held.emplace_back(std::move(*next)).get();
      end = {end.seq + 1, format::kSegmentHeaderSize};
    }
    open();
  }
  auto flush = [&]() -> Status {
    if (buf.empty()) return {};
    written.push_back({seg, end.off, end.off + buf.size()});
    if (int r = put(*seg, end.off, buf.data(), buf.size()); r < 0) {
      return errno_status(-r, "append to " + seg->path());
    }
    end.off += buf.size();
    buf.clear();
    return {};
  };
  for (const auto& r : recs) {
    uint64_t sz = format::record_size(r.ext.size() + r.payload.size());
    if (end.off + buf.size() + sz > seg->info().size || too_new_for(r, seg->info().version)) {
      if (Status s = flush(); !s.ok()) return fail(s);
      auto next = roll(end.seq + 1, seg->info().size, format::kSegmentHeaderSize + opener_size + sz, r.id, &res);
      if (!next.ok()) return fail(next.status());
      seg = held.emplace_back(std::move(*next)).get();
      end = {end.seq + 1, format::kSegmentHeaderSize};
      open();
    }
    at.push_back({end.seq, end.off + buf.size()});
    seg->encode(r, buf);
  }
  if (Status s = flush(); !s.ok()) return fail(s);
  res.end = end;
  res.at = at;
  return res;
}

Status Log::check_end(Pos end, std::shared_ptr<Segment>& seg) {
  if (end.seq == 0) {
    seg.reset();
    if (end.off == 0) return {};
    return Status(Code::kCorrupt, dir_ + ": the log end names no segment but offset " + std::to_string(end.off));
  }
  if (seg == nullptr || seg->info().seq != end.seq) {
    auto found = segment(end.seq);
    if (!found.ok()) {
      seg.reset();
      return Status(Code::kCorrupt, "the log end names segment " + std::to_string(end.seq) + ": " + found.status().message());
    }
    seg = std::move(*found);
  }
  if (end.off < format::kSegmentHeaderSize || end.off > seg->info().size) {
    return Status(Code::kCorrupt, seg->path() + ": the log end, offset " + std::to_string(end.off) +
                                      ", is outside the segment's records");
  }
  // Records start 8-aligned: appends at a misaligned end would be lost at the next scan,
  // and on armhf the first word's 64-bit store faults (SIGBUS, BUS_ADRALN).
  if (end.off % format::kRecordAlign != 0) {
    return Status(Code::kCorrupt, seg->path() + ": the log end, offset " + std::to_string(end.off) +
                                      ", is not a record boundary (records are " +
                                      std::to_string(format::kRecordAlign) + "-aligned)");
  }
  if (seg->record_at(end.off)) {
    return Status(Code::kCorrupt, seg->path() + ": a record lies at the log end (offset " + std::to_string(end.off) +
                                      "): the end is behind the log");
  }
  return {};
}

Status Log::clear_tail(Pos end) {
  if (end.seq == 0) return {};
  auto seg = segment(end.seq);
  if (!seg.ok()) return seg.status();
  // A store killed in the middle leaves at most one record's remnant after the end, its
  // first word still zero (store_records), and so does an unwrite (unstore_records): it
  // lies within one largest record of the end. Only that far is looked at: the whole tail
  // of a fresh segment is tens of MiB of zero-fill, read under the index lock.
  const uint64_t upto = end.off + format::record_size(max_payload());
  if (auto c = stored_after(**seg, end.off, upto)) {
    spool::log().info("{}: zeroing {} bytes after the end of the log (a torn write)", (*seg)->path(),
                      c->length);
    unwrite(*opts_.io, {Written{seg->get(), c->offset, c->offset + c->length}});
  }
  return {};
}

Status Log::sync_through(Pos from, Pos to) {
  // No listing of the directory here: the flusher thread calls this, and a program that
  // forks while a thread allocates can deadlock its child (ASan's allocator, met by the
  // tests). A queue starts `from` after the segments compaction removed.
  uint64_t seq = std::max<uint64_t>(from.seq, 1);
  const bool crossed = to.seq > from.seq;
  for (; seq <= to.seq; ++seq) {
    if (Status s = sync(seq); !s.ok()) {
      if (::access(segment_path(seq).c_str(), F_OK) == 0 || errno != ENOENT) return s;
      // Compaction removed it since the caller read where it stopped (the target's segment
      // too: the log may have rolled past it meanwhile, and compaction synced the copies of
      // what it held), or the log has a gap (recovery accepts one; the numbers may be far
      // apart). Rare: only then is the directory listed, to jump to the next segment present.
      if (seq == to.seq) break;
      auto seqs = segments();
      if (!seqs.ok()) return seqs.status();
      auto next = std::upper_bound(seqs->begin(), seqs->end(), seq);
      seq = (next == seqs->end() || *next > to.seq ? to.seq : *next) - 1;
    }
  }
  if (crossed) {
    if (int r = opts_.io->sync_dir(dir_); r < 0) return errno_status(-r, "sync directory " + dir_);
  }
  return {};
}

Status Log::sync(uint64_t seq) {
  {
    sys::MutexLock lock(mu_);
    if (auto it = failed_syncs_.find(seq); it != failed_syncs_.end()) return it->second;
  }
  auto seg = segment(seq);
  if (!seg.ok()) return seg.status();
  if ((*seg)->cut()) {
    return Status(Code::kCorrupt, (*seg)->path() + " was truncated by another process while this one mapped it; "
                                  "what was stored in its cut part is lost");
  }
  if (int r = opts_.io->datasync((*seg)->fd()); r < 0) {
    // Never retry into a false success: the kernel may have dropped the dirty pages.
    Status s = errno_status(-r, "fdatasync " + (*seg)->path() + " (segment is now failed)");
    sys::MutexLock lock(mu_);
    failed_syncs_.emplace(seq, s);
    return s;
  }
  return {};
}

Result<RecordView> Log::read(Pos p, std::shared_ptr<Segment>* keep) {
  auto seg = segment(p.seq);
  if (!seg.ok()) return seg.status();
  auto rec = (*seg)->record_at(p.off);
  if (!rec) {
    return Status(Code::kCorrupt, segment_path(p.seq) + ": no valid record at offset " +
                                      std::to_string(p.off) + " (checksum mismatch)");
  }
  *keep = *seg;
  return *rec;
}

}  // namespace spool::storage
