// Queue::move_to(): messages from one queue into another, exactly once across a crash.
//
// Per batch: lease the messages here (bound to this process, so a kill returns them at
// once), send them to dst in one batch, each with a dedup id made of this queue's uid and
// the message's id, sync dst, then ack them here. A crash before the sync leaves them
// leased here (released at the death) and perhaps in dst: a rerun's send finds each one
// in dst's dedup window and sends nothing, then acks. A crash after the sync, before or
// among the acks, is the same. So every message ends in exactly one of the queues, as long
// as the rerun comes within dst's dedup window; the sync before the first ack makes it hold
// across a power cut too (an ack that reached the disk has its send there before it).
#include <cstdio>

#include "queue/queue_impl.h"

namespace spool {

namespace {

constexpr size_t kMoveBatch = 256;

// The dedup id of message `id` of the queue with uid `uid` in any destination.
std::string move_dedup_id(uint64_t uid, uint64_t id) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "spool.move:%016llx:%llu", static_cast<unsigned long long>(uid),
                static_cast<unsigned long long>(id));
  return buf;
}

}  // namespace

Result<Queue::MoveResult> Queue::move_to(Queue& dst, const MoveOptions& opts) { return impl_->move_to(dst, opts); }

Result<Queue::MoveResult> Queue::Impl::move_to(Queue& dst, const MoveOptions& opts) {
  if (Status s = whole_queue_only("move"); !s.ok()) return s;
  Impl& q = *this;
  if (Status s = q.writable(); !s.ok()) return s;
  if (Status s = dst.impl_->writable(); !s.ok()) return s;
  if (dst.impl_->cfg.uid == q.cfg.uid) {
    return Status(Code::kInvalidArgument, "move: " + q.dir + " and " + dst.dir() + " are the same queue");
  }
  if (Status s = bind_leases(); !s.ok()) return s;
  {
    // The leases of a move killed just before (a rerun finishes it) are released now, not at
    // the next reap within kReapIntervalNs: until then they are not ready, and a rerun whose
    // messages the dead move held all of ended having moved nothing (ops_test under ASan).
    SPOOL_LOCK_OR_RETURN(held, q, lock());
    q.reap_dead_owners(true);
  }
  const uint64_t vis = ms_to_ns(q.cfg.opts.visibility);
  MoveResult res;

  // Moves `batch` (received here): sent to dst, dst synced, then acked here.
  auto move_batch = [&](std::vector<Message>& batch) -> Status {
    if (batch.empty()) return {};
    std::vector<SendItem> items;
    std::vector<std::string> payloads;  // (SendItem holds a view)
    items.reserve(batch.size());
    for (Message& m : batch) {
      Attributes a = m.attributes;
      add_within_bounds(a, {{"spool.moved.from", q.dir}, {"spool.moved.original_id", std::to_string(m.id)}});
      items.push_back(SendItem{m.payload, std::move(a), move_dedup_id(q.cfg.uid, m.id), m.priority, m.group});
    }
    std::vector<bool> dup;
    auto sent = dst.send_batch(std::span<const SendItem>(items), SendOptions{}, &dup);
    if (!sent.ok()) return Status(sent.status().code(), "move: sending to " + dst.dir() + ": " + sent.status().message());
    q.env->crashpoint("move.after_send");
    if (Status s = dst.sync(); !s.ok()) return s;
    q.env->crashpoint("move.after_sync");
    for (size_t i = 0; i < batch.size(); ++i) {
      if (Status s = change(batch[i].receipt, Change::kAck, 0); !s.ok()) {
        return Status(s.code(), "move: message " + std::to_string(batch[i].id) + " is in " + dst.dir() +
                                    " but could not be acked in " + q.dir + " (a rerun acks it): " + s.message());
      }
      ++res.moved;
      if (dup[i]) ++res.already;
    }
    batch.clear();
    return {};
  };

  std::vector<Message> batch;
  // Takes message `id` into the batch; false (and counted missing, with `note`) if it is
  // not here or not ready.
  auto take = [&](uint64_t id, bool note) -> Result<bool> {
    auto m = q.receive_one(id, vis, true);
    if (!m.ok()) {
      if (m.status().code() != Code::kNotFound && m.status().code() != Code::kEmpty) return m.status();
      if (note) res.missing.push_back(id);
      return false;
    }
    batch.push_back(std::move(*m));
    return true;
  };

  if (!opts.ids.empty()) {
    for (uint64_t id : opts.ids) {
      if (res.moved + batch.size() >= opts.max) break;
      auto t = take(id, true);
      if (!t.ok()) return t.status();
      if (batch.size() >= kMoveBatch) {
        if (Status s = move_batch(batch); !s.ok()) return s;
      }
    }
    if (Status s = move_batch(batch); !s.ok()) return s;
    return res;
  }
  // The messages sent before the move began: with a producer still sending, a move ends.
  auto at_start = stats();
  if (!at_start.ok()) return at_start.status();
  const uint64_t below = at_start->next_id;
  while (res.moved < opts.max) {
    auto ready = list(std::min<uint64_t>(kMoveBatch, opts.max - res.moved), StateFilter::only(MessageState::kReady), 0);
    if (!ready.ok()) return ready.status();
    std::erase_if(*ready, [&](const MessageInfo& m) { return m.id >= below; });
    if (ready->empty()) break;
    for (const MessageInfo& info : *ready) {
      auto t = take(info.id, false);  // another receiver may have taken it since
      if (!t.ok()) return t.status();
    }
    if (batch.empty()) break;  // every one was taken by others: what is left is theirs
    if (Status s = move_batch(batch); !s.ok()) return s;
  }
  return res;
}

}  // namespace spool
