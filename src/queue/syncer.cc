// Durability: syncing the log up to a position, group commit of concurrent waiters, the
// background flusher of the `interval` policy, and the per-call durability a caller asks
// for (docs/durability.md).
#include "queue/syncer.h"

#include <sched.h>

#include <chrono>
#include <climits>

#include "logging.h"
#include "sys/clock.h"
#include "sys/futex.h"

namespace spool::queue {
namespace {

using storage::Pos;

// How long a caller waiting for another's sync sleeps at most before it looks whether
// that leader died (a kill -9 mid-fdatasync costs the others this much).
constexpr uint64_t kSyncWaitSliceNs = 20'000'000;

void raise(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load();
  while (cur < v && !a.compare_exchange_weak(cur, v)) {
  }
}

}  // namespace

Status Syncer::sync_to(uint64_t end) {
  if (Status s = idx_.check_file(); !s.ok()) return s;  // it reads the header outside the lock
  auto& h = idx_.hdr();
  for (;;) {
    uint32_t seen = h.coord.durable_seq.load(std::memory_order_acquire);
    if (h.coord.durable_end.load(std::memory_order_acquire) >= end) return {};
    switch (h.coord.sync_mu.try_lock()) {
      case sys::RobustMutex::LockResult::kOk:
        break;
      case sys::RobustMutex::LockResult::kOwnerDied:
        h.coord.sync_mu.mark_consistent();  // durable_end only ever moves after a successful sync
        break;
      case sys::RobustMutex::LockResult::kBusy:
        // Sliced: a leader killed mid-sync never wakes anyone; try_lock then reports it.
        h.coord.durable_waiters.fetch_add(1);
        sys::futex_wait(&h.coord.durable_seq, seen, kSyncWaitSliceNs);
        h.coord.durable_waiters.fetch_sub(1);
        continue;
      case sys::RobustMutex::LockResult::kUnrecoverable:
      case sys::RobustMutex::LockResult::kError:
      case sys::RobustMutex::LockResult::kTimedOut:  // (try_lock never waits)
        return Status(Code::kIo, dir_ + ": cannot lock the sync mutex");
    }
    Status s;
    if (h.coord.durable_end.load(std::memory_order_acquire) < end) gather();
    // Everything published up to now rides along. sent_through is read first: it is
    // stored after log_end, so the target covers every id up to it. Every record below the
    // published end is in the page cache already (appends finish before they publish), so
    // the sync path never takes the index lock.
    uint64_t ids = h.coord.sent_through.load(std::memory_order_acquire);
    uint64_t target = std::max(end, __atomic_load_n(&h.cache.log_end, __ATOMIC_ACQUIRE));
    if (h.coord.durable_end.load(std::memory_order_acquire) < end) {
      const uint64_t t0 = sys::boot_ns();
      // From the durable end (after a rebuild, 0), but not from segments compaction removed.
      Pos from = Pos::unpack(h.coord.durable_end.load(std::memory_order_acquire));
      const uint64_t kept = __atomic_load_n(&h.disk.compacted_through, __ATOMIC_ACQUIRE) + 1;
      if (from.seq < kept) from = Pos{kept, 0};
      s = log_.sync_through(from, Pos::unpack(target));
      lead_crowd_ = h.coord.durable_waiters.load();
      lead_sync_ns_ = sys::boot_ns() - t0;
      if (s.ok()) {
        raise(h.coord.durable_end, target);
        raise(h.coord.durable_id, ids);
        h.coord.last_sync_ns.store(sys::boot_ns());
      }
    }
    // Bumped before the waiter count is read, and waiters count themselves before they
    // sleep on the old value: a waiter either is seen here or does not sleep.
    h.coord.durable_seq.fetch_add(1);
    h.coord.sync_mu.unlock();
    if (h.coord.durable_waiters.load() != 0) sys::futex_wake(&h.coord.durable_seq, INT_MAX);
    return s;
  }
}

void Syncer::gather() {
  if (lead_crowd_ == 0) return;
  const uint64_t budget = std::min<uint64_t>(lead_sync_ns_ / 4, 1'000'000);
  const uint64_t t0 = sys::boot_ns();
  while (idx_.hdr().coord.durable_waiters.load(std::memory_order_relaxed) < lead_crowd_ && sys::boot_ns() - t0 < budget) {
    ::sched_yield();  // (a 20 us nanosleep instead gathered fewer: 10-20% slower)
  }
}

Status Syncer::written(uint64_t end, Durability d) {
  if (d == Durability::kSync || opts_.sync == SyncPolicy::kAlways) return sync_to(end);
  if (opts_.sync != SyncPolicy::kInterval) return {};
  // Never inline: a caller that ran into the interval would pay a whole fdatasync
  // (milliseconds, the p99 of every call). The flusher thread syncs within one interval;
  // its failure is reported by every later write of this process (sticky, like the
  // segment's own fsync error).
  start_flusher();
  if (failed_.load(std::memory_order_relaxed)) {
    sys::MutexLock lock(mu_);
    return status_;
  }
  return {};
}

void Syncer::start_flusher() {
  // Every write of an `interval` queue comes here: after the first, without the mutex.
  if (started_.load(std::memory_order_acquire)) return;
  sys::MutexLock lock(mu_);
  if (flusher_.joinable() || stopping_) return;
  started_.store(true, std::memory_order_release);
  flusher_ = std::thread([this] {
    sys::MutexLock lk(mu_);
    // A pass follows the one before an interval after it ended, or at once when that pass
    // overran the interval (with small segments one pass syncs many files): a write is on
    // disk at most one interval plus two passes after it returned (docs/durability.md).
    // Starting every pass one interval after the last one started would bound the window by
    // one pass, but syncs more often under load, which slows end-to-end traffic.
    auto wait = opts_.sync_interval;
    while (!stopping_) {
      if (wait.count() > 0) cv_.wait_for(lk, wait);
      if (stopping_) break;
      const auto started = std::chrono::steady_clock::now();
      lk.unlock();
      if (!idx_.check_file().ok()) break;  // truncated by another process: lock() reports it
      uint64_t end = __atomic_load_n(&idx_.hdr().cache.log_end, __ATOMIC_ACQUIRE);
      Status s = sync_to(end);
      if (!s.ok()) spool::log().error("{}: {}", dir_, s.to_string());
      lk.lock();
      wait = std::chrono::steady_clock::now() - started >= opts_.sync_interval ? Millis(0) : opts_.sync_interval;
      if (!s.ok() && !failed_.load()) {
        status_ = Status(s.code(), "background sync failed: " + s.message());
        failed_.store(true);
      }
    }
  });
}

void Syncer::stop() {
  std::thread running;
  {
    sys::MutexLock lock(mu_);
    stopping_ = true;
    running = std::move(flusher_);
  }
  cv_.notify_all();
  if (running.joinable()) running.join();
}

}  // namespace spool::queue
