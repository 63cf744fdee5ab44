#include "logging.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>

namespace spool {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = std::make_shared<spdlog::logger>("spool", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    const char* level = std::getenv("SPOOL_LOG");
    l->set_level(level != nullptr ? spdlog::level::from_str(level) : spdlog::level::warn);
    return l;
  }();
  return *logger;
}

}  // namespace spool
