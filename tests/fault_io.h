// The fault-injecting io::Io of the tests, after LevelDB's fault injection Env (an
// EnvWrapper in its tests): it passes every call on to the Io it wraps, and on the way can
//  - fail the N-th write, datasync, fallocate or open with an errno (once or sticky), or cut
//    every write short;
//  - call a test's hook before each sync (datasync or directory fsync) and each rename, and
//    park the next datasync (the caller holds whatever it holds meanwhile: a test kills it
//    there); it counts the calls it saw;
//  - simulate a power loss (LevelDB's fault injection, SQLite's test6.c): while it records,
//    every write first saves the bytes it overwrites in an undo log and every successful
//    datasync marks that file's entries durable; power_cut() puts back what the unsynced
//    writes overwrote, which is what a power cut does to the page cache. Directory operations
//    (create, rename, unlink) are not undone: spool fsyncs the directory right after each.
// The undo log lives in this process's memory (a cut and a reopen in one process) or in
// memory shared with the children forked after it was made, so that a parent undoes the
// writes of a child it killed with SIGKILL. Every write goes through write_some (never a
// mapping), so each is seen. A queue gets it through its Env (`make_default_env(fault)`),
// a Log through its options.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>

#include "io/io.h"

namespace spool::test {

class FaultIo final : public io::Io {
 public:
  enum class Op { kWrite, kSync, kAllocate, kOpen };
  // kPrivate: this process's memory, recorded from now on. kShared: memory shared with the
  // children this process forks afterwards; a child records after start_recording(), the
  // parent (which cuts after the child died) does not.
  enum class Undo { kPrivate, kShared };
  struct Counters {
    uint64_t writes = 0, syncs = 0, allocates = 0;  // calls seen
    uint64_t injected = 0;                          // calls failed on purpose
    uint64_t shortened = 0;                         // writes cut short on purpose
  };
  struct CutReport {
    size_t unsynced = 0;  // writes not covered by a datasync when the power went
    size_t kept = 0;      // of those, how many reached the disk anyway (oldest first)
    size_t undone = 0;    // rolled back
    bool torn = false;    // the oldest rolled-back write was torn (its first part kept)
    size_t missing = 0;   // undone writes whose file no longer exists (unlinked)
  };

  explicit FaultIo(std::shared_ptr<io::Io> inner) : inner_(std::move(inner)) {}
  ~FaultIo() override;
  FaultIo(const FaultIo&) = delete;
  FaultIo& operator=(const FaultIo&) = delete;
  // The backend whose writes it sees: a mapping one's are pwrites here.
  const char* name() const override { return inner_->maps_writes() ? "pwrite" : inner_->name(); }

  // The `nth` (1-based, from now) call of `op` fails with errno `err`; with `sticky` every
  // later one too, until clear().
  void fail(Op op, int nth, int err, bool sticky = false);
  // Every write transfers at most `bytes` (0: no limit).
  void set_short_writes(uint64_t bytes);
  // No more injected errors or short writes.
  void clear();
  // The next datasync first creates the file `path`, then waits while it exists.
  void park_next_sync(const std::string& path);
  // Called in the syncing thread before every datasync and directory sync (nullptr: none).
  void on_sync(std::function<void()> f);
  // Called in the renaming thread before every rename (nullptr: none).
  void on_rename(std::function<void(const std::string& from, const std::string& to)> f);
  Counters counters() const;

  // Makes (or empties) the undo log; `bytes` bounds what it can hold. kShared: before fork.
  void keep_undo_log(Undo where, size_t bytes);
  // Starts recording in this process (the child that will be "powered off").
  void start_recording();
  // Whether the undo log ran out of room (then a cut would be incomplete).
  bool undo_log_overflowed() const;
  // Number of writes not yet covered by a datasync of their file.
  size_t unsynced_writes() const;
  // Simulated power cut over the files under `root` (found by device and inode, so renamed
  // ones are found too): keeps the oldest `keep` unsynced writes and undoes the rest, newest
  // first; with `tear`, the oldest undone write may be torn at a 512-byte boundary (its first
  // sectors reached the disk), at random. Empties the undo log.
  CutReport power_cut(const std::string& root, size_t keep, std::mt19937_64* tear = nullptr);
  // The same, keeping a random number of them.
  CutReport power_cut(const std::string& root, std::mt19937_64& rng);

  int datasync(int fd) override;
  int allocate(int fd, uint64_t off, uint64_t len) override;
  int open(const std::string& path, int flags, mode_t mode) override;
  int rename(const std::string& from, const std::string& to) override;
  int unlink(const std::string& path) override;
  int sync_dir(const std::string& path) override;

 protected:
  int64_t write_some(int fd, const iovec* iov, int iovcnt, uint64_t off) override;

 private:
  struct Fault {
    int countdown = 0;  // 0: none
    int err = 0;
    bool sticky = false;
  };
  struct Region;  // the undo log (fault_io.cc)
  int injected(Op op);
  void called_on_sync();
  void save_undo(int fd, uint64_t off, uint64_t len);
  void forget(const std::string& path);
  template <class F>
  void for_each_entry(F&& f) const;

  // Guarded by one mutex for every FaultIo of the process (fault_io.cc), which a fork waits
  // for: a child never inherits it locked.
  std::shared_ptr<io::Io> inner_;
  Fault faults_[4];
  uint64_t short_writes_ = 0;
  Counters counters_;
  std::string park_sync_;
  std::function<void()> on_sync_;
  std::function<void(const std::string&, const std::string&)> on_rename_;
  Region* undo_ = nullptr;
  size_t undo_bytes_ = 0;
  bool recording_ = false;
};

}  // namespace spool::test
