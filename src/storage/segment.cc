#include "storage/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <ctime>

#include "sys/clock.h"
#include "sys/mapping.h"
#include "sys/sigbus_guard.h"

namespace spool::storage {
namespace {

using format::kRecordHeaderSize;
using format::kSegmentHeaderSize;

// Fixed little-endian encoding; the supported platforms are little-endian, so these are
// plain copies, and the static_assert keeps a big-endian port from silently misreading.
static_assert(std::endian::native == std::endian::little, "spool's format is little-endian");
template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
void store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

uint64_t random_salt() {
  uint64_t s = 0;
  while (s == 0) {
    if (::getrandom(&s, sizeof s, 0) != sizeof s) s = static_cast<uint64_t>(::time(nullptr)) ^ 0x9e3779b97f4a7c15ull;
  }
  return s;
}

uint64_t record_checksum(const uint8_t* header, std::string_view payload, uint64_t salt) {
  // A small record is hashed in one call over a copy of it: the same value (XXH3's streaming
  // form equals its one-shot form over the concatenation), and up to 240 bytes the one-shot
  // form derives no secret from the seed, which the streaming reset does at every call.
  constexpr size_t kOneShot = 240 - format::kChecksumOffset;
  if (payload.size() <= kOneShot) {
    uint8_t buf[format::kChecksumOffset + kOneShot];
    std::memcpy(buf, header, format::kChecksumOffset);
    if (!payload.empty()) std::memcpy(buf + format::kChecksumOffset, payload.data(), payload.size());
    return XXH3_64bits_withSeed(buf, format::kChecksumOffset + payload.size(), salt);
  }
  XXH3_state_t st;
  // Without this, reset_withSeed reads the uninitialised seed field, and when stale stack
  // bytes happen to equal `salt` it keeps the stale secret: long records then fail to verify.
  XXH3_INITSTATE(&st);
  XXH3_64bits_reset_withSeed(&st, salt);
  XXH3_64bits_update(&st, header, format::kChecksumOffset);
  XXH3_64bits_update(&st, payload.data(), payload.size());
  return XXH3_64bits_digest(&st);
}

// Every segment and spare is opened with O_NOFOLLOW (and created with O_EXCL): a link
// planted in segments/ must never have spool write a header or records into its target.
// A read-only open adds O_NONBLOCK: a FIFO planted under a segment's name must not hang it
// (open() then refuses it as not a regular file). (O_RDWR never blocks on a FIFO; and the
// flag is kept off writable descriptors, where io_uring would return EAGAIN for it.)
Status open_error(int err, const std::string& what, const std::string& path) {
  if (err == ELOOP) {
    return Status(Code::kCorrupt, path + " is a symbolic link; spool does not follow links in a queue's "
                                         "segments directory (remove it)");
  }
  return errno_status(err, what + " " + path);
}

}  // namespace

Result<SegmentInfo> parse_header(const uint8_t* d, uint64_t len, const std::string& name) {
  if (len < kSegmentHeaderSize) {
    return Status(Code::kNotAQueue, name + ": truncated segment header (" + std::to_string(len) +
                                        " of 64 bytes)");
  }
  if (std::memcmp(d, format::kSegmentMagic, 8) != 0) {
    return Status(Code::kNotAQueue, name + ": not a spool segment (bad magic)");
  }
  SegmentInfo info;
  info.version = load<uint32_t>(d + 8);
  if (info.version > format::kVersion) {
    return Status(Code::kIncompatible, name + ": segment format version " +
                                           std::to_string(info.version) + " is newer than this spool (" +
                                           std::to_string(format::kVersion) + "); upgrade spool");
  }
  if (XXH3_64bits(d, 56) != load<uint64_t>(d + 56) || info.version == 0 ||
      load<uint32_t>(d + 12) != kSegmentHeaderSize) {
    return Status(Code::kCorrupt, name + ": segment header is corrupt (checksum mismatch)");
  }
  info.salt = load<uint64_t>(d + 16);
  info.seq = load<uint64_t>(d + 24);
  info.base_id = load<uint64_t>(d + 32);
  info.created_ns = load<uint64_t>(d + 40);
  info.size = load<uint64_t>(d + 48);
  info.preallocated = info.size;
  if (info.size < kSegmentHeaderSize) {
    return Status(Code::kCorrupt, name + ": segment header gives an impossible size");
  }
  return info;
}

Segment::~Segment() {
  sys::unguard_mapping(base_);
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), info_.size);
  if (fd_ >= 0) ::close(fd_);
}

