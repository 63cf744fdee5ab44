// Durability: syncing the log up to a position, group commit of concurrent waiters, the
// background flusher of the `interval` policy, and the per-call durability a caller asks
// for (docs/durability.md).
#include "queue/queue_impl.h"

#include <chrono>

namespace spool {

auto Queue::Impl::sync_to(uint64_t end) -> Status {
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
        sys::futex_wait(&h.durable_seq, seen, kSyncWaitSliceNs);
        h.durable_waiters.fetch_sub(1);
        continue;
      case sys::RobustMutex::LockResult::kUnrecoverable:
      case sys::RobustMutex::LockResult::kError:
      case sys::RobustMutex::LockResult::kTimedOut:  // (try_lock never waits)
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
      // From the durable end (after a rebuild, 0), but not from segments compaction removed.
      Pos from = Pos::unpack(h.durable_end.load(std::memory_order_acquire));
      const uint64_t kept = __atomic_load_n(&h.compacted_through, __ATOMIC_ACQUIRE) + 1;
      if (from.seq < kept) from = Pos{kept, 0};
      s = log->sync_through(from, Pos::unpack(target));
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

auto Queue::Impl::gather() -> void {
  if (lead_crowd == 0) return;
  const uint64_t budget = std::min<uint64_t>(lead_sync_ns / 4, 1'000'000);
  const uint64_t t0 = sys::boot_ns();
  while (idx.hdr().durable_waiters.load(std::memory_order_relaxed) < lead_crowd && sys::boot_ns() - t0 < budget) {
    ::sched_yield();  // (a 20 us nanosleep instead gathered fewer: 10-20% slower)
  }
}

auto Queue::Impl::raise(std::atomic<uint64_t>& a, uint64_t v) -> void {
  uint64_t cur = a.load();
  while (cur < v && !a.compare_exchange_weak(cur, v)) {
  }
}

auto Queue::Impl::written(uint64_t end, Durability d) -> Status {
  maybe_compact(end);
  if (d == Durability::kSync || cfg.opts.sync == SyncPolicy::kAlways) return sync_to(end);
  if (cfg.opts.sync != SyncPolicy::kInterval) return {};
  // Never inline: a caller that ran into the interval would pay a whole fdatasync
  // (milliseconds, the p99 of every call). The flusher thread syncs within one interval;
  // its failure is reported by every later write of this process (sticky, like the
  // segment's own fsync error).
  start_flusher();
  if (flush_failed.load(std::memory_order_relaxed)) {
    sys::MutexLock lock(flush_mu);
    return flush_status;
  }
  return {};
}

auto Queue::Impl::start_flusher() -> void {
  // Every write of an `interval` queue comes here: after the first, without the mutex.
  if (flusher_started.load(std::memory_order_acquire)) return;
  sys::MutexLock lock(flush_mu);
  if (flusher.joinable() || stopping) return;
  flusher_started.store(true, std::memory_order_release);
  flusher = std::thread([this] {
    sys::MutexLock lk(flush_mu);
    // A pass follows the one before an interval after it ended, or at once when that pass
    // overran the interval (with small segments one pass syncs many files): a write is on
    // disk at most one interval plus two passes after it returned (docs/durability.md).
    // Starting every pass one interval after the last one started would bound the window by
    // one pass, but syncs more often under load, which slows end-to-end traffic.
    auto wait = cfg.opts.sync_interval;
    while (!stopping) {
      if (wait.count() > 0) flush_cv.wait_for(lk, wait);
      if (stopping) break;
      const auto started = std::chrono::steady_clock::now();
      lk.unlock();
      if (!idx.check_file().ok()) break;  // truncated by another process: lock() reports it
      uint64_t end = __atomic_load_n(&idx.hdr().log_end, __ATOMIC_ACQUIRE);
      Status s = sync_to(end);
      if (!s.ok()) spool::log().error("spool: {}: {}", dir, s.to_string());
      lk.lock();
      wait = std::chrono::steady_clock::now() - started >= cfg.opts.sync_interval ? Millis(0) : cfg.opts.sync_interval;
      if (!s.ok() && !flush_failed.load()) {
        flush_status = Status(s.code(), "background sync failed: " + s.message());
        flush_failed.store(true);
      }
    }
  });
}

}  // namespace spool
