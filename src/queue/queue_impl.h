// Internals of Queue shared by its modules (queue.cc: the API; compact.cc: compaction;
// verify.cc: fsck). Not a public header.
//
// Every state change follows one order, under the index lock: append the record to the log,
// then update the index, then (outside the lock) sync per policy. So a process that dies at
// any point leaves the log holding every change the index shows, and the repair after
// EOWNERDEAD is simply "rebuild the index from the log". There is no other write path:
// nothing is staged or deferred outside the log.
#pragma once

#include <dirent.h>
#include <spdlog/spdlog.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include "index/index.h"
#include "logging.h"
#include "queue/config.h"
#include "sys/crashpoint.h"
#include "spool/queue.h"
#include "storage/log.h"
#include "queue/log_clock.h"
#include "sys/clock.h"
#include "sys/file_modes.h"
#include "sys/futex.h"
#include "sys/ofd_lock.h"

namespace spool {

using format::RecordType;
using index::Entry;
using index::State;
using storage::Pos;
using storage::Record;

namespace detail {

inline constexpr uint64_t kMaxWaitSliceNs = 1'000'000'000;  // bounded futex waits (PITFALLS §1)
// How often lock holders look for dead lease owners, and how long a long poll sleeps at
// most while any process binds its leases: together they bound how late a dead worker's
// leases come back.
inline constexpr uint64_t kReapIntervalNs = 200'000'000;
inline constexpr uint64_t kBoundWaitSliceNs = 250'000'000;
// How long a caller waiting for another's sync sleeps at most before it looks whether
// that leader died (a kill -9 mid-fdatasync costs the others this much).
inline constexpr uint64_t kSyncWaitSliceNs = 20'000'000;

inline uint64_t ms_to_ns(Millis m) { return m.count() <= 0 ? 0 : static_cast<uint64_t>(m.count()) * 1'000'000ull; }

}  // namespace detail
using queue::Clocks;
using detail::ms_to_ns;
using detail::kMaxWaitSliceNs;
using detail::kReapIntervalNs;
using detail::kBoundWaitSliceNs;

struct Queue::Impl {
  std::string dir;
  bool opened = false;  // open() succeeded: the index and the log agree
  queue::Config cfg;
  bool read_only = false;
  std::unique_ptr<storage::Log> log;
  index::SharedIndex idx;
  // From the directory's mode at open: what each file spool creates gets (sys/file_modes.h).
  sys::FileModes modes;
  std::atomic<bool> told_lost{false};  // the lost index was logged
  int gate_fd = -1;
  int lock_fd = -1;
  pid_t opened_by = ::getpid();  // ~Queue leaves a fork child's inherited copy alone
  // Test hooks (crash tests): park inside the critical section, right after taking the
  // lock or right after a send's log append, until the named file is removed.
  std::string park_path;          // SPOOL_TEST_PARK_IN_LOCK (the first lock() after it is set)
  bool parked = false;
  std::string park_append_path;   // SPOOL_TEST_PARK_AFTER_APPEND

  std::mutex dlq_mu;
  std::unique_ptr<Queue> dlq;

  std::thread flusher;
  std::mutex flush_mu;
  std::condition_variable flush_cv;
  bool stopping = false;
  std::atomic<bool> flush_failed{false};
  Status flush_status;  // guarded by flush_mu

  // Instant release on death (bind_leases): this Queue's owner slot and the descriptor that
  // holds its liveness lock (or that probes others'; -1 in a fork child).
  std::atomic<int> owners_fd{-1};
  int owner_slot = -1;  // guarded by the index lock
  pid_t owner_pid = 0;
  std::atomic<bool> bind_all{false};

  ~Impl() {
    release_own_slot();
    stop_compactor();
    if (flusher.joinable()) {
      {
        std::lock_guard lock(flush_mu);
        stopping = true;
      }
      flush_cv.notify_all();
      flusher.join();
    }
    if (log && idx.attached() && idx.check_file().ok() && !read_only && cfg.opts.sync != SyncPolicy::kNever) {
      (void)sync_to(idx.hdr().log_end);
    }
    seal_if_last();
    if (lock_fd >= 0) ::close(lock_fd);
    if (gate_fd >= 0) ::close(gate_fd);
    sys::forget_in_fork_child(&owners_fd);
    if (int fd = owners_fd.exchange(-1); fd >= 0) ::close(fd);
  }

  // The last process to detach seals the index (docs/durability.md, "First opener"). The
  // gate keeps openers out meanwhile; holding `lock` exclusively proves nobody else is
  // attached. A process that dies instead leaves it unsealed, which only costs the next
  // opener the stronger check.
  void seal_if_last() {
    if (read_only || !idx.attached() || lock_fd < 0 || gate_fd < 0 || !park_path.empty()) return;
    if (::flock(gate_fd, LOCK_EX) != 0) return;
    if (::flock(lock_fd, LOCK_EX | LOCK_NB) == 0) {
      auto held = lock();
      if (held.ok()) idx.seal();
    }
    ::flock(gate_fd, LOCK_UN);
  }

  // ---- locking -------------------------------------------------------------------------

  class Locked {
   public:
    explicit Locked(Impl* impl) : impl_(impl) {}
    Locked(Locked&& o) noexcept : impl_(std::exchange(o.impl_, nullptr)) {}
    Locked& operator=(Locked&&) = delete;
    ~Locked() {
      if (impl_ == nullptr) return;
      // A use found a damaged value in the index (and did not follow it): rebuild it from
      // the log before anyone else sees it (SharedIndex, "Damage").
      if (!impl_->idx.damage().empty()) (void)impl_->repair_damage();
      impl_->idx.hdr().mu.unlock();
    }

   private:
    Impl* impl_;
  };

