// A process-private mutex the thread-safety analysis knows (sys/thread_annotations.h):
// libstdc++'s std::mutex and std::lock_guard carry no annotations. Mutex is a std::mutex;
// MutexLock holds it for a scope and may let go of it for a while (unlock(), lock()), as a
// std::condition_variable_any's wait does with it.
#pragma once

#include <mutex>

#include "sys/thread_annotations.h"

namespace spool::sys {

class CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void lock() ACQUIRE() {
    mu_.lock();
    held_ = true;
  }
  void unlock() RELEASE() {
    held_ = false;
    mu_.unlock();
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

}  // namespace spool::sys