Result<std::shared_ptr<Segment>> Segment::create(io::Io& io, const std::string& path, uint64_t seq,
                                                 uint64_t base_id, uint64_t size, const std::string* spare,
                                                 bool map_writes, mode_t mode, bool huge) {
  std::string tmp = spare != nullptr ? *spare : path + ".tmp." + std::to_string(::getpid());
  int fd = -1;
  auto fail = [&](int err, const char* what) {
    ::close(fd);
    if (spare == nullptr) (void)io.unlink(tmp);
    return errno_status(-err, std::string(what) + " " + path);
  };
  if (spare == nullptr) {
    (void)io.unlink(tmp);  // a leftover of a crashed creator with our pid
    fd = io.open(tmp, O_CREAT | O_EXCL | O_NOFOLLOW | O_RDWR, 0666);
    if (fd < 0) return open_error(-fd, "create segment", tmp);
    if (mode != 0) (void)::fchmod(fd, mode);
    if (int r = io.allocate(fd, 0, size); r < 0) return fail(r, "preallocate segment");
  } else {
    fd = io.open(tmp, O_RDWR | O_NOFOLLOW, 0);
    if (fd < 0) return open_error(-fd, "open spare segment", tmp);
    struct stat st {};
    if (::fstat(fd, &st) != 0) return fail(-errno, "stat spare for");
    if (!S_ISREG(st.st_mode)) return fail(-EINVAL, "spare segment is not a regular file, for");
    if (static_cast<uint64_t>(st.st_size) < size) return fail(-EINVAL, "spare segment too small for");
    // A spare holding a segment header was rolled into a segment whose new name a power cut
    // lost (the rename is made durable by the first sync of the segment, which never came):
    // records of that segment may follow the header, and a new header over them would make
    // them damage in the new segment.
    char magic[8] = {};
    if (::pread(fd, magic, sizeof magic, 0) == static_cast<ssize_t>(sizeof magic) &&
        std::memcmp(magic, format::kSegmentMagic, sizeof magic) == 0) {
      return fail(-EINVAL, "spare segment holds a segment header (a roll a power cut undid), not used for");
    }
  }
  uint8_t h[kSegmentHeaderSize] = {};
  std::memcpy(h, format::kSegmentMagic, 8);
  store<uint32_t>(h + 8, format::kVersion);
  store<uint32_t>(h + 12, kSegmentHeaderSize);
  store<uint64_t>(h + 16, random_salt());
  store<uint64_t>(h + 24, seq);
  store<uint64_t>(h + 32, base_id);
  store<uint64_t>(h + 40, sys::real_ns());
  store<uint64_t>(h + 48, size);
  store<uint64_t>(h + 56, XXH3_64bits(h, 56));
  iovec iov{h, sizeof h};
  if (int r = io.write_all(fd, &iov, 1, 0); r < 0) return fail(r, "write segment header");
  // No sync here: segments are created under the index lock, where nothing may wait for the
  // disk. The header and the name become durable with the first sync that covers the
  // segment (Log::sync_through), before anything in it is called durable; a power cut
  // before that can leave the name without the header, which recover() drops.
  if (int r = io.rename(tmp, path); r < 0) return fail(r, "rename segment into place");
  ::close(fd);
  return open(io, path, true, map_writes, huge);
}

