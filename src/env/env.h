// The environment a queue runs in, as one option (QueueOptions::env), after LevelDB's Env:
// the files it touches (io::Io), the clocks it reads for leases, delays, visibility,
// retention and the log clock, sleeping, and the test hooks (crash points, park points).
// Production code takes all of these from here, never from libc or getenv directly, so a
// test substitutes one object: a FakeClockEnv (tests/fake_clock.h) to move time by hand, a
// fault-injecting Io to fail writes, its own crashpoint() to stop at a named step.
//
// Internal: include/spool/queue.h only forward-declares Env; tests include this header.
// Thread-safety: every member may be called from any thread at once. Lifetime: shared by
// the queue, its dead-letter queue and their threads (shared_ptr); an Env outlives them.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

namespace spool {

namespace io {
class Io;
}

// Where a test may hold a process (Env::park()) to kill it or to act on the queue meanwhile.
enum class ParkPoint : uint8_t {
  kInLock,       // right after lock() took the index lock (Queue::Impl::lock)
  kAfterAppend,  // a send's MSG records are in the log, not yet in the index (commit())
};

class Env {
 public:
  virtual ~Env() = default;
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

  // Every file operation of the queue (spool.conf, the index, the segments). Never null.
  virtual const std::shared_ptr<io::Io>& io() = 0;

  // Clocks, in nanoseconds (sys/clock.h says what each is for).
  // The one read a lock hold makes: CLOCK_BOOTTIME (the index's keys) and the coarse
  // CLOCK_REALTIME the log clock's drift check compares with (queue/log_clock.h).
  struct Now {
    uint64_t boot = 0;
    uint64_t real_coarse = 0;
  };
  virtual Now now() = 0;
  virtual uint64_t boot_ns() = 0;    // CLOCK_BOOTTIME
  virtual uint64_t real_ns() = 0;    // CLOCK_REALTIME
  virtual uint64_t coarse_ns() = 0;  // CLOCK_MONOTONIC_COARSE: throttles, a tick behind
  virtual void sleep_for(std::chrono::nanoseconds d) = 0;

  // Test hooks; in a build without them (meson -Dtesting=false) the default Env's do
  // nothing. crashpoint(): a named step on a rare path (compaction, the dead-letter
  // hand-off, move, redrive) where a crash test may kill the process.
  virtual void crashpoint(const char* name) = 0;
  // park(): hold the calling thread at `where` until the test lets it go. The queue calls
  // it only when parks() is true, so an Env without park points costs a load per lock hold.
  virtual void park(ParkPoint where) = 0;
  bool parks() const { return parks_; }

 protected:
  Env() = default;
  explicit Env(bool parks) : parks_(parks) {}

 private:
  const bool parks_ = false;
};

// The default Env: real clocks and sleep, `io` (null: io::default_io(), which SPOOL_IO
// picks). In a testing build its hooks come from the environment, as read when it is made
// (a test sets a variable, opens a queue, unsets it): crashpoint(NAME) SIGKILLs the
// process at SPOOL_CRASHPOINT=NAME[:N] (src/sys/crashpoint.h); park(kInLock) creates the
// file SPOOL_TEST_PARK_IN_LOCK names at the first lock() of this Env only (a send may lock
// more than once; a queue and its dead-letter queue share the Env) and waits while it
// exists; SPOOL_TEST_PARK_IN_EVERY_LOCK at every lock(), to stop a compaction at each
// step; SPOOL_TEST_PARK_AFTER_APPEND at kAfterAppend. Queue::open makes one per queue when
// QueueOptions::env is empty.
std::shared_ptr<Env> make_default_env(std::shared_ptr<io::Io> io = nullptr);

// Forwards every call to `target`: a test overrides what it fakes and keeps the rest.
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(std::shared_ptr<Env> target);
  const std::shared_ptr<io::Io>& io() override { return target_->io(); }
  Now now() override { return target_->now(); }
  uint64_t boot_ns() override { return target_->boot_ns(); }
  uint64_t real_ns() override { return target_->real_ns(); }
  uint64_t coarse_ns() override { return target_->coarse_ns(); }
  void sleep_for(std::chrono::nanoseconds d) override { target_->sleep_for(d); }
  void crashpoint(const char* name) override { target_->crashpoint(name); }
  void park(ParkPoint where) override { target_->park(where); }
  Env& target() const { return *target_; }

 private:
  std::shared_ptr<Env> target_;
};

}  // namespace spool
