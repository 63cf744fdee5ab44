// spool's own spdlog logger ("spool", to stderr). Quiet by default: warnings and errors
// only; SPOOL_LOG=debug|info|warn|error|off changes the level. Message contents never go
// to the log.
#pragma once

#include <spdlog/spdlog.h>

namespace spool {

spdlog::logger& log();

}  // namespace spool
