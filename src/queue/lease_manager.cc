// LeaseManager: one timer thread renewing many leases, earliest due first.
//
// Each lease that still renews has one item in `due` (time, lease), ordered by time; the
// timer sleeps on a condition variable until the first item is due (or a lease due earlier
// is added, or the manager stops), takes that one lease, marks it `renewing`, and extends
// it with the lock released, so that status() and add() never wait for the Queue. Leaving
// the lock for each extend keeps a waiting ack short: forget() waits for a renewal of its
// lease in progress, because an extend that lands after a nack would lease the message
// again (Queue::extend renews any lease whose receipt is current).
#include "spool/lease_manager.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace spool {

namespace {

std::string ms_text(LeaseManager::Clock::duration d) {
  return std::to_string(std::chrono::duration_cast<Millis>(d).count()) + " ms";
}

Status check_options(const LeaseManager::Options& o) {
  auto bad = [](std::string what) { return Status(Code::kInvalidArgument, "LeaseManager: " + what); };
  if (o.extend_by.count() <= 0) return bad("extend_by must be > 0 (is " + ms_text(o.extend_by) + ")");
  if (o.margin.count() < 0 || o.margin >= o.extend_by) {
    return bad("margin must be at least 0 and below extend_by (margin " + ms_text(o.margin) + ", extend_by " +
               ms_text(o.extend_by) + ")");
  }
  if (o.min_remaining.count() < 0) return bad("min_remaining must be >= 0 (is " + ms_text(o.min_remaining) + ")");
  if (o.max_lifetime.count() < 0) return bad("max_lifetime must be >= 0 (is " + ms_text(o.max_lifetime) + ")");
  return {};
}

}  // namespace

struct LeaseManager::Impl {
  struct Lease {
    std::string receipt;
    LeaseInfo info;
    Clock::time_point next;     // when the timer looks at it next (its item in `due`)
    Clock::time_point give_up;  // added + max_lifetime
    bool renewing = false;      // the timer is extending it, without the lock
  };

  Impl(Queue& q, Options o) : queue(q), opts(std::move(o)) {}

  // Puts `l` in the schedule: renewed `margin` before its lease ends, or looked at when it
  // gives up, whichever comes first.
  void schedule(Lease& l) {
    l.next = std::min(l.info.lease_end - opts.margin, l.give_up);
    due.emplace(l.next, &l);
  }

  // Removes `receipt` once no renewal of it is in progress; false if it is not known.
  bool forget(std::string_view receipt) {
    std::unique_lock lock(mu);
    auto it = leases.find(receipt);
    if (it == leases.end()) return false;
    renewed.wait(lock, [&] { return !it->second.renewing; });
    if (it->second.info.state == LeaseState::kRenewing) due.erase({it->second.next, &it->second});
    leases.erase(it);
    return true;
  }

  void run() {
    std::unique_lock lock(mu);
    while (!stopping) {
      if (due.empty()) {
        wake.wait(lock);
        continue;
      }
      const auto [when, lease] = *due.begin();
      if (Clock::now() < when) {
        wake.wait_until(lock, when);
        continue;  // stopped, or an earlier lease came, or it is due now: look again
      }
      due.erase(due.begin());
      Lease& l = *lease;
      if (Clock::now() >= l.give_up) {
        stopped(lock, l, LeaseState::kExpired, {});
        continue;
      }
      l.renewing = true;
      const std::string receipt = l.receipt;
      lock.unlock();
      const auto before = Clock::now();
      Status s = queue.extend(receipt, opts.extend_by);
      lock.lock();
      // forget() waits while `renewing`, so the lease is still there.
      l.renewing = false;
      if (s.ok()) {
        l.info.lease_end = before + opts.extend_by;
        ++l.info.renewals;
        schedule(l);
        renewed.notify_all();
      } else {
        stopped(lock, l, LeaseState::kLost, std::move(s));
      }
    }
  }

  // `l` renews no more: records why, and tells on_stop (without the lock).
  void stopped(std::unique_lock<std::mutex>& lock, Lease& l, LeaseState state, Status error) {
    l.info.state = state;
    l.info.error = std::move(error);
    renewed.notify_all();
    if (!opts.on_stop) return;
    const std::string receipt = l.receipt;
    const LeaseInfo info = l.info;
    lock.unlock();
    opts.on_stop(receipt, info);
    lock.lock();
  }

  Queue& queue;
  const Options opts;
  std::mutex mu;
  std::condition_variable wake;     // the timer: stop, or a lease due earlier than the first
  std::condition_variable renewed;  // forget(): a renewal finished
  bool stopping = false;
  std::map<std::string, Lease, std::less<>> leases;  // node-based: `due` points into it
  std::set<std::pair<Clock::time_point, Lease*>> due;  // the leases still renewed
  std::thread thread;
};

Result<std::unique_ptr<LeaseManager>> LeaseManager::start(Queue& queue, Options opts) {
  if (Status s = check_options(opts); !s.ok()) return s;
  auto impl = std::make_unique<Impl>(queue, std::move(opts));
  Impl* p = impl.get();
  std::unique_ptr<LeaseManager> m(new LeaseManager(std::move(impl)));
  p->thread = std::thread([p] { p->run(); });
  return m;
}

LeaseManager::LeaseManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

LeaseManager::~LeaseManager() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

Status LeaseManager::add(std::string receipt, Clock::time_point lease_end) {
  Impl& m = *impl_;
  const auto now = Clock::now();
  if (lease_end - now < m.opts.min_remaining) {
    return Status(Code::kInvalidArgument, "LeaseManager::add: lease " + receipt + " has " +
                                              ms_text(lease_end - now) + " left, less than min_remaining (" +
                                              ms_text(m.opts.min_remaining) + ")");
  }
  {
    std::lock_guard lock(m.mu);
    if (m.leases.contains(receipt)) {
      return Status(Code::kInvalidArgument, "LeaseManager::add: lease " + receipt + " was added already");
    }
  }
  if (m.opts.bind) {
    Status s = m.queue.bind(receipt);
    if (!s.ok() && s.code() != Code::kQueueFull) return s;
  }
  std::lock_guard lock(m.mu);
  auto [it, fresh] = m.leases.try_emplace(receipt);
  if (!fresh) return Status(Code::kInvalidArgument, "LeaseManager::add: lease " + receipt + " was added already");
  Impl::Lease& l = it->second;
  l.receipt = std::move(receipt);
  l.info.lease_end = lease_end;
  l.give_up = now + m.opts.max_lifetime;
  m.schedule(l);
  if (m.due.begin()->second == &l) m.wake.notify_all();
  return {};
}

Status LeaseManager::ack(std::string_view receipt, Durability durability) {
  impl_->forget(receipt);
  return impl_->queue.ack(receipt, durability);
}

Status LeaseManager::nack(std::string_view receipt, Millis delay) {
  impl_->forget(receipt);
  return impl_->queue.nack(receipt, delay);
}

Status LeaseManager::release(std::string_view receipt) {
  if (impl_->forget(receipt)) return {};
  return Status(Code::kNotFound, "LeaseManager::release: lease " + std::string(receipt) + " is not held");
}

Result<LeaseManager::LeaseInfo> LeaseManager::status(std::string_view receipt) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->leases.find(receipt);
  if (it == impl_->leases.end()) {
    return Status(Code::kNotFound, "LeaseManager: lease " + std::string(receipt) + " is not held");
  }
  return it->second.info;
}

size_t LeaseManager::size() const {
  std::lock_guard lock(impl_->mu);
  return impl_->leases.size();
}

}  // namespace spool
