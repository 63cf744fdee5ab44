// The store's side of lease owners (queue/lease_owners.h keeps the registry): the RELEASE
// records that give a dead (or closing) owner's leases back.
#include "queue/queue_impl.h"

namespace spool {

auto Queue::Impl::claim_owner_slot() -> Status {
  return owners.claim(idx, [this](std::span<const uint32_t> ks) REQUIRES(idx) { release_leases_of(ks); });
}

auto Queue::Impl::release_leases_of(std::span<const uint32_t> ks) -> void {
  bool mine[index::kOwnerSlots + 1] = {};
  for (uint32_t k : ks) mine[k + 1] = true;
  Clocks now = clocks();
  std::vector<Record> recs;
  // Every view's leases (a subscription's too: its entries carry their taker's owner tag),
  // each released by a RELEASE of its own view.
  auto release_in = [&](index::SharedIndex& v, uint16_t view) REQUIRES(idx) {
    v.assert_held();  // (every view is guarded by view 0's lock)
    std::vector<uint32_t> victims;
    v.for_each_entry([&](uint32_t s, uint64_t, Entry& e) {
      v.assert_held();  // (for_each_entry calls it under the caller's hold)
      if (e.owner == 0 || e.owner > index::kOwnerSlots || !mine[e.owner]) return;
      if (e.state == State::kLeased && v.key(s) > now.boot) {
        victims.push_back(s);
      } else {
        e.owner = 0;
      }
    });
    for (uint32_t s : victims) {
      Entry& e = v.entry(s);
      recs.push_back(Record{RecordType::kRelease, e.count, v.id_of(s), now.rt, now.rt, {}, 0, {}, view});
      e.owner = 0;
    }
  };
  release_in(idx, 0);
  for (uint16_t k : queue::active_views(idx)) {
    if (index::SharedIndex* v = view_index(k)) release_in(*v, k);
  }
  if (recs.empty()) return;
  // If it fails, the leases simply run out as usual.
  (void)commit(recs, now);
  spool::log().info("{}: released {} lease(s) of a process that is gone", dir, recs.size());
}

auto Queue::Impl::reap_dead_owners(bool force) -> void {
  if (read_only) return;
  std::vector<uint32_t> dead = owners.dead(idx, force, *env);
  if (dead.empty()) return;
  release_leases_of(dead);
  owners.free(idx, dead);
}

auto Queue::Impl::release_own_slot() -> void {
  if (!owners.claimed_here()) return;
  auto held = lock();
  if (!held.ok()) return;  // closing the owners descriptor lets go of the slot's liveness lock
  holds(*held);
  (void)owners.release_own(idx, [this](std::span<const uint32_t> ks) REQUIRES(idx) { release_leases_of(ks); });
}

}  // namespace spool
