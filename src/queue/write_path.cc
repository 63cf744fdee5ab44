// The write path: every state change is records appended at the log end under the index
// lock, after the log clock's anchor when one is due; the room a send needs (spare
// segments, max_ready / max_bytes) and waking the senders that wait for it.
#include "queue/queue_impl.h"

#include "queue/apply.h"

namespace spool {
namespace {

// What a segment cannot hold of drain records: its header, the CLOCK record that opens it,
// the tail a drain record did not fit, and the restated subscriptions (SUB records) of the
// opener.
uint64_t per_segment(const index::IndexHeader& h) {
  uint64_t n = format::kSegmentHeaderSize + 2 * format::kRecordHeaderSize + 8;
  for (const auto& sub : h.cache.subs) {
    if (sub.active != 0) n += format::record_size(sub.name_len);
  }
  return n;
}
uint64_t drain_cap(uint64_t size, uint64_t per_segment) { return size - std::min(size, per_segment); }

}  // namespace

std::vector<Record> listed_records(const Record& proto, std::vector<std::pair<uint32_t, uint64_t>> counted,
                                   std::deque<std::string>& payloads) {
  std::sort(counted.begin(), counted.end());
  counted.erase(std::unique(counted.begin(), counted.end()), counted.end());  // (a list names an id once)
  std::vector<Record> out;
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < counted.size();) {
    const uint32_t count = counted[i].first;
    ids.clear();
    for (; i < counted.size() && counted[i].first == count; ++i) ids.push_back(counted[i].second);
    for (std::span<const uint64_t> left(ids); !left.empty();) {
      const size_t n = left.size() == 1 ? 1 : storage::list_fits(left);
      Record r = proto;
      r.count = count;
      r.id = left[n - 1];
      if (n > 1) {
        r.flags = static_cast<uint8_t>(r.flags | format::kFlagList);
        r.payload = payloads.emplace_back(storage::encode_list(left.first(n)));
      }
      out.push_back(r);
      left = left.subspan(n);
    }
  }
  return out;
}

auto Queue::Impl::writable() const -> Status {
  if (read_only) return Status(Code::kReadOnly, dir + ": read-only (no write permission on the queue)");
  return {};
}

auto Queue::Impl::log_tail() -> Result<storage::Segment*> {
  // The segment is looked up again only after a roll or a compaction (in any process: the
  // end names another segment, or this Log's cache changed), not at every send: a lookup
  // takes the Log's mutex, searches its map and counts references.
  if (const uint64_t gen = log->cache_generation(); gen != tail_gen) {
    tail_seen.reset();
    tail_gen = gen;
  }
  if (Status s = log->check_end(Pos::unpack(idx.hdr().cache.log_end), tail_seen); !s.ok()) {
    idx.damaged(s.message());  // rebuilt before the unlock
    return Status(Code::kCorrupt, dir + "/index is damaged: " + s.message() + "; it is rebuilt from the log, try again");
  }
  return tail_seen.get();
}

