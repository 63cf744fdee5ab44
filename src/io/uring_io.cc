// io_uring backend. Each thread gets its own small ring, created on first use and
// re-created when the pid changes: rings must not cross fork (a child sharing its parent's ring corrupts both), and a
// process-wide ring behind a mutex would deadlock a child forked while another thread
// held that mutex. Each write_all call is a single WRITEV submission carrying every record
// of a batch, which is where the batching happens; short results are resumed by
// Io::write_all.
#include <liburing.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>

#include "io/io.h"

namespace spool::io {
namespace {

constexpr unsigned kRingEntries = 8;

// getpid() is a system call on every submission otherwise (glibc stopped caching it); a
// fork handler keeps this copy current.
pid_t current_pid() {
  static std::atomic<pid_t> pid = [] {
    ::pthread_atfork(nullptr, nullptr, [] { pid.store(::getpid(), std::memory_order_relaxed); });
    return ::getpid();
  }();
  return pid.load(std::memory_order_relaxed);
}

// Set when this thread's ring is destroyed; no destructor, so it outlives the ring.
thread_local bool ring_gone = false;

struct ThreadRing {
  io_uring ring{};
  pid_t pid = -1;

  ~ThreadRing() {
    if (pid == current_pid()) io_uring_queue_exit(&ring);
    ring_gone = true;
  }
  // The ring for this thread in this process, or -errno.
  int get(io_uring** out) {
    pid_t me = current_pid();
    if (pid != me) {
      // After fork the child holds a copy of the parent's ring mapping and fd; drop them
      // (this only unmaps and closes in the child) and set up its own.
      if (pid != -1) io_uring_queue_exit(&ring);
      pid = -1;
      if (int r = io_uring_queue_init(kRingEntries, &ring, 0); r < 0) return r;
      pid = me;
    }
    *out = &ring;
    return 0;
  }
};

thread_local ThreadRing tls_ring;

template <class Prep>
int submit_one(Prep prep) {
  // exit() destroys the main thread's ring before exit handlers and static destructors run,
  // where a Queue may still be closed and write: such a write sets up a ring of its own.
  std::optional<ThreadRing> exiting;
  if (ring_gone) exiting.emplace();
  ThreadRing& tr = exiting ? *exiting : tls_ring;
  io_uring* ring = nullptr;
  if (int r = tr.get(&ring); r < 0) return r;
  io_uring_sqe* sqe = io_uring_get_sqe(ring);
  if (sqe == nullptr) return -EBUSY;
  prep(sqe);
  int r = io_uring_submit_and_wait(ring, 1);
  while (r == -EINTR) r = io_uring_submit_and_wait(ring, 1);
  if (r < 0) return r;
  io_uring_cqe* cqe = nullptr;
  r = io_uring_wait_cqe(ring, &cqe);
  if (r < 0) return r;
  int res = cqe->res;
  io_uring_cqe_seen(ring, cqe);
  return res;
}

class UringIo final : public Io {
 public:
  const char* name() const override { return "io_uring"; }

  int datasync(int fd) override {
    return submit_one([&](io_uring_sqe* sqe) { io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC); });
  }

 protected:
  int64_t write_some(int fd, const iovec* iov, int iovcnt, uint64_t off) override {
    return submit_one([&](io_uring_sqe* sqe) {
      io_uring_prep_writev(sqe, fd, iov, static_cast<unsigned>(iovcnt), off);
    });
  }
};

}  // namespace

std::unique_ptr<Io> make_uring_io(std::string* why) {
  io_uring* ring = nullptr;
  if (int r = tls_ring.get(&ring); r < 0) {
    if (why) *why = std::string("io_uring_queue_init: ") + std::strerror(-r);
    return nullptr;
  }
  io_uring_probe* probe = io_uring_get_probe_ring(ring);
  bool ok = probe != nullptr && io_uring_opcode_supported(probe, IORING_OP_WRITEV) &&
            io_uring_opcode_supported(probe, IORING_OP_FSYNC);
  if (probe != nullptr) io_uring_free_probe(probe);
  if (!ok) {
    if (why) *why = "io_uring lacks WRITEV or FSYNC";
    return nullptr;
  }
  return std::make_unique<UringIo>();
}

}  // namespace spool::io
