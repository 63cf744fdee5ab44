#include "cli/autoscale.h"

#include <algorithm>
#include <cmath>

namespace spool::cli {

Autoscaler::Clock::time_point Autoscaler::started() {
  auto t = Clock::now();
  std::lock_guard lock(mu_);
  running_.insert(t);
  return t;
}

void Autoscaler::finished(Clock::time_point token) {
  double took = std::chrono::duration<double>(Clock::now() - token).count();
  std::lock_guard lock(mu_);
  if (auto it = running_.find(token); it != running_.end()) running_.erase(it);
  durations_.push_back(took);
  if (durations_.size() > kSamples) durations_.pop_front();
}

// 1 / the mean duration of the last runs; before the first has finished, the longest-running
// command's time so far stands in (its run takes at least that long), so commands slower
// than a period still scale up.
double Autoscaler::rate_locked(Clock::time_point now, bool* bound) const {
  if (o_.rate > 0) return o_.rate;
  double mean = 0;
  if (!durations_.empty()) {
    for (double d : durations_) mean += d;
    mean /= static_cast<double>(durations_.size());
  } else if (!running_.empty()) {
    mean = std::chrono::duration<double>(now - *running_.begin()).count();
    *bound = true;
  } else {
    return 0;
  }
  return 1.0 / std::max(mean, 0.001);
}

Autoscaler::Decision Autoscaler::evaluate(uint64_t ready, Clock::time_point now) {
  std::lock_guard lock(mu_);
  Decision d;
  d.rate = rate_locked(now, &d.rate_bound);
  const double per_command = d.rate * std::chrono::duration<double>(o_.latency).count();
  double want = 1;  // nothing measured yet: one command, to measure it
  if (per_command > 0) want = std::ceil(static_cast<double>(ready) / per_command);
  d.wanted = static_cast<size_t>(std::clamp(want, 1.0, static_cast<double>(o_.max)));
  wanted_.push_back(d.wanted);
  if (wanted_.size() > kWindow) wanted_.pop_front();
  target_ = *std::max_element(wanted_.begin(), wanted_.end());
  d.target = target_;
  return d;
}

size_t Autoscaler::target() const {
  std::lock_guard lock(mu_);
  return target_;
}

}  // namespace spool::cli
