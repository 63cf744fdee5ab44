// Directories of a queue opened without following a symbolic link at their last component
// (docs/security.md, "Planted links"): a queue's dead-letter queue (QUEUE/dlq), its
// segments directory, and a queue that spool is asked to create. Whoever may write a queue
// directory could otherwise point one of these at a directory of another user, and a
// process of that user (or root) operating on the queue would read, write and re-mode it.
// Modes and owners are changed on the descriptor opened, never by path.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <string>

#include "spool/status.h"

namespace spool::sys {

// An open descriptor, closed when it goes. Not copyable.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Opens the directory at `path` as an O_PATH descriptor (no read permission needed), not
// following a link at its last component unless `follow`; its status in *st. On failure an
// invalid Fd and errno: ELOOP for a link (not followed), ENOTDIR for something that is not
// a directory, anything open(2) returns.
Fd open_dir(const std::string& path, bool follow, struct stat* st);

// The error for a directory `path` that open_dir refused with `err`: a link or a
// non-directory named as such ("remove it"), anything else as errno_status(err, what + " " + path).
Status queue_dir_error(int err, const std::string& what, const std::string& path);

// Gives the directory open at `dir` (an open_dir descriptor) group `gid` (unless -1) and
// mode `mode` (unless 0), through the descriptor. 0, or -1 and errno.
int set_dir_owner_mode(int dir, gid_t gid, mode_t mode);

// Whether `path` names the directory open at `dir` (same device and inode), not through a
// link at its last component unless `follow`: what a path-based open that began with
// open_dir checks at its end, so that a link swapped in meanwhile is refused.
bool still_names(int dir, const std::string& path, bool follow);

}  // namespace spool::sys
