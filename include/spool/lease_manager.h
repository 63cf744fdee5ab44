// LeaseManager: keeps the leases of many received messages alive from one thread.
//
// A worker that holds many messages at once (a batch, a thread pool) adds each received
// message's receipt with the time its lease ends. One timer thread renews (Queue::extend)
// every lease that comes within `margin` of its end, to `extend_by` from then, until
//   - the worker acks, nacks or releases it through the manager (which forgets it);
//   - `max_lifetime` has passed since it was added: renewal stops and the lease runs out on
//     its own, so a hung task cannot hold a message forever (state kExpired);
//   - a renewal fails (kLeaseLost: another consumer has the message; state kLost): the
//     task should stop and not ack.
// A lease that stopped renewing stays known (status() reports it) until it is acked,
// nacked or released.
//
// Thread-safety: every method may be called from any thread. The Queue must outlive the
// manager. The destructor stops the timer thread and neither acks nor nacks anything (the
// leases it held run out on their own, or at once when bound and the process ends).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "spool/queue.h"

namespace spool {

class LeaseManager {
 public:
  using Clock = std::chrono::steady_clock;

  enum class LeaseState : uint8_t {
    kRenewing,  // held and renewed on time
    kLost,      // a renewal failed (LeaseInfo::error says why): stop the task, do not ack
    kExpired,   // max_lifetime passed: no longer renewed; the lease runs out on its own
  };

  struct LeaseInfo {
    LeaseState state = LeaseState::kRenewing;
    Status error;                  // kLost: the failed renewal's error; ok otherwise
    uint64_t renewals = 0;         // renewals that succeeded
    Clock::time_point lease_end;   // no earlier than this (as of the last renewal or add)
  };

  struct Options {
    // Each renewal extends the lease to end this long from now.
    Millis extend_by{30000};
    // A lease is renewed once it has this little left; 0 <= margin < extend_by. Leave room
    // for a renewal that is late by a busy machine (a third of extend_by, say).
    Millis margin{10000};
    // add() refuses (kInvalidArgument) a lease with less than this left: it could run out
    // before the first renewal.
    Millis min_remaining{1000};
    // How long after add() a lease is renewed at most; then kExpired.
    Millis max_lifetime{3600000};
    // add() binds each lease to this process (Queue::bind): if the process dies, its
    // messages are ready again at once. Where no owner slot is free, the leases still run
    // out on their own.
    bool bind = true;
    // Called on the timer thread, without the manager's lock, when a lease stops being
    // renewed on its own (kLost or kExpired). It may call this manager's methods (ack,
    // release, status), but must not destroy it. May be empty.
    std::function<void(const std::string& receipt, const LeaseInfo& info)> on_stop;
  };

  // Starts the timer thread. Bad options (extend_by <= 0, margin outside [0, extend_by),
  // min_remaining or max_lifetime < 0): kInvalidArgument naming the option.
  static Result<std::unique_ptr<LeaseManager>> start(Queue& queue, Options opts);
  ~LeaseManager();
  LeaseManager(const LeaseManager&) = delete;
  LeaseManager& operator=(const LeaseManager&) = delete;

  // Starts renewing the lease `receipt` names, which ends at `lease_end` (take the time
  // just before the receive call plus the visibility it used: the lease ends no earlier).
  // Errors: kInvalidArgument when less than min_remaining is left (the message names both)
  // or the receipt was added already; with `bind`, Queue::bind's: kInvalidArgument for a
  // malformed receipt, kLeaseLost / kNotFound when it no longer names the message's lease
  // (all owner slots taken is no error: the lease is renewed unbound).
  Status add(std::string receipt, Clock::time_point lease_end);

  // Forget the lease (waiting for a renewal of it in progress), then ack / nack it through
  // the Queue; the result is the Queue's. A receipt that was never added (or was released)
  // is still acked or nacked.
  Status ack(std::string_view receipt, Durability durability = Durability::kQueuePolicy);
  Status nack(std::string_view receipt, Millis delay = Millis{0});
  // Stops renewing the lease and forgets it, without acking or nacking; kNotFound if it is
  // not known. Returns once no renewal of it is in progress.
  Status release(std::string_view receipt);

  // Where the lease stands; kNotFound if it is not known (never added, acked, nacked,
  // released).
  Result<LeaseInfo> status(std::string_view receipt) const;
  // How many leases are known (renewing, lost or expired).
  size_t size() const;

 private:
  // The timer, the leases and their schedule (src/queue/lease_manager.cc); out of the
  // header so that they can change without changing the ABI.
  struct Impl;
  explicit LeaseManager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace spool
