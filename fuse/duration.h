// Duration arguments of spoolfs ("500ms", "30s", "5m", "2h", or plain seconds such as
// "1.5"), the same grammar as the spool CLI's.
#pragma once

#include <optional>
#include <string_view>

#include "spool/queue.h"

namespace spool::fs {

// nullopt for anything else (empty, negative, unknown unit, trailing junk, overflow).
std::optional<Millis> parse_duration(std::string_view text);

}  // namespace spool::fs
