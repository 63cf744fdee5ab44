// io_uring backend. One ring per process (rings must not cross fork, PITFALLS §3), created
// lazily and re-created when the pid changes; a mutex serialises its users. Each write_all
// call is a single WRITEV submission carrying every record of a batch, which is where the
// batching happens; short results are resumed by Io::write_all.
#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "io/io.h"

namespace spool::io {
namespace {

constexpr unsigned kRingEntries = 8;

class UringIo final : public Io {
 public:
  ~UringIo() override {
    if (ring_pid_ == ::getpid()) io_uring_queue_exit(&ring_);
  }
  const char* name() const override { return "io_uring"; }

  int init_ring() {
    int r = io_uring_queue_init(kRingEntries, &ring_, 0);
    if (r < 0) return r;
    ring_pid_ = ::getpid();
    return 0;
  }

  int datasync(int fd) override {
    return submit_one([&](io_uring_sqe* sqe) { io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC); });
  }

 protected:
  int64_t write_some(int fd, const iovec* iov, int iovcnt, uint64_t off) override {
    return submit_one([&](io_uring_sqe* sqe) {
      io_uring_prep_writev(sqe, fd, iov, static_cast<unsigned>(iovcnt), off);
    });
  }

 private:
  template <class Prep>
  int submit_one(Prep prep) {
    std::lock_guard lock(mu_);
    if (ring_pid_ != ::getpid()) {
      // A forked child inherited the parent's ring memory; it must not use it.
      int r = init_ring();
      if (r < 0) return r;
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return -EBUSY;
    prep(sqe);
    int r = io_uring_submit_and_wait(&ring_, 1);
    while (r == -EINTR) r = io_uring_submit_and_wait(&ring_, 1);
    if (r < 0) return r;
    io_uring_cqe* cqe = nullptr;
    r = io_uring_wait_cqe(&ring_, &cqe);
    if (r < 0) return r;
    int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    return res;
  }

  std::mutex mu_;
  io_uring ring_{};
  pid_t ring_pid_ = -1;
};

}  // namespace

std::unique_ptr<Io> make_uring_io(std::string* why) {
  auto io = std::make_unique<UringIo>();
  int r = io->init_ring();
  if (r < 0) {
    if (why) *why = std::string("io_uring_queue_init: ") + std::strerror(-r);
    return nullptr;
  }
  io_uring_probe* probe = io_uring_get_probe();
  bool ok = probe != nullptr && io_uring_opcode_supported(probe, IORING_OP_WRITEV) &&
            io_uring_opcode_supported(probe, IORING_OP_FSYNC);
  if (probe != nullptr) io_uring_free_probe(probe);
  if (!ok) {
    if (why) *why = "io_uring lacks WRITEV or FSYNC";
    return nullptr;
  }
  return io;
}

}  // namespace spool::io
