// Subscriptions (issue 46; docs/format.md, "Views"): the indexes of views 1..16, one file
// each (DIR/subs/K.index), guarded by view 0's lock; adding and removing subscriptions (SUB
// records, applied by apply_record() like every other record).
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "queue/queue_impl.h"

namespace spool {
namespace {

// kInvalidArgument naming what is wrong with subscription name `name`; ok if it is valid.
Status check_subscription_name(std::string_view name) {
  auto bad = [&](const std::string& why) {
    return Status(Code::kInvalidArgument, "subscription name '" + std::string(name) + "': " + why);
  };
  if (name.empty() || name.size() > format::kMaxSubscriptionName) {
    return bad("must be 1 to " + std::to_string(format::kMaxSubscriptionName) + " bytes");
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) return bad("only letters, digits, '.', '_' and '-' are allowed");
  }
  if (name == "default") return bad("'default' is the name of the queue's own view");
  return {};
}

std::string_view name_of(const index::Subscription& s) {
  return {s.name, std::min<size_t>(s.name_len, index::kSubscriptionName)};
}

}  // namespace

auto Queue::Impl::held_views() -> std::vector<std::pair<uint16_t, index::SharedIndex*>> {
  std::vector<std::pair<uint16_t, index::SharedIndex*>> out{{0, &idx}};
  for (uint16_t k : queue::active_views(idx)) {
    if (index::SharedIndex* v = view_index(k)) out.emplace_back(k, v);
  }
  return out;
}

auto Queue::Impl::view_index(uint16_t k) -> index::SharedIndex* {
  // Called by apply_record() (through view_fn) and by this file's calls, all of which hold
  // view 0's lock, which guards every view: the analysis cannot follow the std::function.
  idx.assert_held();
  if (k == 0 || k > index::kSubscriptions) return nullptr;
  std::unique_ptr<index::SharedIndex>& v = views[k];
  if (v != nullptr) {
    if (!v->refresh().ok()) {
      idx.damaged("subscription " + std::to_string(k) + "'s index cannot be mapped");
      return nullptr;
    }
    return v.get();
  }
  v = std::make_unique<index::SharedIndex>();
  if (read_only) {
    if (!v->attach("", true, true).ok()) v.reset();
    return v.get();
  }
  const std::string subs = dir + "/subs";
  const std::string path = subs + "/" + std::to_string(k) + ".index";
  if (v->attach(path, false, false, modes.state, io).ok() && v->refresh().ok()) return v.get();
  // Missing, or not this build's and boot's: made afresh, empty. While the view is active
  // its state is then lost from the index (not from the log): a rebuild of every view
  // fills it again, unless this is that rebuild, or the SUB add that empties it anyway.
  v = std::make_unique<index::SharedIndex>();
  if (::mkdir(subs.c_str(), 0777) != 0 && errno != EEXIST) {
    idx.damaged("cannot make " + subs + ": " + std::strerror(errno));
    v.reset();
    return nullptr;
  }
  if (Status s = v->attach(path, true, false, modes.state, io); !s.ok()) {
    idx.damaged("subscription " + std::to_string(k) + "'s index: " + s.message());
    v.reset();
    return nullptr;
  }
  if (!replaying && idx.hdr().cache.subs[k - 1].active != 0) {
    idx.damaged("subscription " + std::to_string(k) + "'s index was missing or unsound");
  }
  return v.get();
}

auto Queue::Impl::views_sound() -> std::string {
  idx.assert_held();  // the first opener: nobody else is attached
  for (uint16_t k : queue::active_views(idx)) {
    index::SharedIndex* v = view_index(k);
    if (v == nullptr || !idx.damage().empty()) return "subscription " + std::to_string(k) + "'s index is missing";
    v->assert_held();
    if (std::string bad = v->check_invariants(); !bad.empty()) return "subscription " + std::to_string(k) + "'s index: " + bad;
    if (v->hdr().cache.next_id != idx.hdr().cache.next_id) {
      return "subscription " + std::to_string(k) + "'s index is behind the queue's";
    }
  }
  return "";
}

