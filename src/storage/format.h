// Constants of the on-disk format. The specification, with field tables and a worked
// example, is docs/format.md; change both together.
#pragma once

#include <cstdint>

namespace spool::format {

// 1: the first. 2: MSG records may carry an extension area (kFlagExt); CLOCK records.
// 3: the extension's GROUP entry, which a reader must not skip.
// 4: subscriptions: the record header's view field (bytes 10-11, 0 before) and SUB records.
inline constexpr uint32_t kVersion = 4;
// The first version whose MSG records may carry an extension; older segments are read as
// before (the bit meant nothing to them) and are never written an extended record.
inline constexpr uint32_t kFirstExtVersion = 2;
// The first version whose MSG records may carry a GROUP entry.
inline constexpr uint32_t kFirstGroupVersion = 3;
// The first version whose records may carry a view other than 0, or be SUB records.
inline constexpr uint32_t kFirstViewVersion = 4;

// Views of a queue (docs/format.md, "Views"): 0 is the default subscription, 1 to
// kMaxSubscriptions are named subscriptions. A view field above it is no record.
inline constexpr uint16_t kMaxSubscriptions = 16;
// Subscription names: 1 to kMaxSubscriptionName bytes of [A-Za-z0-9._-], not "default".
inline constexpr uint32_t kMaxSubscriptionName = 48;

inline constexpr char kSegmentMagic[8] = {'S', 'P', 'O', 'O', 'L', 'S', 'E', 'G'};
inline constexpr uint32_t kSegmentHeaderSize = 64;
inline constexpr uint64_t kDefaultSegmentSize = 64ull << 20;
inline constexpr uint64_t kMinSegmentSize = 4096;

inline constexpr uint32_t kRecordMagic = 0x31525053;  // "SPR1"
inline constexpr uint32_t kRecordHeaderSize = 48;
inline constexpr uint32_t kRecordAlign = 8;
inline constexpr uint32_t kChecksumOffset = 40;  // the checksum covers header bytes [0, 40)

enum class RecordType : uint8_t {
  kMsg = 1,
  kLease = 2,
  kAck = 3,
  kRelease = 4,
  kDead = 5,
  kPurge = 6,
  kCheckpoint = 7,
  kClock = 8,  // payload: 8 bytes, the writer's boot (queue/log_clock.h)
  kPause = 9,  // count 1: the queue was paused, 0: resumed (Queue::pause)
  kSub = 10,   // view k: subscription k was added (count 1, id: its first message) or removed (0)
};
inline constexpr uint8_t kMaxRecordType = 10;

// Record flags.
inline constexpr uint8_t kFlagCopy = 1;     // MSG relocated by compaction, not a new send
inline constexpr uint8_t kFlagExpired = 2;  // ACK written by a retention limit, not a consumer
inline constexpr uint8_t kFlagNack = 4;     // RELEASE written by a consumer's nack (counted)
inline constexpr uint8_t kFlagExt = 8;      // MSG whose payload starts with an extension area
inline constexpr uint8_t kFlagDeleted = 16;  // ACK written by a delete by id, not a consumer
inline constexpr uint8_t kFlagRestated = 32;  // SUB add that opens a segment: restates an active view
// MSG for one view only (version 4): the record's view field names it (0 included), and no
// other view gets the message (a redrive or replay of one subscription's messages).
inline constexpr uint8_t kFlagOneView = 64;
// LEASE or ACK of several messages (version 4): the payload lists them as runs of ids
// (kListRunSize bytes each: first id, last id; ascending, apart), `id` is the last run's
// last, and the record is of each as a record of that id alone would be. A receive's or an
// ack_batch's records: one per view and delivery number instead of one per message.
inline constexpr uint8_t kFlagList = 128;
inline constexpr uint32_t kListRunSize = 16;
// Bounds of one list (a writer splits a longer one): the runs fit the smallest segment,
// and the ids a record is of are bounded, so applying a forged one costs little.
inline constexpr uint32_t kMaxListRuns = 64;
inline constexpr uint64_t kMaxListIds = 4096;

// Whether a record of `type` with `flags` may carry a view other than 0 (a SUB's is the
// subscription it adds or removes; CHECKPOINT and CLOCK records are the queue's, not a
// view's, and so is a MSG unless it is flagged kFlagOneView).
inline constexpr bool has_view(RecordType type, uint8_t flags) {
  if (type == RecordType::kMsg) return (flags & kFlagOneView) != 0;
  return type != RecordType::kCheckpoint && type != RecordType::kClock;
}

// The extension area of a MSG record (docs/format.md, "Message extension").
inline constexpr uint32_t kExtHeaderSize = 8;  // ext_len u32 | ext_version u8 | 3 zero bytes
inline constexpr uint8_t kExtVersion = 1;
inline constexpr uint32_t kExtEntryHeaderSize = 4;  // type u8 | 0 u8 | len u16
enum class ExtType : uint8_t {
  kAttribute = 1,  // key_len u8 | key | value
  kDedupId = 2,    // the deduplication id
  kGroup = 3,      // the ordered group's key
  kPriority = 4,   // u8, 0 most urgent; absent: kDefaultPriority
};
inline constexpr uint8_t kDefaultPriority = 128;
// Bounds (docs/semantics.md, "Attributes" and "Deduplication").
inline constexpr uint32_t kMaxAttributes = 16;
inline constexpr uint32_t kMaxAttrKey = 64;
inline constexpr uint32_t kMaxAttrValue = 1024;
inline constexpr uint32_t kMaxAttrTotal = 4096;  // sum of keys and values
inline constexpr uint32_t kMaxDedupId = 128;
inline constexpr uint32_t kMaxGroupKey = 128;
// The largest extension area: what the bounds above allow, rounded up. Records may be this
// much longer than the queue's max_payload.
inline constexpr uint32_t kMaxExtSize = 8192;
static_assert(kExtHeaderSize + kMaxAttributes * (kExtEntryHeaderSize + 1) + kMaxAttrTotal +
                  kExtEntryHeaderSize + kMaxDedupId + kExtEntryHeaderSize + 1 + kExtEntryHeaderSize +
                  kMaxGroupKey <= kMaxExtSize);

inline constexpr uint64_t align_up(uint64_t n) { return (n + kRecordAlign - 1) & ~uint64_t{kRecordAlign - 1}; }
inline constexpr uint64_t record_size(uint64_t payload_len) {
  return align_up(kRecordHeaderSize + payload_len);
}

}  // namespace spool::format
