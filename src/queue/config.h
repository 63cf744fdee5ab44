// spool.conf: a queue's stored settings, as "key = value" lines after a "spool-queue N"
// version line, so people can read them and tools can grep them.
#pragma once

#include <string>

#include "spool/queue.h"

namespace spool::queue {

inline constexpr int kConfigVersion = 1;

struct Config {
  QueueOptions opts;
  uint64_t uid = 0;  // random; tags receipts so one queue's receipt is refused by another
};

// Writes `dir`/spool.conf atomically (temp file, fsync, rename, fsync dir).
Status write_config(const std::string& dir, const Config& c);
// Reads it. kNotFound when absent; kIncompatible for a newer version; kCorrupt for junk.
Result<Config> read_config(const std::string& dir);

const char* sync_name(SyncPolicy p);

}  // namespace spool::queue