auto Queue::Impl::use_subscription(std::string_view name) -> Status {
  SPOOL_LOCK_OR_RETURN(held, *this, lock());
  const auto& subs = idx.hdr().cache.subs;
  for (uint16_t k = 1; k <= index::kSubscriptions; ++k) {
    if (subs[k - 1].active != 0 && name_of(subs[k - 1]) == name) {
      view_k = k;
      view_name = std::string(name);
      return here().status();
    }
  }
  return Status(Code::kNotFound, dir + ": no subscription '" + std::string(name) + "'");
}

auto Queue::Impl::view_named(std::string_view name) -> Result<uint16_t> {
  if (name.empty()) return uint16_t{0};
  const auto& subs = idx.hdr().cache.subs;
  for (uint16_t k = 1; k <= index::kSubscriptions; ++k) {
    if (subs[k - 1].active != 0 && name_of(subs[k - 1]) == name) return k;
  }
  return Status(Code::kNotFound, dir + ": no subscription '" + std::string(name) + "'");
}

auto Queue::Impl::here() -> Result<index::SharedIndex*> {
  if (view_k == 0) return &idx;
  const index::Subscription& s = idx.hdr().cache.subs[view_k - 1];
  if (s.active == 0 || name_of(s) != view_name) {
    return Status(Code::kNotFound, dir + ": subscription '" + view_name + "' was removed");
  }
  index::SharedIndex* v = view_index(view_k);
  if (v == nullptr) return Status(Code::kIo, dir + ": cannot map subscription '" + view_name + "''s index");
  return v;
}

auto Queue::Impl::whole_queue_only(const char* what) const -> Status {
  if (view_k == 0) return {};
  return Status(Code::kInvalidArgument, std::string(what) + " on a subscription's handle ('" + view_name +
                                            "') is not supported yet; open the queue without one");
}

auto Queue::Impl::max_receives_here() -> uint32_t {
  if (view_k != 0 && idx.hdr().cache.subs[view_k - 1].max_receives != 0) return idx.hdr().cache.subs[view_k - 1].max_receives;
  return cfg.opts.max_receives;
}

auto Queue::Impl::add_subscription(std::string_view name, bool from_start, uint32_t max_receives) -> Status {
  Impl& q = *this;
  if (Status s = check_subscription_name(name); !s.ok()) return s;
  if (Status s = q.writable(); !s.ok()) return s;
  uint64_t end;
  {
    SPOOL_LOCK_OR_RETURN(held, q, lock_to_change());
    auto& subs = q.idx.hdr().cache.subs;
    uint16_t free = 0;
    for (uint16_t k = 1; k <= index::kSubscriptions; ++k) {
      if (subs[k - 1].active == 0) {
        if (free == 0) free = k;
      } else if (name_of(subs[k - 1]) == name) {
        return Status(Code::kInvalidArgument, q.dir + ": subscription '" + std::string(name) + "' exists already");
      }
    }
    if (free == 0) {
      return Status(Code::kInvalidArgument, q.dir + ": a queue has at most " + std::to_string(index::kSubscriptions) +
                                                " subscriptions; remove one first");
    }
    if (q.view_index(free) == nullptr) {
      return Status(Code::kIo, q.dir + ": cannot make the index of subscription '" + std::string(name) + "'");
    }
    const Clocks now = q.clocks();
    // (t1: its own max_receives, 0 for the queue's; restated with it at every segment's start)
    Record rec{RecordType::kSub, 1, from_start ? 0 : q.idx.hdr().cache.next_id, max_receives, 0, name, 0, {}, free};
    auto res = q.commit(std::span(&rec, 1), now);
    if (!res.ok()) return res.status();
    end = res->end.pack();
  }
  return q.written(end, Durability::kSync);
}

