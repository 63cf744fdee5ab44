#include "queue/apply.h"

#include <xxhash.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "logging.h"
#include "spool/queue.h"
#include "storage/log.h"

namespace spool::queue {
static_assert(format::kDefaultPriority == kDefaultPriority && index::kDefaultPriority == kDefaultPriority);
namespace {

using format::RecordType;
using index::Entry;
using index::State;

void drop(index::SharedIndex& x, int64_t slot) REQUIRES(x) {
  x.hdr().cache.bytes_live -= x.entry(static_cast<uint32_t>(slot)).len;
  x.erase(static_cast<uint32_t>(slot));
}

// Every message up to `through`. All of them (a purge of the whole queue, as a live purge
// always is) by a reset of the entries, which costs nothing per message.
Status drop_through(index::SharedIndex& x, uint64_t through) REQUIRES(x) {
  auto& h = x.hdr();
  if (through + 1 >= h.cache.next_id) {
    h.cache.bytes_live = 0;
    return x.reset();
  }
  std::vector<uint64_t> ids;
  x.for_each_entry([&](uint32_t, uint64_t id, const Entry&) {
    if (id <= through) ids.push_back(id);
  });
  // In id order: a group's first goes before the rest of it, so each drop unlinks a first
  // (O(1)) rather than walking its group for a later member.
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) drop(x, x.find(id));
  return {};
}

// Raises next_id past `id`; sent_through follows it (index invariant: sent_through + 1 ==
// next_id), stored after the log end the caller published (durability.cc reads it first).
void raise_next_id(index::IndexHeader& h, uint64_t id) {
  if (id < h.cache.next_id) return;
  h.cache.next_id = id + 1;
  h.coord.sent_through.store(id, std::memory_order_release);
}

// The dedup part of a new message (not a compaction copy): its id is remembered until the
// window ends. A live send reserved the room; a replay makes it here, and past the table's
// bound (only if the window was made longer since) the oldest ids are not remembered.
void remember_dedup(index::SharedIndex& x, uint64_t at, const storage::RecordView& r, const Keys& keys) REQUIRES(x) {
  const uint64_t expires = enqueue_key(x, at, r.t1, keys.now) + keys.dedup_window;
  if (expires <= keys.now.boot) return;
  auto dedup = storage::ext_entry(r.ext, format::ExtType::kDedupId);
  if (!dedup || dedup->empty()) return;
  if (Status s = x.dedup_reserve(1, keys.now.boot); !s.ok()) {
    spool::log().warn("message {}'s dedup id is not remembered: {}", r.id, s.message());
    return;
  }
  x.dedup_insert(dedup_hash(*dedup), at, expires);
}

// A LEASE, RELEASE, ACK or DEAD of message `id` settles an unconfirmed copy of it: the entry
// moves to the copy (`slot` >= 0) or the copy is forgotten.
void settle_copy(index::SharedIndex& x, const Keys& keys, uint64_t id, int64_t slot) REQUIRES(x) {
  if (keys.copies == nullptr || keys.copies->empty()) return;
  auto it = keys.copies->find(id);
  if (it == keys.copies->end()) return;
  if (slot >= 0) x.entry(static_cast<uint32_t>(slot)).loc = it->second;
  keys.copies->erase(it);
}

}  // namespace

Status clear_for_replay(index::SharedIndex& x) {
  auto& c = x.hdr().cache;
  c.next_id = 1;  // reset() starts the window at next_id
  x.hdr().coord.sent_through.store(0, std::memory_order_release);  // (nothing sent yet)
  if (Status s = x.reset(); !s.ok()) return s;
  x.dedup_clear();
  x.kept_clear();
  c.purged_through = 0;
  c.paused = 0;
  c.sent_total = c.acked_total = c.dead_total = c.expired_total = c.nacked_total = c.bytes_live = 0;
  c.received_total = c.redelivered_total = 0;
  clear_anchors(x.hdr());
  return {};
}

uint64_t enqueue_key(const index::SharedIndex& x, uint64_t at, uint64_t t1, const Clocks& now) {
  return std::min(now.boot, now.key(rebase(x.hdr(), at, t1, now)));
}

uint64_t dedup_hash(std::string_view id) { return XXH3_64bits(id.data(), id.size()); }

storage::RecordView view_of(const storage::Record& rec) {
  return storage::RecordView{rec.type, rec.flags, rec.count, rec.id, rec.t1, rec.t2, rec.payload, 0, 0, rec.ext};
}