  // The one lock path. On EOWNERDEAD the index is rebuilt from the log before the mutex is
  // marked consistent; if that fails the mutex is left unrecoverable and every user gets a
  // clear error until the last process closes the queue and the next opener rebuilds.
  Result<Locked> lock() {
    // Before the lock word is touched: it is in the file, which another process may have
    // truncated (a page past the end of a file is a SIGBUS).
    if (Status s = idx.check_file(); !s.ok()) {
      if (!told_lost.exchange(true)) spool::log().error("spool: {}", s.message());  // once: every call fails so
      return s;
    }
    auto& mu = idx.hdr().mu;
    switch (mu.lock()) {
      case sys::RobustMutex::LockResult::kOk:
        break;
      case sys::RobustMutex::LockResult::kOwnerDied: {
        spool::log().warn("spool: {}: a process died holding the index lock; rebuilding from the log", dir);
        // It may have died creating a segment or a spare (both happen under this lock
        // only): its temp file would stay until the next first opener, which a queue with
        // long-lived processes never sees (the hour soak found 258 of them, 15.7 MB).
        log->remove_leftovers();
        Status s = rebuild();
        if (!s.ok()) {
          mu.unlock();
          return Status(s.code(), "repair after a dead lock holder failed: " + s.message());
        }
        mu.mark_consistent();
        break;
      }
      case sys::RobustMutex::LockResult::kUnrecoverable:
        return Status(Code::kCorrupt, dir + ": index lock is unrecoverable after a failed repair; "
                                            "close every process using the queue, then reopen");
      case sys::RobustMutex::LockResult::kError:
      case sys::RobustMutex::LockResult::kBusy:
        return Status(Code::kIo, dir + ": cannot lock the index");
    }
    Locked held(this);
    // Every value the index gives is checked before it is used (SharedIndex, "Damage"):
    // the header here, the rest at each use.
    if (Status s = idx.refresh(); !s.ok()) {
      idx.damaged(s.message());
    } else if (std::string bad = idx.check_header(); !bad.empty()) {
      idx.damaged(bad);
    }
    if (!idx.damage().empty()) {
      if (Status s = repair_damage(); !s.ok()) return s;
    }
    if (idx.hdr().compacted_through > forgotten_through) {
      // Another process removed old segments: let go of their mappings.
      forgotten_through = idx.hdr().compacted_through;
      log->forget_below(forgotten_through + 1);
    }
    reap_dead_owners();
    // Here, where nobody holds a slot yet. On an error the region stays as it was.
    (void)idx.shrink();
    // Once: a send may lock more than once (spares are made between two locks).
    if (!park_path.empty() && !parked) {
      parked = true;
      spool::park(park_path);
    }
    return held;
  }

  // ---- rebuild from the log (first opener, repair) -------------------------------------

  // The index holds a value a check refused (idx.damage()): rebuilt from the log. Lock held.
  Status repair_damage() {
    const std::string why = idx.damage();
    spool::log().error("spool: {}/index is damaged ({}); rebuilding it from the log", dir, why);
    last_repair = why;
    idx.clear_damage();
    Status s = rebuild();
    if (s.ok() && !idx.damage().empty()) s = Status(Code::kCorrupt, idx.damage());
    idx.clear_damage();
    if (!s.ok()) {
      s = Status(s.code(), dir + "/index is damaged (" + why + ") and rebuilding it from the log failed: " + s.message());
      spool::log().error("spool: {}", s.message());
    }
    return s;
  }
  std::string last_repair;  // what the last repair_damage() found (verify reports it); lock held

  // Replays the log into the shared index. Lease bindings (instant release on death) are
  // not in the log, so they are carried over from the old index for the leases it still
  // agrees on (same id, same delivery): above all those of the process whose death caused
  // this rebuild, which would otherwise wait out their timeouts. The old index is only
  // read where its header is sound (a dying grow can leave it inconsistent).
  Status rebuild() {
    struct Owned {
      uint64_t id;
      uint32_t count;
      uint16_t owner;
    };
    std::vector<Owned> owned;
    if (idx.hdr().owners_claimed != 0 && idx.reusable() && idx.refresh().ok()) {
      idx.for_each_entry([&](uint32_t, uint64_t id, const Entry& e) {
        if (e.owner != 0 && e.owner <= index::kOwnerSlots && e.state == State::kLeased) {
          owned.push_back(Owned{id, e.count, e.owner});
        }
      });
    }
    if (Status s = replay(idx); !s.ok()) return s;
    // What a lock holder killed in the middle of a store left after the end.
    if (!read_only) (void)log->clear_tail(Pos::unpack(idx.hdr().log_end));
    auto spares = log->count_spares();
    idx.hdr().spares = spares.ok() ? *spares : 0;
    for (const Owned& o : owned) {
      int64_t slot = idx.find(o.id);
      if (slot < 0) continue;
      Entry& e = idx.entry(static_cast<uint32_t>(slot));
      if (e.state == State::kLeased && e.count == o.count) e.owner = o.owner;
    }
    return {};
  }

  // Replay's removal of a message from `x`.
  static void drop(index::SharedIndex& x, int64_t slot) {
    x.hdr().bytes_live -= x.entry(static_cast<uint32_t>(slot)).len;
    x.erase(static_cast<uint32_t>(slot));
  }

