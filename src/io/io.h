// The one narrow interface through which spool touches files. Everything above src/io/
// calls these and never read/write/fsync directly, so tests can swap in their FaultIo
// (tests/fault_io.h: ENOSPC, EIO, short writes, dropped unsynced data) and CI can run every
// test on each backend.
//
// Conventions follow liburing: functions return >= 0 on success and -errno on failure,
// and never set errno for the caller. Implementations are thread-safe.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>

namespace spool::io {

class Io {
 public:
  virtual ~Io() = default;
  // "mmap", "io_uring" or "pwrite" (a test's FaultIo reports the backend whose writes it sees).
  virtual const char* name() const = 0;
  // Whether records may be stored through a writable shared mapping of a preallocated
  // segment instead of write_all() (the log decides per directory: storage/log.h). The
  // other operations, datasync included, are this Io's either way.
  virtual bool maps_writes() const { return false; }

  // Writes all `iovcnt` buffers at `off`, resuming short writes. 0 or -errno.
  int write_all(int fd, const iovec* iov, int iovcnt, uint64_t off);
  // Makes written data durable (fdatasync). 0 or -errno. An error here is fatal for the
  // file: the caller must not retry and assume success (after a failed fsync the kernel may have dropped the dirty pages and marked them clean: a retry "succeeds" without the data).
  virtual int datasync(int fd) = 0;
  // Reserves [off, off+len) on disk (fallocate mode 0). 0 or -errno (ENOSPC up front).
  virtual int allocate(int fd, uint64_t off, uint64_t len);
  // open(2): fd or -errno. O_CLOEXEC is always added.
  virtual int open(const std::string& path, int flags, mode_t mode);
  virtual int rename(const std::string& from, const std::string& to);
  virtual int unlink(const std::string& path);
  // fsync of a directory, so that creates, renames and unlinks in it are durable.
  virtual int sync_dir(const std::string& path);

 protected:
  // One write attempt: bytes written (may be short) or -errno.
  virtual int64_t write_some(int fd, const iovec* iov, int iovcnt, uint64_t off) = 0;
};

// The plain pwritev/fdatasync backend.
std::unique_ptr<Io> make_pwrite_io();
// pwrite's operations, with maps_writes(): records are stored through the mapping.
std::unique_ptr<Io> make_mmap_io();
// The io_uring backend, or nullptr when io_uring cannot be set up here; `why` then says so.
std::unique_ptr<Io> make_uring_io(std::string* why);
// mmap unless SPOOL_IO names another backend (pwrite, io_uring; io_uring falls back to
// pwrite where it cannot be set up); the choice is logged once per process (spdlog, info
// level). A log on a filesystem where mapped stores are unsafe writes with pwrite instead.
std::shared_ptr<Io> default_io();

}  // namespace spool::io
