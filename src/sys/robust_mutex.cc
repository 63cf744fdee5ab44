#include "sys/robust_mutex.h"

#include <cerrno>

namespace spool::sys {

int RobustMutex::init() {
  pthread_mutexattr_t a;
  int r = pthread_mutexattr_init(&a);
  if (r != 0) return r;
  r = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  if (r == 0) r = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  if (r == 0) r = pthread_mutex_init(&mu_, &a);
  pthread_mutexattr_destroy(&a);
  return r;
}

RobustMutex::LockResult RobustMutex::lock() {
  int r = pthread_mutex_lock(&mu_);
  switch (r) {
    case 0: return LockResult::kOk;
    case EOWNERDEAD: return LockResult::kOwnerDied;
    case ENOTRECOVERABLE: return LockResult::kUnrecoverable;
    default: return LockResult::kError;
  }
}

void RobustMutex::mark_consistent() { pthread_mutex_consistent(&mu_); }

void RobustMutex::unlock() { pthread_mutex_unlock(&mu_); }

}  // namespace spool::sys
