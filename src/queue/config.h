// spool.conf: a queue's stored settings, as "key = value" lines after a "spool-queue N"
// version line, so people can read them and tools can grep them.
#pragma once

#include <string>

#include "io/io.h"
#include "spool/queue.h"

namespace spool::queue {

inline constexpr int kConfigVersion = 1;

// The longest visibility a queue stores, and the longest lease or delay a call may ask
// for: a year. Deadlines are nanoseconds of a 64-bit clock; past this they could overflow.
inline constexpr uint64_t kMaxVisibilityMs = 365ull * 24 * 3600 * 1000;

struct Config {
  QueueOptions opts;
  uint64_t uid = 0;  // random; tags receipts so one queue's receipt is refused by another
};

// Writes `dir`/spool.conf atomically (temp file, fsync, rename, fsync dir).
Status write_config(const std::string& dir, const Config& c, io::Io& io);
// Reads it. kNotFound when absent; kIncompatible for a newer version; kCorrupt for junk,
// a missing setting, or a value out of its range (validate()), naming the key and the range.
Result<Config> read_config(const std::string& dir, io::Io& io);

// Checks the stored settings against their ranges (and fills in the default max_payload
// for 0). kInvalidArgument naming the key, its value and the allowed range; `where` (the
// file, or "" for options given to create a queue) starts the message.
Status validate(QueueOptions& o, const std::string& where);

const char* sync_name(SyncPolicy p);

}  // namespace spool::queue