Result<std::shared_ptr<Segment>> Segment::open(io::Io& io, const std::string& path, bool writable,
                                               bool map_writes, bool huge) {
  int fd = io.open(path, (writable ? O_RDWR : O_RDONLY | O_NONBLOCK) | O_NOFOLLOW, 0);
  if (fd < 0) return open_error(-fd, "open segment", path);
  std::shared_ptr<Segment> seg(new Segment());
  seg->fd_ = fd;
  seg->path_ = path;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno_status(errno, "stat " + path);
  if (!S_ISREG(st.st_mode)) {
    return Status(Code::kCorrupt, path + " is not a regular file; spool keeps only regular files in a queue's "
                                         "segments directory (remove it)");
  }
  uint8_t h[kSegmentHeaderSize];
  ssize_t n = ::pread(fd, h, sizeof h, 0);
  if (n < 0) return errno_status(errno, "read " + path);
  auto info = parse_header(h, static_cast<uint64_t>(n), path);
  if (!info.ok()) return info.status();
  seg->info_ = *info;
  // Never map past EOF: a truncated file would SIGBUS on access to the missing pages.
  seg->info_.size = std::min<uint64_t>(seg->info_.size, static_cast<uint64_t>(st.st_size));
  // mmap takes a size_t: in a 32-bit process a longer segment would be mapped short.
  if (seg->info_.size > std::numeric_limits<size_t>::max()) {
    return Status(Code::kInvalidArgument, path + ": a segment of " + std::to_string(seg->info_.size) +
                                              " bytes is more than this process can map");
  }
  // A store into a hole of the file would SIGBUS on a full disk (the kernel cannot allocate at the fault): the blocks
  // must be allocated. Segments are created preallocated; allocating again is cheap and covers
  // one that was copied sparse. Where that fails, the mapping stays read-only and the log
  // writes this segment with pwrite, which reports ENOSPC.
  seg->map_writable_ = writable && map_writes && io.allocate(fd, 0, seg->info_.size) == 0;
  const int prot = seg->map_writable_ ? PROT_READ | PROT_WRITE : PROT_READ;
  void* p = sys::map_shared(fd, seg->info_.size, prot, 0, huge);
  if (p == MAP_FAILED) return errno_status(errno, "mmap " + path);
  seg->base_ = static_cast<const uint8_t*>(p);
  sys::guard_mapping(p, seg->info_.size, prot, &seg->cut_);
  return seg;
}

namespace {
// The valid record at `h`, with `avail` bytes from there to the end of the segment. A
// length above `max_len` (the log's largest payload) is no record: no checksum is computed
// over it. With `budget`, the bytes the checksum would cover are taken from it first; when
// it has too few, *out_of_budget is set and nothing is checked.
// `version` is the segment's: kFlagExt means nothing in segments older than the extension.
std::optional<RecordView> parse_record(const uint8_t* h, uint64_t avail, uint64_t salt, uint64_t off,
                                       uint64_t max_len, uint32_t version, uint64_t* budget = nullptr,
                                       bool* out_of_budget = nullptr) {
  if (avail < kRecordHeaderSize || load<uint32_t>(h) != format::kRecordMagic) return std::nullopt;
  const uint8_t type = h[8];
  const uint16_t view = load<uint16_t>(h + 10);
  if (type == 0 || type > format::kMaxRecordType) return std::nullopt;
  // Before version 4 the view field was reserved (0) and there were no SUB records; since,
  // only a view's records carry one, and none past the last subscription number.
  // A MSG for one view (kFlagOneView) is of version 4 too.
  const bool one_view = type == static_cast<uint8_t>(format::RecordType::kMsg) && (h[9] & format::kFlagOneView) != 0;
  // So is a LIST (a LEASE or an ACK only).
  const bool list = (h[9] & format::kFlagList) != 0;
  if (list && type != static_cast<uint8_t>(format::RecordType::kLease) &&
      type != static_cast<uint8_t>(format::RecordType::kAck)) {
    return std::nullopt;
  }
  if (version < format::kFirstViewVersion) {
    if (view != 0 || type == static_cast<uint8_t>(format::RecordType::kSub) || one_view || list) return std::nullopt;
  } else if (view > format::kMaxSubscriptions ||
             (view != 0 && !format::has_view(static_cast<format::RecordType>(type), h[9]))) {
    return std::nullopt;
  }
  uint64_t len = load<uint32_t>(h + 4);
  if (len > avail - kRecordHeaderSize || len > max_len) return std::nullopt;
  if (budget != nullptr) {
    if (*budget < kRecordHeaderSize + len) {
      *out_of_budget = true;
      return std::nullopt;
    }
    *budget -= kRecordHeaderSize + len;
  }
  std::string_view payload(reinterpret_cast<const char*>(h + kRecordHeaderSize), len);
  if (record_checksum(h, payload, salt) != load<uint64_t>(h + format::kChecksumOffset)) return std::nullopt;
  // A list that breaks its rules (only a forged record's can) is no record either: what
  // reads a LIST record's runs may trust them.
  if (list && !list_sound(payload, load<uint64_t>(h + 16))) return std::nullopt;
  RecordView v{static_cast<format::RecordType>(type),
               h[9],
               load<uint32_t>(h + 12),
               load<uint64_t>(h + 16),
               load<uint64_t>(h + 24),
               load<uint64_t>(h + 32),
               payload,
               off,
               std::min<uint64_t>(format::record_size(len), avail),
               {},
               view};
  if (v.type == format::RecordType::kMsg && (v.flags & format::kFlagExt) != 0 && version >= format::kFirstExtVersion) {
    // A length field past the record keeps the whole record as the extension, for
    // decode_ext() to refuse: the record is valid (its checksum holds), its message is not.
    uint64_t ext_len = len >= 4 ? load<uint32_t>(h + kRecordHeaderSize) : len;
    if (ext_len > len) ext_len = len;
    v.ext = payload.substr(0, ext_len);
    v.payload = payload.substr(ext_len);
  }
  return v;
}
}  // namespace

