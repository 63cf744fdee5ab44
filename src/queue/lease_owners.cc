#include "queue/lease_owners.h"

#include <unistd.h>

#include "logging.h"
#include "sys/clock.h"
#include "sys/ofd_lock.h"

namespace spool::queue {

LeaseOwners::~LeaseOwners() {
  sys::forget_in_fork_child(&fd_);
  if (int fd = fd_.exchange(-1); fd >= 0) ::close(fd);
}

Status LeaseOwners::open_fd() {
  if (fd_.load() >= 0) return {};
  int fd = sys::open_state_file(dir_ + "/owners", modes_);
  if (fd < 0) return sys::queue_file_error(errno, "open", dir_ + "/owners");
  int none = -1;
  if (!fd_.compare_exchange_strong(none, fd)) {
    ::close(fd);
  } else if (!sys::close_in_fork_child(&fd_)) {
    spool::log().warn("{}: too many open queues to guard their liveness locks across fork()", dir_);
  }
  return {};
}

Status LeaseOwners::claim(index::SharedIndex& x, const Release& release) {
  if (slot_ >= 0) return {};
  if (Status s = open_fd(); !s.ok()) return s;
  auto& h = x.hdr();
  const int fd = fd_.load();
  uint32_t unclaimed_locked = 0;  // locked by something that is not a spool process
  for (uint32_t k = 0; k < index::kOwnerSlots; ++k) {
    if (h.registry.owner_claimed[k] != 0 && sys::ofd_held_elsewhere(fd, k)) continue;
    if (sys::ofd_trylock(fd, k) != 0) {
      unclaimed_locked += h.registry.owner_claimed[k] == 0;
      continue;
    }
    if (h.registry.owner_claimed[k] != 0) {
      release(std::span(&k, 1));
      free(x, std::span(&k, 1));
    }
    h.registry.owner_claimed[k] = 1;
    ++h.registry.owners_claimed;
    slot_ = static_cast<int>(k);
    pid_ = ::getpid();
    h.registry.owner_pid[k] = pid_;
    h.registry.owner_renew_ds[k] = 0;
    return {};
  }
  if (unclaimed_locked > 0) {
    // OFD locks name no process (/proc/locks shows pid -1), so none can be named here.
    return Status(Code::kQueueFull,
                  dir_ + ": no owner slot is free: " + std::to_string(unclaimed_locked) + " of the " +
                      std::to_string(index::kOwnerSlots) +
                      " are locked by processes that are not spool's (a reader who opened " + dir_ +
                      "/owners while its mode let others read it: end it; docs/security.md)");
  }
  return Status(Code::kQueueFull, dir_ + ": " + std::to_string(index::kOwnerSlots) +
                                      " processes already bind their leases; this one cannot");
}

uint8_t LeaseOwners::new_lease_tag(index::SharedIndex&) const {
  return bind_all_.load(std::memory_order_relaxed) && slot_ >= 0 ? static_cast<uint8_t>(slot_ + 1) : 0;
}

uint8_t LeaseOwners::tag(index::SharedIndex&) const { return slot_ >= 0 ? static_cast<uint8_t>(slot_ + 1) : 0; }

void LeaseOwners::free(index::SharedIndex& x, std::span<const uint32_t> ks) {
  auto& h = x.hdr();
  for (uint32_t k : ks) {
    if (h.registry.owner_claimed[k] == 0) continue;
    h.registry.owner_claimed[k] = 0;
    h.registry.owner_pid[k] = 0;
    h.registry.owner_renew_ds[k] = 0;
    if (h.registry.owners_claimed != 0) --h.registry.owners_claimed;
  }
}

std::vector<uint32_t> LeaseOwners::dead(index::SharedIndex& x, bool force, Env& env) {
  auto& h = x.hdr();
  std::vector<uint32_t> out;
  if (h.registry.owners_claimed == 0) return out;
  const uint64_t t = env.boot_ns();
  if (!force && t < h.disk.next_reap_ns) return out;
  h.disk.next_reap_ns = t + kReapIntervalNs;
  if (!open_fd().ok()) return out;
  const int fd = fd_.load();
  for (uint32_t k = 0; k < index::kOwnerSlots; ++k) {
    if (h.registry.owner_claimed[k] != 0 && static_cast<int>(k) != slot_ && !sys::ofd_held_elsewhere(fd, k)) {
      out.push_back(k);
    }
  }
  return out;
}

void LeaseOwners::mend(index::SharedIndex& x) {
  auto& h = x.hdr();
  uint32_t n = 0;
  for (uint32_t k = 0; k < index::kOwnerSlots; ++k) {
    if (h.registry.owner_claimed[k] != 0) {
      h.registry.owner_claimed[k] = 1;
      ++n;
    }
  }
  h.registry.owners_claimed = n;
}

bool LeaseOwners::claimed_here() const { return pid_ == ::getpid() && fd_.load() >= 0; }

int LeaseOwners::release_own(index::SharedIndex& x, const Release& release) {
  // pid_ is set with the slot: 0, or the parent's in a fork child, when this process
  // claimed none.
  if (!claimed_here() || slot_ < 0) return -1;
  uint32_t k = static_cast<uint32_t>(slot_);
  release(std::span(&k, 1));
  free(x, std::span(&k, 1));
  sys::ofd_unlock(fd_.load(), k);
  slot_ = -1;
  return static_cast<int>(k);
}

}  // namespace spool::queue