  // Empties `x` and replays the whole log into it. Lock held (or `x` private).
  Status replay(index::SharedIndex& x) {
    auto& h = x.hdr();
    ++h.region_gen;  // forces every process (and us) to remap before the next access
    if (Status s = x.prepare_rebuild(); !s.ok()) return s;
    h.next_id = 1;
    if (Status s = x.reset(); !s.ok()) return s;
    x.dedup_clear();
    h.purged_through = 0;
    h.sent_total = h.acked_total = h.dead_total = h.expired_total = h.nacked_total = h.bytes_live = 0;
    queue::ReplayClock clock(h, queue::read_clocks(h));
    // Compaction copies of messages already in `x`, by id: not yet followed by a LEASE or
    // RELEASE record of that message (see kMsg below).
    std::unordered_map<uint64_t, uint64_t> unconfirmed_copies;
    auto confirm_copy = [&](uint64_t id, int64_t slot) {
      if (unconfirmed_copies.empty()) return;
      auto it = unconfirmed_copies.find(id);
      if (it == unconfirmed_copies.end()) return;
      if (slot >= 0) x.entry(static_cast<uint32_t>(slot)).loc = it->second;
      unconfirmed_copies.erase(it);
    };
    Status failed;
    auto rec = log->recover([&](Pos pos, const storage::RecordView& r) {
      if (!failed.ok()) return;
      if (r.type == RecordType::kClock) return clock.clock_record(pos.pack(), r);
      if (r.type != RecordType::kCheckpoint) h.next_id = std::max(h.next_id, r.id + 1);
      int64_t slot = r.type == RecordType::kMsg || r.type == RecordType::kPurge ||
                             r.type == RecordType::kCheckpoint
                         ? -1
                         : x.find(r.id);
      switch (r.type) {
        case RecordType::kMsg: {
          // Before the purge check: a dedup id outlives its message (docs/semantics.md).
          if (!r.ext.empty() && (r.flags & format::kFlagCopy) == 0) remember_dedup(x, pos, r, clock.now());
          if (r.id <= h.purged_through) return;
          if (int64_t have = x.find(r.id); have >= 0) {
            // A compaction copy of a live message: point at it, not at the original (the
            // original's segment is about to go, and a repair in the middle of a compaction
            // must not leave the index pointing into it) -- but only once a LEASE or RELEASE
            // record of the message follows the copy (the one compaction writes right after
            // it, or a later one). A compaction killed in the middle of its append can leave
            // a copy without that record (the batch torn between the two, or at a roll);
            // pointing at such a copy let the next compaction remove the original together
            // with every record of the message's receives, and the rebuild after that gave
            // the message receive count 0 again (RECEIVE_COUNT_REPEAT). Unconfirmed, the
            // index keeps the original, which nothing removes before the message is copied
            // again in full.
            if ((r.flags & format::kFlagCopy) != 0) unconfirmed_copies[r.id] = pos.pack();
            return;
          }
          Entry e{pos.pack(), static_cast<uint32_t>(r.payload.size()), 0, index::kNoPos, 0, State::kReady, 0};
          auto ins = x.insert(r.id, e, clock.ready_key(pos.pack(), r.t1, r.t2), clock.now().boot);
          if (!ins.ok()) failed = ins.status();
          if ((r.flags & format::kFlagCopy) == 0) ++h.sent_total;
          h.bytes_live += r.payload.size();
          return;
        }
        case RecordType::kLease:
          if (slot < 0) return;
          confirm_copy(r.id, slot);
          x.entry(slot).count = r.count;
          if (Status s = x.set(static_cast<uint32_t>(slot), State::kLeased, clock.lease_key(pos.pack(), r.t2)); !s.ok()) {
            failed = s;
          }
          return;
        case RecordType::kRelease:
          if ((r.flags & format::kFlagNack) != 0) ++h.nacked_total;
          if (slot < 0) return;
          confirm_copy(r.id, slot);
          x.entry(slot).count = r.count;
          if (Status s = x.set(static_cast<uint32_t>(slot), State::kReady, clock.ready_key(pos.pack(), r.t1, r.t2));
              !s.ok()) {
            failed = s;
          }
          return;
        case RecordType::kAck:
          ++((r.flags & format::kFlagExpired) != 0 ? h.expired_total : h.acked_total);
          confirm_copy(r.id, -1);
          if (slot >= 0) drop(x, slot);
          return;
        case RecordType::kDead:
          ++h.dead_total;
          confirm_copy(r.id, -1);
          if (slot >= 0) drop(x, slot);
          return;
        case RecordType::kPurge: {
          std::vector<uint64_t> ids;
          x.for_each_entry([&](uint32_t, uint64_t id, const Entry&) {
            if (id <= r.id) ids.push_back(id);
          });
          for (uint64_t id : ids) drop(x, x.find(id));
          h.purged_through = std::max(h.purged_through, r.id);
          return;
        }
        case RecordType::kClock:  // handled above
          return;
        case RecordType::kCheckpoint: {
          // Totals of everything before it, including compacted-away segments.
          auto cp = storage::decode_checkpoint(r.payload);
          if (!cp) return;
          h.sent_total = cp->sent_total;
          h.acked_total = cp->acked_total;
          h.dead_total = cp->dead_total;
          h.expired_total = cp->expired_total;
          h.nacked_total = cp->nacked_total;
          h.next_id = std::max(h.next_id, cp->next_id);
          if (cp->purged_through > h.purged_through) {
            // The PURGE itself may have been compacted away: apply it here.
            std::vector<uint64_t> ids;
            x.for_each_entry([&](uint32_t, uint64_t id, const Entry&) {
              if (id <= cp->purged_through) ids.push_back(id);
            });
            for (uint64_t id : ids) drop(x, x.find(id));
            h.purged_through = cp->purged_through;
          }
          return;
        }
      }
    });
    if (!rec.ok()) return rec.status();
    if (!failed.ok()) return failed;
    h.log_end = rec->end.pack();
    h.sent_through.store(h.next_id - 1, std::memory_order_release);
    h.durable_end.store(0);
    h.durable_id.store(0);
    if (!rec->corrupt.empty()) {
      spool::log().error("spool: {}: {} corrupt region(s) skipped while rebuilding the index", dir,
                    rec->corrupt.size());
    }
    return {};
  }

  // ---- deduplication (docs/semantics.md, "Deduplication") -------------------------------

  // The dedup part of applying a MSG record, for live sends and replay alike: a new message
  // (not a compaction copy) whose dedup id is still inside the window is remembered in the
  // index's dedup table. Lock held (or `x` private); a send reserved the room first.
  void remember_dedup(index::SharedIndex& x, Pos pos, const storage::RecordView& r, const Clocks& now);
  // The id of the message that carries `dedup_id` and was sent within the window, or 0.
  // Every hint of the table is confirmed against its record. Lock held.
  uint64_t find_dedup(std::string_view dedup_id, const Clocks& now);
  // The key (CLOCK_BOOTTIME) of the enqueue time `t1` of the MSG record at `at`; a time
  // after now (a wall clock that went back since an earlier boot) counts as now.
  static uint64_t enqueue_key(const index::SharedIndex& x, Pos at, uint64_t t1, const Clocks& now) {
    return std::min(now.boot, now.key(queue::rebase(x.hdr(), at.pack(), t1, now)));
  }
  uint64_t dedup_window_ns() const { return ms_to_ns(cfg.opts.dedup_window); }

