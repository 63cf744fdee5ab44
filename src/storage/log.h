// The log: the ordered sequence of segment files in one directory, with append (rolling
// to a new preallocated segment when the active one is full), random reads through the
// mappings, and full recovery.
//
// The log does not own its end position: the caller passes the current end to append()
// and stores the returned one. In a queue the end lives in the shared index and append()
// runs under the index lock, so many processes append to one log; a single-process user
// just keeps it in a variable. Thread-safe (the segment cache has its own mutex); two
// concurrent appends with the same `end` are the caller's bug.
#pragma once

#include <sys/types.h>

#include <compare>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "io/io.h"
#include "storage/segment.h"
#include "sys/mutex.h"
#include "sys/thread_annotations.h"

namespace spool::storage {

// The highest segment number a Pos can hold (24 bits). The log never creates a segment
// above it: an append that would roll past it fails with kNoSpace (Log::append), and a
// segment file named with a larger number is not part of the log (Log::segments()).
inline constexpr uint64_t kMaxSegmentSeq = (1ull << 24) - 1;

// A position in the log. seq 0 means "before the first segment" (an empty log).
struct Pos {
  uint64_t seq = 0;
  uint64_t off = 0;
  auto operator<=>(const Pos&) const = default;
  // Packed for an atomic word: seq in the high 24 bits, offset in the low 40. Only for
  // seq <= kMaxSegmentSeq and off < 2^40, which the log guarantees for every position it
  // hands out.
  uint64_t pack() const { return (seq << 40) | off; }
  static Pos unpack(uint64_t v) { return {v >> 40, v & ((1ull << 40) - 1)}; }
};

// The size of a log's first segment, unless LogOptions::segment_size is smaller.
inline constexpr uint64_t kFirstSegmentSize = 256ull << 10;

struct LogOptions {
  // The largest preallocated size of a segment; also bounds the largest record. Segments
  // start smaller and grow (next_size()), so a near-empty log takes little disk.
  uint64_t segment_size = format::kDefaultSegmentSize;
  bool read_only = false;
  // What the segments directory, when this creates it, and each segment and spare get,
  // whatever the umask (the queue's modes, sys/file_modes.h). 0: what the umask leaves.
  mode_t dir_mode = 0;
  mode_t file_mode = 0;
  // The largest payload a record may have (the queue's max_payload); a longer length is
  // not a record (docs/format.md, "Validity"). 0: whatever fits a segment.
  uint64_t max_payload = 0;
  // default: io::default_io(). When it maps_writes() and the directory is on a filesystem
  // that allocates blocks at fallocate (ext4, xfs, tmpfs: a store into the mapping can then
  // never need a block at writeback, so never SIGBUS), records are stored through the
  // segments' writable mappings; elsewhere (btrfs, NFS, FUSE, ...) with the Io's write_all.
  // The choice is logged (info) and shown by mapped().
  std::shared_ptr<io::Io> io;
  // Map segments for huge pages (sys::map_shared) and make spares of 2 MiB page cache
  // folios. For queues that never sync: a sync writes each dirty folio whole.
  bool huge_pages = false;
};

struct AppendResult {
  AppendResult() = default;
  AppendResult(AppendResult&&) = default;
  AppendResult(const AppendResult&) = delete;  // `at` may point into `own`

  // Where each record went, in storage of the appending thread that its next append()
  // reuses (log.cc, Scratch): read it before appending again.
  std::span<const Pos> at;
  Pos end;                        // the new end
  uint32_t spares_used = 0;       // spare segments the rolls of this append took
  uint64_t spare_bytes_used = 0;  // and their sizes, summed
  std::vector<Pos> own;           // `at`'s storage once the thread's is gone (at exit)
};

struct Recovery {
  Pos end;  // where the next append goes
  uint64_t records = 0;
  std::vector<Corruption> corrupt;
};

class Log {
 public:
  // Opens (creating `dir` unless read_only) the log kept in `dir`.
  static Result<std::unique_ptr<Log>> open(const std::string& dir, LogOptions opts);

  // Sequence numbers of the segment files present, ascending. A name of the segment form
  // whose number is 0, does not fit 64 bits, or is above kMaxSegmentSeq is not part of the
  // log: it is skipped, with a warning (once per name and Log).
  Result<std::vector<uint64_t>> segments() const;

  // Removes temp files of segment and spare creations that crashed before their rename.
  // Only when no other process can be creating one: the queue's first opener, or the
  // holder of the index lock (creations happen under it).
  void remove_leftovers();

  // Visits every valid record of every segment, in log order, and returns the end.
  // Corrupt regions are skipped and reported (also logged at warn level).
  Result<Recovery> recover(const std::function<void(Pos, const RecordView&)>& visit);

  // Appends `recs` at `end`, which must be the current end; rolls to a new segment when a
  // record does not fit. A record larger than a whole segment is kTooLarge and nothing is
  // written. On an error the end is not advanced, and whatever part of the batch was written
  // is zeroed again (best effort), so recover() does not return it; a segment created on the
  // way may remain, empty. `base_id` is recorded in a new segment's header. `opener`, if
  // given, is written first into every segment this append starts (a queue states its
  // clock and its subscriptions there, so that each segment can be read without the ones
  // before it).
  // `at_end`: segment(end.seq), when the caller holds it (check_end()'s), saving the lookup.
  Result<AppendResult> append(Pos end, std::span<const Record> recs, uint64_t base_id = 0,
                              std::span<const Record> opener = {}, Segment* at_end = nullptr);

