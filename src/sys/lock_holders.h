// Who holds a lock that a writer of a queue waits for (docs/security.md, "Locks held by a
// reader"). The files writers lock grant nothing to a class that may not write the queue,
// but a descriptor opened while their mode let others read (after `chmod -R a+rX`, or lock
// files an older spool left 0644) outlives the mode being tightened again, and flock() and
// OFD read locks work on a read-only descriptor. So a wait for such a lock does not go on
// forever when the holder could never be a writer: it fails naming the process.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "spool/status.h"

namespace spool::sys {

struct LockHolder {
  pid_t pid = 0;
  bool known = false;      // its credentials could be read (false: it has exited, and a
                           // process that inherited the descriptor may hold the lock now)
  uid_t uid = 0;           // the process's file-system uid
  bool may_write = false;  // its credentials may write the queue directory (mode bits only)
};

// The processes holding a flock() on the file open as `fd` (from /proc/locks, which names
// them to every user). Empty if none, or if /proc cannot be read.
std::vector<LockHolder> flock_holders(int fd, const struct stat& queue_dir);

// "pid 123 (uid 1001, user bob)" for each holder, joined by ", ".
std::string describe(const std::vector<LockHolder>& holders);

// Reads the credentials of `h.pid` from /proc/PID/status into h: whether they may write a
// directory of status `dir` by its mode bits (root may). h.known stays false if the process
// is gone.
void read_credentials(LockHolder& h, const struct stat& dir);

// flock(fd, op) (LOCK_SH or LOCK_EX), waiting for as long as the holders may write the queue
// directory or cannot be known (a writer holding it for long, e.g. rebuilding a large index,
// is waited for; a warning names it after 10 s). If a holder may not write it, fails with kIo: "PATH is locked
// by pid N (uid U, user X), which may not write the queue; ...". EINTR is retried.
Status flock_waiting(int fd, int op, const std::string& path, const struct stat& queue_dir);

}  // namespace spool::sys
