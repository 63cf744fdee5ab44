// The durability part of a queue handle: group commit (syncing the log up to a position for
// every caller waiting on it, one fdatasync for many) and the background flusher of the
// `interval` policy (docs/durability.md). It owns its state; what it shares with other
// processes are the index header's durable marks and sync mutex.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <string>
#include <thread>

#include "index/index.h"
#include "spool/queue.h"
#include "storage/log.h"
#include "sys/mutex.h"
#include "sys/thread_annotations.h"

namespace spool::queue {

class Syncer {
 public:
  // `dir` names the queue in errors; `opts` gives the policy. All four outlive the Syncer.
  Syncer(const std::string& dir, const QueueOptions& opts, index::SharedIndex& idx, storage::Log& log)
      : dir_(dir), opts_(opts), idx_(idx), log_(log) {}
  ~Syncer() { stop(); }
  Syncer(const Syncer&) = delete;
  Syncer& operator=(const Syncer&) = delete;

  // Returns once everything up to `end` (a packed Pos) is on disk. One caller at a time (the
  // leader, holding sync_mu) syncs everything published so far; the others sleep on
  // durable_seq, are all woken at once when it is done, and return if that sync covered
  // them, or else one of them leads the next (not queued on sync_mu, which hands it over
  // one wake-up at a time: that chain of wake-ups costs as much as the fdatasync;
  // docs/performance.md).
  Status sync_to(uint64_t end);

  // After a write that ended at `end` returned: honour the sync policy, or sync now.
  Status written(uint64_t end, Durability d);

  // Ends the flusher (idempotent); the handle syncs nothing in the background from then on.
  void stop();

 private:
  // A leader's wait before it syncs (group commit's "commit delay"). Callers the last sync
  // did not cover are asleep here again within microseconds; those it covered are on their
  // way back with their next write, and on two cores that takes tens of microseconds
  // against an fdatasync's hundreds. Waiting until as many callers wait as did when this
  // handle's last sync ended (at most a quarter of that sync's time) lets one fdatasync
  // take them all. A leader whose last sync saw nobody waiting does not wait; callers that
  // arrive at random rather than in a loop may pay the whole budget on most syncs (the
  // price of any commit delay).
  void gather();
  // Bounds the loss window of "interval" when writes stop: a thread that syncs what this
  // process wrote once the interval has passed.
  void start_flusher();

  const std::string& dir_;
  const QueueOptions& opts_;
  index::SharedIndex& idx_;
  storage::Log& log_;

  // Touched only by the leader of a sync (it holds the header's sync_mu).
  uint32_t lead_crowd_ = 0;    // callers waiting when this handle's last sync as leader ended
  uint64_t lead_sync_ns_ = 0;  // and how long that sync took

  sys::Mutex mu_;
  std::thread flusher_ GUARDED_BY(mu_);
  std::atomic<bool> started_{false};  // set once, when the flusher starts
  std::condition_variable_any cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::atomic<bool> failed_{false};
  Status status_ GUARDED_BY(mu_);  // the flusher's first failure, reported by every later write
};

}  // namespace spool::queue
