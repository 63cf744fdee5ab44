// Common harness of the comparison drivers (bench/compare): one executable per system, each
// a System (set up / check / clean the queue) and a Client (what one process does: send,
// receive with a lease, ack). The harness runs the cases with fork()ed processes, each of
// which connects on its own after the fork, and prints one JSON object per run:
//   {"system", "case", "sync", "size", "msgs_per_s", "p50_us", "p99_us", ...}
// See docs/performance.md for the cases and how bench/compare/run.sh drives this.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace cmp {

struct Args {
  std::string kase = "produce";  // produce | produce_batch | produce_mp | e2e_1c | e2e_2c | latency
  std::string sync = "interval";  // always | interval | never | none: the level the server/queue was set to
  std::string dir = "/var/tmp";   // where file-based systems keep their data (a disk, not tmpfs)
  std::string host = "127.0.0.1";
  int port = 0;                   // servers (beanstalkd, redis): started by the script
  size_t size = 100;              // payload bytes (>= 8: the first 8 carry a timestamp)
  uint64_t n = 20000;             // messages of a throughput case
  int samples = 2000;             // round trips of the latency case (after `warmup`)
  int warmup = 50;
  int batch = 64;                 // produce_batch: messages per native batch
  int producers = 8;              // produce_mp: producer processes
  int gap_us = 0;                 // produce, produce_mp: mean random pause before each send
  int poll_us = 1000;             // systems without a blocking receive: sleep between empty polls
  std::string tag;                // unique name of this run (queue dir, tube, stream key, mq name)
};

// What receive hands to ack.
struct Handle {
  uint64_t id = 0;
  std::string receipt;
};

class Client {
 public:
  virtual ~Client() = default;
  // One message, acknowledged by the system (durable per its sync setting) when it returns.
  virtual void send(std::string_view payload) = 0;
  // The system's native batching (a transaction, a pipeline, send_batch).
  virtual void send_batch(std::span<const std::string_view> payloads) {
    for (auto p : payloads) send(p);
  }
  // Takes one message with a lease (visibility 60 s), waiting up to wait_ms for one.
  // False when none came in time.
  virtual bool receive(std::string& payload, Handle& h, int wait_ms) = 0;
  virtual void ack(const Handle& h) = 0;
};

class System {
 public:
  virtual ~System() = default;
  // Posix mq holds a bounded number of messages in the kernel: its produce cases run with a
  // process draining the queue (not timed).
  virtual bool produce_needs_drainer() const { return false; }
  virtual bool has_batch() const { return true; }
  // In the parent, before any child starts: creates the empty queue / table / stream.
  // Must not leave a connection open across the fork (spool does this in a child).
  virtual void prepare(const Args& a) = 0;
  // In every child: its own connection.
  virtual std::unique_ptr<Client> connect(const Args& a) = 0;
  // In the parent after the run: "ok" when exactly `want_left` messages are queued (and none
  // leased), else what is wrong.
  virtual std::string check(const Args& a, uint64_t want_left) = 0;
  virtual void cleanup(const Args& a) = 0;
};

[[noreturn]] void fail(const std::string& what);
uint64_t mono_ns();
// Runs `body` in a fork()ed child and waits for it; true when it exited 0.
bool in_child(const std::function<int()>& body);
// Main of a driver: parses the arguments, runs the case, prints the JSON line.
int run(int argc, char** argv, const char* system, System& sys);

}  // namespace cmp
