// Every queue under some roots, and what the last refreshes read of each: the figures that
// `spool top` and the dashboard of `spool serve --http` show (docs/operations.md).
//
// A refresh reads each queue's stats() (counters in the index header, the heap of leased
// and delayed messages, the segment files' sizes): never the backlog, so a queue of 10M
// ready messages costs what one of 10 does. Rates are the counters' differences between two
// refreshes, so sends and acks pay nothing for them. Not thread-safe: one caller at a time
// (the dashboard holds a lock around it).
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli/bridge_status.h"
#include "spool/queue.h"

namespace spool::cli {

// A root is a queue, or a directory searched `depth` levels down for queues; a queue's own
// subdirectories (its dead-letter queue) are not searched. Returns (dir, name) pairs, the
// name relative to its root (with several roots, prefixed by the root), sorted by name
// within a root.
std::vector<std::pair<std::string, std::string>> find_queues(const std::vector<std::string>& roots, int depth);

// Per second, between two refreshes.
struct Rates {
  double send = 0, receive = 0, redeliver = 0, ack = 0, nack = 0, dead_lettered = 0, expired = 0;
};

// Room left before a send is refused: the queue's back-pressure limits (max_ready counts
// ready and delayed messages, max_bytes payload bytes; 0: no such limit) and the free space
// of its filesystem (for an unprivileged user, statvfs's f_bavail).
struct Headroom {
  uint64_t max_ready = 0, ready_left = 0;
  uint64_t max_bytes = 0, bytes_left = 0;
  uint64_t fs_size = 0, fs_free = 0;
  // The tightest of the three as the fraction left (0..1) and its name ("ready", "bytes",
  // "fs"); fraction 1 and "" when none is known.
  std::pair<double, const char*> tightest() const;
};

// One refresh of a queue, kept for the charts.
struct Sample {
  std::chrono::system_clock::time_point at;
  Rates rates;
  uint64_t ready = 0, in_flight = 0, dead = 0;
};

struct SurveyedQueue {
  std::string name;  // as shown (find_queues)
  std::string dir;
  std::shared_ptr<Queue> q;  // opened at the first refresh; shared so that an action can run outside the survey's lock
  std::string error;         // it could not be opened or read (then the figures are the last good ones)
  Stats st;
  bool have = false;        // st was read at least once
  bool have_rates = false;  // rates was computed (two refreshes)
  Rates rates;
  Headroom room;
  std::vector<BridgeStatus> bridges;  // the live forward/pull bridges of this queue (bridge.* files)
  std::chrono::steady_clock::time_point at;
  std::deque<Sample> history;  // oldest first, at most Survey::kHistory
};

class Survey {
 public:
  static constexpr size_t kHistory = 300;  // samples kept per queue (5 min at 1 s)

  Survey(std::vector<std::string> roots, int depth) : roots_(std::move(roots)), depth_(depth) {}
  // Finds the queues under the roots again: new ones appear, removed ones go; those kept
  // keep their open queue and history.
  void discover();
  // Reads every queue's stats (after discover() if the last one was 5 s ago or more).
  void sample();
  // Reads one queue's stats now (after an action on it).
  void sample(SurveyedQueue& r);
  const std::vector<std::unique_ptr<SurveyedQueue>>& queues() const { return rows_; }
  SurveyedQueue* find(const std::string& name) const;

 private:
  std::vector<std::string> roots_;
  int depth_;
  std::vector<std::unique_ptr<SurveyedQueue>> rows_;
  std::chrono::steady_clock::time_point discovered_;
};

// What the detail views (top's pane, the dashboard's) show of a queue beyond its stats: its
// leases and its dead letters grouped by reason. Reads at most `max_leases` leases and
// `max_dead` dead letters (each one's attributes: show() per dead letter), keeping the
// first `dead_kept` of those; nothing is read for a count that stats `st` says is 0 (so the
// dead-letter queue is not created by looking).
struct DeadLetter {
  uint64_t id = 0;  // in the dead-letter queue
  std::string reason;  // spool.dead.reason, "unknown" without one
  std::string original_id, receive_count, enqueued_at;  // spool.dead.*
  Attributes other;  // the attributes that are not spool.dead.*
  std::string payload;
};
struct Detail {
  std::vector<MessageInfo> leases;                // in flight, by id
  std::map<int32_t, uint64_t> leases_by_holder;   // pid (0: unbound) -> leases
  uint64_t dead_read = 0;                         // dead letters read
  std::map<std::string, uint64_t> dead_by_reason;  // over those read
  std::vector<DeadLetter> dead;                   // the first dead_kept
};
Detail read_detail(Queue& q, const Stats& st, size_t max_leases, size_t max_dead, size_t dead_kept);

// What top's peek shows of a queue: its first `max` messages in id order (Queue::peek:
// ready, in flight and delayed alike; never more, so a queue of 10M costs what one of `max`
// does), those whose payload holds `text` (every one for an empty text), the first `kept`
// of them with their payloads.
struct Peeked {
  size_t read = 0;      // messages read
  bool more = false;    // read == max: the queue may hold messages not searched
  size_t matched = 0;   // of those read, the ones whose payload holds the text
  std::vector<Message> shown;  // the first `kept` of them
};
Result<Peeked> peek_payloads(Queue& q, size_t max, std::string_view text, size_t kept);

// The first bytes of `payload` as at most `width` printable ASCII characters: a backslash
// as \\, tab, newline and carriage return as \t \n \r, every other byte outside ' '..'~'
// as \xHH (UTF-8 text too: a terminal's locale is not known). An escape is never cut.
std::string printable_prefix(std::string_view payload, size_t width);

// A sparkline of `values` in `width` characters of " .:-=+*#%@" (the last `width` values;
// scaled from 0 to their largest), for terminals without line drawing.
std::string ascii_sparkline(const std::vector<double>& values, size_t width);

// 1.5K, 3.0M, 120B; and an age as 4.7s, 3m, 2.0h, 1.5d ("-" for none).
std::string human_bytes(uint64_t b);
std::string human_age(double seconds);

}  // namespace spool::cli