Status apply_record(index::SharedIndex& x, uint64_t at, const storage::RecordView& r, const Keys& keys) {
  auto& h = x.hdr();
  if (r.type == RecordType::kClock) {
    note_anchor(h, at, r);
    return {};
  }
  const uint64_t next = h.cache.next_id;  // before this record
  if (r.type != RecordType::kCheckpoint) raise_next_id(h, r.id);
  switch (r.type) {
    case RecordType::kMsg: {
      const bool copy = (r.flags & format::kFlagCopy) != 0;
      if (!copy && keys.dedup_window != 0 && !r.ext.empty()) remember_dedup(x, at, r, keys);
      if (r.id <= h.cache.purged_through) return {};
      // A message the index holds already (only an id below next_id can be): a compaction
      // copy, followed once a LEASE or RELEASE confirms it.
      if (r.id < next && x.find(r.id) >= 0) {
        if (copy && keys.copies != nullptr) (*keys.copies)[r.id] = at;
        return {};
      }
      Entry e{at, static_cast<uint32_t>(r.payload.size()), 0, index::kNoPos, 0, State::kReady, 0};
      // (A payload-only record, the common case, walks no extension.)
      std::optional<std::string_view> group;
      uint8_t priority = index::kDefaultPriority;
      if (!r.ext.empty()) {
        group = storage::ext_entry(r.ext, format::ExtType::kGroup);
        priority = storage::ext_priority(r.ext);
      }
      if (group) {  // (a live send reserved this; a replay reserves here)
        if (Status s = x.group_reserve(2); !s.ok()) return s;
        if (Status s = x.reserve_heap(1); !s.ok()) return s;
      }
      auto ins = x.insert(r.id, e, keys.ready(at, r.t1, r.t2), keys.now.boot, priority);
      if (!ins.ok()) return ins.status();
      if (group) x.group_join(*ins, r.id, XXH3_64bits(group->data(), group->size()));
      // A copy gets here only when its original is not in the log: removed by the compaction
      // whose CHECKPOINT follows (and sets the totals again), or lost to a power cut before
      // that compaction's sync. Either way the log holds one send of it.
      ++h.cache.sent_total;
      h.cache.bytes_live += r.payload.size();
      return {};
    }
    case RecordType::kLease:
    case RecordType::kRelease: {
      const bool lease = r.type == RecordType::kLease;
      if (!lease && (r.flags & format::kFlagNack) != 0) ++h.cache.nacked_total;
      int64_t slot = x.find(r.id);
      settle_copy(x, keys, r.id, slot);
      if (slot < 0) return {};
      Entry& e = x.entry(static_cast<uint32_t>(slot));
      if (lease && r.count > e.count) {  // a delivery (an extend keeps the count; a copy's LEASE too)
        ++h.cache.received_total;
        if (r.count > 1) ++h.cache.redelivered_total;
      }
      e.count = r.count;
      return lease ? x.set(static_cast<uint32_t>(slot), State::kLeased, keys.lease(at, r.t2))
                   : x.set(static_cast<uint32_t>(slot), State::kReady, keys.ready(at, r.t1, r.t2));
    }
    case RecordType::kAck:
    case RecordType::kDead: {
      if (r.type == RecordType::kDead) {
        ++h.cache.dead_total;
      } else {
        ++((r.flags & format::kFlagExpired) != 0 ? h.cache.expired_total : h.cache.acked_total);
      }
      const int64_t found = x.find(r.id);
      settle_copy(x, keys, r.id, -1);
      if (int64_t slot = found; slot >= 0) {
        if (keys.keep_acked != 0 && r.type == RecordType::kAck &&
            (r.flags & (format::kFlagExpired | format::kFlagDeleted)) == 0) {
          const Entry& e = x.entry(static_cast<uint32_t>(slot));
          x.kept_note(keys.acked != 0 ? keys.acked : keys.now.boot, storage::Pos::unpack(e.loc).seq, e.len, keys.keep_acked);
        }
        drop(x, slot);
      }
      return {};
    }
    case RecordType::kPurge: {
      Status s = drop_through(x, r.id);
      h.cache.purged_through = std::max(h.cache.purged_through, r.id);
      return s;
    }
    case RecordType::kCheckpoint: {
      // Totals of everything before it, including compacted-away segments.
      auto cp = storage::decode_checkpoint(r.payload);
      if (!cp) return {};
      h.cache.sent_total = cp->sent_total;
      h.cache.acked_total = cp->acked_total;
      h.cache.dead_total = cp->dead_total;
      h.cache.expired_total = cp->expired_total;
      h.cache.nacked_total = cp->nacked_total;
      h.cache.received_total = cp->received_total;
      h.cache.redelivered_total = cp->redelivered_total;
      if (cp->next_id > 1) raise_next_id(h, cp->next_id - 1);
      if (cp->paused >= 0) h.cache.paused = static_cast<uint64_t>(cp->paused);  // its PAUSE may be compacted away
      if (cp->purged_through > h.cache.purged_through) {
        // The PURGE itself may have been compacted away: applied here.
        Status s = drop_through(x, cp->purged_through);
        h.cache.purged_through = cp->purged_through;
        return s;
      }
      return {};
    }
    case RecordType::kClock:
      break;
    case RecordType::kPause:
      h.cache.paused = r.count != 0 ? 1 : 0;
      return {};
  }
  return {};
}

}  // namespace spool::queue
