// The lease owners part of a queue handle (instant release on death, Queue::bind_leases):
// the handle's owner slot in the index header's registry and the descriptor that holds its
// liveness, an OFD lock on byte k of `DIR/owners`. A claimed slot whose byte nobody locks
// belongs to a dead process: its leases go back to ready (the store writes the records;
// this part says which slots are dead and frees them).
//
// The registry is the one part of the index the log cannot rebuild; it is checked, not
// trusted: a slot counts as held only while its byte is locked, and mend() derives the
// count from the slots after damage (kept, a damaged count would make every later lock
// report the index damaged and replay the log).
//
// Every function that takes `x` runs with its index lock held (REQUIRES(x)); the slot
// this handle holds is read and written only then.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "env/env.h"
#include "index/index.h"
#include "spool/status.h"
#include "sys/file_modes.h"
#include "sys/thread_annotations.h"

namespace spool::queue {

// How often lock holders look for dead lease owners (with Queue::Impl's kBoundWaitSliceNs,
// how late a dead worker's leases come back at most).
inline constexpr uint64_t kReapIntervalNs = 200'000'000;

class LeaseOwners {
 public:
  // What releasing dead slots' leases means (the store's records); called with the lock held.
  using Release = std::function<void(std::span<const uint32_t>)>;

  LeaseOwners(const std::string& dir, const sys::FileModes& modes) : dir_(dir), modes_(modes) {}
  ~LeaseOwners();
  LeaseOwners(const LeaseOwners&) = delete;
  LeaseOwners& operator=(const LeaseOwners&) = delete;

  // Claims a slot for this handle if it has none: a free one, or one whose owner died (its
  // leftover leases released first by `release`).
  Status claim(index::SharedIndex& x, const Release& release) REQUIRES(x);
  // From now on every lease this handle takes is bound (bind_leases()).
  void bind_all() { bind_all_.store(true, std::memory_order_relaxed); }
  // The owner tag a lease this handle takes now carries: its slot + 1 when it binds all
  // leases, else 0.
  uint8_t new_lease_tag(index::SharedIndex& x) const REQUIRES(x);
  // The tag of this handle's slot (claim() first).
  uint8_t tag(index::SharedIndex& x) const REQUIRES(x);

  // Frees slots `ks` in the registry (their leases were released).
  void free(index::SharedIndex& x, std::span<const uint32_t> ks) REQUIRES(x);
  // The slots claimed by processes that died, if a look is due (every kReapIntervalNs, or
  // now with `force`), else none, on `env`'s boot clock. Not this handle's own.
  std::vector<uint32_t> dead(index::SharedIndex& x, bool force, Env& env) REQUIRES(x);
  // After a rebuild: the count of claimed slots is derived from the slots again.
  static void mend(index::SharedIndex& x) REQUIRES(x);

  // Closing: this handle's slot (if it claimed one in this process) is released with its
  // leases; `release` as for claim(). Returns the slot released, or -1.
  int release_own(index::SharedIndex& x, const Release& release) REQUIRES(x);
  // True when this process claimed a slot with this handle (release_own() has work).
  bool claimed_here() const;

 private:
  Status open_fd();

  const std::string& dir_;
  const sys::FileModes& modes_;
  std::atomic<int> fd_{-1};  // DIR/owners; -1 in a fork child (closed at fork)
  int slot_ = -1;            // (index lock) this handle's slot, or -1
  pid_t pid_ = 0;            // the process that claimed slot_: a fork child's copy is not its claimant
  std::atomic<bool> bind_all_{false};
};

}  // namespace spool::queue
