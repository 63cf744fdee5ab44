// The log clock (docs/format.md, "Time"). Records store times on a clock that is
// CLOCK_BOOTTIME plus an offset fixed at an anchor: a CLOCK record, written by the lock
// holder before the first record of each boot and whenever the wall clock has moved more
// than kClockSlack away from the log clock (a step, or slew that added up); and restated,
// same offset, at the start of every segment, so that what compaction leaves still
// names its anchors. So a record's
// time converts back to this boot's CLOCK_BOOTTIME exactly, whatever the wall clock did
// since, and stays near the wall clock for people and for later boots.
//
// The index orders deadlines on CLOCK_BOOTTIME ("keys"). Contract of the conversions:
//  - a record of this boot: exact, through the anchor in force where it was written;
//  - a record of an earlier boot (written under another boot's anchor): by the wall clock,
//    and a lease of it has ended (no process of that boot can hold it); a delay is held no
//    longer than the record itself asked for (t2 - t1);
//  - a record older than any anchor (a log of spool 0.1, or the first records of a
//    segment after a prefix compaction removed, written by a batch that rolled over into
//    it before its restatement): by the wall clock, as before.
#pragma once

#include <chrono>
#include <cstdint>

#include "env/env.h"
#include "index/index.h"
#include "storage/segment.h"
#include "sys/clock.h"

namespace spool::queue {

inline constexpr uint64_t kClockSlackNs = 1'000'000'000;

// The key (CLOCK_BOOTTIME) of `t`, an instant on a clock `off` ahead of CLOCK_BOOTTIME; 0
// for instants before this boot. Offsets and differences are taken modulo 2^64, so a wall
// clock behind the boot clock (an RTC-less device before NTP) works too; boot times stay
// below 2^63.
inline uint64_t key_at(uint64_t t, uint64_t off) {
  const uint64_t k = t - off;
  return static_cast<int64_t>(k) < 0 ? 0 : k;
}

// One moment on the clocks a lock holder needs, as its Env's clocks give them (read_clocks()).
struct Clocks {
  uint64_t boot = 0;  // CLOCK_BOOTTIME: the index's keys
  uint64_t rt = 0;    // the log clock: what records written now store
  uint64_t real_coarse = 0;  // the coarse CLOCK_REALTIME read with `boot` (anchor_due())
  Env* env = nullptr;        // where real() reads the clocks (null: the system's, sys/clock.h)
  // CLOCK_REALTIME when `boot` was read, computed at the first call: a precise clock read
  // is dear under some hypervisors, and a send needs none (its drift check, anchor_due(),
  // reads the coarse clock). Taken back by the boot clock's advance since, so that real() - boot is
  // the offset between the clocks however long this was kept (a replay keeps it seconds).
  uint64_t real() const {
    if (real_ == 0) {
      const uint64_t since = boot == 0 ? 0 : (env != nullptr ? env->boot_ns() : sys::boot_ns()) - boot;
      real_ = (env != nullptr ? env->real_ns() : sys::real_ns()) - since;
    }
    return real_;
  }
  mutable uint64_t real_ = 0;
  // The key of `t`, an instant on the current log clock (0 for instants before this boot).
  uint64_t key(uint64_t t) const { return key_at(t, rt - boot); }
};

// `real_ns` (CLOCK_REALTIME ns, as Clocks::real()) as the API's wall-clock times are given.
inline std::chrono::system_clock::time_point wall_time(uint64_t real_ns) {
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::nanoseconds(real_ns)));
}

// This boot's identity for CLOCK records: a hash of /proc/sys/kernel/random/boot_id, never 0.
uint64_t boot_hash();

// Reads `env`'s clocks (one Env::now() call); `rt` follows the header's newest anchor (the
// wall clock if it has none).
Clocks read_clocks(const index::IndexHeader& h, Env& env);
// True when the wall clock needs a new anchor: none this boot, or drift past kClockSlackNs
// (while the index has room for one: kClockAnchors a boot).
bool anchor_due(const index::IndexHeader& h, const Clocks& c);
// The CLOCK record stating `c`'s log clock (t1 = c.rt, t2 = c.boot); `boot` backs the payload.
storage::Record anchor_record(const Clocks& c, const uint64_t& boot);
// The CLOCK record that restates the newest anchor's offset (the header has one), at boot
// time `boot_ns`. Only the offset (t1 - t2) is read back, so any boot time this boot has
// seen will do: a caller passes the one it read last and saves a clock read.
storage::Record restatement(const index::IndexHeader& h, const uint64_t& boot, uint64_t boot_ns);
// The CLOCK record `r` at `at` (packed Pos): an anchor of this boot enters the header's
// anchors (none past kClockAnchors), unless it restates the newest one (a segment's opening
// record); another boot's changes nothing. apply_record()'s, for live calls and replay alike
// (replay after ack keeps anchors of its own in a private header the same way).
void note_anchor(index::IndexHeader& h, uint64_t at, const storage::RecordView& r);
// Forgets every anchor (a replay notes them again).
void clear_anchors(index::IndexHeader& h);
// `t`, a time a record at `at` stores, on the current log clock of `now`. Times of earlier
// boots and of logs without anchors are taken as wall-clock times.
uint64_t rebase(const index::IndexHeader& h, uint64_t at, uint64_t t, const Clocks& now);

// Replay's side: which boot wrote the records seen so far, and the keys of their times
// through the header's anchors (which replay's apply_record() enters, note_anchor()). Replay
// reports every CLOCK record in log order, after its anchor was noted.
class ReplayClock {
 public:
  ReplayClock(const index::IndexHeader& h, const Clocks& now) : h_(h), now_(now) {}
  void clock_record(const storage::RecordView& r);
  // Keys for the times of a record at `at`: a lease deadline, a ready-at time (MSG with
  // its enqueue time as t1, RELEASE with its write time or 0).
  uint64_t lease_key(uint64_t at, uint64_t t2) const;
  uint64_t ready_key(uint64_t at, uint64_t t1, uint64_t t2) const;
  // The key of `t`, the time a record at `at` was written (a MSG's enqueue time, a LEASE's
  // or RELEASE's write time, a CLOCK's t1): exact for this boot; for an earlier boot's, by
  // the wall clock, 0 if it lies before this boot, never after now.
  uint64_t time_key(uint64_t at, uint64_t t) const;
  // The same time on the wall clock as of now(): exact (now().real() less the boot time since)
  // for this boot's records, the stored time itself (at most now) for an earlier boot's.
  uint64_t time_wall(uint64_t at, uint64_t t) const;
  // When the record `r` at `at` was written, as time_key() (0: it stores no such time).
  // A new MSG stores its enqueue time, a LEASE or RELEASE its write time (0 in logs of
  // spool 0.1), a CLOCK its anchor; a compaction copy's MSG keeps the original's, and the
  // others (ACK, DEAD, PURGE, CHECKPOINT) store none.
  uint64_t written_key(uint64_t at, const storage::RecordView& r) const { return time_key(at, written(r)); }
  uint64_t written_wall(uint64_t at, const storage::RecordView& r) const {
    const uint64_t t = written(r);
    return t == 0 ? 0 : time_wall(at, t);
  }
  static uint64_t written(const storage::RecordView& r);
  const Clocks& now() const { return now_; }

 private:
  bool this_boot(uint64_t at) const;
  const index::IndexHeader& h_;
  Clocks now_;
  bool foreign_ = false;  // a CLOCK record of another boot was seen
};

}  // namespace spool::queue
