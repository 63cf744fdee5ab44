// Where a spoolfs daemon's errors go once it has left the terminal (docs/filesystem.md,
// "Errors and the log"): fuse_daemonize points stderr at /dev/null, so without this a
// failure that no reply can carry (a send refused at RELEASE, a lease not bound) would be
// seen by no one.
#pragma once

#include <string>

namespace spoolfs {

// Makes spdlog's default logger (used by spoolfs's own messages) write to stderr, with a
// timestamp and level. Call first in main.
void log_to_stderr();

// Opens `path` for appending (created 0600), before daemonizing, so a bad path is reported
// on the terminal. Returns the descriptor, or -1 with errno set.
int open_log_file(const std::string& path);

// After fuse_daemonize: stderr (spoolfs's messages and libspool's warnings alike) becomes
// `log_fd` if it is >= 0, else a pipe whose lines a thread hands to syslog (ident
// "spoolfs", facility daemon, priority warning). Returns false if neither could be set up.
bool redirect_stderr(int log_fd);

}  // namespace spoolfs
