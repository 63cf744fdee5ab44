// Opening and recovery of a queue's index: the one lock path (which rebuilds the index
// after a dead lock holder or damage), replay of the log into an index, and the seal the
// last process to detach leaves (docs/durability.md, "First opener").
#include <sys/stat.h>

#include "queue/queue_impl.h"
#include "sys/lock_holders.h"

#include "queue/apply.h"

namespace spool {
namespace {

constexpr long kLockSliceNs = 100'000'000;  // how often a waiter for the index lock checks the file

}  // namespace

Queue::Impl::~Impl() {
  dlq.close();
  release_own_slot();
  background.stop();
  if (syncer) {
    syncer->stop();
    if (idx.attached() && idx.check_file().ok() && !read_only && cfg.opts.sync != SyncPolicy::kNever) {
      (void)syncer->sync_to(idx.hdr().cache.log_end);
    }
  }
  seal_if_last();
  if (lock_fd >= 0) ::close(lock_fd);
  if (gate_fd >= 0) ::close(gate_fd);
}

auto Queue::Impl::seal_if_last() -> void {
  if (read_only || !idx.attached() || lock_fd < 0 || gate_fd < 0 || env->parks()) return;
  // A gate held by a process that may not write the queue: the index stays unsealed (the
  // next opener checks it whole) rather than this close waiting for that process.
  struct stat dir_st {};
  if (::stat(dir.c_str(), &dir_st) != 0) return;
  if (Status s = sys::flock_waiting(gate_fd, LOCK_EX, dir + "/gate", dir_st); !s.ok()) {
    spool::log().warn("{}: index not sealed at close: {}", dir, s.to_string());
    return;
  }
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) == 0) {
    auto held = lock();
    if (held.ok()) {
      holds(*held);
      idx.seal();
    }
  }
  ::flock(gate_fd, LOCK_UN);
}

