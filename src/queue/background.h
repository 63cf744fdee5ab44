// The background part of a queue handle: one thread per handle, started at the first roll,
// that tops up the spare segments and compacts by policy off every caller's path
// (docs/compaction.md, docs/durability.md "A full disk"). A roll or a send that found the
// spares low asks for it; the work itself is the store's (given as two callables).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <thread>

#include "sys/mutex.h"
#include "sys/thread_annotations.h"

namespace spool::queue {

class Background {
 public:
  // `top_up`: make the spares the queue should have. `compact`: compact by policy. Both run
  // on the background thread only, never under a lock of this part.
  Background(std::function<void()> top_up, std::function<void()> compact)
      : top_up_(std::move(top_up)), compact_(std::move(compact)) {}
  ~Background() { stop(); }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  // Called after every write, with the end it wrote to (a packed Pos): the first write to a
  // segment after a roll asks for a top-up and a compaction. A load and a compare otherwise.
  void written(uint64_t end);
  // Asks for a top-up alone (a send that found the spares low); only the first of many
  // such senders takes the mutex.
  void spares_low();
  // Ends the thread (idempotent): waits for a running compaction; nothing starts after.
  void stop();

 private:
  void wake() REQUIRES(mu_);

  const std::function<void()> top_up_;
  const std::function<void()> compact_;
  std::atomic<uint64_t> seen_seq_{0};
  std::atomic<bool> seen_seq_initialised_{false};
  // A top-up is asked for and not yet started (read without mu_).
  std::atomic<bool> top_up_asked_{false};
  sys::Mutex mu_;
  std::thread thread_ GUARDED_BY(mu_);
  std::condition_variable_any cv_;
  bool compact_wanted_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
};

}  // namespace spool::queue