auto Queue::Impl::commit(std::span<const Record> recs, const Clocks& now, storage::Segment* tail, bool applied)
    -> Result<storage::AppendResult> {
  auto& h = idx.hdr();
  if (tail == nullptr) {
    auto t = log_tail();
    if (!t.ok()) return t.status();
    tail = *t;
  }
  // Every segment opens with a CLOCK record restating the log clock (queue/log_clock.h),
  // then a SUB add flagged RESTATED per active subscription, so that a log whose prefix
  // compaction removed (with the subscriptions' own adds) still starts with every view
  // that was active at that segment's roll (apply_sub: a no-op for a view already active).
  // (The CLOCK record's payload is a view of `boot`, which outlives the append.)
  const uint64_t boot = queue::boot_hash();
  std::array<Record, 1 + index::kSubscriptions> opener;
  size_t n = 0;
  if (!read_only && h.cache.clock_n != 0) {
    opener[n++] = queue::restatement(h, boot, boot_seen != 0 ? boot_seen : env->boot_ns());
  }
  for (uint16_t k = 1; !read_only && k <= index::kSubscriptions; ++k) {
    const index::Subscription& sub = h.cache.subs[k - 1];
    if (sub.active == 0) continue;
    const std::string_view name(sub.name, std::min<size_t>(sub.name_len, index::kSubscriptionName));
    opener[n++] = Record{RecordType::kSub, 1, sub.from, sub.max_receives, 0, name, format::kFlagRestated, {}, k};
  }
  auto res = log->append(Pos::unpack(h.cache.log_end), recs, h.cache.next_id, std::span(opener.data(), n), tail);
  if (!res.ok()) {
    if (applied) (void)rebuild();
    return res.status();
  }
  h.disk.spares -= std::min<uint64_t>(h.disk.spares, res->spares_used);
  h.disk.spare_bytes -= std::min<uint64_t>(h.disk.spare_bytes, res->spare_bytes_used);
  __atomic_store_n(&h.cache.log_end, res->end.pack(), __ATOMIC_RELEASE);
  // (A crash test's hook: a send parks here, its messages in the log and not in the index.)
  if (kTestHooks && env->parks() && !recs.empty() && recs.front().type == RecordType::kMsg &&
      (recs.front().flags & format::kFlagCopy) == 0) {
    env->park(ParkPoint::kAfterAppend);
  }
  queue::Copies copies;  // (allocates nothing unless a copy comes)
  const queue::Keys keys = live_keys(now, &copies);
  for (size_t i = 0; i < recs.size(); ++i) {
    const Record& r = recs[i];
    if (!applied) {
      if (Status s = queue::apply_record(idx, res->at[i].pack(), queue::view_of(r), keys); !s.ok()) {
        idx.damaged(s.message());  // rebuilt from the log before the unlock
      }
    }
    switch (r.type) {
      case RecordType::kMsg:
      case RecordType::kRelease:
        // Receivable now (no delay): one long poll each.
        if (r.t2 <= r.t1 && (r.flags & format::kFlagCopy) == 0) ++wake_pending;
        break;
      case RecordType::kPause:
        // A resume: every long poll, all of which slept through the pause.
        if (r.count == 0) wake_pending += INT32_MAX;
        break;
      case RecordType::kLease:
        // A receive's (the LEASEs applied before their append): a ready message leased no
        // longer counts against max_ready. An extend's or a compaction copy's changes no count.
        if (applied) room_pending = true;
        break;
      case RecordType::kAck:
      case RecordType::kDead:
      case RecordType::kPurge:
        room_pending = true;
        break;
      default:
        break;
    }
  }
  return res;
}

auto Queue::Impl::live_keys(const Clocks& now, queue::Copies* copies) const -> queue::Keys {
  return queue::Keys{nullptr, now, ms_to_ns(cfg.opts.keep_acked), 0, dedup_window_ns(), copies, &view_fn};
}

auto Queue::Impl::apply_before_append(const Record& rec, const Clocks& now) -> Status {
  return queue::apply_record(idx, 0, queue::view_of(rec), live_keys(now, nullptr));
}

auto Queue::Impl::clocks() -> Clocks {
  auto& h = idx.hdr();
  Clocks c = queue::read_clocks(h, *env);
  boot_seen = c.boot;
  if (read_only || !queue::anchor_due(h, c)) return c;
  Clocks next = c;
  next.rt = next.real();
  const uint64_t boot = queue::boot_hash();
  Record r = queue::anchor_record(next, boot);
  auto at = commit(std::span(&r, 1), next);
  if (!at.ok()) {
    spool::log().warn("{}: cannot write a clock record: {}", dir, at.status().to_string());
    return c;
  }
  return next;  // (commit() applied the record: its anchor is in the header)
}