  // True when the log holds records the index has not seen (the index is stale).
  bool log_ahead_of_index() {
    Pos end = Pos::unpack(idx.hdr().log_end);
    auto seqs = log->segments();
    if (!seqs.ok() || seqs->empty()) return end.seq != 0;
    if (seqs->back() != end.seq) return true;
    auto seg = log->segment(end.seq);
    return !seg.ok() || (*seg)->record_at(end.off).has_value();
  }

  // ---- durability ----------------------------------------------------------------------

  // Group commit. One caller at a time (the leader, holding sync_mu) syncs everything
  // published so far; the others sleep on durable_seq, are all woken at once when it is
  // done, and return if that sync covered them, or else one of them leads the next. They
  // used to queue on sync_mu itself, which hands it over one wake-up at a time: on this VM
  // that chain of wake-ups cost as much as the fdatasync, and 8 producers at kAlways got
  // 1.2x the messages of one (docs/performance.md).
  Status sync_to(uint64_t end) {
    if (Status s = idx.check_file(); !s.ok()) return s;  // it reads the header outside the lock
    auto& h = idx.hdr();
    for (;;) {
      uint32_t seen = h.durable_seq.load(std::memory_order_acquire);
      if (h.durable_end.load(std::memory_order_acquire) >= end) return {};
      switch (h.sync_mu.try_lock()) {
        case sys::RobustMutex::LockResult::kOk:
          break;
        case sys::RobustMutex::LockResult::kOwnerDied:
          h.sync_mu.mark_consistent();  // durable_end only ever moves after a successful sync
          break;
        case sys::RobustMutex::LockResult::kBusy:
          // Sliced: a leader killed mid-sync never wakes anyone; try_lock then reports it.
          h.durable_waiters.fetch_add(1);
          sys::futex_wait(&h.durable_seq, seen, detail::kSyncWaitSliceNs);
          h.durable_waiters.fetch_sub(1);
          continue;
        case sys::RobustMutex::LockResult::kUnrecoverable:
        case sys::RobustMutex::LockResult::kError:
          return Status(Code::kIo, dir + ": cannot lock the sync mutex");
      }
      Status s;
      if (h.durable_end.load(std::memory_order_acquire) < end) gather();
      // Everything published up to now rides along. sent_through is read first: it is
      // stored after log_end, so the target covers every id up to it. Every record below the
      // published end is in the page cache already (appends finish before they publish), so
      // the sync path never takes the index lock.
      uint64_t ids = h.sent_through.load(std::memory_order_acquire);
      uint64_t target = std::max(end, __atomic_load_n(&h.log_end, __ATOMIC_ACQUIRE));
      if (h.durable_end.load(std::memory_order_acquire) < end) {
        const uint64_t t0 = sys::boot_ns();
        s = log->sync(Pos::unpack(target).seq);
        lead_crowd = h.durable_waiters.load();
        lead_sync_ns = sys::boot_ns() - t0;
        if (s.ok()) {
          raise(h.durable_end, target);
          raise(h.durable_id, ids);
          h.last_sync_ns.store(sys::boot_ns());
        }
      }
      // Bumped before the waiter count is read, and waiters count themselves before they
      // sleep on the old value: a waiter either is seen here or does not sleep.
      h.durable_seq.fetch_add(1);
      h.sync_mu.unlock();
      if (h.durable_waiters.load() != 0) sys::futex_wake(&h.durable_seq, INT_MAX);
      return s;
    }
  }

  // A leader's wait before it syncs (group commit's "commit delay"). Callers the last sync
  // did not cover are asleep here again within microseconds; those it covered are on their
  // way back with their next write, and on two cores that takes tens of microseconds
  // against an fdatasync's hundreds. Waiting until as many callers wait as did when this
  // handle's last sync ended (at most a quarter of that sync's time) lets one fdatasync
  // take them all. A leader whose last sync saw nobody waiting does not wait; callers that
  // arrive at random rather than in a loop may pay the whole budget on most syncs (the
  // price of any commit delay).
  void gather() {
    if (lead_crowd == 0) return;
    const uint64_t budget = std::min<uint64_t>(lead_sync_ns / 4, 1'000'000);
    const uint64_t t0 = sys::boot_ns();
    while (idx.hdr().durable_waiters.load(std::memory_order_relaxed) < lead_crowd && sys::boot_ns() - t0 < budget) {
      ::sched_yield();  // (a 20 us nanosleep instead gathered fewer: 10-20% slower)
    }
  }
  uint32_t lead_crowd = 0;    // callers waiting when this handle's last sync as leader ended
  uint64_t lead_sync_ns = 0;  // and how long that sync took

  static void raise(std::atomic<uint64_t>& a, uint64_t v) {
    uint64_t cur = a.load();
    while (cur < v && !a.compare_exchange_weak(cur, v)) {
    }
  }

  // After a write returned by the lock holder: honour the sync policy (or sync now).
  Status written(uint64_t end, Durability d = Durability::kQueuePolicy) {
    maybe_compact(end);
    if (d == Durability::kSync) return sync_to(end);
    switch (cfg.opts.sync) {
      case SyncPolicy::kAlways:
        return sync_to(end);
      case SyncPolicy::kInterval:
        // Never inline: a caller that ran into the interval used to pay a whole fdatasync
        // (milliseconds; the p99 of every call). The flusher thread syncs within one interval;
        // its failure is reported by every later write of this process (sticky, like
        // the segment's own fsync error).
        start_flusher();
        if (flush_failed.load(std::memory_order_relaxed)) {
          std::lock_guard lock(flush_mu);
          return flush_status;
        }
        return {};
      case SyncPolicy::kNever:
        return {};
    }
    return {};
  }

