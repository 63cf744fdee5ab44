// The permissions of the files spool creates in a queue directory, derived from the
// directory's own mode bits, so that the directory's permissions are the access control
// (docs/security.md, "Who may do what") whoever creates a file and whatever their umask.
//
// A class (owner, group, other) that may write the directory may change the queue: it gets
// read and write on every file. A class that may only read the directory gets read access
// to the files that hold what it may see (segments, spool.conf) and none to the files that
// coordinate writers (index, gate, lock, owners, compact.lock): flock() and OFD locks work
// on a read-only descriptor, so a reader who could open those could stop every writer.
// Read-only openers use none of them (they replay the log into a private index).
#pragma once

#include <sys/types.h>

#include <string>

#include "spool/status.h"

namespace spool::sys {

struct FileModes {
  mode_t dir = 0;    // segments/ and a dead-letter queue: the queue directory's own mode
  mode_t data = 0;   // segments, spares, spool.conf
  mode_t state = 0;  // index, gate, lock, owners, compact.lock
};

FileModes modes_for(mode_t dir_mode);

// The mode bits of a queue directory that `spool init --mode M` asks for: M for its files,
// search (x) wherever M grants read, and set-group-ID when a group may write, so that files
// made later by any member take the directory's group.
mode_t dir_mode_for(mode_t file_mode);

// Opens (creating if needed) a state file of the queue at `path`, never following a link,
// and sets the mode `modes` gives it when this process owns it (a file created under a
// umask, or by an older spool, may grant a reader more). -1 and errno on failure; EINVAL
// for something there that is not a regular file (a FIFO, a socket, a device).
int open_state_file(const std::string& path, const FileModes& modes);

// The error for a file of a queue at `path` that `open_state_file` or another opener
// refused with `err`: a planted link or a file that is not a regular file named as such
// ("remove it"), anything else as errno_status(err, what + " " + path).
Status queue_file_error(int err, const std::string& what, const std::string& path);

// The same for a state file that exists but is not opened at every open (owners,
// compact.lock): set to the mode when this process owns it; nothing if it does not exist.
void fix_state_file(const std::string& path, const FileModes& modes);

// Sets `fd` to `mode` when this process owns the file and its mode differs (best effort:
// the file works either way). What the three above and the index's attach share.
void set_own_mode(int fd, mode_t mode);

}  // namespace spool::sys
