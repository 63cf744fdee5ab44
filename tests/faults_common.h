// What the queue-level fault tests share. Faults at the queue level (docs/reliability.md,
// campaigns 2-4), one executable `faults_test` made of:
//  - tests/faults_setup_test.cc: the queues' file operations reach the fault-injecting Io;
//  - tests/faults_lock_holder_test.cc (2): a process killed with SIGKILL inside the index lock
//    during each state-changing call, and a holder stopped with SIGSTOP (never overridden);
//  - tests/faults_power_test.cc (3, 3b): power loss under sync=always: unsynced writes dropped
//    (tests/fault_io.h), the index deleted, torn or left from "before the reboot"; a garbage
//    or torn index file on open;
//  - tests/faults_disk_test.cc (4): a really full file system (a 2 MiB tmpfs) and injected EIO,
//    ENOSPC and short writes.
// Their queues write through fault_io(), over the pwrite backend whatever SPOOL_IO says. The
// gtest Environment that quiets the log is registered once, in tests/faults_common.cc.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "child_report.h"
#include "env/env.h"
#include "proc_util.h"
#include "spool/queue.h"
#include "fault_io.h"
#include "test_util.h"

namespace spool::faults {

// The test utilities the parts use, by their short names.
using namespace std::chrono_literals;
using test::in_child;
using test::Report;
using test::spawn;
using test::TempDir;
using test::wait_exit;
using test::wait_for_file;
using test::FaultIo;
namespace fs = std::filesystem;

// The fault-injecting Io of this process, shared with its fork children (never destroyed:
// queues opened by static destructors or exit handlers may still use it).
FaultIo& fault_io();

// `o` with fault_io(): what every queue of these tests is opened with, but those of
// FullDisk, which fill a real disk on the default backend.
QueueOptions faulty(QueueOptions o = {});

std::set<uint64_t> ids_of(Queue& q);

// "" when stats, a listing and a replay of the log agree on the depth and the index holds
// its invariants; else what disagrees.
std::string consistency(Queue& q);

// What each known bug is, for the loud skip message.
const char* known_bug_text(const std::string& name);

// GTEST_SKIPs (loudly) when SPOOL_KNOWN_BUG_<name> is set.
#define SKIP_IF_KNOWN_BUG(name)                                                                  \
  do {                                                                                           \
    if (std::getenv("SPOOL_KNOWN_BUG_" name) != nullptr) {                                       \
      std::printf("\n*** KNOWN BUG SPOOL_KNOWN_BUG_%s: %s. This case is SKIPPED until it is "   \
                  "fixed; unset the variable to run it. ***\n\n",                                \
                  name, ::spool::faults::known_bug_text(name));                                  \
      GTEST_SKIP() << "known bug SPOOL_KNOWN_BUG_" name;                                         \
    }                                                                                            \
  } while (0)

// ---- Shared by 2. Lock-holder death and 4. I/O errors -----------------------------------------

// A queue with work for every operation: 200 messages of 1000 bytes in 64 KiB segments
// (four segments), two in three of the first 150 acked, so the sealed segments are about a
// third live: on-demand compaction has live messages to copy, while the background
// compactor (at most a quarter live, and only started by a roll) leaves them alone, so no
// thread of this process writes behind a test's back. The two oldest live messages (ids 3
// and 6) are leased for a minute (receipts for ack, nack and extend).
struct Prepared {
  std::string dir;
  std::unique_ptr<Queue> q;
  std::vector<Message> leased;
  std::set<uint64_t> live;
};
inline constexpr uint64_t kPreparedReady = 98;

Prepared prepare(const std::string& dir);

// ---- Shared by 3. Power loss, 3b. index damage and 4. I/O errors ------------------------------

// Whatever comes back after a cut can be checked byte for byte.
inline constexpr test::TaggedPayloads kPayloads{20, 2500, 'a', 40};

// Damage a stale index can show after a reboot; the first opener must never trust it.
enum class IndexAfterCut { kLeft, kDeleted, kGarbage, kTruncated };

void damage_index(const std::string& qdir, IndexAfterCut how, std::mt19937_64& rng);

}  // namespace spool::faults
