// Compaction: reclaims the disk of acked messages (docs/compaction.md).
//
// It always removes a prefix of the log: the oldest sealed segments. Before they go, every
// live message in them is copied to the head of the log (a MSG record flagged COPY, then a
// LEASE or RELEASE record carrying its receive count and deadline), so replaying what is
// left gives the same state; removing only a prefix also removes every older control
// record that could otherwise be replayed against a copy. A CHECKPOINT record carries the
// totals (sent, acked, ...) that the removed records counted.
//
// Crash safety needs no manifest: the segment files present are the log. The copies are
// synced before any original is unlinked; until then both exist and replay keeps the first
// MSG of an id and applies the copy's state records (it points the index at a copy only once
// a LEASE or RELEASE of the message follows it: a killed append may leave a copy without).
// Unlinks happen under the index lock so no replay (repair) runs while files disappear,
// oldest first, then the directory is synced.
#include <sys/file.h>
#include <sys/stat.h>

#include <algorithm>

#include "queue/queue_impl.h"
#include "sys/lock_holders.h"
#include "sys/ofd_lock.h"

namespace spool {
namespace {

// Live data at or below 1/N of a prefix's size makes the prefix worth compacting: N = 4 for
// automatic runs, 2 on demand. Never unconditionally: copying a live set larger than a
// segment into the head makes the next compaction copy it again (a copy storm measured at
// 26-88 copies per acked message with compact() in a loop).
constexpr uint64_t kAutoLiveDenominator = 4;
constexpr uint64_t kOnDemandLiveDenominator = 2;
constexpr size_t kCopyBatch = 256;  // messages copied per lock hold

// compact.lock is flock()ed, a lock of the open file description: a child fork()ed while
// this thread compacts would share it and keep it held for its whole life, blocking every
// later compaction. So the child's copy of the descriptor is closed at fork.
struct CompactLockFd {
  std::atomic<int> fd;
  bool registered;
  explicit CompactLockFd(int f) : fd(f), registered(f >= 0 && sys::close_in_fork_child(&fd)) {}
  ~CompactLockFd() {
    int f = fd.exchange(-1);
    if (registered) sys::forget_in_fork_child(&fd);
    if (f >= 0) ::close(f);
  }
};

}  // namespace

Result<CompactResult> Queue::Impl::compact(bool everything, bool wait, const Progress& progress) {
  if (Status s = writable(); !s.ok()) return s;
  CompactResult res;
  std::string lock_path = dir + "/compact.lock";
  CompactLockFd guard(sys::open_state_file(lock_path, modes));
  if (guard.fd < 0) return sys::queue_file_error(errno, "open", lock_path);
  // Unregistered only past 256 guarded descriptors in one process: compaction still works,
  // only a fork during it would keep the lock (logged).
  if (!guard.registered) spool::log().warn("{}: compact.lock not guarded across fork", dir);
  if (wait) {
    struct stat dir_st {};
    if (::stat(dir.c_str(), &dir_st) != 0) return errno_status(errno, "stat " + dir);
    if (Status s = sys::flock_waiting(guard.fd.load(), LOCK_EX, lock_path, dir_st); !s.ok()) return s;
  }
  while (!wait && ::flock(guard.fd.load(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return res;  // another process is compacting
    if (errno != EINTR) return errno_status(errno, "lock " + lock_path);
  }
  auto& h = idx.hdr();

  // 1. Choose the prefix: the longest run of oldest sealed segments whose live bytes are at
  //    most a quarter of their size (half, on demand). The live bytes come from a read of
  //    every live message's entry, which runs at every roll: it reads the index file without
  //    the lock (index::SharedIndex::scan_window), so senders and receivers go on meanwhile
  //    and the window does not stay mapped in this process. The choice is an estimate: the
  //    copy below checks each message again under the lock, and nothing is removed while
  //    the prefix holds one not copied.
  uint64_t last = 0;
  std::vector<uint64_t> prefix;
  std::vector<uint64_t> seqs, live;
  uint64_t active = 0, pinned = 0, removed = 0;
  // Live bytes per segment, in the order of `seqs` (a flat array and a binary search: this
  // visits every live message; the numbers may have gaps).
  size_t last_i = 0;  // the last entry's segment, in `seqs`: most entries follow one in its segment
  auto add_live = [&](uint64_t, const Entry& e) {
    const uint64_t seq = Pos::unpack(e.loc).seq;
    if (last_i >= seqs.size() || seqs[last_i] != seq) {
      auto it = std::lower_bound(seqs.begin(), seqs.end(), seq);
      if (it == seqs.end() || *it != seq) return;
      last_i = static_cast<size_t>(it - seqs.begin());
    }
    live[last_i] += format::record_size(e.len);
  };
  index::SharedIndex::WindowView view{};
  // Subscriptions (issue 46): the live set is the union of every view's entries; each copy
  // is followed by one LEASE or RELEASE per view holding the message. The surviving log's
  // first segment opens with every view active at its roll restated (write_path.cc), so a
  // replay activates them before any record of theirs. A subscription added or removed
  // while this copies (the lock is let go between batches) may hold messages gathered for
  // no view: then nothing is removed (checked before the checkpoint and the unlinks).
  std::array<index::Subscription, index::kSubscriptions> subs_at_start{};
  auto subs_changed = [&]() REQUIRES(idx) {
    return std::memcmp(subs_at_start.data(), h.cache.subs, sizeof(h.cache.subs)) != 0;
  };
  {
    SPOOL_LOCK_OR_RETURN(held, *this, lock());
    std::memcpy(subs_at_start.data(), h.cache.subs, sizeof(h.cache.subs));
    if (held_views().size() != queue::active_views(idx).size() + 1) {
      return Status(Code::kIo, "compaction stopped: a subscription's index cannot be opened");
    }
    // Retention reaches every view without a receive in it (a stalled subscription): what
    // it drops here is not live below. A failure (a full disk) must not stop the
    // compaction that frees disk: it is logged, and the next send or compaction retries.
    if (Status s = retain(clocks(), true); !s.ok()) {
      spool::log().warn("{}: retention before compaction: {}", dir, s.message());
    }
    // A dedup id is confirmed against its SEND record and rebuilt from it: a segment holding
    // one still inside the window stays (docs/compaction.md).
    // Replay after ack likewise: the segments from the oldest MSG record of a message acked
    // within keep_acked on stay, so that replay() finds its payload and its ACK.
    const uint64_t now_boot = env->boot_ns();
    pinned = std::min(idx.dedup_oldest_seq(now_boot), idx.kept_oldest_seq(now_boot, ms_to_ns(cfg.opts.keep_acked)));
    removed = 0;  // what every view has let go of so far: compaction may have work if it grew
    for (auto [k, v] : held_views()) {  // each subscription's acks too: replay() is per view
      v->assert_held();
      const auto& c = v->hdr().cache;
      removed += c.acked_total + c.dead_total + c.expired_total + c.purged_through;
      if (k != 0) pinned = std::min(pinned, v->kept_oldest_seq(now_boot, ms_to_ns(cfg.opts.keep_acked)));
    }
    if (!everything && removed == fruitless_removed.load() && pinned == fruitless_pinned.load() &&
        fruitless_skips.fetch_add(1) + 1 < kFruitlessScanEvery) {
      return res;
    }
    fruitless_skips.store(0);
    auto listed = log->segments();
    if (!listed.ok()) return listed.status();
    seqs = std::move(*listed);
    live.assign(seqs.size(), 0);
    active = Pos::unpack(h.cache.log_end).seq;
    idx.for_each_overflow(add_live);
    view = idx.window_view();
    // A subscription's entries are read under the lock (a message several views hold counts
    // once per view: the estimate errs towards keeping segments).
    for (auto [k, v] : held_views()) {
      if (k == 0) continue;
      v->assert_held();
      if (!v->scan_entries(add_live)) return Status(Code::kIo, "compaction stopped: a subscription's index could not be read");
    }
  }
  const bool read = idx.scan_window(view, add_live);
  {
    SPOOL_LOCK_OR_RETURN(held, *this, lock());
    // The window was laid out again meanwhile: what was read means nothing; the next roll
    // chooses again.
    if (!read || !idx.same_geometry(view)) return res;
    uint64_t cum_live = 0, cum_size = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const uint64_t seq = seqs[i];
      if (seq >= active || seq >= pinned) break;
      cum_live += live[i];
      // Each segment's own size: the log grows them (storage/log.h).
      auto seg = log->segment(seq);
      cum_size += seg.ok() ? (*seg)->info().size : cfg.opts.segment_size;
      uint64_t n = everything ? kOnDemandLiveDenominator : kAutoLiveDenominator;
      if (cum_live * n <= cum_size) last = seq;
    }
    for (uint64_t seq : seqs)
      if (seq <= last) prefix.push_back(seq);
    if (last == 0) {
      fruitless_removed.store(removed);
      fruitless_pinned.store(pinned);
    }
  }
  if (last == 0) return res;

  // 2. Copy the live messages out of the prefix, a batch per lock hold so that producers
  //    and consumers keep running. One scan finds them all (not one per batch, which was
  //    quadratic); a message acked or moved meanwhile is simply skipped.
  std::vector<uint64_t> ids;
  uint64_t rebuilds = 0;
  {
    SPOOL_LOCK_OR_RETURN(held, *this, lock());
    for (auto [k, v] : held_views()) {
      v->assert_held();
      const bool read_all = v->scan_entries([&](uint64_t id, const Entry& e) {
        if (Pos::unpack(e.loc).seq <= last) ids.push_back(id);
      });
      if (!read_all) return Status(Code::kIo, "compaction stopped: the index could not be read");
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    rebuilds = h.disk.rebuilds;
  }
  // Progress counts messages to copy, then segments to remove.
  const uint64_t work = ids.size() + prefix.size();
  auto report = [&](uint64_t done) {
    if (progress) progress(done, work);
  };
  for (size_t next = 0; next < ids.size(); report(next)) {
    SPOOL_LOCK_OR_RETURN(held, *this, lock());
    const size_t batch_start = next;
    // Per message of the batch: the views holding it in the prefix, and its slot in each.
    struct Holder {
      uint16_t view;
      index::SharedIndex* x;
      uint32_t slot;
    };
    std::vector<std::vector<Holder>> batch;
    const auto all = held_views();
    for (; next < ids.size() && batch.size() < kCopyBatch; ++next) {
      std::vector<Holder> holders;
      for (auto [k, v] : all) {
        v->assert_held();
        const int64_t slot = v->find(ids[next]);
        if (slot >= 0 && Pos::unpack(v->entry(static_cast<uint32_t>(slot)).loc).seq <= last) {
          holders.push_back(Holder{k, v, static_cast<uint32_t>(slot)});
        }
      }
      if (!holders.empty()) batch.push_back(std::move(holders));
    }
    if (batch.empty()) continue;
    Clocks now = clocks();
    std::vector<Record> recs;
    std::vector<std::shared_ptr<storage::Segment>> keep(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      index::SharedIndex& first = *batch[i].front().x;
      first.assert_held();
      const Entry& e = first.entry(batch[i].front().slot);
      auto v = log->read(Pos::unpack(e.loc), &keep[i]);
      if (!v.ok()) {
        // Never drop what cannot be copied: the prefix stays until verify/repair decides.
        return Status(v.status().code(), "compaction stopped: " + v.status().message());
      }
      const uint64_t id = first.id_of(batch[i].front().slot);
      // The copy goes under the current anchor: its times are restated on today's log clock.
      const uint64_t at = e.loc;
      recs.push_back(Record{RecordType::kMsg, 0, id, queue::rebase(idx.hdr(), at, v->t1, now),
                            queue::rebase(idx.hdr(), at, v->t2, now), v->payload, format::kFlagCopy, v->ext});
      for (const Holder& hv : batch[i]) {
        hv.x->assert_held();
        const Entry& ve = hv.x->entry(hv.slot);
        const uint64_t key = hv.x->key(hv.slot);
        const uint64_t rt = key >= now.boot ? now.rt + (key - now.boot) : now.rt - std::min(now.rt, now.boot - key);
        recs.push_back(Record{ve.state == State::kLeased ? RecordType::kLease : RecordType::kRelease, ve.count, id,
                              now.rt, rt, {}, 0, {}, hv.view});
      }
    }
    uint64_t copy_bytes = 0, largest = 0;
    for (const Record& r : recs) {
      const uint64_t rb = format::record_size(r.ext.size() + r.payload.size());
      copy_bytes += rb;
      largest = std::max(largest, rb);
    }
    // Spares are made outside the lock, as a send makes them; then the batch is chosen again.
    auto tail = log_tail();
    if (!tail.ok()) return tail.status();
    if (SpareShort short_by = spares_short(*tail, 0, copy_bytes, largest); short_by.n != 0) {
      Locked::release(std::move(held).value());
      if (Status s = make_spares(short_by); !s.ok()) return Status(s.code(), "compaction stopped: " + s.message());
      next = batch_start;
      continue;
    }
    // Each copy moves its entry once the LEASE or RELEASE after it is applied (apply_record).
    if (auto at = commit(recs, now, *tail); !at.ok()) return at.status();
    res.messages_copied += batch.size();
  }
  // Everything the prefix still holds must have been copied. Live operations append every
  // record at the head, so an entry can point into the prefix again only after a rebuild
  // from the log (SharedIndex::reset()): without one since the gathering above, each entry
  // it found was copied or is gone, and no other is there; after one, every entry is read.
  auto prefix_left = [&]() REQUIRES(idx) -> Status {
    if (h.disk.rebuilds == rebuilds) return {};
    bool left = false;
    for (auto [k, v] : held_views()) {
      v->assert_held();
      const bool read_all = v->scan_entries([&](uint64_t, const Entry& e) { left = left || Pos::unpack(e.loc).seq <= last; });
      if (!read_all) return Status(Code::kIo, "compaction stopped: the index could not be read");
    }
    if (left) return Status(Code::kCorrupt, "compaction stopped: a message of the prefix was not copied");
    return {};
  };
  {
    SPOOL_LOCK_OR_RETURN(held, *this, lock());
    if (Status s = prefix_left(); !s.ok()) return s;
  }
  env->crashpoint("compact.after_copy");

  // 3. The copies must be on disk before any original goes, whatever the sync policy. The
  //    prefix too, before the checkpoint counts what it holds: a power cut can leave the
  //    prefix in place (its removal not yet durable) with its unsynced tail gone, and the
  //    checkpoint would then count sends and acks the recovered log does not hold (issue 42:
  //    acked_total above sent_total, found by a power-loss test on ext4 and xfs). Under
  //    `interval` the flusher has synced nearly all of it already.
  Pos end = Pos::unpack(__atomic_load_n(&h.cache.log_end, __ATOMIC_ACQUIRE));
  if (Status s = log->sync_through(Pos{prefix.front(), 0}, end); !s.ok()) return s;
  const Pos synced = end;
  env->crashpoint("compact.after_sync");

  // 4. Checkpoint the totals, sync it (outside the lock: nothing under it waits for the
  // disk), then remove the prefix, oldest first. Checked again under each lock: a repair
  // since the check above rebuilt the index from the log.
  {
    SPOOL_LOCK_OR_RETURN(held, *this, lock());
    if (Status s = prefix_left(); !s.ok()) return s;
    if (subs_changed()) return res;  // (see subs_at_start)
    storage::Checkpoint cp{h.cache.sent_total,     h.cache.acked_total,    h.cache.dead_total,
                           h.cache.next_id,        h.cache.purged_through, h.cache.expired_total,
                           h.cache.nacked_total,   h.cache.paused != 0 ? 1 : 0, h.cache.received_total,
                           h.cache.redelivered_total};
    std::string payload = storage::encode_checkpoint(cp);
    // Each subscription's totals after view 0's (their MSGs and records may be in the prefix).
    for (auto [k, v] : held_views()) {
      if (k == 0) continue;
      v->assert_held();
      const auto& c = v->hdr().cache;
      payload += storage::encode_view_checkpoint(
          k, storage::Checkpoint{c.sent_total, c.acked_total, c.dead_total, c.next_id, c.purged_through, c.expired_total,
                                 c.nacked_total, c.paused != 0 ? 1 : 0, c.received_total, c.redelivered_total});
    }
    Record rec{RecordType::kCheckpoint, 0, 0, 0, 0, payload};
    auto at = commit(std::span(&rec, 1), clocks());
    if (!at.ok()) return at.status();
    end = at->end;
  }
  if (Status s = log->sync_through(synced, end); !s.ok()) return s;
  env->crashpoint("compact.after_checkpoint");
  SPOOL_LOCK_OR_RETURN(held, *this, lock());
  if (Status s = prefix_left(); !s.ok()) return s;
  if (subs_changed()) return res;  // (as before the checkpoint)
  for (uint64_t seq : prefix) {
    std::string path = log->segment_path(seq);
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) res.bytes_freed += static_cast<uint64_t>(st.st_blocks) * 512;
    if (int r = log->io().unlink(path); r < 0 && r != -ENOENT) return errno_status(-r, "remove " + path);
    ++res.segments_removed;
    report(ids.size() + res.segments_removed);
    __atomic_store_n(&h.disk.compacted_through, seq, __ATOMIC_RELEASE);  // sync_to() reads it without the lock
    env->crashpoint("compact.after_unlink");
  }
  log->forget_below(last + 1);
  Locked::release(std::move(held).value());
  if (int r = log->io().sync_dir(log->dir()); r < 0) return errno_status(-r, "sync " + log->dir());
  spool::log().info("{}: compaction removed {} segments, copied {} live messages", dir,
                    res.segments_removed, res.messages_copied);
  return res;
}

Result<CompactResult> Queue::compact(const Progress& progress) { return impl_->compact(true, true, progress); }

auto Queue::Impl::compact_by_policy() -> void {
  auto r = compact(false, false);
  if (!r.ok()) spool::log().warn("{}: compaction: {}", dir, r.status().to_string());
}

}  // namespace spool
