// spool's own spdlog logger ("spool", to stderr). Quiet by default: warnings and errors
// only; SPOOL_LOG=debug|info|warn|error|off changes the level. Message contents never go
// to the log.
#pragma once

#include <spdlog/spdlog.h>

namespace spool {

spdlog::logger& log();

// The one format of every log line spool writes, the library's and `spool work`'s alike
// (docs/api.md, "Logging"): local time to the millisecond, who wrote it (the logger's name
// and the process id), the level, the message:
//   2026-12-07T14:05:00.123 spool[4242] warning: /srv/q: compaction: ...
//   2026-12-07T14:05:00.123 spool work[4243] info: message 17: command exited ...
// The name says who, so messages do not start with "spool: ".
inline constexpr const char* kLogPattern = "%Y-%m-%dT%H:%M:%S.%e %n[%P] %l: %v";

}  // namespace spool
