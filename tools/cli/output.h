// Output helpers of the CLI: JSON objects for messages and stats, UTF-8 check, base64.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "spool/queue.h"
#include "sys/clock.h"

namespace spool::cli {

bool valid_utf8(std::string_view s);
std::string base64(std::string_view s);
// The bytes of standard base64 `s` (padding optional); nullopt if `s` is not base64.
std::optional<std::string> unbase64(std::string_view s);
// `s` on one line of text: a backslash as \\, a newline as \n, a carriage return as \r,
// other control bytes (and, where `s` is not UTF-8, every byte from 0x80) as \xNN. For
// attribute keys and values printed as "attribute: KEY=VALUE", so that a value cannot forge
// another line (a "receipt:" line of recv's stderr), and for a JSON key that is not UTF-8.
std::string one_line(std::string_view s);
// ISO 8601 UTC with milliseconds, e.g. 2026-11-29T20:40:00.123Z (sys/clock.h).
using sys::iso_time;
// id, receipt (if any), receive_count, enqueued_at, and payload or payload_base64.
nlohmann::json message_json(const Message& m);
// id, state, receive_count, size, priority, group (if any), enqueued_at, age_s; due_at (in
// flight, delayed), holder_pid (a bound lease) and original_id (a dead letter) when the
// message has them. `dead`: a dead letter's info (as the DLQ's list() gives it), shown
// with state "dead".
nlohmann::json info_json(const MessageInfo& m, bool dead = false);
// One line of `spool list`: ID STATE RECEIVES BYTES PRI AGE DUE HOLDER ORIGINAL GROUP ("-"
// where there is none; the group last, as one_line() writes it); list_header() names the
// columns.
std::string info_line(const MessageInfo& m, bool dead = false);
std::string list_header();
nlohmann::json stats_json(const Stats& s);
// A subscription as `spool sub list --json` and `spool stats --json` show it.
nlohmann::json subscription_json(const SubscriptionInfo& s);
// The Prometheus text exposition format of some queues' stats, each series labelled
// queue="NAME" (the dashboard's /metrics); each family's HELP and TYPE come once, as the
// format requires. The one-queue form is `spool stats --prometheus`.
std::string prometheus(const std::vector<std::pair<std::string, const Stats*>>& queues);
std::string prometheus(const std::string& queue, const Stats& s);
// `value` escaped for a Prometheus label value (backslash, double quote, newline).
std::string prometheus_label(const std::string& value);
// One more gauge of `queue` in the format prometheus() writes.
std::string prometheus_gauge(const std::string& queue, const char* name, const char* help, uint64_t value);

// The disk a queue directory takes, counted as du(1) counts it: the blocks allocated to
// every file and directory under it (each inode once; symbolic links not followed), so the
// dead-letter queue (DIR/dlq) is in `total` too. By part: the segment files, the index, the
// dead-letter queue; `total` less those three is the rest (spool.conf, lock files, the
// directories themselves).
struct DiskUse {
  uint64_t total = 0, segments = 0, index = 0, dlq = 0;
};
DiskUse disk_use(const std::string& dir);

// With `prev`, the stats of `seconds` ago, adds a line of rates (for --watch); with `disk`,
// a line of what the directory takes on disk.
std::string human_stats(const std::string& queue, const Stats& s, const Stats* prev = nullptr,
                        double seconds = 0, const DiskUse* disk = nullptr);

}  // namespace spool::cli
