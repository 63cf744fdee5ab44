#include "queue/background.h"

#include "storage/log.h"

namespace spool::queue {

void Background::written(uint64_t end) {
  const uint64_t seq = storage::Pos::unpack(end).seq;
  // A load first: the exchange is a locked instruction, and a write's segment is mostly the
  // one seen before.
  if (seq <= seen_seq_.load(std::memory_order_relaxed) || seq <= seen_seq_.exchange(seq)) return;
  if (!seen_seq_initialised_.exchange(true)) return;  // the first write only sets the mark
  sys::MutexLock lock(mu_);
  if (stopping_) return;
  compact_wanted_ = true;
  wake();
}

void Background::spares_low() {
  if (top_up_asked_.exchange(true)) return;
  sys::MutexLock lock(mu_);
  if (!stopping_) wake();
}

void Background::wake() {
  if (!thread_.joinable()) {
    thread_ = std::thread([this] {
      sys::MutexLock lk(mu_);
      for (;;) {
        cv_.wait(lk, [this]() REQUIRES(mu_) { return compact_wanted_ || top_up_asked_.load() || stopping_; });
        if (stopping_) return;
        const bool compacting = compact_wanted_;
        compact_wanted_ = false;
        top_up_asked_.store(false);
        lk.unlock();
        top_up_();
        if (compacting) compact_();
        lk.lock();
      }
    });
  }
  cv_.notify_all();
}

void Background::stop() {
  std::thread running;  // written() starts none once stopping_ is set
  {
    sys::MutexLock lock(mu_);
    stopping_ = true;
    running = std::move(thread_);
  }
  cv_.notify_all();
  if (running.joinable()) running.join();
}

}  // namespace spool::queue