  // Bounds the loss window of "interval" when writes stop: a thread that syncs what this
  // process wrote once the interval has passed.
  void start_flusher() {
    std::lock_guard lock(flush_mu);
    if (flusher.joinable() || stopping) return;
    flusher = std::thread([this] {
      std::unique_lock lk(flush_mu);
      while (!stopping) {
        flush_cv.wait_for(lk, cfg.opts.sync_interval);
        if (stopping) break;
        lk.unlock();
        if (!idx.check_file().ok()) break;  // truncated by another process: lock() reports it
        uint64_t end = __atomic_load_n(&idx.hdr().log_end, __ATOMIC_ACQUIRE);
        Status s = sync_to(end);
        if (!s.ok()) spool::log().error("spool: {}: {}", dir, s.to_string());
        lk.lock();
        if (!s.ok() && !flush_failed.load()) {
          flush_status = Status(s.code(), "background sync failed: " + s.message());
          flush_failed.store(true);
        }
      }
    });
  }

  // ---- helpers -------------------------------------------------------------------------

  Status writable() const {
    if (read_only) return Status(Code::kReadOnly, dir + ": read-only (no write permission on the queue)");
    return {};
  }

  // "ID.GEN.TAG": the message, its delivery (the fence), and the low 32 bits of the queue's
  // uid in 8 hex digits. Formatted and parsed with to_chars/from_chars: sscanf was 2% of an
  // e2e profile.
  std::string receipt(uint64_t id, uint32_t gen) const {
    char buf[48];
    char* p = std::to_chars(buf, buf + 20, id).ptr;
    *p++ = '.';
    p = std::to_chars(p, p + 10, gen).ptr;
    *p++ = '.';
    static constexpr char kHex[] = "0123456789abcdef";
    uint32_t tag = static_cast<uint32_t>(cfg.uid);
    for (int shift = 28; shift >= 0; shift -= 4) *p++ = kHex[(tag >> shift) & 0xf];
    return std::string(buf, p);
  }

  Result<std::pair<uint64_t, uint32_t>> parse_receipt(std::string_view r) const {
    auto malformed = [&] {
      return Status(Code::kInvalidArgument,
                    "malformed receipt '" + std::string(r) + "' (expected ID.GEN.TAG as printed by receive)");
    };
    uint64_t id = 0;
    uint32_t gen = 0, tag = 0;
    const char* p = r.data();
    const char* end = r.data() + r.size();
    auto num = [&](auto& out, int base) {
      if (p == end || *p == '+' || *p == '-') return false;
      auto res = std::from_chars(p, end, out, base);
      if (res.ec != std::errc()) return false;
      p = res.ptr;
      return true;
    };
    auto dot = [&] { return p != end && *p++ == '.'; };
    const char* tag_start = nullptr;
    if (!num(id, 10) || !dot() || !num(gen, 10) || !dot() || (tag_start = p, !num(tag, 16)) || p != end ||
        p - tag_start > 8 || id == 0 || gen == 0) {
      return malformed();
    }
    if (tag != static_cast<uint32_t>(cfg.uid)) {
      return Status(Code::kInvalidArgument, "receipt '" + std::string(r) + "' belongs to another queue than " + dir);
    }
    return std::make_pair(id, gen);
  }

  // Finds the entry a receipt names and checks its fence. Lock held.
  Result<uint32_t> fenced(uint64_t id, uint32_t gen) {
    int64_t slot = idx.find(id);
    if (slot < 0) {
      return Status(Code::kNotFound, "message " + std::to_string(id) +
                                         " is not in the queue (already acked, dead-lettered or purged)");
    }
    const Entry& e = idx.entry(static_cast<uint32_t>(slot));
    if (e.count != gen) {
      return Status(Code::kLeaseLost,
                    "lease lost: message " + std::to_string(id) + " was received again (delivery " +
                        std::to_string(e.count) + "; this receipt is for delivery " +
                        std::to_string(gen) + ")");
    }
    return static_cast<uint32_t>(slot);
  }

  // Appends at the log end and publishes the new end. Lock held.
  Result<storage::AppendResult> append_all(std::span<const Record> recs) {
    auto& h = idx.hdr();
    if (Status s = log->check_end(Pos::unpack(h.log_end)); !s.ok()) {
      idx.damaged(s.message());  // rebuilt before the unlock
      return Status(Code::kCorrupt, dir + "/index is damaged: " + s.message() + "; it is rebuilt from the log, try again");
    }
    // Every segment opens with a CLOCK record restating the log clock (queue/log_clock.h).
    const uint64_t boot = queue::boot_hash();
    std::optional<Record> opener;
    if (!read_only && h.clock_n != 0) opener = queue::restatement(h, boot);
    auto res = log->append(Pos::unpack(h.log_end), recs, h.next_id, opener ? &*opener : nullptr);
    if (!res.ok()) return res.status();
    h.spares -= std::min<uint64_t>(h.spares, res->spares_used);
    __atomic_store_n(&h.log_end, res->end.pack(), __ATOMIC_RELEASE);
    return res;
  }
  Result<Pos> append(std::span<const Record> recs) {
    auto res = append_all(recs);
    if (!res.ok()) return res.status();
    return res->at.empty() ? res->end : res->at.front();
  }

  // The clocks for the records written under this hold of the lock. A CLOCK record goes
  // first when a new anchor is due (queue/log_clock.h). If it cannot be written the log
  // clock keeps its offset: exact for this boot still, only further from the wall clock.
  Clocks clocks() {
    auto& h = idx.hdr();
    Clocks c = queue::read_clocks(h);
    if (read_only || !queue::anchor_due(h, c)) return c;
    Clocks next = c;
    next.rt = next.real;
    const uint64_t boot = queue::boot_hash();
    Record r = queue::anchor_record(next, boot);
    auto at = append(std::span(&r, 1));
    if (!at.ok()) {
      spool::log().warn("spool: {}: cannot write a clock record: {}", dir, at.status().to_string());
      return c;
    }
    queue::add_anchor(h, at->pack(), next.rt - next.boot);
    return next;
  }

