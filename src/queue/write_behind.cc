#include "queue/write_behind.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <xxhash.h>

#include "logging.h"

namespace spool::write_behind {

using storage::Pos;

// Recovery takes a zero gap of up to every slot's bytes for staged records never written.
static_assert(uint64_t{index::kPendingSlots} * index::kPendingBytes <= format::kMaxUnwrittenGap);

std::optional<Staged> stage(index::SharedIndex& idx, storage::Log& log, std::span<const storage::Record> recs,
                            uint64_t now_ns) {
  auto& h = idx.hdr();
  // The writer's own copy, owned by the Staged it returns. (A thread_local buffer saved one
  // small allocation but broke a Queue closed from an exit handler: exit() destroys the
  // main thread's thread_locals first.)
  std::string buf;
  Pos end = Pos::unpack(h.log_end);
  auto after = log.place(end, recs, buf);
  if (!after || buf.size() > index::kPendingBytes) return std::nullopt;
  for (uint32_t k = 0; k < index::kPendingSlots; ++k) {
    index::PendingWrite& p = idx.pending(k);
    if (p.at.load(std::memory_order_acquire) != 0) continue;
    std::memcpy(p.bytes, buf.data(), buf.size());
    p.len = static_cast<uint32_t>(buf.size());
    p.staged_ns = now_ns;
    h.pending_writes.fetch_add(1);
    // The slot before the log end: a sync that reads the end then the slots sees the range
    // either staged or written (lowest()).
    p.at.store(end.pack(), std::memory_order_release);
    __atomic_store_n(&h.log_end, after->pack(), __ATOMIC_RELEASE);
    return Staged{k, end, std::move(buf), {}};
  }
  return std::nullopt;
}

namespace {
// Frees slot `k` if it still holds the write staged at `at`: a lock holder may have
// finished it and another writer staged a new one there since. False if not.
bool release(index::SharedIndex& idx, uint32_t k, uint64_t at) {
  uint64_t want = at;
  if (!idx.pending(k).at.compare_exchange_strong(want, 0, std::memory_order_acq_rel)) return false;
  idx.hdr().pending_writes.fetch_sub(1);
  return true;
}
}  // namespace

Status finish(index::SharedIndex& idx, storage::Log& log, const Staged& s) {
  if (Status st = log.write_placed(s.at, s.bytes, false); !st.ok()) return st;
  release(idx, s.slot, s.at.pack());
  return {};
}

bool withdraw(index::SharedIndex& idx, storage::Log& log, const Staged& s) {
  if (!release(idx, s.slot, s.at.pack())) return false;
  std::vector<storage::Record> filler(s.bytes.size() / format::kRecordHeaderSize,
                                      storage::Record{format::RecordType::kLease, 0, 0, 0, 0, {}});
  std::string bytes;
  // Best effort, like the zeroing after a failed append: the device may still fail.
  if (log.place(s.at, filler, bytes) && bytes.size() == s.bytes.size()) (void)log.write_placed(s.at, bytes, false);
  return true;
}

Status settle(index::SharedIndex& idx, storage::Log& log, uint64_t below, uint64_t staged_before_ns) {
  if (idx.hdr().pending_writes.load(std::memory_order_acquire) == 0) return {};
  Status result;
  for (uint32_t k = 0; k < index::kPendingSlots; ++k) {
    index::PendingWrite& p = idx.pending(k);
    uint64_t at = p.at.load(std::memory_order_acquire);
    if (at == 0 || (at >= below && p.staged_ns >= staged_before_ns)) continue;
    uint32_t len = std::min<uint32_t>(p.len, index::kPendingBytes);
    Status s = log.write_placed(Pos::unpack(at), std::string_view(p.bytes, len), true);
    // Bytes that are not valid records, or a range holding other data, come from a damaged
    // index: nothing to finish, and the slot must not block syncs forever.
    if (s.ok() || s.code() == Code::kCorrupt) {
      release(idx, k, at);
    }
    if (!s.ok() && result.ok()) result = s;
  }
  return result;
}

uint64_t lowest(index::SharedIndex& idx) {
  if (idx.hdr().deferred.word.load(std::memory_order_acquire) != 0) return 0;
  uint64_t low = UINT64_MAX;
  if (idx.hdr().pending_writes.load(std::memory_order_acquire) == 0) return low;
  for (uint32_t k = 0; k < index::kPendingSlots; ++k) {
    uint64_t at = idx.pending(k).at.load(std::memory_order_acquire);
    if (at != 0) low = std::min(low, at);
  }
  return low;
}

namespace {
uint64_t commit_word(const index::DeferredRecords& d, uint32_t count) {
  if (count == 0) return 0;
  return uint64_t{count} | (XXH3_64bits(d.e, count * sizeof(index::DeferredRecord)) << 16);
}
uint32_t listed(const index::DeferredRecords& d) {
  uint64_t w = d.word.load(std::memory_order_acquire);
  uint32_t n = static_cast<uint32_t>(w & 0xffff);
  if (n == 0 || n > index::kDeferredRecords || commit_word(d, n) != w) return 0;
  return n;
}
// Entries first, then the one store that makes them count.
void append_listed(index::DeferredRecords& d, uint32_t n, std::span<const index::DeferredRecord> recs,
                   uint64_t now_ns) {
  std::copy(recs.begin(), recs.end(), d.e + n);
  if (n == 0) d.since_ns = now_ns;
  d.word.store(commit_word(d, n + static_cast<uint32_t>(recs.size())), std::memory_order_release);
}
}  // namespace

bool defer(index::SharedIndex& idx, std::span<const storage::Record> recs, uint64_t now_ns) {
  auto& d = idx.hdr().deferred;
  uint32_t n = listed(d);
  if (n + recs.size() > kDeferLimit) return false;
  index::DeferredRecord add[kDeferLimit];
  for (size_t k = 0; k < recs.size(); ++k) {
    const storage::Record& r = recs[k];
    add[k] = index::DeferredRecord{r.id, r.t2, r.count, static_cast<uint8_t>(r.type), {}};
  }
  append_listed(d, n, std::span(add, recs.size()), now_ns);
  return true;
}

std::vector<index::DeferredRecord> deferred(index::SharedIndex& idx) {
  auto& d = idx.hdr().deferred;
  uint32_t n = listed(d);
  if (n == 0 && d.word.load(std::memory_order_relaxed) != 0) {
    spool::log().warn("spool: the index's list of deferred records does not check out; ignoring it");
    d.word.store(0, std::memory_order_release);
  }
  return std::vector<index::DeferredRecord>(d.e, d.e + n);
}

void clear_deferred(index::SharedIndex& idx) { idx.hdr().deferred.word.store(0, std::memory_order_release); }

size_t restore_deferred(index::SharedIndex& idx, std::span<const index::DeferredRecord> recs, uint64_t now_ns) {
  auto& d = idx.hdr().deferred;
  uint32_t n = listed(d);
  size_t k = std::min<size_t>(recs.size(), index::kDeferredRecords - n);
  if (k != 0) append_listed(d, n, recs.first(k), now_ns);
  return recs.size() - k;
}

void keep_deferred(index::SharedIndex& idx, const std::function<bool(const index::DeferredRecord&)>& keep,
                   uint64_t now_ns) {
  auto recs = deferred(idx);
  if (std::erase_if(recs, [&](const auto& r) { return !keep(r); }) == 0) return;
  clear_deferred(idx);
  (void)restore_deferred(idx, recs, now_ns);
}

std::vector<storage::Record> records(std::span<const index::DeferredRecord> listed,
                                     std::span<const storage::Record> then) {
  std::vector<storage::Record> recs;
  recs.reserve(listed.size() + then.size());
  for (const auto& r : listed) {
    recs.push_back(storage::Record{static_cast<format::RecordType>(r.type), r.count, r.id, 0, r.t2, {}});
  }
  recs.insert(recs.end(), then.begin(), then.end());
  return recs;
}

}  // namespace spool::write_behind
