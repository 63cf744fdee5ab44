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
static_assert(index::kSubscriptions == format::kMaxSubscriptions && index::kSubscriptionName == format::kMaxSubscriptionName);
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
  if (slot >= 0) x.entry(static_cast<uint32_t>(slot)).loc = it->second.at;
  keys.copies->erase(it);
}

// Inserts message `id` into `v`, its group (hash `group`, 0: none) joined, counted as sent.
Status insert_message(index::SharedIndex& v, uint64_t id, const Entry& e, uint64_t key, uint64_t now, uint8_t priority,
                      uint64_t group) REQUIRES(v) {
  if (group != 0) {  // (a live send reserved this in view 0; a replay and every other view reserve here)
    if (Status s = v.group_reserve(2); !s.ok()) return s;
    if (Status s = v.reserve_heap(1); !s.ok()) return s;
  }
  auto ins = v.insert(id, e, key, now, priority);
  if (!ins.ok()) return ins.status();
  if (group != 0) v.group_join(*ins, id, group);
  ++v.hdr().cache.sent_total;
  v.hdr().cache.bytes_live += e.len;
  return {};
}

// With subscriptions, a LEASE or RELEASE of view `v` that follows a compaction copy of its
// message: the entry moves to the copy, or, where `v` does not hold the message (it came
// from a view that did), is inserted from the copy. The copy stays noted for the views after
// this one. Returns the entry's slot, or -1.
Result<int64_t> take_copy(index::SharedIndex& v, const Keys& keys, const storage::RecordView& r, int64_t slot)
    REQUIRES(v) {
  if (keys.copies == nullptr || keys.copies->empty()) return slot;
  auto it = keys.copies->find(r.id);
  if (it == keys.copies->end()) return slot;
  const Copy& c = it->second;
  if (slot >= 0) {
    v.entry(static_cast<uint32_t>(slot)).loc = c.at;
    return slot;
  }
  if (r.id <= v.hdr().cache.purged_through) return int64_t{-1};
  Entry e{c.at, c.len, 0, index::kNoPos, 0, State::kReady, 0};
  if (Status s = insert_message(v, r.id, e, keys.now.boot, keys.now.boot, c.priority, c.group); !s.ok()) return s;
  return v.find(r.id);
}

// The records that change one view's state (LEASE, RELEASE, ACK, DEAD, PURGE, PAUSE), on
// that view's index `v`. `subs`: the queue has subscriptions (copies are followed per view).
Status apply_state(index::SharedIndex& v, uint64_t at, const storage::RecordView& r, const Keys& keys, bool subs)
    REQUIRES(v) {
  auto& h = v.hdr();
  switch (r.type) {
    case RecordType::kLease:
    case RecordType::kRelease: {
      const bool lease = r.type == RecordType::kLease;
      if (!lease && (r.flags & format::kFlagNack) != 0) ++h.cache.nacked_total;
      int64_t slot = v.find(r.id);
      if (subs) {
        auto took = take_copy(v, keys, r, slot);
        if (!took.ok()) return took.status();
        slot = *took;
      } else {
        settle_copy(v, keys, r.id, slot);
      }
      if (slot < 0) return {};
      Entry& e = v.entry(static_cast<uint32_t>(slot));
      if (lease && r.count > e.count) {  // a delivery (an extend keeps the count; a copy's LEASE too)
        ++h.cache.received_total;
        if (r.count > 1) ++h.cache.redelivered_total;
      }
      e.count = r.count;
      return lease ? v.set(static_cast<uint32_t>(slot), State::kLeased, keys.lease(at, r.t2))
                   : v.set(static_cast<uint32_t>(slot), State::kReady, keys.ready(at, r.t1, r.t2));
    }
    case RecordType::kAck:
    case RecordType::kDead: {
      if (r.type == RecordType::kDead) {
        ++h.cache.dead_total;
      } else {
        ++((r.flags & format::kFlagExpired) != 0 ? h.cache.expired_total : h.cache.acked_total);
      }
      const int64_t found = v.find(r.id);
      if (!subs) settle_copy(v, keys, r.id, -1);  // (with subscriptions another view may take it)
      if (int64_t slot = found; slot >= 0) {
        if (keys.keep_acked != 0 && r.type == RecordType::kAck &&
            (r.flags & (format::kFlagExpired | format::kFlagDeleted)) == 0) {
          const Entry& e = v.entry(static_cast<uint32_t>(slot));
          v.kept_note(keys.acked != 0 ? keys.acked : keys.now.boot, storage::Pos::unpack(e.loc).seq, e.len, keys.keep_acked);
        }
        drop(v, slot);
      }
      return {};
    }
    case RecordType::kPurge: {
      Status s = drop_through(v, r.id);
      h.cache.purged_through = std::max(h.cache.purged_through, r.id);
      return s;
    }
    case RecordType::kPause:
      h.cache.paused = r.count != 0 ? 1 : 0;
      return {};
    default:
      return {};
  }
}

