// Delivery: reading a message from its record, taking it for a receive (or handing it to
// the dead-letter queue past max_receives, or dropping it for retention), and logging
// the leases taken.
#include <algorithm>
#include <cctype>

#include "queue/queue_impl.h"

#include "queue/apply.h"

namespace spool {

auto Queue::Impl::read_stored(uint32_t slot, std::shared_ptr<storage::Segment>* keep, const Clocks& now)
    -> Result<Stored> {
  index::SharedIndex& v = vw();  // the handle's view: its slots
  v.assert_held();
  const Entry& e = v.entry(slot);
  const uint64_t id = v.id_of(slot);
  auto r = log->read(Pos::unpack(e.loc), keep);
  if (!r.ok()) {
    // A record the index points at is gone or damaged: the rebuild before the unlock
    // drops it (or finds the message's record elsewhere), so receives move past it.
    idx.damaged("the record of message " + std::to_string(id) + ": " + r.status().message());
    return r.status();
  }
  if (r->id != id || r->type != RecordType::kMsg) {
    idx.damaged("message " + std::to_string(id) + " points at the record of another");  // rebuilt before the unlock
    return Status(Code::kCorrupt, "index points at the wrong record for message " + std::to_string(id));
  }
  Stored out{*r, {}, 0};
  if (!r->ext.empty()) {
    auto ext = storage::decode_ext(r->ext);
    if (!ext.ok()) {
      return Status(Code::kCorrupt, "message " + std::to_string(id) + " (" + log->segment_path(Pos::unpack(e.loc).seq) +
                                        "): " + ext.status().message());
    }
    out.ext = std::move(*ext);
  }
  out.age_ns = now.boot - queue::enqueue_key(idx, e.loc, r->t1, now);
  return out;
}

auto Queue::Impl::load(uint32_t slot, Mapped* mapped, const Clocks* now, uint64_t* age_ns) -> Result<Message> {
  // The caller's Clocks by reference: its real() is read once per lock hold, not per message.
  Clocks own;
  if (now == nullptr) own = queue::read_clocks(idx.hdr(), *env);
  const Clocks& c = now != nullptr ? *now : own;
  std::shared_ptr<storage::Segment> keep;
  auto got = read_stored(slot, &keep, c);
  if (!got.ok()) return got.status();
  index::SharedIndex& v = vw();
  v.assert_held();
  Message m;
  m.id = v.id_of(slot);
  m.attributes.insert(got->ext.attributes.begin(), got->ext.attributes.end());
  m.priority = got->ext.priority;
  m.group = std::move(got->ext.group);
  if (mapped != nullptr) {
    mapped->view = got->r.payload;
    mapped->keep = std::move(keep);
  } else {
    m.payload.assign(got->r.payload);
  }
  m.receive_count = v.entry(slot).count;
  if (age_ns != nullptr) *age_ns = got->age_ns;
  m.enqueued = queue::wall_time(c.real() - got->age_ns);
  return m;
}

namespace {
// The LEASE record of delivery `count` of message `id`, leased for `vis` ns from `now`.
Record lease_record(uint64_t id, uint32_t count, const Clocks& now, uint64_t vis, uint16_t view) {
  return Record{RecordType::kLease, count, id, now.rt, now.rt + vis, {}, 0, {}, view};
}
// A move to the dead-letter queue that a receive made on its own, which no caller is told
// of: a warning. (One a consumer asks for, dead_letter(), is its caller's to report: it is
// logged at info only, so that spool work's own line about it is the only one by default.)
void log_moved(const std::string& dir, uint64_t id, const char* reason, uint32_t count) {
  spool::log().warn("{}: message {} moved to the dead-letter queue ({} after {} deliveries)", dir, id, reason,
                    count);
}
}  // namespace

auto Queue::Impl::take(uint32_t slot, const Clocks& now, uint64_t vis, uint64_t* end, Mapped* mapped) -> Result<std::optional<Message>> {
  auto& h = idx.hdr();
  index::SharedIndex& v = vw();
  v.assert_held();
  const uint64_t id = v.id_of(slot);
  uint64_t age = 0;
  auto msg = load(slot, mapped, &now, &age);
  if (msg.ok() && cfg.opts.retention_max_age.count() > 0 && age > ms_to_ns(cfg.opts.retention_max_age)) {
    if (Status s = expire(slot, now); !s.ok()) return s;
    *end = h.cache.log_end;
    return std::optional<Message>();
  }
  if (!msg.ok() && idx.damage().empty()) {
    // The index points right and the record's checksum holds, but its message cannot be
    // used (an extension that does not decode: a forged record). A rebuild would find it
    // again, so receives would fail on it forever (issue 48): it is dead-lettered, body
    // as stored, with the reason; verify reports it too.
    std::shared_ptr<storage::Segment> seg;
    auto r = log->read(Pos::unpack(v.entry(slot).loc), &seg);
    if (!r.ok()) return r.status();
    Message raw;
    raw.id = id;
    std::string why = msg.status().message().substr(0, format::kMaxAttrValue);
    const uint32_t count = v.entry(slot).count;
    if (Status s = bury(slot, raw, r->payload, "unreadable", {{"spool.dead.error", why}}, now); !s.ok()) return s;
    log_moved(dir, id, "unreadable", count);
    *end = h.cache.log_end;
    return std::optional<Message>();
  }
  if (!msg.ok()) {
    // load() recorded this as damage of the index, which the rebuild from the log before
    // this call unlocks mends: the message is back if its record is intact (the index
    // pointed wrong), gone if the damage destroyed it. No DEAD record: that dropped intact
    // messages whose index entry had been overwritten (tests/damage_campaign_test.cc).
    return Status(Code::kCorrupt, "message " + std::to_string(id) + " could not be read (" + msg.status().message() +
                                      "); the index is rebuilt from the log, try again");
  }
  Entry& e = v.entry(slot);
  if (const uint32_t max = max_receives_here(); max != 0 && e.count >= max) {
    const std::string body = mapped != nullptr ? std::string(mapped->view) : std::move(msg->payload);
    const uint32_t count = e.count;
    if (Status s = bury(slot, *msg, body, "max_receives", {}, now); !s.ok()) return s;
    log_moved(dir, id, "max_receives", count);
    *end = h.cache.log_end;
    return std::optional<Message>();
  }
  e.owner = owners.new_lease_tag(idx);
  if (e.owner != 0) h.registry.owner_renew_ds[e.owner - 1] = index::renew_stamp(now.boot);
  const uint32_t count = e.count + 1;
  // The LEASE record log_leases() commits for it, applied now: the next message is picked
  // from the state this one leaves. The caller reserved heap room for every message it
  // takes, so this cannot remap; if the append fails, the index is rebuilt from the log.
  if (Status s = apply_before_append(lease_record(id, count, now, vis, view_k), now); !s.ok()) return s;
  msg->receive_count = count;
  msg->receipt = receipt(id, count);
  return std::optional<Message>(std::move(*msg));
}

void add_within_bounds(Attributes& a, const std::vector<std::pair<std::string, std::string>>& add) {
  size_t total = 0;
  for (const auto& [k, v] : a) total += k.size() + v.size();
  auto key_ok = [](const std::string& k) {
    return !k.empty() && k.size() <= format::kMaxAttrKey && std::all_of(k.begin(), k.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    });
  };
  for (const auto& [k, v] : add) {
    if (!key_ok(k)) continue;
    auto it = a.find(k);
    const size_t old = it == a.end() ? 0 : it->first.size() + it->second.size();
    if (it == a.end() && a.size() >= format::kMaxAttributes) continue;
    if (v.size() > format::kMaxAttrValue || total - old + k.size() + v.size() > format::kMaxAttrTotal) continue;
    total = total - old + k.size() + v.size();
    a[k] = v;
  }
}

