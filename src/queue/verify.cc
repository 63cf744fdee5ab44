// verify: the queue's fsck. The log is the truth, so checking means replaying it into a
// private index and holding the shared one against it.
#include "queue/queue_impl.h"

namespace spool {

Result<VerifyReport> Queue::verify(bool repair, const Progress& progress) { return impl_->verify(repair, progress); }

Result<VerifyReport> Queue::Impl::verify(bool repair, const Progress& progress) {
  Impl& q = *this;
  VerifyReport rep;
  auto seqs = q.log->segments();
  if (!seqs.ok()) return seqs.status();
  rep.segments = seqs->size();
  // Progress: one step per segment checked, and a last one for the replay.
  for (size_t i = 0; i < seqs->size(); ++i) {
    if (progress) progress(i, seqs->size() + 1);
    uint64_t seq = (*seqs)[i];
    if (i > 0 && seq != (*seqs)[i - 1] + 1) {
      rep.problems.push_back("segments " + std::to_string((*seqs)[i - 1] + 1) + ".." +
                             std::to_string(seq - 1) + " are missing from " + q.log->dir());
    }
    auto seg = q.log->segment(seq);
    if (!seg.ok()) {
      rep.problems.push_back(seg.status().message());
      continue;
    }
    auto scan = storage::scan(**seg, format::kSegmentHeaderSize, [](const storage::RecordView&) {},
                              i + 1 < seqs->size());
    rep.records += scan.records;
    for (const auto& c : scan.corrupt) {
      rep.problems.push_back(q.log->segment_path(seq) + ": " + std::to_string(c.length) +
                             " corrupt bytes at offset " + std::to_string(c.offset));
    }
  }
  index::SharedIndex truth;
  if (Status s = truth.attach("", true, true); !s.ok()) return s;
  truth.assert_held();  // private (anonymous)
  SPOOL_LOCK_OR_RETURN(held, q, lock());
  if (const std::string& why = held->repaired(); !why.empty()) {
    // The lock found the index damaged and rebuilt it already (SharedIndex, "Damage").
    rep.problems.push_back("index: damaged (" + why + "); rebuilt from the log when verify took the lock");
    rep.repairs.push_back("rebuilt the shared index from the log: it was damaged (" + why + ")");
  }
  if (Status s = q.replay(truth); !s.ok()) return s;
  if (progress) progress(seqs->size() + 1, seqs->size() + 1);
  auto& t = truth.hdr();
  auto& h = q.idx.hdr();
  rep.messages = t.layout.count;

  size_t index_problems = 0;
  auto problem = [&](std::string p) {
    ++index_problems;
    if (index_problems <= 20) rep.problems.push_back("index: " + std::move(p));
  };
  if (std::string inv = q.idx.check_invariants(); !inv.empty()) problem("broken invariant " + inv);
  q.idx.for_each_entry([&](uint32_t, uint64_t id, const Entry& e) {
    truth.assert_held();  // private (above)
    int64_t ts = truth.find(id);
    if (ts < 0) {
      problem("message " + std::to_string(id) + " is not in the log (acked or never sent)");
      return;
    }
    const Entry& te = truth.entry(static_cast<uint32_t>(ts));
    if (te.count != e.count) {
      problem("message " + std::to_string(id) + " has receive count " + std::to_string(e.count) +
              ", the log says " + std::to_string(te.count));
    }
    // Queued or ready in the heap is placement, not state: a delayed message whose delay
    // has passed is queued in a replay.
    if ((te.state == State::kLeased) != (e.state == State::kLeased)) {
      problem("message " + std::to_string(id) + " has the wrong state");
    }
    std::shared_ptr<storage::Segment> keep;
    auto rec = q.log->read(Pos::unpack(e.loc), &keep);
    if (!rec.ok() || rec->id != id || rec->payload.size() != e.len) {
      problem("message " + std::to_string(id) + " points at a wrong or unreadable record");
    }
  });
  size_t unusable = 0;
  truth.for_each_entry([&](uint32_t, uint64_t id, const Entry& te) {
    q.idx.assert_held();  // (for_each_entry calls it under the hold above)
    if (q.idx.find(id) < 0) problem("message " + std::to_string(id) + " is in the log but not in the index");
    // A record whose checksum holds but whose message a receive cannot use as stored (a
    // forged extension): the receive dead-letters it (issue 48); say so before it does.
    std::shared_ptr<storage::Segment> keep;
    auto rec = q.log->read(Pos::unpack(te.loc), &keep);
    if (!rec.ok() || rec->ext.empty()) return;
    std::string why;
    if (auto ext = storage::decode_ext(rec->ext); !ext.ok()) {
      why = ext.status().message() + "; a receive dead-letters it as unreadable";
    } else {
      for (const auto& [k, v] : ext->attributes) {
        if (k.size() > format::kMaxAttrKey || v.size() > format::kMaxAttrValue) {
          why = "attribute '" + k.substr(0, format::kMaxAttrKey) + "' of " + std::to_string(v.size()) +
                " bytes is over the bounds a send accepts; a dead-lettering drops it";
          break;
        }
      }
    }
    if (!why.empty() && ++unusable <= 20) {
      rep.problems.push_back("log: message " + std::to_string(id) + " (" +
                             q.log->segment_path(Pos::unpack(te.loc).seq) + "): " + why);
    }
  });
  if (unusable > 20) rep.problems.push_back("log: ... and " + std::to_string(unusable - 20) + " more unusable messages");
  auto counter = [&](const char* name, uint64_t have, uint64_t want) {
    if (have != want) problem(std::string(name) + " is " + std::to_string(have) + ", a recount gives " + std::to_string(want));
  };
  counter("depth", h.layout.count, t.layout.count);
  counter("leased", h.layout.leased, t.layout.leased);
  counter("sent total", h.cache.sent_total, t.cache.sent_total);
  counter("acked total", h.cache.acked_total, t.cache.acked_total);
  counter("dead-lettered total", h.cache.dead_total, t.cache.dead_total);
  counter("expired total", h.cache.expired_total, t.cache.expired_total);
  counter("nacked total", h.cache.nacked_total, t.cache.nacked_total);
  counter("received total", h.cache.received_total, t.cache.received_total);
  counter("redelivered total", h.cache.redelivered_total, t.cache.redelivered_total);
  if (h.cache.next_id < t.cache.next_id) problem("next id " + std::to_string(h.cache.next_id) + " would reuse ids up to " + std::to_string(t.cache.next_id - 1));
  if (index_problems > 20) rep.problems.push_back("index: ... and " + std::to_string(index_problems - 20) + " more");

  if (repair && index_problems > 0) {
    if (Status s = q.rebuild(); !s.ok()) return s;
    rep.repairs.push_back("rebuilt the shared index from the log (" + std::to_string(index_problems) +
                          " disagreements)");
    // What is left are problems of the log itself, which the rebuilt index now reflects.
    std::erase_if(rep.problems, [](const std::string& p) { return p.starts_with("index: "); });
  }
  return rep;
}

}  // namespace spool