// Empties `x`'s state (messages, dedup ids, kept buckets, totals, pause, purge mark) with
// its window starting at `next` (a view made or dropped mid-log starts at the queue's).
Status clear_state(index::SharedIndex& x, uint64_t next) REQUIRES(x) {
  auto& c = x.hdr().cache;
  c.next_id = next;  // reset() starts the window at next_id
  x.hdr().coord.sent_through.store(next - 1, std::memory_order_release);
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

struct Live {
  uint64_t id;
  Entry e;
  uint8_t priority;
  uint64_t group;    // its group's hash (0: none)
  bool own_priority;  // `priority` is the message's (a blocked entry keeps none: the default)
};
void collect_live(index::SharedIndex& from, std::vector<Live>& out) REQUIRES(from) {
  from.for_each_entry([&](uint32_t, uint64_t id, const Entry& e) {
    const bool own_priority = e.state == State::kReady || e.state == State::kLeased;
    out.push_back({id, Entry{e.loc, e.len, 0, index::kNoPos, 0, State::kReady, 0},
                   own_priority ? static_cast<uint8_t>(e.key_hi) : index::kDefaultPriority, from.group_of(id),
                   own_priority});
  });
}

// "From start": every message live in view 0 or another active view than `self`, in id
// order, as a new view takes it: ready now, receive count 0, with its priority (a blocked
// one's is not kept in its entry: the default) and its ordered group, whose first in the
// new view is its lowest id there (the rest blocked behind it).
std::vector<Live> live_in_views(index::SharedIndex& x, uint16_t self, const Keys& keys) REQUIRES(x) {
  std::vector<Live> msgs;
  collect_live(x, msgs);
  if (keys.views != nullptr) {
    for (uint16_t k : active_views(x)) {
      if (k == self) continue;
      index::SharedIndex* o = (*keys.views)(k);
      if (o == nullptr) continue;
      o->assert_held();
      collect_live(*o, msgs);
    }
  }
  // A message several views hold: the entry with its own priority first (the views' slot
  // orders differ between a live index and a rebuilt one; this choice does not).
  std::sort(msgs.begin(), msgs.end(), [](const Live& a, const Live& b) {
    return a.id != b.id ? a.id < b.id : a.own_priority > b.own_priority;
  });
  msgs.erase(std::unique(msgs.begin(), msgs.end(), [](const Live& a, const Live& b) { return a.id == b.id; }), msgs.end());
  return msgs;
}

// A SUB record: subscription r.view added (count 1) or removed (0) in view 0's table `x`,
// its index emptied either way (its window starting at the first message it takes).
Status apply_sub(index::SharedIndex& x, uint64_t at, const storage::RecordView& r, const Keys& keys) REQUIRES(x) {
  const uint16_t k = r.view;
  if (k == 0 || k > index::kSubscriptions) return {};
  auto& h = x.hdr();
  index::Subscription& sub = h.cache.subs[k - 1];
  const bool add = r.count != 0;
  const bool restated = add && (r.flags & format::kFlagRestated) != 0;
  // A restatement (every segment opens with one per active view): of a view active with
  // that `from`, nothing (its add came before); else the log's prefix with the real add
  // was compacted away, and the view starts here, empty: its messages come back from the
  // copies' LEASE/RELEASE records and from the MSGs after this.
  if (restated && sub.active != 0 && sub.from == r.id) return {};
  sub = index::Subscription{};
  const bool from_start = add && r.id == 0 && !restated;
  std::vector<Live> msgs;
  if (from_start) msgs = live_in_views(x, k, keys);
  if (add) {
    sub.active = 1;
    sub.added = at;
    sub.from = from_start ? (msgs.empty() ? h.cache.next_id : msgs.front().id) : r.id;
    sub.max_receives = static_cast<uint32_t>(std::min<uint64_t>(r.t1, UINT32_MAX));  // (0: the queue's)
    sub.name_len = static_cast<uint32_t>(std::min<size_t>(r.payload.size(), index::kSubscriptionName));
    std::copy_n(r.payload.data(), sub.name_len, sub.name);
  }
  index::SharedIndex* v = keys.views != nullptr ? (*keys.views)(k) : nullptr;
  if (v == nullptr) return {};
  v->assert_held();
  const uint64_t first = restated ? std::max<uint64_t>(1, r.id) : msgs.empty() ? h.cache.next_id : msgs.front().id;
  if (Status s = clear_state(*v, first); !s.ok()) return s;
  raise_next_id(v->hdr(), h.cache.next_id - 1);
  for (const Live& m : msgs) {
    if (Status s = insert_message(*v, m.id, m.e, 0, keys.now.boot, m.priority, m.group); !s.ok()) return s;
  }
  return {};
}

// A CHECKPOINT's totals of one view (view 0's, or a subscription's appended after them),
// including what segments compaction removed held.
Status apply_checkpoint(index::SharedIndex& x, const storage::Checkpoint& cp) REQUIRES(x) {
  auto& h = x.hdr();
  h.cache.sent_total = cp.sent_total;
  h.cache.acked_total = cp.acked_total;
  h.cache.dead_total = cp.dead_total;
  h.cache.expired_total = cp.expired_total;
  h.cache.nacked_total = cp.nacked_total;
  h.cache.received_total = cp.received_total;
  h.cache.redelivered_total = cp.redelivered_total;
  if (cp.paused >= 0) h.cache.paused = static_cast<uint64_t>(cp.paused);  // its PAUSE may be compacted away
  if (cp.purged_through > h.cache.purged_through) {
    // The PURGE itself may have been compacted away: applied here.
    Status s = drop_through(x, cp.purged_through);
    h.cache.purged_through = cp.purged_through;
    return s;
  }
  return {};
}

// Raises next_id past `id` in view 0 and in every active subscription's index. Every
// active view's next_id is at least view 0's after each record (a SUB add raises the new
// view to it, a restated one may start it higher; views_sound() checks they are equal at
// the first open), so an id that does not raise view 0's raises none: most records (every LEASE, RELEASE and ACK) return at the first test, with
// no walk of the subscription table.
void raise_all(index::SharedIndex& x, const Keys& keys, uint64_t id, bool subs) REQUIRES(x) {
  auto& h = x.hdr();
  if (id < h.cache.next_id) return;
  raise_next_id(h, id);
  if (!subs || keys.views == nullptr) return;
  for (uint16_t k = 1; k <= index::kSubscriptions; ++k) {
    if (h.cache.subs[k - 1].active == 0) continue;
    if (index::SharedIndex* v = (*keys.views)(k)) raise_next_id(v->hdr(), id);
  }
}

// A LIST record (format::kFlagList): each id it lists, in order, as a record of that id
// alone with the same view, count, times and other flags. (The reader checked the list.)
Status apply_list(index::SharedIndex& x, uint64_t at, const storage::RecordView& r, const Keys& keys) REQUIRES(x) {
  storage::RecordView one = r;
  one.flags = static_cast<uint8_t>(r.flags & ~format::kFlagList);
  one.payload = {};
  Status first_error;
  storage::for_each_listed(r.payload, [&](uint64_t id) {
    x.assert_held();  // (the analysis does not follow into the lambda)
    if (!first_error.ok()) return;
    one.id = id;
    first_error = apply_record(x, at, one, keys);
  });
  return first_error;
}

}  // namespace