std::optional<RecordView> Segment::record_at(uint64_t off) const {
  const uint64_t size = info_.size;
  if (off < kSegmentHeaderSize || off % format::kRecordAlign != 0 || off > size) return std::nullopt;
  return parse_record(base_ + off, size - off, info_.salt, off, max_payload_, info_.version);
}

uint64_t Segment::resync(uint64_t off, uint64_t* budget, bool* out_of_budget) const {
  // Past the end there is nothing to find, and aligning or adding to an offset near 2^64
  // would wrap around to the start of the mapping.
  if (off >= info_.size) return info_.size;
  off = std::max<uint64_t>(format::align_up(off), kSegmentHeaderSize);
  bool spent = false;
  for (; off + kRecordHeaderSize <= info_.size; off += format::kRecordAlign) {
    // Cheap magic test first; the full check only where the magic matches.
    if (load<uint32_t>(base_ + off) != format::kRecordMagic) continue;
    if (parse_record(base_ + off, info_.size - off, info_.salt, off, max_payload_, info_.version, budget, &spent)) {
      return off;
    }
    if (spent) {
      if (out_of_budget != nullptr) *out_of_budget = true;
      return info_.size;
    }
  }
  return info_.size;
}

void Segment::encode(const Record& r, std::string& out) const {
  size_t at = out.size();
  const uint64_t len = r.ext.size() + r.payload.size();
  out.resize(at + format::record_size(len), '\0');
  auto* h = reinterpret_cast<uint8_t*>(out.data() + at);
  store<uint32_t>(h, format::kRecordMagic);
  store<uint32_t>(h + 4, static_cast<uint32_t>(len));
  h[8] = static_cast<uint8_t>(r.type);
  // The extension bit follows the extension itself, so a payload-only record is exactly
  // what version 1 wrote.
  h[9] = static_cast<uint8_t>(r.ext.empty() ? r.flags & ~format::kFlagExt : r.flags | format::kFlagExt);
  store<uint16_t>(h + 10, r.view);
  store<uint32_t>(h + 12, r.count);
  store<uint64_t>(h + 16, r.id);
  store<uint64_t>(h + 24, r.t1);
  store<uint64_t>(h + 32, r.t2);
  // Control records have an empty payload whose data() may be null, and memcpy from null is
  // undefined even for zero bytes.
  if (!r.ext.empty()) std::memcpy(h + kRecordHeaderSize, r.ext.data(), r.ext.size());
  if (!r.payload.empty()) std::memcpy(h + kRecordHeaderSize + r.ext.size(), r.payload.data(), r.payload.size());
  std::string_view body(reinterpret_cast<const char*>(h + kRecordHeaderSize), len);
  store<uint64_t>(h + format::kChecksumOffset, record_checksum(h, body, info_.salt));
}

