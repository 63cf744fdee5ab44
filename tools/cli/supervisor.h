// The supervisor `spool work` puts between itself and each command, so that no process of
// a command outlives it: not the command, and not what the command started (docs/cli.md,
// "No command outlives spool work").
//
//   spool work ── supervisor (own process group, child subreaper) ── CMD (own process group)
//                                                                      └─ CMD's children ...
//
// The supervisor forks CMD into a process group of its own and waits for it. It forwards a
// SIGTERM to CMD's whole group; SIGUSR1, or the death of `spool work` (its parent-death
// signal, so a kill -9 counts too), makes it SIGKILL CMD's group. Once CMD has exited, for
// whatever reason, it SIGKILLs what is left of the group and, being a child subreaper, every
// process orphaned below it (a grandchild that left the group with setsid included), reaps
// them all, and only then reports CMD's wait status and exits.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace spool::cli {

struct Supervised {
  pid_t pid = -1;      // the supervisor; signal it with SIGTERM (TERM to CMD's group) or SIGUSR1 (KILL)
  int status_fd = -1;  // read end: CMD's wait status (an int) arrives here before the supervisor exits
};

// Starts the supervisor, which runs `exe` with `argv` and `envp` (each ends with nullptr),
// `stdin_fd` as its standard input, `stderr_fd` as its standard error, and descriptor 1 of
// this process as its standard output. Only
// async-signal-safe calls run between fork and execve, so it may be called from any thread
// of a multi-threaded process; the calling thread must outlive the supervisor (its exit is
// the parent-death signal). Returns pid -1 with errno set if fork fails. The caller closes
// its copies of `stdin_fd` and `stderr_fd`, waits for `pid` and reads `status_fd` (then
// closes it). The supervisor holds `stderr_fd` until it exits, after what the command left
// is gone: a pipe there reaches end of file only then.
Supervised start_supervised(const std::string& exe, char* const* argv, char* const* envp, int stdin_fd,
                            int stderr_fd);

// CMD's wait status from `s` once the supervisor has exited (closes status_fd); false if the
// supervisor ended without reporting one (it was killed).
bool supervised_status(Supervised& s, int* wait_status);

}  // namespace spool::cli
