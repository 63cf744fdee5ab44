#include "logging.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>

namespace spool {

spdlog::logger& log() {
  // Never destroyed: a Queue closed from an exit handler or a static destructor may still
  // log, after this function's statics are gone.
  static spdlog::logger* const logger = [] {
    auto* l = new spdlog::logger("spool", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    const char* level = std::getenv("SPOOL_LOG");
    l->set_pattern(kLogPattern);
    l->set_level(level != nullptr ? spdlog::level::from_str(level) : spdlog::level::warn);
    return l;
  }();
  return *logger;
}

}  // namespace spool
