// A robust, process-shared pthread mutex living in shared memory, behind one lock path.
//
// Boost 1.74's interprocess_mutex is not robust and, even where Boost has robust mutexes,
// it offers no hook to repair state when the owner died, so this ~60-line
// wrapper is written here. lock() reports kOwnerDied: the caller then holds the lock, must
// repair the protected state, and call mark_consistent() before unlock(); if it unlocks
// without doing so, every later lock() reports kUnrecoverable.
#pragma once

#include <pthread.h>

namespace spool::sys {

class RobustMutex {
 public:
  enum class LockResult { kOk, kOwnerDied, kUnrecoverable, kError, kBusy, kTimedOut };

  // Initialises the mutex in place (shared memory); only when no process can be using it.
  // Returns 0 or an errno.
  int init();
  // Takes the lock, or kTimedOut when it has slept about `slice_ns` (> 0; measured by the
  // wall clock, see the .cc) without getting it, so that the caller can check what a
  // sleeper cannot see and call again.
  LockResult lock_for(long slice_ns);
  // Like lock_for(), but kBusy instead of waiting when another thread holds it.
  LockResult try_lock();
  void mark_consistent();
  void unlock();
  pthread_mutex_t* native() { return &mu_; }

 private:
  pthread_mutex_t mu_;
};

}  // namespace spool::sys
