#include "fake_clock.h"

#include "sys/clock.h"

namespace spool::test {

FakeClockEnv::FakeClockEnv(std::shared_ptr<Env> target)
    : EnvWrapper(std::move(target)), boot0_(sys::boot_ns()), real0_(sys::real_ns()), coarse0_(sys::coarse_ns()) {}

Env::Now FakeClockEnv::now() {
  const uint64_t t = elapsed_.fetch_add(kTickNs) + kTickNs;
  return Now{boot0_ + t, real0_ + t};
}
uint64_t FakeClockEnv::boot_ns() { return boot0_ + elapsed_.load(); }
uint64_t FakeClockEnv::real_ns() { return real0_ + elapsed_.load(); }
uint64_t FakeClockEnv::coarse_ns() { return coarse0_ + elapsed_.load(); }

void FakeClockEnv::advance(std::chrono::nanoseconds d) { elapsed_.fetch_add(static_cast<uint64_t>(d.count())); }

QueueOptions on_clock(const std::shared_ptr<FakeClockEnv>& clock, QueueOptions o) {
  o.env = clock;
  return o;
}

}  // namespace spool::test