bool any_subscription(const index::SharedIndex& x) {
  for (const auto& sub : x.hdr().cache.subs) {
    if (sub.active != 0) return true;
  }
  return false;
}

std::vector<uint16_t> active_views(const index::SharedIndex& x) {
  std::vector<uint16_t> out;
  for (uint16_t k = 1; k <= index::kSubscriptions; ++k) {
    if (x.hdr().cache.subs[k - 1].active != 0) out.push_back(k);
  }
  return out;
}

Status clear_for_replay(index::SharedIndex& x) {
  for (auto& sub : x.hdr().cache.subs) sub = index::Subscription{};
  return clear_state(x, 1);
}

uint64_t enqueue_key(const index::SharedIndex& x, uint64_t at, uint64_t t1, const Clocks& now) {
  return std::min(now.boot, now.key(rebase(x.hdr(), at, t1, now)));
}

uint64_t dedup_hash(std::string_view id) { return XXH3_64bits(id.data(), id.size()); }

storage::RecordView view_of(const storage::Record& rec) {
  return storage::RecordView{rec.type, rec.flags, rec.count, rec.id, rec.t1, rec.t2, rec.payload, 0, 0, rec.ext, rec.view};
}

Status apply_record(index::SharedIndex& x, uint64_t at, const storage::RecordView& r, const Keys& keys) {
  auto& h = x.hdr();
  if (r.type == RecordType::kClock) {
    note_anchor(h, at, r);
    return {};
  }
  if (r.type == RecordType::kSub) return apply_sub(x, at, r, keys);
  if ((r.flags & format::kFlagList) != 0) return apply_list(x, at, r, keys);
  const bool subs = any_subscription(x);
  const uint64_t next = h.cache.next_id;  // before this record
  if (r.type != RecordType::kCheckpoint) raise_all(x, keys, r.id, subs);
  if (r.view != 0 && r.type != RecordType::kMsg) {  // a subscription's: its own index, if it is active
    if (r.view > index::kSubscriptions || h.cache.subs[r.view - 1].active == 0 || keys.views == nullptr) return {};
    index::SharedIndex* v = (*keys.views)(r.view);
    if (v == nullptr) return {};
    v->assert_held();
    return apply_state(*v, at, r, keys, true);
  }
  switch (r.type) {
    case RecordType::kMsg: {
      const bool copy = (r.flags & format::kFlagCopy) != 0;
      if (!copy && keys.dedup_window != 0 && !r.ext.empty()) remember_dedup(x, at, r, keys);
      // (A payload-only record, the common case, walks no extension.)
      std::optional<std::string_view> group;
      uint8_t priority = index::kDefaultPriority;
      if (!r.ext.empty()) {
        group = storage::ext_entry(r.ext, format::ExtType::kGroup);
        priority = storage::ext_priority(r.ext);
      }
      const uint64_t group_hash = group ? XXH3_64bits(group->data(), group->size()) : 0;
      const auto len = static_cast<uint32_t>(r.payload.size());
      // Into a subscription's view `k`, unless it took the message already or purged past it.
      auto into_view = [&](uint16_t k) -> Status {
        index::SharedIndex* v = (*keys.views)(k);
        if (v == nullptr) return {};
        v->assert_held();
        if (r.id <= v->hdr().cache.purged_through || v->find(r.id) >= 0) return {};
        Entry e{at, len, 0, index::kNoPos, 0, State::kReady, 0};
        return insert_message(*v, r.id, e, keys.ready(at, r.t1, r.t2), keys.now.boot, priority, group_hash);
      };
      // A message for one view (a redrive or replay of its own, kFlagOneView): a
      // subscription's goes to it alone (nowhere once it is removed), view 0's skips the
      // fan-out below. A compaction copy is never flagged: its LEASE/RELEASE say who holds it.
      const bool one_view = !copy && (r.flags & format::kFlagOneView) != 0;
      if (one_view && r.view != 0) {
        if (!subs || keys.views == nullptr || r.view > index::kSubscriptions || h.cache.subs[r.view - 1].active == 0) {
          return {};
        }
        return into_view(r.view);
      }
      if (copy && subs) {
        // Of no view by itself: the LEASE and RELEASE records after it say which hold it.
        if (keys.copies != nullptr) (*keys.copies)[r.id] = Copy{at, len, priority, group_hash};
        return {};
      }
      if (r.id > h.cache.purged_through) {
        // A message the index holds already (only an id below next_id can be): a compaction
        // copy, followed once a LEASE or RELEASE confirms it.
        if (r.id < next && x.find(r.id) >= 0) {
          if (copy && keys.copies != nullptr) (*keys.copies)[r.id] = Copy{at, len, priority, group_hash};
          if (copy) return {};
        } else {
          // A copy gets here only when its original is not in the log: removed by the
          // compaction whose CHECKPOINT follows (and sets the totals again), or lost to a
          // power cut before that compaction's sync. Either way the log holds one send of it.
          Entry e{at, len, 0, index::kNoPos, 0, State::kReady, 0};
          if (Status s = insert_message(x, r.id, e, keys.ready(at, r.t1, r.t2), keys.now.boot, priority, group_hash); !s.ok()) {
            return s;
          }
        }
      }
      if (copy || one_view || !subs || keys.views == nullptr) return {};
      for (uint16_t k : active_views(x)) {
        if (r.id < h.cache.subs[k - 1].from) continue;
        if (Status s = into_view(k); !s.ok()) return s;
      }
      return {};
    }
    case RecordType::kLease:
    case RecordType::kRelease:
    case RecordType::kAck:
    case RecordType::kDead:
    case RecordType::kPurge:
    case RecordType::kPause:
      return apply_state(x, at, r, keys, subs);
    case RecordType::kCheckpoint: {
      // Totals of everything before it, including compacted-away segments.
      auto cp = storage::decode_checkpoint(r.payload);
      if (!cp) return {};
      if (cp->next_id > 1) raise_all(x, keys, cp->next_id - 1, subs);
      // Each subscription's (issue 46): applied to its view when it is active here.
      for (const auto& [k, vc] : storage::decode_view_checkpoints(r.payload)) {
        if (h.cache.subs[k - 1].active == 0 || keys.views == nullptr) continue;
        index::SharedIndex* v = (*keys.views)(k);
        if (v == nullptr) continue;
        v->assert_held();
        if (Status s = apply_checkpoint(*v, vc); !s.ok()) return s;
      }
      return apply_checkpoint(x, *cp);
    }
    case RecordType::kClock:
    case RecordType::kSub:
      break;
  }
  return {};
}

}  // namespace spool::queue
