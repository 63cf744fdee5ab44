// The crash campaign's ledger (tests/crash_campaign_test.cc): what the journals of its
// processes say was sent, delivered, acked and nacked, read back after the processes died.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace spool::campaign {

struct Delivery {
  uint64_t id = 0;
  uint32_t count = 0;
  std::string who;       // "C0.3" (role, slot, incarnation), "W0.2", "D" (the final drain)
  std::string tag;       // the payload's tag
  uint64_t t0 = 0, t1 = 0;  // receive called / returned (CLOCK_BOOTTIME); W: t0 = 0
  uint64_t vis_ns = 0;
  uint64_t deadline = 0;  // lower bound of the lease deadline (extends included)
  bool nack_tried = false, acked = false, ack_tried = false, lease_lost = false;
  bool w_failed = false;  // spool work: the command failed, so it nacked
  bool w_ack_known = false;  // spool work: a later message of the same process proves the ack returned
};

struct Incarnation {
  char role;
  int slot;
  int inc;
  pid_t pid = -1;
  std::string journal, err;
  uint64_t killed_at = 0;  // boot_ns of the SIGKILL
  bool bound = false;      // leases bound to its life
  int view = 0;            // a consumer's view: 0 the queue's own, k subscription "sK"
};

struct Ledger {
  std::set<std::string> attempted;           // tags a send was tried with
  std::map<uint64_t, std::string> sent;      // send returned
  std::map<std::pair<uint64_t, uint32_t>, Delivery> deliveries;
  std::set<std::pair<uint64_t, uint32_t>> duplicate_deliveries;  // the same (id, count) twice
  std::set<uint64_t> acked_ids;              // an ack returned (or spool work's ack is proven)
  std::set<uint64_t> ack_tried_ids;          // an ack was attempted (may not have returned)
  std::vector<std::string> errors;           // E lines
  uint64_t sends = 0, acks = 0, nacks = 0, extends = 0, lease_lost = 0, compactions = 0, copied = 0;
  uint64_t work_handled = 0, work_ack_failed = 0;

  std::vector<std::string> duplicate_details;
  // Records delivery (id, count); a second delivery with the same count is a duplicate.
  void add(Delivery d);
  // The journal of a library process: s/S sends, R receives, a/A acks, n/N nacks, L lease
  // lost, X extends, K compactions, E errors.
  void read_library(const Incarnation& in);
  // The journal of `spool work`'s command ("id count uptime tag" per message) and its stderr.
  // The command fails the first delivery of every 17th id (start_work()).
  void read_work(const Incarnation& in);
};

}  // namespace spool::campaign
