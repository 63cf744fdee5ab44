// Shared (never FUTEX_PRIVATE_FLAG) futex wait/wake on a word in a MAP_SHARED file
// mapping: the kernel keys it by inode and offset, so it works across processes that map
// the file at different addresses (a private futex is keyed by address: no wake would cross).
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <ctime>

namespace spool::sys {

// Sleeps while *word == expected, at most `timeout_ns`. Spurious returns are allowed.
inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, uint64_t timeout_ns) {
  timespec ts{static_cast<time_t>(timeout_ns / 1000000000ull),
              static_cast<long>(timeout_ns % 1000000000ull)};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

// Wakes up to `n` waiters.
inline void futex_wake(std::atomic<uint32_t>* word, int n) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, n, nullptr, nullptr, 0);
}

static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free);

}  // namespace spool::sys