  // PRODUCT.md §4: a full disk must not stop a queue from draining. Every queued message
  // keeps room, in the active segment and in spare segments, for the two control records
  // that drain it (LEASE, ACK), plus a checkpoint for compaction. Before a send or a
  // compaction copy writes `bytes` of records that would eat into that room, more spares
  // are preallocated; when the disk cannot give one, the write fails with kNoSpace and the
  // room stays for the drain. (Nacks, extends and expiries are not reserved for.)
  // How many spares short of that room the queue is. Lock held.
  uint64_t spares_short(uint64_t new_msgs, uint64_t bytes) {
    constexpr uint64_t kDrainBytesPerMsg = 2 * format::kRecordHeaderSize;
    constexpr uint64_t kSlack = 4096;
    auto& h = idx.hdr();
    const uint64_t seg = cfg.opts.segment_size;
    const uint64_t cap = seg - format::kSegmentHeaderSize;
    Pos end = Pos::unpack(h.log_end);
    // A spare beyond the last segment number a position can hold is never rolled into.
    const uint64_t numbers_left = storage::kMaxSegmentSeq - std::min(end.seq, storage::kMaxSegmentSeq);
    uint64_t usable = std::min(h.spares, numbers_left);
    uint64_t room = (end.seq == 0 ? 0 : seg - std::min(seg, end.off)) + usable * cap;
    // Twice the records: a roll wastes the tail of a segment the next record does not fit.
    uint64_t need = (h.count + new_msgs) * kDrainBytesPerMsg + 2 * bytes + kSlack;
    if (room >= need) return 0;
    const uint64_t short_by = (need - room + cap - 1) / cap;
    return short_by > numbers_left - usable ? kNoSegmentNumbers : short_by;
  }
  // spares_short(): no number of spares would do, the log has used every segment number.
  static constexpr uint64_t kNoSegmentNumbers = UINT64_MAX;
  // Makes `n` spares. Without the lock (a send's: each spare is a large fallocate and two
  // syncs, which nothing under the index lock may wait for), each is counted under a short
  // lock of its own once it is on disk; with `locked` (compaction's copies), under the lock
  // the caller holds.
  Status make_spares(uint64_t n, bool locked) {
    if (n == kNoSegmentNumbers) {
      return Status(Code::kNoSpace, dir + ": the log has used every segment number (1 to " +
                                        std::to_string(storage::kMaxSegmentSeq) +
                                        "); the room left is kept so that the queued messages can still be received "
                                        "and acked. Drain the queue into a new one (a larger segment_size makes the "
                                        "limit further away)");
    }
    for (; n > 0; --n) {
      if (Status s = log->make_spare(); !s.ok()) {
        std::optional<Result<Locked>> held;
        if (!locked) held.emplace(lock());  // the count is read under the lock
        return Status(s.code(), s.message() + "; the space left is kept so that the " +
                                    std::to_string(idx.hdr().count) + " queued messages can still be received and acked");
      }
      if (locked) {
        ++idx.hdr().spares;
      } else {
        auto held = lock();
        if (!held.ok()) return held.status();
        ++idx.hdr().spares;
      }
    }
    return {};
  }
  // Lock held.
  Status ensure_room(uint64_t new_msgs, uint64_t bytes) { return make_spares(spares_short(new_msgs, bytes), true); }

  // `n` messages just became receivable: wake as many long-pollers, not all of them (a
  // thundering herd cost ~2 context switches per waiter per message). A woken waiter that
  // dies before receiving only delays the message to another waiter's next wait slice.
  void wake(uint64_t n) {
    auto& h = idx.hdr();
    h.wake_seq.fetch_add(1, std::memory_order_release);
    if (h.waiters.load(std::memory_order_acquire) > 0) {
      sys::futex_wake(&h.wake_seq, static_cast<int>(std::min<uint64_t>(n, INT32_MAX)));
    }
  }

  // Consumers made room in a queue with back-pressure limits: wake every sender waiting for
  // room (each rechecks the limits under the lock).
  void room() {
    if (cfg.opts.max_ready == 0 && cfg.opts.max_bytes == 0) return;
    auto& h = idx.hdr();
    h.room_seq.fetch_add(1, std::memory_order_release);
    if (h.room_waiters.load(std::memory_order_acquire) > 0) sys::futex_wake(&h.room_seq, INT32_MAX);
  }

  // Why a send of `n` messages / `bytes` payload bytes does not fit now; "" if it does.
  // Lock held.
  std::string full_reason(uint64_t n, uint64_t bytes) {
    auto& h = idx.hdr();
    const auto& o = cfg.opts;
    uint64_t waiting = h.count - h.leased;
    if (o.max_ready != 0 && waiting + n > o.max_ready) {
      return std::to_string(waiting) + " messages waiting, max_ready is " + std::to_string(o.max_ready);
    }
    if (o.max_bytes != 0 && h.bytes_live + bytes > o.max_bytes) {
      return std::to_string(h.bytes_live) + " bytes queued, max_bytes is " + std::to_string(o.max_bytes);
    }
    return "";
  }

  // ---- lease owners (instant release on death) ------------------------------------------

  Status open_owners() {
    if (owners_fd.load() >= 0) return {};
    int fd = sys::open_state_file(dir + "/owners", modes);
    if (fd < 0) return errno_status(errno, "open " + dir + "/owners");
    int none = -1;
    if (!owners_fd.compare_exchange_strong(none, fd)) {
      ::close(fd);
    } else if (!sys::close_in_fork_child(&owners_fd)) {
      spool::log().warn("spool: {}: too many open queues to guard their liveness locks across fork()", dir);
    }
    return {};
  }

  // Claims an owner slot for this Queue (lock held): a free one, or one whose owner died
  // (its leftover leases are released first).
  Status claim_owner_slot() {
    if (owner_slot >= 0) return {};
    if (Status s = open_owners(); !s.ok()) return s;
    auto& h = idx.hdr();
    int fd = owners_fd.load();
    for (uint32_t k = 0; k < index::kOwnerSlots; ++k) {
      if (h.owner_claimed[k] != 0 && sys::ofd_held_elsewhere(fd, k)) continue;
      if (sys::ofd_trylock(fd, k) != 0) continue;
      if (h.owner_claimed[k] != 0) release_owned(std::span(&k, 1));
      h.owner_claimed[k] = 1;
      ++h.owners_claimed;
      owner_slot = static_cast<int>(k);
      owner_pid = ::getpid();
      return {};
    }
    return Status(Code::kQueueFull, dir + ": " + std::to_string(index::kOwnerSlots) +
                                        " processes already bind their leases; this one cannot");
  }