auto Queue::Impl::remove_subscription(std::string_view name) -> Status {
  Impl& q = *this;
  if (Status s = q.writable(); !s.ok()) return s;
  uint64_t end;
  {
    SPOOL_LOCK_OR_RETURN(held, q, lock_to_change());
    const auto& subs = q.idx.hdr().cache.subs;
    uint16_t found = 0;
    for (uint16_t k = 1; k <= index::kSubscriptions && found == 0; ++k) {
      if (subs[k - 1].active != 0 && name_of(subs[k - 1]) == name) found = k;
    }
    if (found == 0) return Status(Code::kNotFound, q.dir + ": no subscription '" + std::string(name) + "'");
    (void)q.view_index(found);  // (emptied by the record, where it is attached)
    const Clocks now = q.clocks();
    Record rec{RecordType::kSub, 0, 0, 0, 0, name, 0, {}, found};
    auto res = q.commit(std::span(&rec, 1), now);
    if (!res.ok()) return res.status();
    end = res->end.pack();
  }
  return q.written(end, Durability::kSync);
}

auto Queue::Impl::subscriptions() -> Result<std::vector<SubscriptionInfo>> {
  Impl& q = *this;
  SPOOL_LOCK_OR_RETURN(held, q, lock());
  std::vector<SubscriptionInfo> out;
  for (uint16_t k = 1; k <= index::kSubscriptions; ++k) {
    const index::Subscription& s = q.idx.hdr().cache.subs[k - 1];
    if (s.active == 0) continue;
    SubscriptionInfo info;
    info.name = std::string(name_of(s));
    info.from = s.from;
    info.max_receives = s.max_receives;
    if (index::SharedIndex* v = q.view_index(k)) {
      info.messages = v->hdr().layout.count;
      info.leased = v->hdr().layout.leased;
      info.expired_total = v->hdr().cache.expired_total;
      info.held_back_bytes = q.held_back(k);
    }
    out.push_back(std::move(info));
  }
  return out;
}

auto Queue::Impl::held_back(uint16_t k) -> uint64_t {
  const std::vector<uint16_t> subs = queue::active_views(idx);
  if (subs.empty()) return 0;
  // The lowest segment a view's records sit in (not that of its lowest id: compaction moves
  // old messages to the log's head).
  auto oldest_seq = [](index::SharedIndex& v) {
    uint64_t seq = UINT64_MAX;
    v.for_each_entry([&](uint32_t, uint64_t, const Entry& e) { seq = std::min(seq, Pos::unpack(e.loc).seq); });
    return seq;
  };
  uint64_t mine = UINT64_MAX;
  uint64_t others = Pos::unpack(idx.hdr().cache.log_end).seq;
  auto side = [&](uint16_t j) -> uint64_t& { return j == k ? mine : others; };
  side(0) = std::min(side(0), oldest_seq(idx));
  for (uint16_t j : subs) {
    if (index::SharedIndex* v = view_index(j)) side(j) = std::min(side(j), oldest_seq(*v));
  }
  if (mine >= others) return 0;
  auto seqs = log->segments();
  if (!seqs.ok()) return 0;
  uint64_t bytes = 0;
  for (uint64_t s : *seqs) {
    struct stat sb {};
    if (s >= mine && s < others && ::stat(log->segment_path(s).c_str(), &sb) == 0) {
      bytes += static_cast<uint64_t>(sb.st_blocks) * 512;
    }
  }
  return bytes;
}

Status Queue::add_subscription(std::string_view name, bool from_start) { return impl_->add_subscription(name, from_start, 0); }
Status Queue::add_subscription(std::string_view name, bool from_start, uint32_t max_receives) {
  return impl_->add_subscription(name, from_start, max_receives);
}
Status Queue::remove_subscription(std::string_view name) { return impl_->remove_subscription(name); }
Result<std::vector<SubscriptionInfo>> Queue::subscriptions() { return impl_->subscriptions(); }

}  // namespace spool
