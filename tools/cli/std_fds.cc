#include "cli/std_fds.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace spool::cli {

bool ensure_std_fds(StdFds* closed) {
  *closed = {};
  bool* flag[3] = {&closed->in_closed, &closed->out_closed, &closed->err_closed};
  // In order 0, 1, 2: open() returns the lowest free number, so it is `fd` when the ones
  // below are open (and they are, by then); dup2 covers a surprise.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    *flag[fd] = true;
    // Not O_CLOEXEC: like any standard descriptor, it is inherited by commands run.
    int null = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (null < 0) return false;
    if (null != fd) {
      int moved = ::dup2(null, fd);
      int saved = errno;
      ::close(null);
      if (moved != fd) {
        errno = saved;
        return false;
      }
    }
  }
  return true;
}

}  // namespace spool::cli
