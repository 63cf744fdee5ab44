#include "env/env.h"

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>

#include "io/io.h"
#include "sys/clock.h"
#include "sys/crashpoint.h"

namespace spool {
namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

struct ParkPaths {
  std::string lock;   // SPOOL_TEST_PARK_IN_LOCK or SPOOL_TEST_PARK_IN_EVERY_LOCK
  bool every = false;
  std::string append;  // SPOOL_TEST_PARK_AFTER_APPEND
  bool any() const { return !lock.empty() || !append.empty(); }
};

ParkPaths read_park_paths() {
  ParkPaths p;
  if (!kTestHooks) return p;
  p.lock = env_or_empty("SPOOL_TEST_PARK_IN_LOCK");
  if (std::string every = env_or_empty("SPOOL_TEST_PARK_IN_EVERY_LOCK"); !every.empty()) {
    p.lock = every;
    p.every = true;
  }
  p.append = env_or_empty("SPOOL_TEST_PARK_AFTER_APPEND");
  return p;
}

class DefaultEnv final : public Env {
 public:
  DefaultEnv(std::shared_ptr<io::Io> io, ParkPaths park) : Env(park.any()), io_(std::move(io)), park_(std::move(park)) {}

  const std::shared_ptr<io::Io>& io() override { return io_; }
  Now now() override { return Now{sys::boot_ns(), sys::now_ns(CLOCK_REALTIME_COARSE)}; }
  uint64_t boot_ns() override { return sys::boot_ns(); }
  uint64_t real_ns() override { return sys::real_ns(); }
  uint64_t coarse_ns() override { return sys::coarse_ns(); }
  void sleep_for(std::chrono::nanoseconds d) override { std::this_thread::sleep_for(d); }
  // Read at each call, not cached: see sys/crashpoint.h.
  void crashpoint(const char* name) override { spool::crashpoint(name); }
  void park(ParkPoint where) override {
    if (where == ParkPoint::kInLock) {
      if (!park_.lock.empty() && (park_.every || !parked_.exchange(true))) spool::park(park_.lock);
    } else if (!park_.append.empty()) {
      spool::park(park_.append);
    }
  }

 private:
  const std::shared_ptr<io::Io> io_;
  const ParkPaths park_;
  std::atomic<bool> parked_{false};  // kInLock has held once
};

}  // namespace

std::shared_ptr<Env> make_default_env(std::shared_ptr<io::Io> io) {
  return std::make_shared<DefaultEnv>(io ? std::move(io) : io::default_io(), read_park_paths());
}

EnvWrapper::EnvWrapper(std::shared_ptr<Env> target) : Env(target->parks()), target_(std::move(target)) {}

}  // namespace spool
