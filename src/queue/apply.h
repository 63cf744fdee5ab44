// The one mutator: how a record changes the index state. Live calls apply each record they
// write (the record they append, as replay will read it), replay applies every record in
// log order, both through apply_record(), so that the index a process leaves and the index
// a rebuild makes from the same log agree.
#pragma once

#include <cstdint>
#include <functional>
#include <unordered_map>

#include <vector>

#include "index/index.h"
#include "queue/log_clock.h"
#include "spool/status.h"
#include "storage/segment.h"

namespace spool::queue {

// A compaction copy not yet confirmed (Keys::copies): where it is, and what a view that
// does not hold its message needs to take it from the copy (docs/format.md, "Views").
struct Copy {
  uint64_t at = 0;  // packed Pos of the copy
  uint32_t len = 0;
  uint8_t priority = index::kDefaultPriority;
  uint64_t group = 0;  // the group key's hash (0: none)
};
using Copies = std::unordered_map<uint64_t, Copy>;

// The index of view `k` (1..index::kSubscriptions), attached, and made where missing, by
// the caller, and guarded by view 0's lock (the caller holds it); null if it cannot be.
using ViewIndex = std::function<index::SharedIndex*(uint16_t k)>;

// The keys (CLOCK_BOOTTIME) of a record's times. A live call's records are of this boot and
// were written at `now` (the times convert through its log clock exactly); replay's come
// from any boot, and its ReplayClock converts them through the anchors seen so far.
struct Keys {
  const ReplayClock* replay = nullptr;
  Clocks now;
  // Replay after ack: the queue's keep_acked in ns (0: off), and the key of an ACK's time
  // (0: now.boot, a live ack's). An ACK record stores no time: replay passes the latest
  // time of the records before it (ReplayClock::time_key()).
  uint64_t keep_acked = 0;
  uint64_t acked = 0;
  // The queue's dedup window in ns (0: none): a new message's dedup id is remembered for it.
  uint64_t dedup_window = 0;
  // Compaction copies of messages the index holds, by id, not yet confirmed by a LEASE or
  // RELEASE of the message (see apply_record): replay keeps one map for the whole log, a
  // live commit one for its records. Null: copies are not followed (only a caller that
  // writes none may pass it).
  Copies* copies = nullptr;
  // The subscriptions' indexes (view k > 0). Null: the caller has none; then records of a
  // subscription change nothing but view 0's table (only a queue that never had one may).
  const ViewIndex* views = nullptr;
  uint64_t lease(uint64_t at, uint64_t t2) const { return replay != nullptr ? replay->lease_key(at, t2) : now.key(t2); }
  uint64_t ready(uint64_t at, uint64_t t1, uint64_t t2) const {
    return replay != nullptr ? replay->ready_key(at, t1, t2) : now.key(t2);
  }
};

// Applies record `r`, at `at` (a packed Pos; 0 where the caller applies before its append,
// which only a live LEASE does), to `x`, held (the index lock, or a private index). Every
// effect a record has on the index is here, for live calls and replay alike:
// - every record but CLOCK and CHECKPOINT raises next_id past its id (and sent_through);
// - a MSG's dedup id is remembered within the window (before the purge check: a dedup id
//   outlives its message); a MSG at or below the purge mark is dropped; a compaction copy
//   of a message the index holds is noted in keys.copies and moves the entry there only
//   once a LEASE or RELEASE of that message follows (a compaction killed in its append can
//   leave a copy without one); any other MSG inserts a ready message (a live caller
//   reserved the room);
// - LEASE and RELEASE set the receive count, state and deadline;
// - ACK and DEAD drop the message (a consumer's ACK noted in the kept-acked buckets first,
//   with keep_acked); PURGE drops every message up to its id; CHECKPOINT sets the totals
//   (and the paused state, where it carries one); PAUSE sets the paused state; CLOCK enters
//   its anchor (note_anchor(), queue/log_clock.h).
// Subscriptions (docs/format.md, "Views"): a record of view k > 0 does the above to view k's
// index (keys.views) instead; a MSG (not a copy) is a message of view 0 and of every active
// subscription whose first id is at most its id; every id raises each view's next_id; a SUB
// record adds (its state emptied, then, "from start", filled from view 0) or removes (its
// state emptied) subscription k in view 0's table. While any subscription is active, a
// compaction copy goes into no view by itself: the LEASE or RELEASE of each view that
// follows it moves that view's entry to the copy, or inserts it from the copy where the
// view does not hold it.
// Every total (sent, acked, expired, dead, nacked, bytes live) is counted here and nowhere
// else. Records of messages the index does not hold change nothing but the totals. An error means the index could not take the record (no
// room): the caller rebuilds the index from the log.
Status apply_record(index::SharedIndex& x, uint64_t at, const storage::RecordView& r, const Keys& keys) REQUIRES(x);

// The active subscriptions in view 0's table `x` (held), by view number.
std::vector<uint16_t> active_views(const index::SharedIndex& x);
// Whether view 0's table `x` (held) has any active subscription.
bool any_subscription(const index::SharedIndex& x);

// Empties the index's cache for a replay, which then applies every record: no messages, no
// dedup ids or kept buckets, no clock anchors, every total 0, next_id 1. The owner registry
// and the disk bookkeeping stay (index.h). Lock held.
Status clear_for_replay(index::SharedIndex& x) REQUIRES(x);

// The key (CLOCK_BOOTTIME) of the enqueue time `t1` of the MSG record at `at`; a time after
// now (a wall clock that went back since an earlier boot) counts as now.
uint64_t enqueue_key(const index::SharedIndex& x, uint64_t at, uint64_t t1, const Clocks& now);

// The dedup table's hash of a dedup id.
uint64_t dedup_hash(std::string_view id);

// `rec`, appended at `at`, as replay reads it (what apply_record() takes).
storage::RecordView view_of(const storage::Record& rec);

}  // namespace spool::queue