  // Whether `end`, read from a shared index, can be the log's end: its segment exists, the
  // offset lies inside it and no record starts there (else an append would overwrite one).
  // kCorrupt saying what is wrong. Cheap: for every append. Gives the segment `end` is in
  // in `seg` (null for the empty log's end), which is looked up unless `seg` holds it
  // already: as an earlier call gave it, while cache_generation() has not changed since.
  Status check_end(Pos end, std::shared_ptr<Segment>& seg);
  // Changes whenever a segment this Log gave out may have been dropped or replaced by
  // another of the same number (a roll over a stale one, a compaction, a recovery).
  uint64_t cache_generation() const { return cache_gen_.load(std::memory_order_acquire); }

  // Zeroes what follows the logical end `end` (from recover()) in its segment, if anything
  // does: the first part of a write that a crash of the system tore. Left there, it would be
  // sealed as damage by the next roll.
  Status clear_tail(Pos end);

  // Spare segments: preallocated files, not part of the log, that the next rolls take
  // instead of allocating. A queue keeps enough of them that the messages it holds can be
  // drained (received and acked) when the disk is full. make_spare() adds one of `size`
  // bytes (0: segment_size; clamped to [kMinSegmentSize, segment_size]; kNoSpace when the
  // disk is full); count_spares() counts them and, with `bytes`, sums their sizes.
  // A roll takes the first spare (oldest) that the record it rolls for fits, whatever its
  // size, and the new segment has the spare's size; a spare too small stays for a later roll.
  // With the mapped backend, `zero_fill` writes the spare's zeros before its sync, so
  // that its blocks are written ones (prefault()): worth its disk writes for a spare a
  // background thread makes ahead of a roll, not for one a caller waits for. Without it
  // nothing of the spare is touched: most spares are the room kept for a drain, and the
  // rolls that take them are far off.
  Status make_spare(uint64_t size = 0, bool zero_fill = false);
  Result<uint64_t> count_spares(uint64_t* bytes = nullptr) const;
  // Reads the spares the next kWarmSpares rolls take (the oldest) into the page cache, once
  // per spare, so that the stores into their pages under the index lock find them there
  // (a store into a page that is not, faults and zeroes it under the lock). Called without
  // the lock, by a background thread; a spare a roll takes meanwhile is still warmed (the
  // open file is the same). Two: the roll into the first wakes the thread, which then
  // has the whole of that segment's filling to warm the third.
  void warm_next_spares();
  static constexpr size_t kWarmSpares = 2;

  // Segment sizes: the first segment is first_size(); a roll from a segment of `prev`
  // bytes makes one of next_size(prev) (double, at most segment_size), or larger if the
  // record it rolls for needs it; a spare it takes keeps its own size.
  uint64_t first_size() const;
  uint64_t next_size(uint64_t prev) const;
  uint64_t max_size() const { return opts_.segment_size; }

  // fdatasync of segment `seq`. An error is sticky for that segment (fsyncgate).
  Status sync(uint64_t seq);
  // Makes everything appended up to `to` durable, given that everything up to `from` is:
  // syncs each segment from from.seq (1 for seq 0) to to.seq, and the
  // directory when that crosses into a segment after from.seq (a roll does not sync the
  // segment it leaves, nor the new one's header and name). A segment compaction removed
  // meanwhile is skipped.
  Status sync_through(Pos from, Pos to);

  // The record at `p`, validated; the view lives as long as `*keep`.
  Result<RecordView> read(Pos p, std::shared_ptr<Segment>* keep);

  // The open segment `seq` (cached).
  Result<std::shared_ptr<Segment>> segment(uint64_t seq);

  // Drops cached segments below `seq` (after compaction removed them).
  void forget_below(uint64_t seq);

  const std::string& dir() const { return dir_; }
  // Whether records are stored through the mappings (LogOptions::io).
  bool mapped() const { return mapped_; }
  std::string segment_path(uint64_t seq) const;
  uint64_t max_payload() const;
  io::Io& io() { return *opts_.io; }

 private:
  Log(std::string dir, LogOptions opts, bool mapped)
      : dir_(std::move(dir)), opts_(std::move(opts)), mapped_(mapped) {}
  // Stores `len` bytes at `off` of `seg`: through its mapping when it is writable, else with
  // write_all. 0 or -errno.
  int put(const Segment& seg, uint64_t off, const void* p, uint64_t len);
  // Faults the first `len` bytes of `fd` into the page cache through a mapping: for writing
  // with `write` (dirty zeros, so that the sync that follows turns the spare's preallocated
  // blocks into written ones), else for reading.
  void prefault(int fd, uint64_t len, bool write) const;
  // Starts segment `seq` after one of `prev` bytes (0: none), at least `need` bytes long.
  Result<std::shared_ptr<Segment>> roll(uint64_t seq, uint64_t prev, uint64_t need, uint64_t base_id,
                                        AppendResult* res);
  std::vector<std::string> spares() const;

  std::string dir_;
  LogOptions opts_;
  bool mapped_;
  mutable sys::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<Segment>> cache_ GUARDED_BY(mu_);
  std::atomic<uint64_t> cache_gen_{0};  // cache_generation(); bumped under mu_
  std::map<uint64_t, Status> failed_syncs_ GUARDED_BY(mu_);
  mutable std::set<std::string> warned_names_ GUARDED_BY(mu_);
  std::vector<std::string> warmed_ GUARDED_BY(mu_);  // the spares warm_next_spares() read last
};

}  // namespace spool::storage
