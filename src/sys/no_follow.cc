#include "sys/no_follow.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace spool::sys {

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Fd open_dir(const std::string& path, bool follow, struct stat* st) {
  // O_PATH with O_NOFOLLOW opens a link itself rather than failing, so fstat tells a link
  // from a directory without a second lookup of the path.
  Fd fd(::open(path.c_str(), O_PATH | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW)));
  if (!fd.ok()) return fd;
  if (::fstat(fd.get(), st) != 0) return Fd();
  if (!S_ISDIR(st->st_mode)) {
    const int err = S_ISLNK(st->st_mode) ? ELOOP : ENOTDIR;
    fd = Fd();
    errno = err;
  }
  return fd;
}

Status queue_dir_error(int err, const std::string& what, const std::string& path) {
  if (err == ELOOP) {
    return Status(Code::kCorrupt, path + " is a symbolic link; spool does not follow links in a queue "
                                         "directory (remove it)");
  }
  if (err == ENOTDIR) return Status(Code::kCorrupt, path + " is not a directory (remove it)");
  return errno_status(err, what + " " + path);
}

int set_dir_owner_mode(int dir, gid_t gid, mode_t mode) {
  // "." from the O_PATH descriptor is the directory itself: no name to swap.
  Fd d(::openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d.ok()) return -1;
  if (gid != static_cast<gid_t>(-1) && ::fchown(d.get(), static_cast<uid_t>(-1), gid) != 0) return -1;
  if (mode != 0 && ::fchmod(d.get(), mode) != 0) return -1;
  return 0;
}

bool still_names(int dir, const std::string& path, bool follow) {
  struct stat a {}, b {};
  if (::fstat(dir, &a) != 0) return false;
  const int r = follow ? ::stat(path.c_str(), &b) : ::lstat(path.c_str(), &b);
  return r == 0 && S_ISDIR(b.st_mode) && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace spool::sys
