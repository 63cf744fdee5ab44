// One segment file: an fd plus a MAP_SHARED mapping of the whole preallocated file (writable
// when the log stores records through it: storage/log.h), and the record codec. Layout:
// docs/format.md.
//
// A Segment is immutable once open and safe to share between threads; it stays valid (and
// its mapping readable) while any shared_ptr to it lives, even after the file is unlinked.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/io.h"
#include "spool/status.h"
#include "storage/format.h"

namespace spool::storage {

// What a writer appends.
struct Record {
  format::RecordType type = format::RecordType::kMsg;
  uint32_t count = 0;
  uint64_t id = 0;
  uint64_t t1 = 0;
  uint64_t t2 = 0;
  std::string_view payload;
  uint8_t flags = 0;  // format::kFlag*
  // MSG only: the encoded extension area (encode_ext()), written before the payload; the
  // encoder sets kFlagExt when it is not empty. Empty: the record is as in version 1.
  std::string_view ext = {};
  // The view (subscription) the record is of: 0, the default, is what every record before
  // version 4 is of. Only where format::has_view(type, flags); a SUB's is the subscription.
  uint16_t view = 0;
};

// A validated record inside a mapping; `payload` points into the mapping (zero-copy) and
// is valid while the Segment lives.
struct RecordView {
  format::RecordType type;
  uint8_t flags;
  uint32_t count;
  uint64_t id;
  uint64_t t1;
  uint64_t t2;
  std::string_view payload;  // the message body (after the extension area, if any)
  uint64_t offset;  // of the record header in the segment
  uint64_t size;    // header + payload + pad
  // The extension area of a MSG with kFlagExt in a segment of version >= 2 (decode it with
  // decode_ext()), else empty. If its length field is longer than the record, the whole
  // record is here and decode_ext() reports it.
  std::string_view ext = {};
  uint16_t view = 0;  // as Record's (0 in segments before version 4)
};

struct SegmentInfo {
  uint32_t version = 0;
  uint64_t salt = 0;
  uint64_t seq = 0;
  uint64_t base_id = 0;
  uint64_t created_ns = 0;
  uint64_t size = 0;  // usable bytes: the header's size, or less if the file was truncated
  uint64_t preallocated = 0;  // the header's size: what the file was preallocated to
};

// A run of bytes that held no valid record between two valid ones.
struct Corruption {
  uint64_t seq;
  uint64_t offset;
  uint64_t length;
};

class Segment {
 public:
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  // Creates `path` (temp file, fallocate, header, rename): a kill never leaves a segment
  // without its header; syncing it is the caller's (Log::sync_through).
  // ENOSPC from fallocate comes back as kNoSpace with nothing left behind.
  // With `spare`, that preallocated file (Log::make_spare) becomes the segment instead of a
  // new one; on failure it stays a spare.
  // `map_writes` and `huge` as for open(). `mode` (0: what the umask leaves) is set on a new file.
  static Result<std::shared_ptr<Segment>> create(io::Io& io, const std::string& path, uint64_t seq,
                                                 uint64_t base_id, uint64_t size,
                                                 const std::string* spare = nullptr, bool map_writes = false,
                                                 mode_t mode = 0, bool huge = false);
  // Opens and validates an existing segment. Errors name the file: kNotAQueue (bad magic or
  // header checksum, short header), kIncompatible (newer version), kIo/kReadOnly (open).
  // With `map_writes` (and `writable`) the mapping is writable too: wdata(). With `huge`
  // it is laid out for huge pages (sys::map_shared).
  static Result<std::shared_ptr<Segment>> open(io::Io& io, const std::string& path, bool writable,
                                               bool map_writes = false, bool huge = false);

  const SegmentInfo& info() const { return info_; }
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  const uint8_t* data() const { return base_; }
  // The writable view of the mapping, or nullptr when it is read-only. Stores through it
  // must stay inside [0, info().size), which the file's preallocated blocks back.
  uint8_t* wdata() const { return map_writable_ ? const_cast<uint8_t*>(base_) : nullptr; }

  // The valid record at `off`, or nullopt (see "Validity" in docs/format.md).
  std::optional<RecordView> record_at(uint64_t off) const;
  // The first offset >= off holding a valid record, or info().size if there is none. With
  // `budget`, the checksums of the candidates it checks cost their bytes from *budget; when
  // that runs out it stops, sets *out_of_budget and returns info().size.
  uint64_t resync(uint64_t off, uint64_t* budget = nullptr, bool* out_of_budget = nullptr) const;

  // Records with a longer payload are not valid (docs/format.md, "Validity"): the log's
  // max_payload. Set by the log before the segment is shared; default: any that fits.
  void set_max_payload(uint64_t n) { max_payload_ = n; }

  // True once another process truncated the file under this mapping and an access past its
  // new end was caught: the mapping reads zeros since, and stores through it are lost.
  bool cut() const { return cut_.load(std::memory_order_acquire); }

  // Appends the encoding of `r` for this segment (header, payload, pad) to `out`.
  void encode(const Record& r, std::string& out) const;

