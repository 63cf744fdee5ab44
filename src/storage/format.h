// Constants of the on-disk format. The specification, with field tables and a worked
// example, is docs/format.md; change both together.
#pragma once

#include <cstdint>

namespace spool::format {

inline constexpr uint32_t kVersion = 1;

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
};
inline constexpr uint8_t kMaxRecordType = 7;

// Record flags.
inline constexpr uint8_t kFlagCopy = 1;     // MSG relocated by compaction, not a new send
inline constexpr uint8_t kFlagExpired = 2;  // ACK written by a retention limit, not a consumer
inline constexpr uint8_t kFlagNack = 4;     // RELEASE written by a consumer's nack (counted)

inline constexpr uint64_t align_up(uint64_t n) { return (n + kRecordAlign - 1) & ~uint64_t{kRecordAlign - 1}; }
inline constexpr uint64_t record_size(uint64_t payload_len) {
  return align_up(kRecordHeaderSize + payload_len);
}

}  // namespace spool::format