std::string encode_ext(const MessageExt& e) {
  if (e.attributes.empty() && e.dedup_id.empty() && e.priority == format::kDefaultPriority && e.group.empty()) return {};
  std::string out(format::kExtHeaderSize, '\0');
  out[4] = static_cast<char>(format::kExtVersion);
  auto entry = [&](format::ExtType type, std::string_view a, std::string_view b) {
    const uint64_t n = a.size() + b.size();
    const char head[format::kExtEntryHeaderSize] = {static_cast<char>(type), 0, static_cast<char>(n & 0xff),
                                                    static_cast<char>(n >> 8)};
    out.append(head, sizeof head);
    out.append(a);
    out.append(b);
  };
  for (const auto& [k, v] : e.attributes) {
    const char klen = static_cast<char>(k.size());
    entry(format::ExtType::kAttribute, std::string(1, klen) + k, v);
  }
  if (!e.dedup_id.empty()) entry(format::ExtType::kDedupId, e.dedup_id, {});
  if (e.priority != format::kDefaultPriority) entry(format::ExtType::kPriority, std::string(1, static_cast<char>(e.priority)), {});
  if (!e.group.empty()) entry(format::ExtType::kGroup, e.group, {});
  store<uint32_t>(reinterpret_cast<uint8_t*>(out.data()), static_cast<uint32_t>(out.size()));
  return out;
}

Result<MessageExt> decode_ext(std::string_view ext) {
  auto bad = [](const std::string& why) { return Status(Code::kCorrupt, "message extension: " + why); };
  const auto* p = reinterpret_cast<const uint8_t*>(ext.data());
  if (ext.size() < format::kExtHeaderSize || load<uint32_t>(p) != ext.size()) {
    return bad("its length field does not match the record");
  }
  if (p[4] != format::kExtVersion || p[5] != 0 || p[6] != 0 || p[7] != 0) {
    return bad("version " + std::to_string(p[4]) + " is not " + std::to_string(format::kExtVersion));
  }
  MessageExt e;
  for (uint64_t o = format::kExtHeaderSize; o < ext.size();) {
    if (ext.size() - o < format::kExtEntryHeaderSize) return bad("an entry header is cut short");
    const auto type = static_cast<format::ExtType>(p[o]);
    const uint64_t n = load<uint16_t>(p + o + 2);
    o += format::kExtEntryHeaderSize;
    if (n > ext.size() - o) return bad("an entry runs past the extension");
    std::string_view v = ext.substr(o, n);
    o += n;
    switch (type) {
      case format::ExtType::kAttribute: {
        if (v.empty() || static_cast<uint8_t>(v[0]) + 1u > v.size()) return bad("an attribute's key is cut short");
        const size_t klen = static_cast<uint8_t>(v[0]);
        std::string key(v.substr(1, klen));
        if (!e.attributes.empty() && e.attributes.back().first >= key) return bad("attribute keys out of order");
        e.attributes.emplace_back(std::move(key), std::string(v.substr(1 + klen)));
        break;
      }
      case format::ExtType::kDedupId:
        e.dedup_id.assign(v);
        break;
      case format::ExtType::kPriority:
        if (v.size() != 1) return bad("a priority entry of " + std::to_string(v.size()) + " bytes (it is 1)");
        e.priority = static_cast<uint8_t>(v[0]);
        break;
      case format::ExtType::kGroup:
        if (v.empty() || v.size() > format::kMaxGroupKey) return bad("a group key of " + std::to_string(v.size()) + " bytes");
        e.group.assign(v);
        break;
      default:
        break;  // a later version's optional entry
    }
  }
  return e;
}

std::optional<std::string_view> ext_entry(std::string_view ext, format::ExtType type) {
  const auto* p = reinterpret_cast<const uint8_t*>(ext.data());
  if (ext.size() < format::kExtHeaderSize || load<uint32_t>(p) != ext.size()) return std::nullopt;
  for (uint64_t o = format::kExtHeaderSize; ext.size() - o >= format::kExtEntryHeaderSize;) {
    const auto t = static_cast<format::ExtType>(p[o]);
    const uint64_t n = load<uint16_t>(p + o + 2);
    o += format::kExtEntryHeaderSize;
    if (n > ext.size() - o) break;
    if (t == type) return ext.substr(o, n);
    o += n;
  }
  return std::nullopt;
}

