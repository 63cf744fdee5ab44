#include "queue/dead_letter_link.h"

#include <unistd.h>

#include "sys/clock.h"

namespace spool::queue {

void DeadLetterLink::open_early() {
  if (is_open_.load(std::memory_order_acquire)) return;
  // The coarse clock: a once-a-second throttle needs no precise one, and every receive of a
  // queue with max_receives and no DLQ comes here.
  const uint64_t now = sys::coarse_ns();
  if (now < next_look_.load(std::memory_order_relaxed)) return;
  // One that does not exist yet is made under the lock by the first dead letter: empty, it
  // has nothing to replay. One made by another process meanwhile is found within a second.
  if (::access((dir_ + "/dlq/spool.conf").c_str(), F_OK) != 0) {
    next_look_.store(now + 1'000'000'000, std::memory_order_relaxed);
    return;
  }
  if (!get().ok()) next_look_.store(now + 1'000'000'000, std::memory_order_relaxed);
}

Result<Queue*> DeadLetterLink::get() {
  sys::MutexLock lock(mu_);
  if (!dlq_) {
    auto q = open_();
    if (!q.ok()) return q.status();
    dlq_ = std::move(q).value();
    is_open_.store(true, std::memory_order_release);
  }
  return dlq_.get();
}

void DeadLetterLink::close() {
  std::unique_ptr<Queue> gone;
  {
    sys::MutexLock lock(mu_);
    gone = std::move(dlq_);
  }
}

}  // namespace spool::queue
