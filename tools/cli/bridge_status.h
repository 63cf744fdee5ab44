// Where a `spool forward` or `spool pull` bridge stands, for `spool top` and the dashboard
// (docs/operations.md, "Bridges"): each bridge process writes a small status file,
// QUEUE/bridge.PID (JSON), into the directory of the queue it drains or fills, about once a
// second, and removes it when it stops. A viewer reads the queue's bridge.* files and keeps
// those of a live process updated within the last kStaleAfter (a SIGKILLed bridge's file
// stays behind, ignored, until a bridge with its pid replaces it).
//
// The file is written as every file spool makes in a queue directory: relative to a
// descriptor of the directory, never following a link (a temporary file created with
// O_EXCL | O_NOFOLLOW, then renamed over the name, which replaces a planted link instead of
// following it), with the mode of the queue's spool.conf (who may read the settings may
// read this). A reader opens with O_NOFOLLOW and reads regular files only.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace spool::cli {

inline constexpr std::chrono::seconds kBridgeStaleAfter{10};

struct BridgeStatus {
  std::string kind;  // "forward" (this queue to NATS) or "pull" (NATS into this queue)
  int pid = 0;
  std::string peer;  // the NATS server (credentials removed) and the subject or stream/consumer
  uint64_t moved = 0;       // messages moved since the bridge started
  uint64_t last_id = 0;     // forward: the last queue id confirmed; pull: the last stream sequence queued; 0: none
  double last_at = 0;       // Unix time of that move; 0: none yet
  // The bridge's backlog: forward: the messages of the queue not yet forwarded (ready,
  // delayed, and leased: published and awaiting the PubAck); pull: the consumer's pending
  // messages as the last fetched one said (0 after a fetch that found none). -1: not known yet.
  int64_t lag = -1;
  // Forward: the age of the queue's oldest ready message; pull: how old (since its publish)
  // the last message pulled was when it was queued. 0: none.
  double lag_s = 0;
  double updated_at = 0;  // Unix time of this status
};

// Writes the status of the bridge running in this process for queue `dir`, at most once a
// second (now when `force`); failures are ignored (the status is for viewers only).
// remove() (and the destructor) takes the file away. One per bridge; not thread-safe.
class BridgeStatusFile {
 public:
  explicit BridgeStatusFile(std::string dir);
  ~BridgeStatusFile();
  BridgeStatusFile(const BridgeStatusFile&) = delete;
  BridgeStatusFile& operator=(const BridgeStatusFile&) = delete;
  // True when a write is due (a second after the last one).
  bool due() const;
  void write(BridgeStatus s);
  void remove();

 private:
  std::string dir_;
  int dir_fd_ = -1;
  std::string name_;  // bridge.PID
  std::chrono::steady_clock::time_point last_{};
};

// The live bridges of queue `dir` (see above), by pid.
std::vector<BridgeStatus> read_bridges(const std::string& dir);

}  // namespace spool::cli
