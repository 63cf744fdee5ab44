// Inode numbers of a spoolfs mount.
//
// An inode number is a pure function of what it names and is never reused: message ids only
// increase, files being written take numbers from a counter, and a queue keeps its slot for
// the life of the mount. So lookup counts need no bookkeeping (FORGET is a no-op) and a
// stale inode simply answers ENOENT.
//
//   bits 63..44: the view (20 bits)   bits 43..0: the inode within the view (44 bits)
//
// View 0 is the mount itself; its only inode is FUSE_ROOT_ID (1). Every queue of the mount
// has a slot s (a single-queue mount has slot 0; a --root mount numbers queues in the order
// it first sees them) and two views: 2 + 2s for the queue and 3 + 2s for its dead-letter
// queue. So no two queues, and no queue and its dead-letter queue, share an inode.
// Within a view:
//   1           the view's directory (in a single-queue mount, the queue's directory is the
//               mount root and answers as FUSE_ROOT_ID instead)
//   2, 3        .stats, .stats.json
//   4           .next
//   256 + N     message N (1 <= N < 2^43 - 256: about 8.8e12 messages per queue)
//   2^43 + k    the k-th file created for writing in this view
#pragma once

#include <fuse_lowlevel.h>

#include <cstddef>
#include <cstdint>

namespace spoolfs::ino {

constexpr int kLocalBits = 44;
constexpr uint64_t kLocalMask = (uint64_t{1} << kLocalBits) - 1;
constexpr uint64_t kMaxViews = uint64_t{1} << (64 - kLocalBits);
static_assert(sizeof(fuse_ino_t) == 8, "inode numbers must hold a view and a message id");

// Local inode numbers within a view.
constexpr uint64_t kDir = 1;
constexpr uint64_t kStats = 2;
constexpr uint64_t kStatsJson = 3;
constexpr uint64_t kNext = 4;
constexpr uint64_t kMsgBase = 256;
constexpr uint64_t kNewBase = uint64_t{1} << (kLocalBits - 1);
constexpr uint64_t kMaxMsgId = kNewBase - kMsgBase - 1;

constexpr size_t kMaxSlots = (kMaxViews - 2) / 2;

constexpr fuse_ino_t make(uint64_t view, uint64_t local) {
  return (view << kLocalBits) | local;
}
constexpr uint64_t view_of(fuse_ino_t ino) {
  return ino >> kLocalBits;
}
constexpr uint64_t local_of(fuse_ino_t ino) {
  return ino & kLocalMask;
}

constexpr uint64_t queue_view(size_t slot) {
  return 2 + 2 * uint64_t{slot};
}
constexpr uint64_t dlq_view(size_t slot) {
  return 3 + 2 * uint64_t{slot};
}
// For views >= 2: the slot, and whether it is the dead-letter queue's view.
constexpr size_t slot_of(uint64_t view) {
  return static_cast<size_t>((view - 2) / 2);
}
constexpr bool is_dlq_view(uint64_t view) {
  return view % 2 == 1;
}

constexpr bool is_msg(uint64_t local) {
  return local > kMsgBase && local < kNewBase;  // ids start at 1
}
constexpr uint64_t msg_local(uint64_t id) {
  return kMsgBase + id;
}
constexpr uint64_t msg_id(uint64_t local) {
  return local - kMsgBase;
}

static_assert(view_of(make(kMaxViews - 1, kLocalMask)) == kMaxViews - 1);
static_assert(local_of(make(queue_view(kMaxSlots - 1), kNewBase + 5)) == kNewBase + 5);
static_assert(is_dlq_view(dlq_view(7)) && slot_of(dlq_view(7)) == 7 && slot_of(queue_view(7)) == 7);
static_assert(make(0, kDir) == FUSE_ROOT_ID, "view 0's directory is the mount root");

}  // namespace spoolfs::ino
