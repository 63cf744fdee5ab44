#include "spool/lease_keeper.h"

#include <algorithm>

namespace spool {

LeaseKeeper::LeaseKeeper(Queue& queue, std::string receipt, Options opts) : receipt_(std::move(receipt)) {
  LeaseManager::Options mo;
  mo.extend_by = opts.extend_by;
  // Renewed when extend_by - interval is left of a lease that was extend_by long: every
  // interval. The margin must stay below extend_by, so an interval of 0 renews every 1 ms.
  mo.margin = std::clamp(opts.extend_by - opts.interval, Millis{0}, std::max(opts.extend_by - Millis{1}, Millis{0}));
  mo.min_remaining = Millis{0};
  mo.max_lifetime = opts.max_lifetime;
  mo.bind = true;
  auto m = LeaseManager::start(queue, std::move(mo));
  if (!m.ok()) {
    status_ = m.status();
    return;
  }
  status_ = (*m)->add(receipt_, LeaseManager::Clock::now() + opts.extend_by);
  if (status_.ok()) manager_ = std::move(*m);
}

LeaseKeeper::~LeaseKeeper() { stop(); }

void LeaseKeeper::stop() {
  std::lock_guard lock(mu_);
  if (!manager_) return;
  if (auto info = manager_->status(receipt_); info.ok()) {
    status_ = info->error;
    renewals_ = info->renewals;
  }
  manager_.reset();
}

Status LeaseKeeper::status() const {
  std::lock_guard lock(mu_);
  if (!manager_) return status_;
  auto info = manager_->status(receipt_);
  return info.ok() ? info->error : Status{};
}

uint64_t LeaseKeeper::renewals() const {
  std::lock_guard lock(mu_);
  if (!manager_) return renewals_;
  auto info = manager_->status(receipt_);
  return info.ok() ? info->renewals : renewals_;
}

}  // namespace spool
