#include "sys/file_modes.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace spool::sys {

FileModes modes_for(mode_t dir_mode) {
  FileModes m;
  m.dir = dir_mode & 07777;
  m.data = dir_mode & 0666;
  const mode_t w = dir_mode & 0222;
  m.state = w | (w << 1);  // read and write for each class that has write
  return m;
}

mode_t dir_mode_for(mode_t file_mode) {
  const mode_t f = file_mode & 0666;
  mode_t d = f | ((f & 0444) >> 2);
  if ((f & 0020) != 0) d |= S_ISGID;
  return d;
}

int open_state_file(const std::string& path, const FileModes& modes) {
  // (O_RDWR never blocks on a FIFO; a planted one is refused below, not locked and read.)
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, modes.state);
  if (fd < 0) return fd;
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    const int err = stat_ok ? EINVAL : errno;  // EINVAL: not a regular file (queue_file_error)
    ::close(fd);
    errno = err;
    return -1;
  }
  set_own_mode(fd, modes.state);
  return fd;
}

Status queue_file_error(int err, const std::string& what, const std::string& path) {
  if (err == ELOOP) {
    return Status(Code::kCorrupt, path + " is a symbolic link; spool does not follow links in a queue "
                                         "directory (remove it)");
  }
  if (err == EINVAL || err == EISDIR) {
    return Status(Code::kCorrupt, path + " is not a regular file; spool keeps only regular files there (remove it)");
  }
  return errno_status(err, what + " " + path);
}

void fix_state_file(const std::string& path, const FileModes& modes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) set_own_mode(fd, modes.state);
  ::close(fd);
}

void set_own_mode(int fd, mode_t mode) {
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_uid == ::geteuid() && (st.st_mode & 07777) != mode) (void)::fchmod(fd, mode);
}

}  // namespace spool::sys