auto Queue::Impl::spares_short(const storage::Segment* tail, uint64_t new_msgs, uint64_t bytes, uint64_t largest,
                               bool ahead) -> SpareShort {
  constexpr uint64_t kDrainBytesPerMsg = 2 * format::kRecordHeaderSize;
  constexpr uint64_t kSlack = 4096;
  auto& h = idx.hdr();
  const uint64_t per_seg = per_segment(h);
  auto cap = [per_seg](uint64_t size) { return drain_cap(size, per_seg); };
  Pos end = Pos::unpack(h.cache.log_end);
  const uint64_t active = tail == nullptr ? 0 : tail->info().size;
  // A spare beyond the last segment number a position can hold is never rolled into; when
  // there are more spares than numbers, each one left counts as the smallest a spare can be.
  const uint64_t numbers_left = storage::kMaxSegmentSeq - std::min(end.seq, storage::kMaxSegmentSeq);
  uint64_t usable = std::min(h.disk.spares, numbers_left);
  const uint64_t spare_room = usable == h.disk.spares ? h.disk.spare_bytes - std::min(h.disk.spare_bytes, h.disk.spares * per_seg)
                                                 : usable * cap(log->first_size());
  uint64_t room = active - std::min(active, end.off) + spare_room;
  // Every reader drains its own: a LEASE and an ACK of each message it holds, in each
  // subscription's view as in the queue's own.
  // (By hand, not held_views(): this runs at every send, and walks without allocating.)
  uint64_t to_drain = h.layout.count + new_msgs;
  for (uint16_t k = 1; k <= index::kSubscriptions; ++k) {
    if (h.cache.subs[k - 1].active == 0) continue;
    index::SharedIndex* v = view_index(k);
    if (v == nullptr) continue;
    v->assert_held();
    to_drain += v->hdr().layout.count + new_msgs;
  }
  // Twice the records: a roll wastes the tail of a segment the next record does not fit.
  uint64_t need = to_drain * kDrainBytesPerMsg + 2 * bytes + kSlack;
  if (ahead) need += cap(log->next_size(active));
  if (room >= need) {
    // While segments still grow, rolls come often and each tops up; the largest can take
    // hundreds of thousands of sends between rolls, while the reserve grows with each.
    return SpareShort{.low = !ahead && active >= log->max_size() && room - need < cap(active), .per_segment = per_seg};
  }
  SpareShort s;
  s.per_segment = per_seg;
  s.missing = need - room;
  // The size of the roll after the spares there are (each roll doubles).
  uint64_t size = log->next_size(active);
  for (uint64_t i = 0; i < h.disk.spares && size < log->max_size(); ++i) size = log->next_size(size);
  s.size = size;
  const uint64_t header_and_clock = format::kSegmentHeaderSize + format::record_size(8);
  s.at_least = largest == 0 ? 0 : std::min(log->max_size(), (header_and_clock + largest + 4095) & ~uint64_t{4095});
  const uint64_t max_n = numbers_left - usable;
  while (room < need) {
    if (s.n >= max_n) return SpareShort{kNoSegmentNumbers, 0, 0};
    if (size >= log->max_size() && s.at_least <= size) {
      // The rest are all of the largest size.
      const uint64_t c = std::max<uint64_t>(1, cap(size));
      const uint64_t more = (need - room + c - 1) / c;
      if (more > max_n - s.n) return SpareShort{kNoSegmentNumbers, 0, 0};
      s.n += more;
      break;
    }
    room += cap(std::max(size, s.at_least));
    ++s.n;
    size = log->next_size(size);
  }
  return s;
}

auto Queue::Impl::make_spares(const SpareShort& s, bool zero_fill) -> Status {
  if (s.n == kNoSegmentNumbers) {
    return Status(Code::kNoSpace, dir + ": the log has used every segment number (1 to " +
                                      std::to_string(storage::kMaxSegmentSeq) +
                                      "); the room left is kept so that the queued messages can "
                                      "still be received and acked. Drain the queue into a new one "
                                      "(a larger segment_size makes the limit further away)");
  }
  uint64_t size = s.size;
  uint64_t missing = s.missing;
  for (uint64_t n = s.n; n > 0 && missing > 0; --n, size = log->next_size(size)) {
    uint64_t bytes = std::max(size, s.at_least);
    Status made = log->make_spare(bytes, zero_fill);
    // A small device (issue 43): the disk cannot give a spare of the size the doubling
    // asks for, but may give one of the room still missing, which serves as well (a roll
    // takes a spare's own size). At least the largest record about to be written, and not
    // below the first segment's size: smaller spares would cut the log of a nearly full disk
    // into many small segments, each send making one.
    const uint64_t fits =
        (std::max({missing + s.per_segment, s.at_least, log->first_size()}) + 4095) & ~uint64_t{4095};
    if (made.code() == Code::kNoSpace && fits < bytes) {
      bytes = fits;
      made = log->make_spare(bytes, zero_fill);
    }
    auto held = lock();  // the count is read and changed under the lock
    if (!held.ok()) return made.ok() ? held.status() : made;
    holds(*held);
    if (!made.ok()) {
      return Status(made.code(), made.message() + "; the space left is kept so that the " +
                                     std::to_string(idx.hdr().layout.count) +
                                     " queued messages can still be received and acked");
    }
    ++idx.hdr().disk.spares;
    idx.hdr().disk.spare_bytes += bytes;
    missing -= std::min(missing, drain_cap(bytes, s.per_segment));
  }
  return {};
}

