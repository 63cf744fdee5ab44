// A fault-injecting Io for tests, after LevelDB's fault_injection_test Env and SQLite's
// test6.c: it wraps a real backend, can fail the N-th operation of a kind with an errno,
// can cut every write short, and remembers the bytes each unsynced write overwrote so a
// simulated power cut can put them back ("unsynced writes are lost").
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "io/io.h"

namespace spool::io {

class FaultIo final : public Io {
 public:
  enum class Op { kWrite, kSync, kAllocate, kOpen };

  explicit FaultIo(std::shared_ptr<Io> inner) : inner_(std::move(inner)) {}
  // Every write goes through write_some (never a mapping), so an mmap inner backend's are pwrites here.
  const char* name() const override { return inner_->maps_writes() ? "pwrite" : inner_->name(); }

  // The `nth` (1-based, counted from now) operation of kind `op` fails with -err; with
  // `sticky` every later one does too, until clear_faults().
  void fail(Op op, int nth, int err, bool sticky = false);
  void clear_faults();
  // Every write transfers at most `bytes` per attempt (0: no limit).
  void set_short_writes(uint64_t bytes) { short_writes_ = bytes; }
  // Number of writes not yet covered by a datasync of their file.
  size_t unsynced_writes() const;
  // Simulated power cut: keeps the oldest `keep` unsynced writes and undoes the rest, newest
  // first, by restoring the bytes they overwrote. Forgets all unsynced state afterwards.
  void drop_unsynced(size_t keep);

  int datasync(int fd) override;
  int allocate(int fd, uint64_t off, uint64_t len) override;
  int open(const std::string& path, int flags, mode_t mode) override;

 protected:
  int64_t write_some(int fd, const iovec* iov, int iovcnt, uint64_t off) override;

 private:
  struct Undo {
    int fd;
    uint64_t off;
    std::vector<char> old;
  };
  int injected(Op op);

  std::shared_ptr<Io> inner_;
  mutable std::mutex mu_;
  struct Fault {
    int countdown;
    int err;
    bool sticky;
  };
  std::map<Op, Fault> faults_;
  uint64_t short_writes_ = 0;
  std::vector<Undo> unsynced_;
};

}  // namespace spool::io