 private:
  Segment() = default;
  std::string path_;
  int fd_ = -1;
  const uint8_t* base_ = nullptr;
  std::atomic<bool> cut_{false};  // a SIGBUS on the mapping was caught (sys/sigbus_guard.h)
  bool map_writable_ = false;
  uint64_t max_payload_ = UINT32_MAX;
  SegmentInfo info_;
};

struct ScanResult {
  uint64_t end = 0;      // logical end: where the next record goes
  uint64_t records = 0;  // valid records visited
  std::vector<Corruption> corrupt;
  // The search past damage ran out of its budget: the last corrupt region runs to the end
  // of the segment, unsearched, and `end` is the segment's size.
  bool budget_spent = false;
};

// Copies `len` bytes of whole encoded records from `src` to `dst` (a writable mapping of a
// segment), so that a process killed at any instruction leaves a prefix of them: complete
// records, then at most one whose first word (magic and length) is still zero, then the
// zeros that were there. Each record's first word is stored last, after the rest of it.
// memcpy gives no order (glibc's stores a large copy's first bytes last): a headless first
// record before complete ones is a hole replay skips. Both `dst` and `src` are 8-aligned.
void store_records(uint8_t* dst, const uint8_t* src, uint64_t len);

// Zeroes `len` bytes of records at `dst` (a writable mapping of a segment) from the last
// word to the first, so that a process killed at any instruction leaves a prefix of them:
// whole records, then at most one whose body is partly zero, then zeros. memset gives no
// order, and a kill in its middle could leave the first record zeroed before whole ones,
// which replay would take (duplicates of a batch whose append was reported failed).
// `dst` is 8-aligned.
void unstore_records(uint8_t* dst, uint64_t len);

// The non-zero bytes of [end, upto): from `end` to the last of them, or nothing if all are zero.
std::optional<Corruption> stored_after(const Segment& seg, uint64_t end, uint64_t upto);

// Visits every valid record from `from` (a record boundary, >= 64) in offset order, skipping
// and reporting corrupt regions, and finds the logical end. With `sealed` (a segment the log
// has rolled past) it also reports the damage a torn tail cannot explain: non-zero bytes after
// the end (a sealed segment's unused space is the zero-fill it was preallocated with), and a
// file shorter than its header's size (each segment has its own: the log grows them,
// storage/log.h).
ScanResult scan(const Segment& seg, uint64_t from,
                const std::function<void(const RecordView&)>& visit, bool sealed = false);

// Payload of a CHECKPOINT record: the queue's totals up to that point in the log.
struct Checkpoint {
  uint64_t sent_total = 0;
  uint64_t acked_total = 0;
  uint64_t dead_total = 0;
  uint64_t next_id = 0;
  uint64_t purged_through = 0;
  uint64_t expired_total = 0;  // absent (0) in checkpoints written before retention existed
  uint64_t nacked_total = 0;   // absent (0) in checkpoints written before it was counted
  // 1 while the queue is paused (Queue::pause); -1 in checkpoints written before pausing
  // existed, which leave the state as the records before them set it.
  int paused = -1;
  // Deliveries (LEASEs that raised a message's receive count) and, of them, redeliveries
  // (a count above 1); absent (0) in checkpoints written before they were counted.
  uint64_t received_total = 0;
  uint64_t redelivered_total = 0;
};
// A run of message ids of a LIST record (format::kFlagList), first to last inclusive.
struct IdRun {
  uint64_t first = 0;
  uint64_t last = 0;
};
// The runs of a LIST record's payload. A reader gets only records whose list is sound
// (list_sound()), so a caller of a record from a segment need not check again.
std::vector<IdRun> list_runs(std::string_view payload);
// f(id) for each id of a LIST record's payload, in order (no allocation per id).
template <class F>
void for_each_listed(std::string_view payload, F&& f) {
  for (const IdRun& run : list_runs(payload)) {
    for (uint64_t id = run.first;; ++id) {
      f(id);
      if (id == run.last) break;
    }
  }
}
// Whether `payload` is a sound list of a record with id `id`: 1 to kMaxListRuns runs,
// ascending and apart, of at most kMaxListIds ids in all, the last ending at `id`.
bool list_sound(std::string_view payload, uint64_t id);
// The payload of a list of `ids` (ascending, distinct, fitting one record: list_fits()).
std::string encode_list(std::span<const uint64_t> ids);
// How many of `ids` (ascending, distinct), from the first, one LIST record can hold.
size_t list_fits(std::span<const uint64_t> ids);
std::string encode_checkpoint(const Checkpoint& c);
std::optional<Checkpoint> decode_checkpoint(std::string_view payload);
// A subscription's totals, appended after the queue's 80 bytes, one per active view: its
// number (u64) then its own checkpoint (80 bytes; next_id is view 0's). Empty list for a
// queue without subscriptions, whose checkpoints stay as before.
inline constexpr size_t kCheckpointBytes = 80;
std::string encode_view_checkpoint(uint16_t view, const Checkpoint& c);
std::vector<std::pair<uint16_t, Checkpoint>> decode_view_checkpoints(std::string_view payload);

// The contents of a MSG record's extension area (docs/format.md, "Message extension").
struct MessageExt {
  std::vector<std::pair<std::string, std::string>> attributes;  // in key order, keys unique
  std::string dedup_id;                                         // empty: none
  uint8_t priority = format::kDefaultPriority;
  std::string group;  // empty: none
};
// The encoding of `e` ("" for an empty one: no extension). The caller checked the bounds.
std::string encode_ext(const MessageExt& e);
// Decodes an extension area; kCorrupt naming what is wrong. Entry types it does not know
// are skipped (docs/format.md says which may be added so).
Result<MessageExt> decode_ext(std::string_view ext);
// The value of the first entry of `type` in an extension area, without decoding the rest;
// nullopt when there is none or the area is not sound (decode_ext() is what reports that).
std::optional<std::string_view> ext_entry(std::string_view ext, format::ExtType type);
// The priority an extension area gives (kDefaultPriority when it gives none).
uint8_t ext_priority(std::string_view ext);

// Parses and validates a segment header from raw bytes; used by open() and the fuzzer.
Result<SegmentInfo> parse_header(const uint8_t* data, uint64_t len, const std::string& name);

}  // namespace spool::storage
