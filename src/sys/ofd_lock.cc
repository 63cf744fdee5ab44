#include "sys/ofd_lock.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

namespace spool::sys {

namespace {

struct flock byte(short type, uint64_t n) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = static_cast<off_t>(n);
  fl.l_len = 1;
  return fl;
}

constexpr int kForkTable = 256;
std::atomic<std::atomic<int>*> g_fork_table[kForkTable];

void close_all_in_child() {
  for (auto& slot : g_fork_table) {
    std::atomic<int>* p = slot.load();
    if (p == nullptr) continue;
    int fd = p->exchange(-1);
    if (fd >= 0) ::close(fd);
  }
}

}  // namespace

int ofd_trylock(int fd, uint64_t n) {
  struct flock fl = byte(F_WRLCK, n);
  while (::fcntl(fd, F_OFD_SETLK, &fl) != 0) {
    if (errno != EINTR) return errno == EACCES ? EAGAIN : errno;
  }
  return 0;
}

void ofd_unlock(int fd, uint64_t n) {
  struct flock fl = byte(F_UNLCK, n);
  (void)::fcntl(fd, F_OFD_SETLK, &fl);
}

bool ofd_held_elsewhere(int fd, uint64_t n) {
  struct flock fl = byte(F_WRLCK, n);
  if (::fcntl(fd, F_OFD_GETLK, &fl) != 0) return true;
  return fl.l_type != F_UNLCK;
}

bool close_in_fork_child(std::atomic<int>* fd) {
  static std::once_flag once;
  std::call_once(once, [] { ::pthread_atfork(nullptr, nullptr, close_all_in_child); });
  for (auto& slot : g_fork_table) {
    std::atomic<int>* expected = nullptr;
    if (slot.compare_exchange_strong(expected, fd)) return true;
  }
  return false;
}

void forget_in_fork_child(std::atomic<int>* fd) {
  for (auto& slot : g_fork_table) {
    std::atomic<int>* expected = fd;
    if (slot.compare_exchange_strong(expected, nullptr)) return;
  }
}

}  // namespace spool::sys