  // Returns the leases bound to the owner slots `ks` to ready now and frees the slots (lock
  // held). Leases that already ran out only lose their tag.
  void release_owned(std::span<const uint32_t> ks) {
    auto& h = idx.hdr();
    bool mine[index::kOwnerSlots + 1] = {};
    for (uint32_t k : ks) mine[k + 1] = true;
    Clocks now = clocks();
    std::vector<uint32_t> victims;
    idx.for_each_entry([&](uint32_t s, uint64_t, Entry& e) {
      if (e.owner == 0 || e.owner > index::kOwnerSlots || !mine[e.owner]) return;
      if (e.state == State::kLeased && idx.key(s) > now.boot) {
        victims.push_back(s);
      } else {
        e.owner = 0;
      }
    });
    if (!victims.empty()) {
      std::vector<Record> recs;
      for (uint32_t s : victims) {
        const Entry& e = idx.entry(s);
        recs.push_back(Record{RecordType::kRelease, e.count, idx.id_of(s), now.rt, now.rt, {}});
      }
      bool logged = append(recs).ok();  // if not, the leases simply run out as usual
      for (uint32_t s : victims) {
        Entry& e = idx.entry(s);
        e.owner = 0;
        if (!logged) continue;
        (void)idx.set(s, State::kReady, now.boot);  // leased: in the heap already, no remap
      }
      if (logged) wake(victims.size());
      spool::log().info("spool: {}: released {} lease(s) of a process that is gone", dir, victims.size());
    }
    for (uint32_t k : ks) {
      if (h.owner_claimed[k] == 0) continue;
      h.owner_claimed[k] = 0;
      --h.owners_claimed;
    }
  }

  // Lock held: every kReapIntervalNs, release the leases of binders that died.
  void reap_dead_owners() {
    auto& h = idx.hdr();
    if (h.owners_claimed == 0 || read_only) return;
    uint64_t t = sys::boot_ns();
    if (t < h.next_reap_ns) return;
    h.next_reap_ns = t + kReapIntervalNs;
    if (!open_owners().ok()) return;
    int fd = owners_fd.load();
    std::vector<uint32_t> dead;
    for (uint32_t k = 0; k < index::kOwnerSlots; ++k) {
      if (h.owner_claimed[k] != 0 && static_cast<int>(k) != owner_slot && !sys::ofd_held_elsewhere(fd, k)) {
        dead.push_back(k);
      }
    }
    if (!dead.empty()) release_owned(dead);
  }

  // A Queue closed by its process releases its bound leases like a death would.
  void release_own_slot() {
    if (owner_slot < 0 || owner_pid != ::getpid() || owners_fd.load() < 0) return;
    {
      auto held = lock();
      if (held.ok()) {
        uint32_t k = static_cast<uint32_t>(owner_slot);
        release_owned(std::span(&k, 1));
      }
    }
    sys::ofd_unlock(owners_fd.load(), static_cast<uint32_t>(owner_slot));
    owner_slot = -1;
  }

  // A payload left in the mapped segment (zero-copy receive): the view, and the segment
  // kept mapped for as long as the view is used (compaction may unlink the file meanwhile;
  // the mapping stays valid, as the file is never truncated).
  struct Mapped {
    std::shared_ptr<storage::Segment> keep;
    std::string_view view;
  };

