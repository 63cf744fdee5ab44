// Write-behind of control records (LEASE, ACK, RELEASE, extend): the log range is reserved
// and the index changed under the index lock, and the write itself happens after the unlock.
// That write (one pwritev, 2-3 us on this VM) was most of what a receive or an ack held the
// lock for, so a producer and its consumers took turns around system calls
// (docs/performance.md, "What changed in the sixth session").
//
// A staged write keeps a copy of its bytes in a shared slot of the index until it is done,
// so that any lock holder can finish it (the same bytes at the same place, harmless if the
// writer writes them too):
//  - when its writer died or stalls (finish after kStaleNs, looked at by every lock());
//  - before the index is rebuilt from the log, before an append rolls to a new segment (the
//    roll syncs the old one), and before a sync counts the range as durable;
//  - by the first opener, for writers that died while the queue was open.
// So the log still holds every change the index shows whenever anyone reads it, and a call
// returns only after its own write. MSG records are never written behind: consumers map
// them, and must not before they exist. Neither are writes that must be synced at once
// (sync policy always, Durability::kSync): the fdatasync costs far more than the lock.
//
// Leases and acks go one step further: they are deferred (defer()). Under the lock the index
// changes (a lease taken, a message gone) and the LEASE or ACK record is listed in the index
// header; the call makes no write at all. The next write to the log, whoever makes it,
// carries the listed records in front of its own: a send's MSG records, a staged write, or
// the list alone once it is full. So a consumer that alternates receive and ack makes no
// write of its own while a producer keeps sending, and one per kDeferLimit records when
// nobody else writes. Order is kept: anything made after a listed record is written after
// it or in the same write behind it, so replay meets every message's records in the order
// they were made. The list is in shared memory, so a kill -9 of the lister loses nothing;
// until the records are written the index is "the log, then the list" (rebuild() replays
// the log and applies the list). The list is written by: the next write to the log, any
// lock holder once it is kStaleNs old, a sync (so `interval` and Queue::sync() cover it),
// verify, compaction, and a closing process. Only receives list LEASE records (an extend's
// LEASE is staged), and RELEASE records are never listed: replay counts nacks, and a listed
// one that a killed writer had written already would count twice. A listed record can also
// be stale: written already (its writer killed before it emptied the list), put back after
// a failed write while other processes wrote later records about its message, or carried
// over from an index page older than the synced log after a reboot. So a rebuild keeps and
// applies only the records that are news after the replay (Impl::news()): an ACK of a
// message still there, or the LEASE of a later delivery than the log's last. Each delivery
// has a receive count of its own, which is why extends, whose LEASE records repeat the
// count (and may shorten the lease, or lease a nacked message again), are not listed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "index/index.h"
#include "spool/status.h"
#include "storage/log.h"

namespace spool::write_behind {

// A staged write dies with its writer's thread; its bytes are the writer's own copy (the
// shared slot may be finished and reused by another process before the writer gets to it).
struct Staged {
  uint32_t slot;
  storage::Pos at;
  std::string bytes;  // the encoded records, the writer's own copy
  std::vector<index::DeferredRecord> listed;  // deferred records that lead `bytes`
};

// After this long, any lock holder finishes a staged write itself.
inline constexpr uint64_t kStaleNs = 200'000'000;

// Lock held. Reserves `recs` at the log end (and moves log_end past them) and stages them,
// when they fit in the active segment and a slot is free; nullopt when not (the caller then
// appends under the lock as usual).
std::optional<Staged> stage(index::SharedIndex& idx, storage::Log& log, std::span<const storage::Record> recs,
                            uint64_t now_ns);

// No lock: writes a staged range and frees its slot. On an error the slot stays, and a
// lock holder retries the write later.
Status finish(index::SharedIndex& idx, storage::Log& log, const Staged& s);

// Lock held, after finish() failed: takes the staged write back, so that it never lands,
// and writes filler records over its range (LEASE records of id 0, which no message has:
// replay ignores them) so that the records appended after it are not behind a hole. False
// when another process had written it already: then the change stands. The caller rebuilds
// the index from the log, which undoes the change there.
bool withdraw(index::SharedIndex& idx, storage::Log& log, const Staged& s);

// Lock held, or no other process attached: finishes every staged write that starts below
// `below` (a packed Pos) or was staged before `staged_before_ns`.
Status settle(index::SharedIndex& idx, storage::Log& log, uint64_t below, uint64_t staged_before_ns);

// No lock: the lowest packed position of a staged write, 0 when records are deferred (a
// sync must write them), or UINT64_MAX.
uint64_t lowest(index::SharedIndex& idx);

// Lock held. Lists `recs` (LEASE and ACK records) as deferred, all or none: false when the
// list would hold more than kDeferLimit (the caller writes them, carrying the list). The
// list holds kDeferredRecords, more than that, for restore_deferred().
inline constexpr uint32_t kDeferLimit = 8;
bool defer(index::SharedIndex& idx, std::span<const storage::Record> recs, uint64_t now_ns);

// Lock held. The deferred records, oldest first; none when the list does not check out.
std::vector<index::DeferredRecord> deferred(index::SharedIndex& idx);
// Lock held. Empties the list (its records are written or staged).
void clear_deferred(index::SharedIndex& idx);
// Lock held. Lists `recs` again, after those listed now, as many as fit; returns how many
// did not fit.
size_t restore_deferred(index::SharedIndex& idx, std::span<const index::DeferredRecord> recs, uint64_t now_ns);
// Lock held. Keeps the deferred records `keep` is true for, drops the others.
void keep_deferred(index::SharedIndex& idx, const std::function<bool(const index::DeferredRecord&)>& keep,
                   uint64_t now_ns);
// The log records of deferred records, followed by `then`.
std::vector<storage::Record> records(std::span<const index::DeferredRecord> listed,
                                     std::span<const storage::Record> then = {});

}  // namespace spool::write_behind
