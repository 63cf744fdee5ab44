// A mount left behind by a killed spoolfs, and its removal; a live one, and its refusal.
//
// spoolfs mounts with auto_unmount, so fusermount3 removes the mount when the daemon dies,
// even by SIGKILL. Two cases defeat that: the watcher was killed too (SIGKILL to the whole
// process group or cgroup, as systemd's final kill does), and a chroot whose / is not a
// mount point (the watcher's first step, marking / private in a new mount namespace, fails
// there and it exits without unmounting). The dead mount then answers every access with
// "Transport endpoint is not connected", and mounting on it fails, so a restart would too.
#pragma once

#include <string>

namespace spoolfs {

// If `mountpoint` is the dead mount of a spoolfs, unmounts it (lazily, with fusermount3,
// which also works for the non-root user who mounted it) and sets *notice to say so.
// Returns false with *error set if a dead mount is there that is not spoolfs's (it is left
// alone) or that could not be removed. Anything else, dead mount or not, returns true.
bool clear_dead_mount(const std::string& mountpoint, std::string* notice, std::string* error);

// False with *error set (naming the queue mounted there and how to unmount it) if
// `mountpoint` already holds a live spoolfs mount: mounting again would stack a second
// daemon on top of the first (issue 24), whose files would then be out of reach.
bool refuse_live_mount(const std::string& mountpoint, std::string* error);

}  // namespace spoolfs
