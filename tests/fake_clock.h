// An Env whose clocks move only when the test moves them: for tests of lease, delay,
// visibility and retention logic, which test the queue's arithmetic on time and not the
// kernel's timers, without sleeping. The boot and wall clocks start where the real ones are
// when it is made and move together, by advance() or by a sleep_for() through the Env, and
// by 1 us at each now() (the read a lock hold makes), so that no two holds see the same
// instant, as on a real clock: orders that follow the time of an event (a nack's ready
// time against a send's) stay those of the events.
// Files and test hooks are those of the Env it wraps (the default one unless given).
//
// A call that waits (receive with a wait, send with wait_for_room) waits in the kernel
// until its deadline on this clock, which only advance() moves: give such calls no wait,
// or advance the clock from another thread. The queue's other users of real time (the
// lease keeper's renewals, the interval flusher) are not on this clock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "env/env.h"
#include "spool/queue.h"

namespace spool::test {

class FakeClockEnv : public EnvWrapper {
 public:
  explicit FakeClockEnv(std::shared_ptr<Env> target = make_default_env());
  Now now() override;
  uint64_t boot_ns() override;
  uint64_t real_ns() override;
  uint64_t coarse_ns() override;
  void sleep_for(std::chrono::nanoseconds d) override { advance(d); }
  static constexpr uint64_t kTickNs = 1000;  // what each now() moves the clocks on
  // Moves every clock of this Env on by `d`. Thread-safe.
  void advance(std::chrono::nanoseconds d);

 private:
  const uint64_t boot0_;
  const uint64_t real0_;
  const uint64_t coarse0_;
  std::atomic<uint64_t> elapsed_{0};
};

// `o` with a queue (and its dead-letter queue) on `clock`.
QueueOptions on_clock(const std::shared_ptr<FakeClockEnv>& clock, QueueOptions o = {});

}  // namespace spool::test