auto Queue::Impl::written(uint64_t end, Durability d) -> Status {
  background.written(end);
  return syncer->written(end, d);
}

auto Queue::Impl::top_up_spares() -> void {
  SpareShort s;
  {
    auto held = lock();  // reads the counts only: no reaping or shrinking from this thread
    if (!held.ok()) return;
    holds(*held);
    auto tail = log_tail();
    if (!tail.ok()) return;
    s = spares_short(*tail, 0, 0, 0, true);
  }
  // A failure here is not the caller's: the send that is really short makes the spare
  // itself and reports the error.
  if (s.n != 0 && s.n != kNoSegmentNumbers) {
    // Zero-filled where syncs come (they would otherwise commit the extent conversions a
    // store causes); a queue that never syncs saves the disk the segment's size in zeros.
    const bool zero_fill = cfg.opts.sync != SyncPolicy::kNever;
    if (Status st = make_spares(s, zero_fill); !st.ok()) {
      spool::log().debug("{}: spare ahead: {}", dir, st.to_string());
    }
  }
  log->warm_next_spares();
}

auto Queue::Impl::wake(uint64_t n) -> void {
  auto& h = idx.hdr();
  h.coord.wake_seq.fetch_add(1, std::memory_order_release);
  if (h.coord.waiters.load(std::memory_order_acquire) > 0) {
    sys::futex_wake(&h.coord.wake_seq, static_cast<int>(std::min<uint64_t>(n, INT32_MAX)));
  }
}

auto Queue::Impl::room() -> void {
  if (cfg.opts.max_ready == 0 && cfg.opts.max_bytes == 0) return;
  auto& h = idx.hdr();
  h.coord.room_seq.fetch_add(1, std::memory_order_release);
  if (h.coord.room_waiters.load(std::memory_order_acquire) > 0) sys::futex_wake(&h.coord.room_seq, INT32_MAX);
}

auto Queue::Impl::full_reason(uint64_t n, uint64_t bytes) -> std::string {
  const auto& o = cfg.opts;
  // With subscriptions the fullest view counts: a stalled subscription holds the producer
  // back as a full queue does. Unless a retention limit is set: retention then drops that
  // view's oldest messages instead (retain()), and only the queue's own readers count.
  const bool retention = o.retention_max_age.count() != 0 || o.retention_max_bytes != 0;
  struct Fullest {
    uint64_t n = 0;
    std::string who;  // "": the queue's own readers
  };
  Fullest waiting{idx.hdr().layout.count - idx.hdr().layout.leased, ""}, queued{idx.hdr().cache.bytes_live, ""};
  auto count = [&](index::SharedIndex& v, std::string_view name) {
    const auto& h = v.hdr();
    const std::string who = " (subscription '" + std::string(name) + "')";
    if (h.layout.count - h.layout.leased > waiting.n) waiting = {h.layout.count - h.layout.leased, who};
    if (h.cache.bytes_live > queued.n) queued = {h.cache.bytes_live, who};
  };
  for (uint16_t k : retention ? std::vector<uint16_t>{} : queue::active_views(idx)) {
    const index::Subscription& sub = idx.hdr().cache.subs[k - 1];
    if (index::SharedIndex* v = view_index(k)) count(*v, {sub.name, std::min<size_t>(sub.name_len, index::kSubscriptionName)});
  }
  if (o.max_ready != 0 && waiting.n + n > o.max_ready) {
    return std::to_string(waiting.n) + " messages waiting" + waiting.who + ", max_ready is " + std::to_string(o.max_ready);
  }
  if (o.max_bytes != 0 && queued.n + bytes > o.max_bytes) {
    return std::to_string(queued.n) + " bytes queued" + queued.who + ", max_bytes is " + std::to_string(o.max_bytes);
  }
  return "";
}

}  // namespace spool
