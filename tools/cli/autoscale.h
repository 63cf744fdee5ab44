// `spool work --autoscale`: how many commands to run at once so that the ready backlog waits
// no longer than a latency target (docs/cli.md, "Autoscale"). The rule only; spool work
// calls evaluate() every kPeriod and starts no command beyond target().
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <set>

#include "spool/queue.h"

namespace spool::cli {

struct AutoscaleOptions {
  Millis latency{0};  // how long the ready backlog may wait; above 0
  double rate = 0;    // messages per second one command handles; 0: measured from durations
  size_t max = 1;     // the most commands at once (-j)
};

// Thread-safe: commands report from their own threads while one thread evaluates.
class Autoscaler {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr Millis kPeriod{1000};  // between evaluations
  // Hysteresis: the target is the largest of the last kWindow wanted counts, so it grows at
  // once and shrinks only when fewer have been wanted for kWindow evaluations in a row.
  static constexpr size_t kWindow = 3;
  static constexpr size_t kSamples = 16;  // the measured rate is over this many last runs

  explicit Autoscaler(const AutoscaleOptions& o) : o_(o) {}

  // A command starts (returns its token) and finishes (its duration feeds the measured rate).
  Clock::time_point started();
  void finished(Clock::time_point token);

  struct Decision {
    size_t target = 1;  // what is now in force
    size_t wanted = 1;  // this evaluation's ⌈ready / (rate × latency)⌉, within 1 .. max
    double rate = 0;    // per command, messages/s; 0: not known yet (nothing has run)
    bool rate_bound = false;  // rate is only an upper bound: no command has finished yet
  };
  // One evaluation with `ready` messages receivable now.
  Decision evaluate(uint64_t ready, Clock::time_point now);
  size_t target() const;

 private:
  double rate_locked(Clock::time_point now, bool* bound) const;

  const AutoscaleOptions o_;
  mutable std::mutex mu_;
  std::deque<double> durations_;        // seconds, the last kSamples finished runs
  std::multiset<Clock::time_point> running_;  // start times of the commands running now
  std::deque<size_t> wanted_;           // the last kWindow wanted counts
  size_t target_ = 1;
};

}  // namespace spool::cli