auto Queue::Impl::lock() -> Result<Locked> {
  // Before the lock word is touched: it is in the file, which another process may have
  // truncated (a page past the end of a file is a SIGBUS, which the guard turns into zeros
  // and a flag: SharedIndex::check_file_recent()).
  // A lost index is logged once: every later call fails the same way.
  auto lost = [this](Status s) {
    if (!told_lost.exchange(true)) spool::log().error("{}", s.message());
    return s;
  };
  if (Status s = idx.check_file_recent(); !s.ok()) return lost(s);
  auto& mu = idx.hdr().coord.mu;
  // In slices, checking the file between them: once another process cuts the file, the
  // holder's unlock goes to private zero pages (check_file()) and wakes nobody, so a waiter
  // asleep on the lock word's futex must notice the cut by itself.
  sys::RobustMutex::LockResult got;
  for (;;) {
    got = mu.lock_for(kLockSliceNs);
    if (got != sys::RobustMutex::LockResult::kTimedOut) break;
    if (Status s = idx.check_file(); !s.ok()) return lost(s);
  }
  switch (got) {
    case sys::RobustMutex::LockResult::kOk:
      break;
    case sys::RobustMutex::LockResult::kOwnerDied: {
      idx.assert_held();
      spool::log().warn("{}: a process died holding the index lock; rebuilding from the log", dir);
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
    case sys::RobustMutex::LockResult::kTimedOut:
      return Status(Code::kIo, dir + ": cannot lock the index");
  }
  idx.assert_held();  // kOk or kOwnerDied: every other case returned
  if (idx.faulted() || !idx.check_file_recent().ok()) {
    // The file was cut since the last check: the "lock" just taken is a private zero page.
    mu.unlock();
    return lost(idx.check_file());
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
    held.repaired_ = Status(Code::kCorrupt, idx.damage());
    if (Status s = repair_damage(); !s.ok()) return s;
  }
  if (idx.hdr().disk.compacted_through > forgotten_through) {
    // Another process removed old segments: let go of their mappings.
    forgotten_through = idx.hdr().disk.compacted_through;
    log->forget_below(forgotten_through + 1);
    tail_seen.reset();  // it may be one of them, after a roll
  }
  if (kTestHooks && env->parks()) env->park(ParkPoint::kInLock);
  return held;
}

Queue::Impl::Locked::~Locked() {
  if (impl_ == nullptr) return;
  // A use found a damaged value in the index (and did not follow it): rebuild it from
  // the log before anyone else sees it (SharedIndex, "Damage").
  if (!impl_->idx.damage().empty()) (void)impl_->repair_damage();
  // What this hold's commits made receivable, and any group member a removal let through,
  // is woken after the unlock: a consumer woken while the lock is still held runs straight
  // into it, sleeps on the mutex and has to be woken a second time by the unlock (two
  // context switches per message on the long-poll path). Waiters cannot miss the wake:
  // they read wake_seq under the lock before they sleep, and it is bumped only now.
  uint64_t woken = impl_->idx.promotions() - promotions_ + std::exchange(impl_->wake_pending, 0);
  // Long polls of every view sleep on view 0's wake_seq, and a MSG is receivable in each
  // active view: with subscriptions every sleeper is woken, else a subscription's poll
  // could sleep out its slice while the wakes went to view 0's pollers. Those with nothing
  // to take go back to sleep.
  if (woken != 0 && queue::any_subscription(impl_->idx)) woken = INT32_MAX;
  const bool room = std::exchange(impl_->room_pending, false);
  impl_->idx.hdr().coord.mu.unlock();
  if (woken != 0) impl_->wake(woken);
  if (room) impl_->room();
}

auto Queue::Impl::lock_to_change() -> Result<Locked> {
  auto held = lock();
  if (!held.ok()) return held;
  holds(*held);
  reap_dead_owners();
  // Here, where nobody holds a slot yet. On an error the region stays as it was.
  (void)idx.shrink();
  return held;
}

auto Queue::Impl::repair_damage() -> Status {
  const std::string why = idx.damage();
  spool::log().error("{}/index is damaged ({}); rebuilding it from the log", dir, why);
  idx.clear_damage();
  Status s = rebuild();
  if (s.ok() && !idx.damage().empty()) s = Status(Code::kCorrupt, idx.damage());
  idx.clear_damage();
  if (!s.ok()) {
    s = Status(s.code(), dir + "/index is damaged (" + why + ") and rebuilding it from the log failed: " + s.message());
    spool::log().error("{}", s.message());
  }
  return s;
}

auto Queue::Impl::rebuild() -> Status {
  struct Owned {
    uint64_t id;
    uint32_t count;
    uint16_t owner;
  };
  std::vector<Owned> owned;
  if (idx.hdr().registry.owners_claimed != 0 && idx.reusable() && idx.refresh().ok()) {
    idx.for_each_entry([&](uint32_t, uint64_t id, const Entry& e) {
      if (e.owner != 0 && e.owner <= index::kOwnerSlots && e.state == State::kLeased) {
        owned.push_back(Owned{id, e.count, e.owner});
      }
    });
  }
  if (Status s = replay(idx); !s.ok()) return s;
  idx.punch_tail();
  // What a lock holder killed in the middle of a store left after the end.
  if (!read_only) (void)log->clear_tail(Pos::unpack(idx.hdr().cache.log_end));
  uint64_t spare_bytes = 0;
  auto spares = log->count_spares(&spare_bytes);
  idx.hdr().disk.spares = spares.ok() ? *spares : 0;
  idx.hdr().disk.spare_bytes = spares.ok() ? spare_bytes : 0;
  queue::LeaseOwners::mend(idx);  // the registry is not the log's: made consistent, not rebuilt
  for (const Owned& o : owned) {
    int64_t slot = idx.find(o.id);
    if (slot < 0) continue;
    Entry& e = idx.entry(static_cast<uint32_t>(slot));
    if (e.state == State::kLeased && e.count == o.count) e.owner = o.owner;
  }
  return {};
}

auto Queue::Impl::replay(index::SharedIndex& x) -> Status {
  auto& h = x.hdr();
  ++h.layout.region_gen;  // forces every process (and us) to remap before the next access
  if (Status s = x.prepare_rebuild(); !s.ok()) return s;
  const Clocks now = queue::read_clocks(h, *env);  // (the log clock of the anchors before the rebuild)
  if (Status s = queue::clear_for_replay(x); !s.ok()) return s;
  queue::ReplayClock clock(h, now);
  queue::Copies copies;  // apply_record()'s unconfirmed compaction copies
  // Replay after ack: an ACK record stores no time; it is taken as the latest time of the
  // records before it (docs/semantics.md, "Replay after ack").
  const uint64_t keep_acked = ms_to_ns(cfg.opts.keep_acked);
  uint64_t latest = 0;
  Status failed;
  // Replay is a loop of apply: every effect of a record is apply_record()'s, as for the
  // live call that wrote it, the clock anchors included.
  replaying = true;
  auto rec = log->recover([&](Pos pos, const storage::RecordView& r) REQUIRES(x) {
    if (!failed.ok()) return;
    if (r.type == RecordType::kClock) {
      // Its anchor first: it dates the records from it on, itself included.
      clock.clock_record(r);
      (void)queue::apply_record(x, pos.pack(), r, queue::Keys{&clock, clock.now()});  // (cannot fail)
      if (keep_acked != 0) latest = std::max(latest, clock.written_key(pos.pack(), r));
      return;
    }
    if (keep_acked != 0) latest = std::max(latest, clock.written_key(pos.pack(), r));
    // The subscriptions' indexes are the queue's, replayed only with its own (verify replays
    // view 0 alone into a private index).
    const queue::Keys keys{&clock, clock.now(), keep_acked, latest, dedup_window_ns(), &copies,
                           &x == &idx ? &view_fn : nullptr};
    if (Status s = queue::apply_record(x, pos.pack(), r, keys); !s.ok()) failed = s;
  });
  replaying = false;
  if (!rec.ok()) return rec.status();
  if (!failed.ok()) return failed;
  h.cache.log_end = rec->end.pack();
  // Nothing is known to be durable: the next sync covers every segment compaction left
  // (a process that died may have rolled past segments it never synced; sync_to()).
  h.coord.durable_end.store(0);
  h.coord.durable_id.store(0);
  if (!rec->corrupt.empty()) {
    spool::log().error("{}: {} corrupt region(s) skipped while rebuilding the index", dir,
                  rec->corrupt.size());
  }
  return {};
}

auto Queue::Impl::log_ahead_of_index() -> bool {
  Pos end = Pos::unpack(idx.hdr().cache.log_end);
  auto seqs = log->segments();
  if (!seqs.ok() || seqs->empty()) return end.seq != 0;
  if (seqs->back() != end.seq) return true;
  auto seg = log->segment(end.seq);
  return !seg.ok() || (*seg)->record_at(end.off).has_value();
}

}  // namespace spool