auto Queue::Impl::bury(uint32_t slot, Message& msg, std::string_view body, const char* reason,
                       const Attributes& extra, const Clocks& now) -> Status {
  index::SharedIndex& v = vw();
  v.assert_held();
  const Entry& e = v.entry(slot);
  const uint64_t id = v.id_of(slot);
  const uint32_t count = e.count;
  auto dead_q = dlq.get();
  if (!dead_q.ok()) return dead_q.status();
  // The attributes go with it, then its history; the dedup id does not (the DLQ is no new
  // send). A consumer's own attributes come first, so the history cannot crowd them out.
  SendOptions keep;
  // Only what a send accepts: a forged record's attributes (a 6,000-byte value, say) made
  // the DLQ send fail, and so every receive that met the message (issue 48).
  const size_t had = msg.attributes.size();
  add_within_bounds(keep.attributes, {msg.attributes.begin(), msg.attributes.end()});
  const size_t dropped = had - keep.attributes.size();
  keep.priority = msg.priority;
  keep.group = msg.group;  // so that a redrive puts it back in its group
  std::vector<std::pair<std::string, std::string>> history(extra.begin(), extra.end());
  history.emplace_back("spool.dead.reason", reason);
  history.emplace_back("spool.dead.original_id", std::to_string(id));
  history.emplace_back("spool.dead.receive_count", std::to_string(count));
  history.emplace_back("spool.dead.enqueued_at", sys::iso_time(msg.enqueued));
  // A subscription's dead letters share the queue's dead-letter queue, named by it.
  if (view_k != 0) history.emplace_back("spool.dead.subscription", view_name);
  if (dropped != 0) history.emplace_back("spool.dead.dropped_attributes", std::to_string(dropped));
  add_within_bounds(keep.attributes, history);
  if (auto sent = (*dead_q)->send(body, keep); !sent.ok()) return sent.status();
  env->crashpoint("dead_letter.after_send");  // in the DLQ, not yet DEAD here: a duplicate, never a loss
  Record dead{RecordType::kDead, count, id, 0, 0, {}, 0, {}, view_k};
  if (auto res = commit(std::span(&dead, 1), now); !res.ok()) return res.status();
  return {};
}