  // The message in `slot`, its payload copied, or with `mapped` left in the segment.
  // `now`: the clocks of the caller's lock hold (read here if null); *age_ns: how long ago
  // the message was sent, on the boot clock.
  Result<Message> load(uint32_t slot, Mapped* mapped = nullptr, const Clocks* now = nullptr, uint64_t* age_ns = nullptr) {
    const Entry& e = idx.entry(slot);
    const uint64_t id = idx.id_of(slot);
    std::shared_ptr<storage::Segment> keep;
    auto r = log->read(Pos::unpack(e.loc), &keep);
    if (!r.ok()) {
      // A record the index points at is gone or damaged: the rebuild before the unlock
      // drops it (or finds the message's record elsewhere), so receives move past it.
      idx.damaged("the record of message " + std::to_string(id) + ": " + r.status().message());
      return r.status();
    }
    if (r->id != id || r->type != RecordType::kMsg) {
      idx.damaged("message " + std::to_string(id) + " points at the record of another");  // rebuilt before the unlock
      return Status(Code::kCorrupt, "index points at the wrong record for message " + std::to_string(id));
    }
    Message m;
    m.id = id;
    if (!r->ext.empty()) {
      auto ext = storage::decode_ext(r->ext);
      if (!ext.ok()) {
        return Status(Code::kCorrupt, "message " + std::to_string(id) + " (" + log->segment_path(Pos::unpack(e.loc).seq) +
                                          "): " + ext.status().message());
      }
      m.attributes.insert(ext->attributes.begin(), ext->attributes.end());
    }
    if (mapped != nullptr) {
      mapped->view = r->payload;
      mapped->keep = std::move(keep);
    } else {
      m.payload.assign(r->payload);
    }
    m.receive_count = e.count;
    // The wall clock of the send as of now: the record's time, converted to this boot's
    // clock and back, so that a wall-clock step since moves it along.
    const Clocks c = now != nullptr ? *now : queue::read_clocks(idx.hdr());
    const uint64_t age = c.boot - enqueue_key(idx, Pos::unpack(e.loc), r->t1, c);
    if (age_ns != nullptr) *age_ns = age;
    m.enqueued = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::nanoseconds(c.real - age)));
    return m;
  }

  // Compaction (compact.cc): every sealed segment with `everything`, else by policy;
  // waits for a running compaction with `wait`, else returns at once.
  Result<CompactResult> compact(bool everything, bool wait, const Progress& progress = {});

  // Called after a write that may have rolled the log. A roll asks the process's compactor
  // thread to compact by policy, so no send or ack waits for a compaction.
  void maybe_compact(uint64_t end) {
    uint64_t seq = Pos::unpack(end).seq;
    if (seq <= seen_seq.exchange(seq)) return;
    if (!seen_seq_initialised.exchange(true)) return;  // the first write only sets the mark
    std::lock_guard lock(compact_mu);
    if (compact_stopping) return;
    compact_wanted = true;
    if (!compactor.joinable()) {
      compactor = std::thread([this] {
        std::unique_lock lk(compact_mu);
        for (;;) {
          compact_cv.wait(lk, [this] { return compact_wanted || compact_stopping; });
          if (compact_stopping) return;
          compact_wanted = false;
          lk.unlock();
          auto r = compact(false, false);
          if (!r.ok()) spool::log().warn("spool: {}: compaction: {}", dir, r.status().to_string());
          lk.lock();
        }
      });
    }
    compact_cv.notify_all();
  }
  void stop_compactor() {
    {
      std::lock_guard lock(compact_mu);
      compact_stopping = true;
    }
    compact_cv.notify_all();
    if (compactor.joinable()) compactor.join();
  }
  std::atomic<uint64_t> seen_seq{0};
  std::atomic<bool> seen_seq_initialised{false};
  std::thread compactor;
  std::mutex compact_mu;
  std::condition_variable compact_cv;
  bool compact_wanted = false;    // guarded by compact_mu
  bool compact_stopping = false;  // guarded by compact_mu
  uint64_t forgotten_through = 0;  // segments <= this dropped from the log's cache

  // Takes the receivable message in `slot` (lock held). A message past max_receives goes to
  // the dead-letter queue (nullopt); one whose record cannot be read is kCorrupt (the index
  // is rebuilt before the unlock); otherwise it is leased in the index and returned, and
  // the caller logs the lease with log_leases().
  Result<std::optional<Message>> take(uint32_t slot, const Clocks& now, uint64_t vis, uint64_t* end,
                                      Mapped* mapped = nullptr) {
    auto& h = idx.hdr();
    const uint64_t id = idx.id_of(slot);
    uint64_t age = 0;
    auto msg = load(slot, mapped, &now, &age);
    if (msg.ok() && cfg.opts.retention_max_age.count() > 0 && age > ms_to_ns(cfg.opts.retention_max_age)) {
      if (Status s = expire(slot); !s.ok()) return s;
      *end = h.log_end;
      return std::optional<Message>();
    }
    if (!msg.ok()) {
      // load() recorded this as damage of the index, which the rebuild from the log before
      // this call unlocks mends: the message is back if its record is intact (the index
      // pointed wrong), gone if the damage destroyed it. No DEAD record: that dropped intact
      // messages whose index entry had been overwritten (tests/damage_campaign_test.cc).
      return Status(Code::kCorrupt, "message " + std::to_string(id) + " could not be read (" + msg.status().message() +
                                        "); the index is rebuilt from the log, try again");
    }
    Entry& e = idx.entry(slot);
    if (cfg.opts.max_receives != 0 && e.count >= cfg.opts.max_receives) {
      std::string body = mapped != nullptr ? std::string(mapped->view) : std::move(msg->payload);
      auto dead_q = dead_letters();
      if (!dead_q.ok()) return dead_q.status();
      // The attributes go with it; the dedup id does not (the DLQ is no new send).
      SendOptions keep;
      keep.attributes = std::move(msg->attributes);
      if (auto sent = (*dead_q)->send(body, keep); !sent.ok()) return sent.status();
      crashpoint("dead_letter.after_send");  // in the DLQ, not yet DEAD here: a duplicate, never a loss
      Record dead{RecordType::kDead, e.count, id, 0, 0, {}};
      auto at = append(std::span(&dead, 1));
      if (!at.ok()) return at.status();
      h.bytes_live -= e.len;
      ++h.dead_total;
      idx.erase(slot);
      room();
      *end = h.log_end;
      return std::optional<Message>();
    }
    if (e.state != State::kLeased) room();  // leased ones do not count against max_ready
    e.owner = bind_all.load(std::memory_order_relaxed) ? static_cast<uint8_t>(owner_slot + 1) : 0;
    const uint32_t count = ++e.count;
    // The caller reserved heap room for every message it takes: set() cannot remap.
    if (Status s = idx.set(slot, State::kLeased, now.boot + vis); !s.ok()) return s;
    msg->receive_count = count;
    msg->receipt = receipt(id, count);
    return std::optional<Message>(std::move(*msg));
  }

  // Drops the message in `slot` for a retention limit: an ACK record flagged EXPIRED, so
  // the drop is durable and counted apart from consumer acks (lock held).
  Status expire(uint32_t slot) {
    auto& h = idx.hdr();
    Entry& e = idx.entry(slot);
    const uint64_t id = idx.id_of(slot);
    Record rec{RecordType::kAck, e.count, id, 0, 0, {}, format::kFlagExpired};
    auto at = append(std::span(&rec, 1));
    if (!at.ok()) return at.status();
    spool::log().warn("spool: {}: retention limit dropped message {} ({} bytes)", dir, id, e.len);
    h.bytes_live -= e.len;
    ++h.expired_total;
    idx.erase(slot);
    room();
    return {};
  }

  // Logs the leases of messages just taken (lock held), in one append. If it fails the
  // index is rebuilt from the log, which undoes the leases. *end is the log end to honour
  // the sync policy for.
  Status log_leases(const std::vector<Message>& taken, const Clocks& now, uint64_t vis, uint64_t* end) {
    if (taken.empty()) return {};
    std::vector<Record> recs;
    recs.reserve(taken.size());
    for (const auto& m : taken) recs.push_back(Record{RecordType::kLease, m.receive_count, m.id, now.rt, now.rt + vis, {}});
    auto at = append(recs);
    if (!at.ok()) {
      (void)rebuild();
      return at.status();
    }
    *end = idx.hdr().log_end;
    return {};
  }

  Result<Queue*> dead_letters() {
    std::lock_guard lock(dlq_mu);
    if (!dlq) {
      QueueOptions o = cfg.opts;
      o.max_receives = 0;
      o.create = !read_only;
      o.mode = modes.data;  // shared as the queue is; the group comes with set-group-ID
      auto q = Queue::open(dir + "/dlq", o);
      if (!q.ok()) return q.status();
      dlq = std::move(q).value();
    }
    return dlq.get();
  }
};

}  // namespace spool
