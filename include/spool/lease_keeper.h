// LeaseKeeper: keeps one message's lease alive while a long task runs.
//
// Every `interval` it extends the lease to `extend_by` from now, until it is stopped or
// destroyed, until `max_lifetime` has passed since it started (then it stops renewing and
// the lease runs out on its own, so a hung task cannot hold a message forever), or until a
// renewal fails (lease lost: another consumer has the message; the task should stop).
// Choose interval well below extend_by, so that a renewal delayed by one interval still
// lands before the lease ends (an interval not below extend_by renews as the lease ends).
// It is a LeaseManager (lease_manager.h) holding one lease; a worker holding many messages
// needs one manager, not a keeper (and a thread) per message.
//
// The lease is bound to the process (Queue::bind): if the process dies, the message is
// ready again at once.
//
// Thread-safety: a LeaseKeeper runs one background thread (its manager's); its methods may
// be called from any thread. The Queue must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "spool/lease_manager.h"
#include "spool/queue.h"

namespace spool {

class LeaseKeeper {
 public:
  struct Options {
    Millis interval{10000};
    Millis extend_by{30000};
    Millis max_lifetime{3600000};
  };

  LeaseKeeper(Queue& queue, std::string receipt, Options opts);
  ~LeaseKeeper();  // stops renewing (does not ack or nack)
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  void stop();
  // ok while renewing; the renewal error (kLeaseLost, ...) once one failed.
  Status status() const;
  // How many renewals succeeded.
  uint64_t renewals() const;

 private:
  // The keeper is a LeaseManager holding one lease: `interval` becomes its margin
  // (extend_by - interval) and the lease is taken to end extend_by after the start, so the
  // first renewal comes one interval in. Null once stopped, or when it could not start.
  std::unique_ptr<LeaseManager> manager_;
  const std::string receipt_;
  mutable std::mutex mu_;
  Status status_;  // after stop(), or why the manager could not start or take the lease
  uint64_t renewals_ = 0;  // after stop()
};

}  // namespace spool
