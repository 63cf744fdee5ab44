#include "duration.h"

#include <cmath>
#include <cstdlib>
#include <string>

namespace spool::fs {

std::optional<Millis> parse_duration(std::string_view text) {
  size_t digits = 0;
  bool dot = false;
  while (digits < text.size() &&
         ((text[digits] >= '0' && text[digits] <= '9') || (text[digits] == '.' && !dot))) {
    dot = dot || text[digits] == '.';
    ++digits;
  }
  if (digits == 0 || (digits == 1 && dot)) return std::nullopt;
  std::string number(text.substr(0, digits));
  std::string_view unit = text.substr(digits);
  double scale;
  if (unit == "ms") {
    scale = 1;
  } else if (unit == "s" || unit.empty()) {
    scale = 1e3;
  } else if (unit == "m") {
    scale = 60e3;
  } else if (unit == "h") {
    scale = 3600e3;
  } else {
    return std::nullopt;
  }
  double ms = std::strtod(number.c_str(), nullptr) * scale;
  if (!std::isfinite(ms) || ms > 1e15) return std::nullopt;
  return Millis{static_cast<int64_t>(std::llround(ms))};
}

}  // namespace spool::fs
