#include "cli/units.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace spool::cli {
namespace {

// Splits "12.5ms" into 12.5 and "ms"; nullopt unless the number is finite and >= 0.
std::optional<std::pair<double, std::string>> split(const std::string& text) {
  if (text.empty() || text[0] == '-' || text[0] == '+' || std::isspace(static_cast<unsigned char>(text[0]))) {
    return std::nullopt;
  }
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !std::isfinite(v) || v < 0) return std::nullopt;
  return std::make_pair(v, std::string(end));
}

}  // namespace

std::optional<Millis> parse_duration(const std::string& text) {
  auto p = split(text);
  if (!p) return std::nullopt;
  double scale;
  if (p->second.empty() || p->second == "s") scale = 1000;
  else if (p->second == "ms") scale = 1;
  else if (p->second == "m") scale = 60'000;
  else if (p->second == "h") scale = 3'600'000;
  else return std::nullopt;
  double ms = p->first * scale;
  if (ms > 1e15) return std::nullopt;
  return Millis(static_cast<int64_t>(std::llround(ms)));
}

std::optional<uint64_t> parse_size(const std::string& text) {
  auto p = split(text);
  if (!p) return std::nullopt;
  double scale;
  const std::string& u = p->second;
  if (u.empty() || u == "B") scale = 1;
  else if (u == "K" || u == "k" || u == "KiB") scale = 1024.0;
  else if (u == "M" || u == "MiB") scale = 1024.0 * 1024;
  else if (u == "G" || u == "GiB") scale = 1024.0 * 1024 * 1024;
  else return std::nullopt;
  double bytes = p->first * scale;
  if (bytes > 1e18 || bytes != std::floor(bytes)) return std::nullopt;
  return static_cast<uint64_t>(bytes);
}

std::string format_size(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes) / 1024;
  size_t u = 0;
  while (v >= 1024 && u + 1 < sizeof kUnits / sizeof kUnits[0]) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

std::string count_of(uint64_t n, const std::string& noun, const std::string& plural) {
  return std::to_string(n) + " " + (n == 1 ? noun : plural.empty() ? noun + "s" : plural);
}

}  // namespace spool::cli
