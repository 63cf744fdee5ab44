// The "one fdatasync per message" baseline: appends SIZE bytes to a file and fdatasync()s
// it, N times, in one process. What a queue that syncs every message on its own would do;
// spool's sync=always with concurrent producers should beat it by sharing fdatasyncs.
// --prealloc: the file is posix_fallocate()d first and written in place with pwrite (as spool
// writes its preallocated segments), so fdatasync does not have to log a new file size.
// --uring: the write (IORING_OP_WRITEV) and the fdatasync (IORING_OP_FSYNC with
// IORING_FSYNC_DATASYNC) go through io_uring, as spool's default I/O backend issues them.
// Usage: cmp_fdatasync [--n=N] [--size=BYTES] [--dir=DIR] [--prealloc] [--uring]
// (prints one JSON line)
#include <fcntl.h>
#include <liburing.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {
uint64_t mono_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}
double pct_us(std::vector<uint64_t>& v, double q) {
  std::sort(v.begin(), v.end());
  size_t i = std::clamp<size_t>(static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))), 1, v.size()) - 1;
  return static_cast<double>(v[i]) / 1e3;
}
}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 1000;
  size_t size = 100;
  std::string dir = "/var/tmp";
  bool prealloc = false, uring = false;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--n=", 0) == 0) n = std::strtoull(s.c_str() + 4, nullptr, 10);
    else if (s.rfind("--size=", 0) == 0) size = std::strtoull(s.c_str() + 7, nullptr, 10);
    else if (s.rfind("--dir=", 0) == 0) dir = s.substr(6);
    else if (s == "--prealloc") prealloc = true;
    else if (s == "--uring") uring = true;
    else {
      std::fprintf(stderr, "usage: cmp_fdatasync [--n=N] [--size=BYTES] [--dir=DIR] [--prealloc] [--uring]\n");
      return 64;
    }
  }
  if (n == 0) n = 1;
  std::string path = dir + "/fdatasync-loop." + std::to_string(::getpid());
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | (prealloc ? 0 : O_APPEND) | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::perror(path.c_str());
    return 1;
  }
  if (prealloc) {
    int r = ::posix_fallocate(fd, 0, static_cast<off_t>(n * size + 4096));
    if (r != 0 || ::fdatasync(fd) != 0) {
      std::fprintf(stderr, "posix_fallocate: %s\n", std::strerror(r));
      return 1;
    }
  }
  io_uring ring{};
  if (uring && ::io_uring_queue_init(8, &ring, 0) != 0) {
    std::fprintf(stderr, "io_uring_queue_init failed\n");
    return 1;
  }
  auto datasync = [&]() -> int {
    if (!uring) return ::fdatasync(fd);
    io_uring_sqe* sqe = ::io_uring_get_sqe(&ring);
    ::io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
    if (::io_uring_submit_and_wait(&ring, 1) < 0) return -1;
    io_uring_cqe* cqe = nullptr;
    if (::io_uring_wait_cqe(&ring, &cqe) != 0) return -1;
    int r = cqe->res;
    ::io_uring_cqe_seen(&ring, cqe);
    return r < 0 ? -1 : 0;
  };
  std::string payload(size, 'x');
  std::vector<uint64_t> lat;
  lat.reserve(n);
  uint64_t t0 = mono_ns();
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t t = mono_ns();
    ssize_t w;
    if (uring) {
      iovec iov{payload.data(), payload.size()};
      io_uring_sqe* sqe = ::io_uring_get_sqe(&ring);
      ::io_uring_prep_writev(sqe, fd, &iov, 1, prealloc ? i * size : static_cast<uint64_t>(-1));
      ::io_uring_submit_and_wait(&ring, 1);
      io_uring_cqe* cqe = nullptr;
      ::io_uring_wait_cqe(&ring, &cqe);
      w = cqe->res;
      ::io_uring_cqe_seen(&ring, cqe);
    } else {
      w = prealloc ? ::pwrite(fd, payload.data(), payload.size(), static_cast<off_t>(i * size))
                   : ::write(fd, payload.data(), payload.size());
    }
    if (w != static_cast<ssize_t>(payload.size()) || datasync() != 0) {
      std::perror("write/fdatasync");
      return 1;
    }
    lat.push_back(mono_ns() - t);
  }
  double secs = static_cast<double>(mono_ns() - t0) / 1e9;
  std::string name = std::string("fdatasync-loop") + (prealloc ? "-prealloc" : "") + (uring ? "-uring" : "");
  ::close(fd);
  ::unlink(path.c_str());
  std::printf(
      "{\"system\": \"%s\", \"case\": \"produce\", \"sync\": \"always\", \"size\": %zu, "
      "\"msgs_per_s\": %.0f, \"p50_us\": %.1f, \"p99_us\": %.1f, \"n\": %" PRIu64 ", \"seconds\": %.3f, \"check\": \"ok\"}\n",
      name.c_str(), size, static_cast<double>(n) / secs, pct_us(lat, 0.5), pct_us(lat, 0.99), n, secs);
  return 0;
}