uint8_t ext_priority(std::string_view ext) {
  auto v = ext_entry(ext, format::ExtType::kPriority);
  return v && v->size() == 1 ? static_cast<uint8_t>((*v)[0]) : format::kDefaultPriority;
}

std::string encode_checkpoint(const Checkpoint& c) {
  std::string out(kCheckpointBytes, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  store<uint64_t>(p, c.sent_total);
  store<uint64_t>(p + 8, c.acked_total);
  store<uint64_t>(p + 16, c.dead_total);
  store<uint64_t>(p + 24, c.next_id);
  store<uint64_t>(p + 32, c.purged_through);
  store<uint64_t>(p + 40, c.expired_total);
  store<uint64_t>(p + 48, c.nacked_total);
  store<uint64_t>(p + 56, c.paused > 0 ? 1 : 0);
  store<uint64_t>(p + 64, c.received_total);
  store<uint64_t>(p + 72, c.redelivered_total);
  return out;
}

std::optional<Checkpoint> decode_checkpoint(std::string_view payload) {
  if (payload.size() < 40) return std::nullopt;  // later versions may append fields
  auto* p = reinterpret_cast<const uint8_t*>(payload.data());
  return Checkpoint{load<uint64_t>(p),      load<uint64_t>(p + 8),  load<uint64_t>(p + 16),
                    load<uint64_t>(p + 24), load<uint64_t>(p + 32),
                    payload.size() >= 48 ? load<uint64_t>(p + 40) : 0,
                    payload.size() >= 56 ? load<uint64_t>(p + 48) : 0,
                    payload.size() >= 64 ? static_cast<int>(load<uint64_t>(p + 56) != 0) : -1,
                    payload.size() >= 72 ? load<uint64_t>(p + 64) : 0,
                    payload.size() >= 80 ? load<uint64_t>(p + 72) : 0};
}

std::vector<IdRun> list_runs(std::string_view payload) {
  std::vector<IdRun> out;
  auto* p = reinterpret_cast<const uint8_t*>(payload.data());
  for (size_t at = 0; at + format::kListRunSize <= payload.size(); at += format::kListRunSize) {
    out.push_back(IdRun{load<uint64_t>(p + at), load<uint64_t>(p + at + 8)});
  }
  return out;
}

bool list_sound(std::string_view payload, uint64_t id) {
  const size_t n = payload.size() / format::kListRunSize;
  if (n == 0 || n > format::kMaxListRuns || payload.size() % format::kListRunSize != 0) return false;
  auto* p = reinterpret_cast<const uint8_t*>(payload.data());
  uint64_t ids = 0, prev_last = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t first = load<uint64_t>(p + i * format::kListRunSize);
    const uint64_t last = load<uint64_t>(p + i * format::kListRunSize + 8);
    if (first == 0 || first > last || (i > 0 && first <= prev_last)) return false;
    if (last - first >= format::kMaxListIds) return false;  // (before the sum, which cannot overflow then)
    ids += last - first + 1;
    if (ids > format::kMaxListIds) return false;
    prev_last = last;
  }
  return prev_last == id;
}

size_t list_fits(std::span<const uint64_t> ids) {
  size_t runs = 0, i = 0;
  for (; i < ids.size() && i < format::kMaxListIds; ++i) {
    if (i == 0 || ids[i] != ids[i - 1] + 1) {
      if (runs == format::kMaxListRuns) break;
      ++runs;
    }
  }
  return i;
}

std::string encode_list(std::span<const uint64_t> ids) {
  std::string out;
  auto run = [&](uint64_t first, uint64_t last) {
    const size_t at = out.size();
    out.resize(at + format::kListRunSize);
    store<uint64_t>(reinterpret_cast<uint8_t*>(out.data() + at), first);
    store<uint64_t>(reinterpret_cast<uint8_t*>(out.data() + at + 8), last);
  };
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    run(ids[i], ids[j]);
    i = j + 1;
  }
  return out;
}

std::string encode_view_checkpoint(uint16_t view, const Checkpoint& c) {
  std::string out(8, '\0');
  store<uint64_t>(reinterpret_cast<uint8_t*>(out.data()), view);
  return out + encode_checkpoint(c);
}

