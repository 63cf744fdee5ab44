#include "spool/lease_keeper.h"

#include <chrono>

namespace spool {

LeaseKeeper::LeaseKeeper(Queue& queue, std::string receipt, Options opts)
    : queue_(queue), receipt_(std::move(receipt)), opts_(opts), thread_([this] { run(); }) {
  // A task kept alive by a keeper dies with its process; so should its lease. If binding is
  // impossible (all owner slots taken) the lease still runs out on its own.
  (void)queue_.bind(receipt_);
}

LeaseKeeper::~LeaseKeeper() { stop(); }

void LeaseKeeper::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

Status LeaseKeeper::status() const {
  std::lock_guard lock(mu_);
  return status_;
}

uint64_t LeaseKeeper::renewals() const {
  std::lock_guard lock(mu_);
  return renewals_;
}

void LeaseKeeper::run() {
  const auto give_up = std::chrono::steady_clock::now() + opts_.max_lifetime;
  std::unique_lock lock(mu_);
  for (;;) {
    auto next = std::min(std::chrono::steady_clock::now() + opts_.interval, give_up);
    if (cv_.wait_until(lock, next, [this] { return stopping_; })) return;
    if (std::chrono::steady_clock::now() >= give_up) return;  // let the lease run out
    lock.unlock();
    Status s = queue_.extend(receipt_, opts_.extend_by);
    lock.lock();
    if (!s.ok()) {
      status_ = s;
      return;
    }
    ++renewals_;
  }
}

}  // namespace spool
