// The one mutator: how a record changes the index state. Live calls apply each record they
// write (the record they append, as replay will read it), replay applies every record in
// log order, both through apply_record(), so that the index a process leaves and the index
// a rebuild makes from the same log agree.
#pragma once

#include <cstdint>

#include "index/index.h"
#include "queue/log_clock.h"
#include "spool/status.h"
#include "storage/segment.h"

namespace spool::queue {

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
  uint64_t lease(uint64_t at, uint64_t t2) const { return replay != nullptr ? replay->lease_key(at, t2) : now.key(t2); }
  uint64_t ready(uint64_t at, uint64_t t1, uint64_t t2) const {
    return replay != nullptr ? replay->ready_key(at, t1, t2) : now.key(t2);
  }
};

// Applies record `r`, at `at` (a packed Pos; 0 where the caller applies before its append,
// which only a live LEASE does), to `x`, held (the index lock, or a private index): a MSG inserts a ready message (the room
// reserved by a live caller), LEASE and RELEASE set the receive count, state and deadline,
// ACK and DEAD drop the message (a consumer's ACK noted in the kept-acked buckets first,
// with keep_acked), PURGE drops every message up to its id, CHECKPOINT sets
// the totals (and the paused state, where it carries one), PAUSE sets the paused state. Every total (sent, acked, expired, dead, nacked, bytes live) is counted here
// and nowhere else. Records of messages the index does not hold change nothing but the
// totals. CLOCK records are the ReplayClock's; which MSG records are applied at all
// (compaction copies, ids below a purge) is replay's choice.
Status apply_record(index::SharedIndex& x, uint64_t at, const storage::RecordView& r, const Keys& keys) REQUIRES(x);

// `rec`, appended at `at`, as replay reads it (what apply_record() takes).
storage::RecordView view_of(const storage::Record& rec);

}  // namespace spool::queue
