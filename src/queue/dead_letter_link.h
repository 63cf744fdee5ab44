// The dead-letter part of a queue handle: its dead-letter queue (DIR/dlq), opened once and
// kept open. It is opened before a call that may dead-letter takes the index lock
// (open_early()): opened under the lock, its replay (or a file planted in it) would hold up
// every send and receive of this queue meanwhile.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "spool/queue.h"
#include "sys/mutex.h"
#include "sys/thread_annotations.h"

namespace spool::queue {

class DeadLetterLink {
 public:
  using Open = std::function<Result<std::unique_ptr<Queue>>()>;
  // `dir`: the queue's directory (outlives this); `open` opens (or makes) its dead-letter queue.
  DeadLetterLink(const std::string& dir, Open open) : dir_(dir), open_(std::move(open)) {}

  // The dead-letter queue, opened (and made, where the queue is writable) on first use.
  Result<Queue*> get() EXCLUDES(mu_);
  // Opens it if it exists, else looks again at most once a second (a stat per receive of a
  // queue without one cost a system call on the hot path). An error is left for get() to
  // report, should a dead letter need the queue.
  void open_early() EXCLUDES(mu_);
  // Closes it (the handle is closing).
  void close() EXCLUDES(mu_);

 private:
  const std::string& dir_;
  const Open open_;
  sys::Mutex mu_;
  std::unique_ptr<Queue> dlq_ GUARDED_BY(mu_);
  std::atomic<bool> is_open_{false};     // set once dlq_ is open: a receive then takes no mutex
  std::atomic<uint64_t> next_look_{0};   // coarse-clock time before which open_early() does not look
};

}  // namespace spool::queue