auto Queue::Impl::expire(uint32_t slot, const Clocks& now) -> Status {
  index::SharedIndex& v = vw();
  v.assert_held();
  Entry& e = v.entry(slot);
  const uint64_t id = v.id_of(slot);
  Record rec{RecordType::kAck, e.count, id, 0, 0, {}, format::kFlagExpired, {}, view_k};
  const uint32_t len = e.len;
  if (auto res = commit(std::span(&rec, 1), now); !res.ok()) return res.status();
  spool::log().warn("{}: retention limit dropped message {} ({} bytes)", dir, id, len);
  return {};
}

auto Queue::Impl::retain(const Clocks& now, bool by_age) -> Status {
  const uint64_t max_age = ms_to_ns(cfg.opts.retention_max_age);
  const uint64_t max_bytes = cfg.opts.retention_max_bytes;
  by_age = by_age && max_age != 0;
  if (!by_age && max_bytes == 0) return {};
  const auto held = held_views();
  std::vector<Record> recs;
  std::deque<std::string> payloads;  // (of the LIST records among them)
  std::vector<std::pair<uint64_t, uint32_t>> oldest;  // (id, slot) of a view's ready messages
  size_t n_dropped = 0;
  for (auto [k, v] : held) {
    v->assert_held();
    uint64_t bytes = v->hdr().cache.bytes_live;
    if (!by_age && bytes <= max_bytes) continue;
    (void)v->next(now.boot);  // moves the delayed messages due now into the due heap
    // Its oldest ready messages: the first queued ones (in id order) and the due heap's
    // (redeliveries, heap order; a backlog of them is read in part: bounded work).
    oldest.clear();
    v->for_each_queued([&](uint32_t slot, uint64_t id) {
      oldest.emplace_back(id, slot);
      return oldest.size() < kRetainBatch;
    });
    const index::HeapItem* due = v->due_begin();
    for (uint64_t i = 0; i < std::min<uint64_t>(v->due_size(), 4 * kRetainBatch); ++i) {
      if (int64_t slot = v->find(due[i].id); slot >= 0) oldest.emplace_back(due[i].id, static_cast<uint32_t>(slot));
    }
    std::sort(oldest.begin(), oldest.end());
    if (oldest.size() > kRetainBatch) oldest.resize(kRetainBatch);
    std::vector<std::pair<uint32_t, uint64_t>> dropped;  // (count, id)
    for (auto [id, slot] : oldest) {
      const Entry& e = v->entry(slot);
      bool drop = max_bytes != 0 && bytes > max_bytes;
      if (!drop && by_age) {
        std::shared_ptr<storage::Segment> seg;
        auto r = log->read(Pos::unpack(e.loc), &seg);
        if (!r.ok()) break;  // a receive meets it and reports it (the index is rebuilt)
        drop = now.boot - queue::enqueue_key(idx, e.loc, r->t1, now) > max_age;
      }
      if (!drop) break;  // the rest are younger (ids follow the send order)
      bytes -= std::min<uint64_t>(bytes, e.len);
      dropped.emplace_back(e.count, id);
    }
    // One ACK flagged EXPIRED per delivery number, listing the messages (format.md, LIST).
    n_dropped += dropped.size();
    const Record proto{RecordType::kAck, 0, 0, 0, 0, {}, format::kFlagExpired, {}, k};
    for (const Record& r : listed_records(proto, std::move(dropped), payloads)) recs.push_back(r);
  }
  if (recs.empty()) return {};
  if (auto res = commit(recs, now); !res.ok()) return res.status();
  spool::log().warn("{}: retention limit dropped {} message(s) across {} view(s)", dir, n_dropped, held.size());
  return {};
}

auto Queue::Impl::log_leases(const std::vector<Message>& taken, const Clocks& now, uint64_t vis, uint64_t* end) -> Status {
  if (taken.empty()) return {};
  // One record per delivery number (LIST records: format::kFlagList), not one per message:
  // a batch of first deliveries is one LEASE, a 48-byte header and 16 bytes per run of ids
  // (its ACKs, by ack_batch, likewise).
  std::vector<std::pair<uint32_t, uint64_t>> counted;
  counted.reserve(taken.size());
  for (const auto& m : taken) counted.emplace_back(m.receive_count, m.id);
  std::deque<std::string> payloads;
  const std::vector<Record> recs = listed_records(lease_record(0, 0, now, vis, view_k), std::move(counted), payloads);
  auto res = commit(recs, now, nullptr, true);
  if (!res.ok()) return res.status();
  *end = res->end.pack();
  return {};
}

auto Queue::Impl::open_dead_letter_queue() -> Result<std::unique_ptr<Queue>> {
  QueueOptions o = cfg.opts;
  o.max_receives = 0;
  o.create = !read_only;
  o.mode = modes.data;  // shared as the queue is; the group comes with set-group-ID
  o.env = env;
  return open_queue(dir + "/dlq", o, true);
}

}  // namespace spool
