// Lease owners: instant release of a dead process's leases. A Queue that binds its leases
// claims an owner slot whose liveness is an OFD lock on a byte of `owners`; a slot whose
// lock is free belongs to a dead process, and its leases are released.
#include "queue/queue_impl.h"

namespace spool {

auto Queue::Impl::open_owners() -> Status {
  if (owners_fd.load() >= 0) return {};
  int fd = sys::open_state_file(dir + "/owners", modes);
  if (fd < 0) return sys::queue_file_error(errno, "open", dir + "/owners");
  int none = -1;
  if (!owners_fd.compare_exchange_strong(none, fd)) {
    ::close(fd);
  } else if (!sys::close_in_fork_child(&owners_fd)) {
    spool::log().warn("spool: {}: too many open queues to guard their liveness locks across fork()", dir);
  }
  return {};
}

auto Queue::Impl::claim_owner_slot() -> Status {
  if (owner_slot >= 0) return {};
  if (Status s = open_owners(); !s.ok()) return s;
  auto& h = idx.hdr();
  int fd = owners_fd.load();
  uint32_t unclaimed_locked = 0;  // locked by something that is not a spool process
  for (uint32_t k = 0; k < index::kOwnerSlots; ++k) {
    if (h.owner_claimed[k] != 0 && sys::ofd_held_elsewhere(fd, k)) continue;
    if (sys::ofd_trylock(fd, k) != 0) {
      unclaimed_locked += h.owner_claimed[k] == 0;
      continue;
    }
    if (h.owner_claimed[k] != 0) release_owned(std::span(&k, 1));
    h.owner_claimed[k] = 1;
    ++h.owners_claimed;
    owner_slot = static_cast<int>(k);
    owner_pid = ::getpid();
    h.owner_pid[k] = owner_pid;
    return {};
  }
  if (unclaimed_locked > 0) {
    // OFD locks name no process (/proc/locks shows pid -1), so none can be named here.
    return Status(Code::kQueueFull,
                  dir + ": no owner slot is free: " + std::to_string(unclaimed_locked) + " of the " +
                      std::to_string(index::kOwnerSlots) +
                      " are locked by processes that are not spool's (a reader who opened " + dir +
                      "/owners while its mode let others read it: end it; docs/security.md)");
  }
  return Status(Code::kQueueFull, dir + ": " + std::to_string(index::kOwnerSlots) +
                                      " processes already bind their leases; this one cannot");
}

auto Queue::Impl::release_owned(std::span<const uint32_t> ks) -> void {
  auto& h = idx.hdr();
  bool mine[index::kOwnerSlots + 1] = {};
  for (uint32_t k : ks) mine[k + 1] = true;
  Clocks now = clocks();
  std::vector<uint32_t> victims;
  idx.for_each_entry([&](uint32_t s, uint64_t, Entry& e) {
    if (e.owner == 0 || e.owner > index::kOwnerSlots || !mine[e.owner]) return;
    if (e.state == State::kLeased && idx.key(s) > now.boot) {
      victims.push_back(s);
    } else {
      e.owner = 0;
    }
  });
  if (!victims.empty()) {
    std::vector<Record> recs;
    for (uint32_t s : victims) {
      const Entry& e = idx.entry(s);
      recs.push_back(Record{RecordType::kRelease, e.count, idx.id_of(s), now.rt, now.rt, {}});
    }
    for (uint32_t s : victims) idx.entry(s).owner = 0;
    // If it fails, the leases simply run out as usual.
    (void)commit(recs, now);
    spool::log().info("spool: {}: released {} lease(s) of a process that is gone", dir, victims.size());
  }
  for (uint32_t k : ks) {
    if (h.owner_claimed[k] == 0) continue;
    h.owner_claimed[k] = 0;
    h.owner_pid[k] = 0;
    --h.owners_claimed;
  }
}

auto Queue::Impl::reap_dead_owners() -> void {
  auto& h = idx.hdr();
  if (h.owners_claimed == 0 || read_only) return;
  uint64_t t = sys::boot_ns();
  if (t < h.next_reap_ns) return;
  h.next_reap_ns = t + kReapIntervalNs;
  if (!open_owners().ok()) return;
  int fd = owners_fd.load();
  std::vector<uint32_t> dead;
  for (uint32_t k = 0; k < index::kOwnerSlots; ++k) {
    if (h.owner_claimed[k] != 0 && static_cast<int>(k) != owner_slot && !sys::ofd_held_elsewhere(fd, k)) {
      dead.push_back(k);
    }
  }
  if (!dead.empty()) release_owned(dead);
}

auto Queue::Impl::release_own_slot() -> void {
  // owner_pid is set with the slot: 0, or the parent's in a fork child, when this process
  // claimed none.
  if (owner_pid != ::getpid() || owners_fd.load() < 0) return;
  auto held = lock();
  if (!held.ok()) return;  // closing owners_fd (~Impl) lets go of the slot's liveness lock
  holds(*held);
  if (owner_slot < 0) return;
  uint32_t k = static_cast<uint32_t>(owner_slot);
  release_owned(std::span(&k, 1));
  sys::ofd_unlock(owners_fd.load(), k);
  owner_slot = -1;
}

}  // namespace spool
