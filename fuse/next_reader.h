// READs of a queue's .next file that wait for a message (docs/filesystem.md, "Waiting for
// the next message").
//
// A READ that must wait is not answered by the FUSE worker thread that got it: it is queued
// here and answered later by this object's own thread, which long-polls the queue
// (Queue::receive with a wait, woken at once by a send from any process) for as many
// messages as there are waiting reads, and hands them out in the order the reads came. So
// waiting readers hold no worker of the session, which goes on serving ls, cat and rm.
//
// Interrupts: a reader that gets a signal (Ctrl-C, `timeout`) makes the kernel send
// FUSE_INTERRUPT and then wait, uninterruptibly, for the answer to its READ. Queue::receive
// cannot be woken from outside, so the thread waits at most kSlice at a time and looks at
// fuse_req_interrupted in between; an interrupted read is answered EINTR, and a message
// received for a read interrupted meanwhile is given back at once (nack), never left leased
// to nobody.
//
// Contract: stop() must be called before the session is destroyed (no request may be
// answered after that); it answers every waiting read with the errno given.
#pragma once

#include <fuse_lowlevel.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "spool/queue.h"

namespace spoolfs {

class NextReader {
 public:
  // The longest an interrupted read waits for its EINTR.
  static constexpr spool::Millis kSlice{100};

  // Leases up to `n` messages, waiting up to `wait` for the first.
  using Receive = std::function<spool::Result<std::vector<spool::Message>>(size_t n, spool::Millis wait)>;
  // Answers the read `req` of the open file `key` with message `m`. Returns false if it did
  // not take `m` (the file had a message already), which is then given back.
  using Deliver = std::function<bool(fuse_req_t req, void* key, size_t size, off_t off, spool::Message& m)>;
  // Returns a message no read is left to take.
  using GiveBack = std::function<void(const spool::Message& m)>;

  NextReader(Receive receive, Deliver deliver, GiveBack give_back);
  ~NextReader();
  NextReader(const NextReader&) = delete;
  NextReader& operator=(const NextReader&) = delete;

  // Queues the read `req`; returns at once. After stop(), answers it with the stop errno.
  void add(fuse_req_t req, void* key, size_t size, off_t off);
  // Answers every waiting read with `err` and ends the thread. Idempotent.
  void stop(int err);

 private:
  struct Waiter {
    fuse_req_t req;
    void* key;
    size_t size;
    off_t off;
  };
  void run();
  void drop_interrupted();  // mu_ held
  void fail_all(int err);   // mu_ held

  const Receive receive_;
  const Deliver deliver_;
  const GiveBack give_back_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Waiter> waiting_;  // in the order the reads came
  bool stopping_ = false;
  int stop_err_ = 0;
  std::thread thread_;  // started by the first add
};

}  // namespace spoolfs
