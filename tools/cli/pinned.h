// Disk held by segments that compaction removed while a process still had them open or
// mapped (docs/security.md, "Disk a reader can pin"). A removed file keeps its blocks until
// its last descriptor and mapping go; any process that could open a segment (anyone the
// queue lets read) can so keep writers' space. The kernel says who through /proc; spool
// stats reports it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace spool::cli {

struct Pinned {
  uint64_t segments = 0;     // removed segment files still open or mapped
  uint64_t bytes = 0;        // the disk they hold (allocated blocks; 0 where unreadable)
  std::vector<pid_t> pids;   // the processes holding them, ascending
  uint64_t unexamined = 0;   // processes whose descriptors and maps this user may not read
};

// Scans /proc/*/fd and /proc/*/map_files for the removed segments of the queue `dir`
// (links "DIR/segments/NAME (deleted)"). Only processes this user may inspect are seen
// (root sees all); the others are counted in `unexamined`.
Pinned pinned_segments(const std::string& dir);

}  // namespace spool::cli