std::vector<std::pair<uint16_t, Checkpoint>> decode_view_checkpoints(std::string_view payload) {
  std::vector<std::pair<uint16_t, Checkpoint>> out;
  constexpr size_t kEach = 8 + kCheckpointBytes;
  for (size_t at = kCheckpointBytes; at + kEach <= payload.size(); at += kEach) {
    const uint64_t view = load<uint64_t>(reinterpret_cast<const uint8_t*>(payload.data() + at));
    auto c = decode_checkpoint(payload.substr(at + 8, kCheckpointBytes));
    if (view == 0 || view > format::kMaxSubscriptions || !c) continue;
    out.emplace_back(static_cast<uint16_t>(view), *c);
  }
  return out;
}

void store_records(uint8_t* dst, const uint8_t* src, uint64_t len) {
  for (uint64_t at = 0; at < len;) {
    const uint64_t size = std::min(format::record_size(load<uint32_t>(src + at + 4)), len - at);
    std::memcpy(dst + at + 8, src + at + 8, size - 8);
    // The first word goes last, in one store; a release store also keeps the compiler (and
    // a weakly ordered CPU, for readers in other processes) from moving it before the copy.
    uint64_t first = 0;
    std::memcpy(&first, src + at, 8);
    __atomic_store_n(reinterpret_cast<uint64_t*>(dst + at), first, __ATOMIC_RELEASE);
    at += size;
  }
}

void unstore_records(uint8_t* dst, uint64_t len) {
  uint64_t at = len;
  while (at % 8 != 0) dst[--at] = 0;
  // Release stores keep the compiler from merging or reordering the loop into a memset.
  for (; at >= 8; at -= 8) __atomic_store_n(reinterpret_cast<uint64_t*>(dst + at - 8), uint64_t{0}, __ATOMIC_RELEASE);
}

std::optional<Corruption> stored_after(const Segment& seg, uint64_t end, uint64_t upto) {
  upto = std::min(upto, seg.info().size);
  // Backwards, eight bytes at a time where aligned: up to a whole segment of zero-fill.
  const uint8_t* d = seg.data();
  uint64_t last = upto;
  while (last > end && last % 8 != 0 && d[last - 1] == 0) --last;
  while (last >= end + 8 && last % 8 == 0 && load<uint64_t>(d + last - 8) == 0) last -= 8;
  while (last > end && d[last - 1] == 0) --last;
  if (last <= end) return std::nullopt;
  return Corruption{seg.info().seq, end, last - end};
}

ScanResult scan(const Segment& seg, uint64_t from,
                const std::function<void(const RecordView&)>& visit, bool sealed) {
  ScanResult res;
  uint64_t off = std::max<uint64_t>(from, kSegmentHeaderSize);
  const uint64_t size = seg.info().size;
  // Searching past damage checks the checksum of every candidate that has the record magic
  // and a plausible length, which hostile bytes (the magic every 16 bytes, each with a length
  // reaching far on) make quadratic, under the index lock. The checksums cost at most 4 bytes
  // per byte of the segment plus 64 MiB per scan (docs/format.md, "Finding the end"); past it
  // the rest of the segment is damage and the end is the segment's end, so the next append
  // rolls and overwrites nothing there.
  uint64_t budget = 4 * size + (64ull << 20);
  while (off < size) {
    if (auto rec = seg.record_at(off)) {
      visit(*rec);
      ++res.records;
      off += rec->size;
      continue;
    }
    bool spent = false;
    uint64_t next = seg.resync(off + format::kRecordAlign, &budget, &spent);
    if (spent) {
      res.corrupt.push_back({seg.info().seq, off, size - off});
      res.budget_spent = true;
      off = size;
      break;
    }
    if (next >= size) break;  // nothing valid after: `off` is the logical end
    res.corrupt.push_back({seg.info().seq, off, next - off});
    off = next;
  }
  res.end = std::min(off, size);
  if (sealed) {
    const uint64_t want = seg.info().preallocated;
    if (auto c = stored_after(seg, res.end, size)) res.corrupt.push_back(*c);
    if (size < want) res.corrupt.push_back(Corruption{seg.info().seq, size, want - size});
  }
  return res;
}

}  // namespace spool::storage
