#include "io/io.h"

#include <fcntl.h>
#include "logging.h"
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace spool::io {

int Io::write_all(int fd, const iovec* iov, int iovcnt, uint64_t off) {
  std::vector<iovec> rest(iov, iov + iovcnt);
  size_t first = 0;
  while (first < rest.size()) {
    int64_t n = write_some(fd, rest.data() + first, static_cast<int>(rest.size() - first), off);
    if (n == -EINTR || n == -EAGAIN) continue;
    if (n < 0) return static_cast<int>(n);
    if (n == 0) return -EIO;  // no progress: treat as an I/O error rather than spin
    off += static_cast<uint64_t>(n);
    // Short write: drop what was written and resume with the remainder.
    while (n > 0 && first < rest.size()) {
      auto take = std::min<int64_t>(n, static_cast<int64_t>(rest[first].iov_len));
      rest[first].iov_base = static_cast<char*>(rest[first].iov_base) + take;
      rest[first].iov_len -= static_cast<size_t>(take);
      n -= take;
      if (rest[first].iov_len == 0) ++first;
    }
  }
  return 0;
}

int Io::allocate(int fd, uint64_t off, uint64_t len) {
  int r = ::posix_fallocate(fd, static_cast<off_t>(off), static_cast<off_t>(len));
  return r == 0 ? 0 : -r;
}

int Io::open(const std::string& path, int flags, mode_t mode) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  return fd >= 0 ? fd : -errno;
}

int Io::rename(const std::string& from, const std::string& to) {
  return ::rename(from.c_str(), to.c_str()) == 0 ? 0 : -errno;
}

int Io::unlink(const std::string& path) { return ::unlink(path.c_str()) == 0 ? 0 : -errno; }

int Io::sync_dir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int r = ::fsync(fd) == 0 ? 0 : -errno;
  ::close(fd);
  return r;
}

namespace {

class PwriteIo : public Io {
 public:
  const char* name() const override { return "pwrite"; }
  int datasync(int fd) override { return ::fdatasync(fd) == 0 ? 0 : -errno; }

 protected:
  int64_t write_some(int fd, const iovec* iov, int iovcnt, uint64_t off) override {
    ssize_t n = ::pwritev(fd, iov, std::min(iovcnt, IOV_MAX), static_cast<off_t>(off));
    return n >= 0 ? n : -errno;
  }
};

class MmapIo final : public PwriteIo {
 public:
  const char* name() const override { return "mmap"; }
  bool maps_writes() const override { return true; }
};

}  // namespace

std::unique_ptr<Io> make_pwrite_io() { return std::make_unique<PwriteIo>(); }
std::unique_ptr<Io> make_mmap_io() { return std::make_unique<MmapIo>(); }

std::shared_ptr<Io> default_io() {
  static std::once_flag once;
  // Never destroyed: a queue may be opened from an exit handler or a static destructor
  // (the dead-letter queue is opened lazily, by a receive or stats()).
  static auto* const io = new std::shared_ptr<Io>;
  std::call_once(once, [] {
    // mmap is the default: an append is a memcpy into the segment's page cache pages, no
    // system call (docs/performance.md). pwrite stays for filesystems that may need blocks at
    // writeback (the log falls back per directory) and on request. io_uring cannot complete
    // small buffered writes inline on ext4 (each is punted to an io-wq worker, two context
    // switches per append), so it is only chosen when asked for (SPOOL_IO=io_uring).
    const char* forced = std::getenv("SPOOL_IO");
    std::string why = "default";
    if (forced != nullptr && std::strcmp(forced, "io_uring") == 0) {
      if (auto u = make_uring_io(&why)) {
        *io = std::move(u);
        spool::log().info("I/O backend io_uring");
        return;
      }
    } else if (forced == nullptr || *forced == '\0' || std::strcmp(forced, "mmap") == 0) {  // SPOOL_IO= too
      *io = make_mmap_io();
      spool::log().info("I/O backend mmap");
      return;
    } else if (std::strcmp(forced, "pwrite") != 0) {
      why = std::string("SPOOL_IO=") + forced + " is not a backend (mmap, pwrite, io_uring)";
    } else {
      // (Built from `forced`, not assigned a literal: g++ 12 for 32-bit targets then reports
      // a false -Wrestrict overlap inside std::string::assign.)
      why = std::string("SPOOL_IO=") + forced;
    }
    *io = make_pwrite_io();
    spool::log().info("I/O backend pwrite ({})", why);
  });
  return *io;
}

}  // namespace spool::io
