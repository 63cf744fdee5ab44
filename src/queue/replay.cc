// Replay after ack (docs/semantics.md, "Replay after ack"): sends the messages acked within a time
// window again, as new messages, from what the log still holds. Per view: the acks of the
// handle's view (ACK records carry it), sent back for that view only (kFlagOneView).
//
// The log is read, not the index (a cache that forgets a message at its ack): one pass
// finds the ACK records in the window, a second the MSG record of each (the original or a
// compaction copy: same payload and attributes). An ACK record stores no time (format 2:
// its t1 and t2 are 0), so its time is taken as the latest time of the records before it
// in the log, converted as every record time is (docs/format.md, "Time"): the receive or
// extension that leased the message at the latest, a later send or receive of any message
// when there is traffic. The kept-acked buckets of the index take an ACK's time the same
// way when they are rebuilt from the log, so compaction keeps what this finds.
//
// Neither pass holds the index lock: records below the log end read at the start are
// whole and never change, and a segment compaction removes meanwhile is only missed (its
// records are older than the copies and checkpoint that follow).
#include <unordered_map>

#include "queue/queue_impl.h"

namespace spool {
namespace {

constexpr size_t kReplayBatch = 256;                 // messages per send_batch
constexpr uint64_t kReplayBatchBytes = 16ull << 20;  // and at most this much payload

struct Acked {
  uint64_t id;
  uint64_t wall;     // the ack's time, wall clock ns as of now
  Pos msg{};         // its MSG record; seq 0: not found
};

}  // namespace

Result<ReplayResult> Queue::replay(const ReplayOptions& o) { return impl_->replay(*this, o); }

Result<ReplayResult> Queue::Impl::replay(Queue& self, const ReplayOptions& o) {
  Impl& q = *this;
  if (o.since.count() <= 0 || o.until.count() < 0 || o.until >= o.since) {
    return Status(Code::kInvalidArgument, "replay: the window must have since > until >= 0 (since " +
                                              std::to_string(o.since.count()) + " ms, until " +
                                              std::to_string(o.until.count()) + " ms)");
  }
  std::unique_ptr<Queue> other;
  Queue* target = &self;  // (the facade: replay sends through the public API)
  if (!o.to.empty()) {
    QueueOptions qo;
    qo.create = false;
    auto t = Queue::open(o.to, qo);
    if (!t.ok()) return Status(t.status().code(), "replay to " + o.to + ": " + t.status().message());
    other = std::move(*t);
    target = other.get();
  } else if (Status s = q.writable(); !s.ok()) {
    return s;
  }

  Pos end;
  Clocks now;
  {
    SPOOL_LOCK_OR_RETURN(held, q, lock());
    end = Pos::unpack(__atomic_load_n(&q.idx.hdr().cache.log_end, __ATOMIC_ACQUIRE));
    now = queue::read_clocks(q.idx.hdr(), *q.env);
  }
  const uint64_t since_ns = ms_to_ns(o.since), until_ns = ms_to_ns(o.until);
  const uint64_t lo = now.real() - std::min(now.real(), since_ns);
  const uint64_t hi = now.real() - std::min(now.real(), until_ns);

  auto seqs = q.log->segments();
  if (!seqs.ok()) return seqs.status();
  // Each pass visits the records below `end`, in log order.
  auto each_record = [&](uint64_t through_seq, const std::function<void(Pos, const storage::RecordView&)>& f) {
    for (uint64_t seq : *seqs) {
      if (seq > through_seq || seq > end.seq) break;
      auto seg = q.log->segment(seq);
      if (!seg.ok()) continue;  // compaction removed it since the listing
      if (seq != end.seq) {
        (void)storage::scan(**seg, format::kSegmentHeaderSize,
                            [&](const storage::RecordView& r) { f(Pos{seq, r.offset}, r); });
        continue;
      }
      // The active segment only up to the end read above: past it other processes are
      // appending, and nothing there may be read.
      for (uint64_t off = format::kSegmentHeaderSize; off < end.off;) {
        auto r = (*seg)->record_at(off);
        if (!r) {
          off = (*seg)->resync(off + format::kRecordAlign);  // damage: the next valid record
          continue;
        }
        if (off + r->size > end.off) break;
        f(Pos{seq, off}, *r);
        off += r->size;
      }
    }
  };

  // 1. The consumer acks in the window, in log order.
  auto anchors = std::make_unique<index::IndexHeader>();  // the ReplayClock's private anchors
  queue::ReplayClock clock(*anchors, now);
  uint64_t latest = 0, last_ack_seq = 0;
  std::vector<Acked> acks;
  std::unordered_map<uint64_t, size_t> want;  // id -> its entry in `acks`
  each_record(UINT64_MAX, [&](Pos pos, const storage::RecordView& r) {
    if (r.type == RecordType::kClock) {
      queue::note_anchor(*anchors, pos.pack(), r);
      clock.clock_record(r);
    }
    latest = std::max(latest, clock.written_wall(pos.pack(), r));
    if (r.type != RecordType::kAck || r.view != q.view_k) return;  // this handle's view's acks
    if ((r.flags & (format::kFlagExpired | format::kFlagDeleted)) != 0) return;  // not a consumer's ack
    if (latest < lo || latest > hi) return;
    auto acked = [&](uint64_t id) {
      if (acks.size() >= o.max || want.contains(id)) return;
      want.emplace(id, acks.size());
      acks.push_back(Acked{id, latest});
      last_ack_seq = pos.seq;
    };
    if ((r.flags & format::kFlagList) == 0) {
      acked(r.id);
      return;
    }
    storage::for_each_listed(r.payload, acked);  // an ack_batch's
  });
  ReplayResult res;
  if (acks.empty()) return res;

  // 2. Their MSG records: before the ACK in the log, so in no later segment.
  each_record(last_ack_seq, [&](Pos pos, const storage::RecordView& r) {
    if (r.type != RecordType::kMsg) return;
    auto it = want.find(r.id);
    if (it != want.end() && acks[it->second].msg.seq == 0) acks[it->second].msg = pos;
  });

  // 3. Send them again, in batches, in the order of their acks.
  std::vector<SendItem> items;
  std::vector<std::shared_ptr<storage::Segment>> keep;
  uint64_t batch_bytes = 0;
  auto flush = [&]() -> Status {
    if (items.empty()) return {};
    // Into this queue: for the view the acks were of only (the queue's own while it has
    // subscriptions, or this handle's subscription); into another: as any send.
    auto ids = other ? target->send_batch(std::span<const SendItem>(items))
                     : q.send_items(std::span<const SendItem>(items), SendOptions{}, nullptr, std::string_view(q.view_name));
    if (!ids.ok()) {
      return Status(ids.status().code(), "replay: sending " + std::to_string(items.size()) + " messages after " +
                                             std::to_string(res.replayed) + ": " + ids.status().message());
    }
    res.ids.insert(res.ids.end(), ids->begin(), ids->end());
    res.replayed += ids->size();
    items.clear();
    keep.clear();
    batch_bytes = 0;
    return {};
  };
  for (const Acked& a : acks) {
    if (a.msg.seq == 0) {
      ++res.missing;
      continue;
    }
    std::shared_ptr<storage::Segment> seg;
    auto r = q.log->read(a.msg, &seg);
    Result<storage::MessageExt> ext = storage::MessageExt{};
    if (r.ok() && !r->ext.empty()) ext = storage::decode_ext(r->ext);
    if (!r.ok() || !ext.ok()) {
      spool::log().warn("{}: replay: message {} cannot be read: {}", q.dir, a.id,
                        (r.ok() ? ext.status() : r.status()).message());
      ++res.missing;
      continue;
    }
    SendItem item{r->payload, Attributes(ext->attributes.begin(), ext->attributes.end())};
    item.priority = ext->priority;  // a replay is the message again, urgency and group included
    item.group = ext->group;
    std::erase_if(item.attributes, [](const auto& kv) { return kv.first.starts_with("spool.replay."); });
    const auto acked_at = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::nanoseconds(a.wall)));
    add_within_bounds(item.attributes, {{"spool.replay.original_id", std::to_string(a.id)},
                                        {"spool.replay.acked_at", sys::iso_time(acked_at)}});
    if (!items.empty() && (items.size() >= kReplayBatch || batch_bytes + r->payload.size() > kReplayBatchBytes)) {
      if (Status s = flush(); !s.ok()) return s;
    }
    batch_bytes += r->payload.size();
    items.push_back(std::move(item));
    keep.push_back(std::move(seg));
  }
  if (Status s = flush(); !s.ok()) return s;
  spool::log().info("{}: replay sent {} acked messages again{}{} ({} no longer in the log)", q.dir,
                    res.replayed, o.to.empty() ? "" : " to ", o.to, res.missing);
  return res;
}

}  // namespace spool
