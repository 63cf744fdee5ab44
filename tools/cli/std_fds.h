// Descriptors 0, 1 and 2 of a process started with some of them closed (`spool recv Q >&-`,
// a daemon's careless parent). Unless they are open, the first file a program opens takes
// the lowest free number: a queue's `gate` or `index` becomes "standard output", and a
// printf writes a payload into the queue's lock file. Every program of spool (spool,
// spool-dump, spoolfs) calls ensure_std_fds() first in main(), before it opens anything.
#pragma once

namespace spool::cli {

// Which of the standard descriptors were closed at start.
struct StdFds {
  bool in_closed = false;
  bool out_closed = false;
  bool err_closed = false;
};

// Opens /dev/null onto each of 0, 1 and 2 that is closed (read-only on 0, write-only on 1
// and 2), so nothing opened later can take their numbers, and says which were closed.
// Returns false (errno set) if /dev/null could not be opened: the caller must then exit
// without opening anything (it cannot say why if 2 is among the closed ones).
// Not thread-safe: call it before any thread starts.
bool ensure_std_fds(StdFds* closed);

}  // namespace spool::cli
