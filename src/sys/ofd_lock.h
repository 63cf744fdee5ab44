// Liveness locks: open-file-description (OFD) byte locks, as LMDB's reader table uses.
//
// An OFD lock belongs to the open file description, not to a PID: the kernel drops it when
// the last descriptor referring to it closes, which a kill -9 does. So "is byte k locked by
// someone else?" answers "is the process that claimed slot k alive?" with no PID involved,
// immune to PID reuse and PID namespaces. Unlike classic POSIX record locks, closing some
// other descriptor of the same file does not drop it (that would make a library unsafe).
// fork() duplicates descriptors, which would keep a parent's lock alive in its child;
// close_in_fork_child() prevents that.
#pragma once

#include <atomic>
#include <cstdint>

namespace spool::sys {

// Takes an exclusive lock on byte `n` of `fd` without waiting: 0, or a positive errno
// (EAGAIN: someone holds it).
int ofd_trylock(int fd, uint64_t n);
void ofd_unlock(int fd, uint64_t n);
// True when another open file description holds a lock on byte `n` (or on error, so that
// a failed probe never releases a live process's leases).
bool ofd_held_elsewhere(int fd, uint64_t n);

// In a child created by fork(), the descriptor in *fd is closed (and *fd set to -1) before
// fork() returns there. Registration is lock-free (fork may happen on any thread); false if
// the table (256 entries) is full.
bool close_in_fork_child(std::atomic<int>* fd);
void forget_in_fork_child(std::atomic<int>* fd);

}  // namespace spool::sys
