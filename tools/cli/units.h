// Parsing of the CLI's durations ("500ms", "30s", "5m", "2h", or plain seconds such as
// "1.5") and sizes ("4096", "64K", "64M", "1G"; powers of 1024).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "spool/queue.h"

namespace spool::cli {

std::optional<Millis> parse_duration(const std::string& text);
std::optional<uint64_t> parse_size(const std::string& text);
// A byte count for people: "19 B", "4.0 KiB", "64.0 MiB", "1.5 GiB" (powers of 1024).
std::string format_size(uint64_t bytes);
// A count with its noun, singular for 1: "1 message", "3 messages", "1 dead letter"
// (`plural`: the noun's plural where it is not noun + "s").
std::string count_of(uint64_t n, const std::string& noun, const std::string& plural = "");

}  // namespace spool::cli
