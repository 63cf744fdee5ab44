// I/O fault injection for queue-level tests (tests/faults_*_test.cc): an io::Io (the
// internal seam every file operation of a queue goes through, src/io/io.h) that a test puts
// in the queue's Env (`o.env = make_default_env(sysfaults::io())`), and whose bookkeeping lives in this
// process and, for the undo log, in memory shared across fork. Its writes are pwrites (no
// mapped stores), so every write of such a queue is seen. Unarmed, each call just makes the
// system call.
//
// Two uses:
//  - injected errors: the N-th write / datasync / fallocate fails with an errno (once or
//    sticky), or writes transfer at most K bytes per call (short writes);
//  - simulated power loss, after LevelDB's fault_injection_test: while recording, every
//    write first saves the bytes it overwrites into a shared-memory undo log, and every
//    successful datasync marks that file's entries durable. The log lives in a
//    MAP_SHARED mapping made before fork, so after a child is SIGKILLed the parent can
//    undo the child's unsynced writes (newest first, optionally tearing the oldest undone
//    write at a 512-byte boundary), which is what a power cut does to the page cache.
//    Directory operations (create, rename, unlink) are not undone; spool fsyncs the
//    directory right after each of them.
//
// Why this and io::FaultIo (src/io/fault_io.h) are still two: FaultIo keeps its undo log in
// the memory of the process that wrote (a cut and a reopen in one process: storage_test,
// power_cut_test), this one in a MAP_SHARED mapping made before fork, so that the parent
// undoes the writes of a child that was SIGKILLed, and it adds what the faults tests hold a
// process with (park_next_sync, on_sync, on_rename) and process-wide counters. One Io would
// be FaultIo with a pluggable undo store (private or shared) and these hooks; not done yet
// (issue 42, item 5). Both reach a queue the same way, through its Env.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <functional>
#include <string>

namespace spool::io {
class Io;
}

namespace spool::test::sysfaults {

// The Io to open queues with: shared by every queue of the process (and its fork children).
std::shared_ptr<io::Io> io();

enum class Op { kWrite, kSync, kAllocate };

// The `nth` (1-based, from now) call of `op` fails with errno `err`; with `sticky` every
// later one too, until clear().
void fail(Op op, int nth, int err, bool sticky = false);
// Every write transfers at most `bytes` (0: no limit).
void short_writes(size_t bytes);
void clear();
// The next datasync first creates the file `path`, then waits while it exists (the call
// holds whatever the caller holds meanwhile: a test kills it there).
void park_next_sync(const std::string& path);
// Called in the syncing thread before every datasync and directory sync (nullptr: none).
void on_sync(std::function<void()> f);
// Called in the renaming thread before every rename (nullptr: none).
void on_rename(std::function<void(const std::string& from, const std::string& to)> f);

struct Counters {
  uint64_t writes = 0, syncs = 0, allocates = 0;  // calls seen
  uint64_t injected = 0;                          // calls failed on purpose
  uint64_t shortened = 0;                         // writes cut short on purpose
};
Counters counters();

// Maps the shared undo log (call before fork; `bytes` bounds what can be undone).
void init_undo_log(size_t bytes);
// Starts recording in this process (the child that will be "powered off").
void start_recording();
// Whether the undo log ran out of room (then the round proves nothing and is retried).
bool undo_log_overflowed();

struct CutReport {
  size_t unsynced = 0;  // writes not covered by a datasync when the power went
  size_t kept = 0;      // of those, how many reached the disk anyway (oldest first)
  size_t undone = 0;    // rolled back
  bool torn = false;    // the oldest rolled-back write was torn (its first part kept)
  size_t missing = 0;   // undone writes whose file no longer exists (unlinked)
};
// Simulated power cut over the files under `root`: keeps a random prefix of the unsynced
// writes and undoes the rest. Call in the parent after the recording child died. Empties
// the undo log.
CutReport power_cut(const std::string& root, std::mt19937_64& rng);

}  // namespace spool::test::sysfaults
