// The queue's public API (include/spool/queue.h) over the log and the shared index;
// the shared machinery (locking, repair, sync) is in queue_impl.h.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "queue/apply.h"
#include "queue/queue_impl.h"
#include "sys/file_modes.h"
#include "sys/lock_holders.h"
#include "sys/no_follow.h"

namespace spool {

// ---- Queue ---------------------------------------------------------------------------------

Queue::Queue(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Queue::~Queue() {
  if (impl_ && impl_->inherited()) {
    // A fork child destroying the copy it inherited (returning from main does that). Its
    // threads exist only in the parent: joining them, or destroying a condition variable
    // they waited on, waits forever; and its descriptors share the parent's locks. The
    // copy is left alone: only the child's memory, and the kernel closes the rest at exit.
    (void)impl_.release();
  }
}
const std::string& Queue::dir() const { return impl_->path(); }
const QueueOptions& Queue::options() const { return impl_->options(); }

uint64_t Stats::workers_needed(double rate_per_worker, double latency_target_s) const {
  if (ready == 0) return 0;
  double per_worker = rate_per_worker * latency_target_s;
  if (per_worker <= 0) return ready;
  return static_cast<uint64_t>(std::ceil(static_cast<double>(ready) / per_worker));
}

namespace {

// The mode and group a new queue was asked for (QueueOptions::mode, group), given to its
// directory, open at `dir_fd` (sys::open_dir): the group first (a chown may clear
// set-group-ID), then the mode, both through the descriptor, never by path.
Status share_dir(int dir_fd, const std::string& dir, const QueueOptions& opts) {
  if (opts.mode > 0777 || (opts.mode != 0 && (opts.mode & 0600) != 0600)) {
    char m[16];
    std::snprintf(m, sizeof m, "%04o", opts.mode);
    return Status(Code::kInvalidArgument, std::string("mode ") + m +
                                              " is not a queue's file mode: it must be at most 0777 and let the "
                                              "owner read and write (0600 at least)");
  }
  if (opts.group >= 0 && sys::set_dir_owner_mode(dir_fd, static_cast<gid_t>(opts.group), 0) != 0) {
    return errno_status(errno, "give " + dir + " to group " + std::to_string(opts.group));
  }
  struct stat st {};
  if (::fstat(dir_fd, &st) != 0) return errno_status(errno, "open queue " + dir);
  const mode_t files = opts.mode != 0 ? static_cast<mode_t>(opts.mode) : (st.st_mode & 0666);
  const mode_t want = sys::dir_mode_for(files);
  if ((st.st_mode & 07777) != want && sys::set_dir_owner_mode(dir_fd, static_cast<gid_t>(-1), want) != 0) {
    return errno_status(errno, "set the mode of " + dir);
  }
  return {};
}

// Whether `dir` holds anything but what a half-created queue may have left.
bool has_foreign_files(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return false;
  bool foreign = false;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == ".." || n == "gate" || n == "lock" || n.starts_with("spool.conf.tmp")) continue;
    foreign = true;
  }
  ::closedir(d);
  return foreign;
}

}  // namespace

Result<std::unique_ptr<Queue>> Queue::open(const std::string& dir, const QueueOptions& opts) {
  auto q = Impl::open_queue(dir, opts, false);
  if (!q.ok() || opts.subscription.empty()) return q;
  if (Status s = (*q)->impl_->use_subscription(opts.subscription); !s.ok()) return s;
  return q;
}

Result<std::unique_ptr<Queue>> Queue::Impl::open_queue(const std::string& dir_in, const QueueOptions& opts,
                                                       bool nested) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  impl->env = opts.env ? opts.env : make_default_env();
  impl->io = impl->env->io();
  if (opts.create && ::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST) {
    return errno_status(errno, "create queue directory " + dir);
  }
  // A link at the directory's last component is followed only to a queue that exists and
  // that the caller named: never to a dead-letter queue (`nested`: a link planted there by
  // whoever may write the queue would have its users, root too, read, fill and re-mode the
  // link's target), nor to make a queue (spool init through another user's link).
  struct stat st {};
  sys::Fd dir_fd = sys::open_dir(dir, false, &st);
  bool follow = false;
  if (!dir_fd.ok() && errno == ELOOP && !nested) {
    if (opts.create && ::access((dir + "/spool.conf").c_str(), F_OK) != 0) {
      return Status(Code::kCorrupt, dir + " is a symbolic link; spool makes a queue only in a directory itself, "
                                          "never through a link (give the link's target)");
    }
    follow = true;
    dir_fd = sys::open_dir(dir, true, &st);
  }
  if (!dir_fd.ok()) {
    if (errno == ENOENT) return Status(Code::kNotAQueue, dir + ": no such queue");
    if (nested) return sys::queue_dir_error(errno, "open queue", dir);
    if (errno == ENOTDIR) return Status(Code::kNotAQueue, dir + ": not a directory, so not a queue");
    return errno_status(errno, "open queue " + dir);
  }
  // Paths are used from here on: a link swapped in for the directory meanwhile is caught at
  // the end (still_names).
  const auto replaced = [&] {
    return Status(Code::kCorrupt, dir + " was replaced while it was being opened (by a link or another "
                                        "directory); open it again");
  };
  impl->read_only = ::access(dir.c_str(), W_OK) != 0;

  // Leave nothing behind in a directory that is not a queue and will not become one.
  const auto no_conf = [&] {
    return Status(Code::kNotAQueue, dir + ": not a spool queue (no spool.conf)");
  };
  const auto foreign = [&] {
    return Status(Code::kNotAQueue,
                  dir + " holds other files and is not a spool queue; use an empty or new "
                        "directory");
  };
  const std::string conf = dir + "/spool.conf";
  if (::access(conf.c_str(), F_OK) != 0) {
    if (!opts.create || impl->read_only) return no_conf();
    // Another process may be creating the queue right now: its spool.conf appears (by
    // rename) before any of the queue's other files, so look again before refusing.
    if (has_foreign_files(dir) && ::access(conf.c_str(), F_OK) != 0) return foreign();
    if (opts.mode != 0 || opts.group >= 0) {
      // Settings first: a refused creation must not have changed the directory.
      QueueOptions checked = opts;
      if (Status s = queue::validate(checked, ""); !s.ok()) return s;
      if (Status s = share_dir(dir_fd.get(), dir, opts); !s.ok()) return s;
      if (::fstat(dir_fd.get(), &st) != 0) return errno_status(errno, "open queue " + dir);
    }
  }
  impl->modes = sys::modes_for(st.st_mode);

  // The gate serialises attach/detach decisions; see "First opener" in docs/durability.md.
  if (!impl->read_only) {
    impl->gate_fd = sys::open_state_file(dir + "/gate", impl->modes);
    if (impl->gate_fd < 0) return sys::queue_file_error(errno, "open", dir + "/gate");
    if (Status s = sys::flock_waiting(impl->gate_fd, LOCK_EX, dir + "/gate", st); !s.ok()) return s;
  }
  // An open that fails closes `lock` first, then destroys its Impl here, still holding the
  // gate. ~Impl's seal_if_last() then does nothing: it used to take the gate again while
  // holding `lock` exclusively, after this released the gate, so that another opener that
  // took the gate and waited for `lock` deadlocked with it (issue 48); and it sealed an
  // index this open had not finished (a rebuild that failed), which the next opener then
  // trusted, opening the queue without its messages.
  struct GateRelease {
    int fd;
    std::unique_ptr<Impl>* failed;  // null once the Queue has it
    ~GateRelease() {
      if (*failed) {
        if ((*failed)->lock_fd >= 0) ::close(std::exchange((*failed)->lock_fd, -1));
        failed->reset();
        return;
      }
      if (fd >= 0) ::flock(fd, LOCK_UN);
    }
  } gate_release{impl->gate_fd, &impl};

  auto cfg = queue::read_config(dir, *impl->io);
  if (!cfg.ok() && cfg.status().code() == Code::kNotFound) {
    if (impl->read_only || !opts.create) return no_conf();
    if (has_foreign_files(dir)) return foreign();
    queue::Config c;
    c.opts = opts;
    if (Status s = queue::validate(c.opts, ""); !s.ok()) return s;
    while (c.uid == 0) {
      if (::getrandom(&c.uid, sizeof c.uid, 0) != sizeof c.uid) c.uid = sys::real_ns();
    }
    if (Status s = queue::write_config(dir, c, *impl->io); !s.ok()) return s;
    cfg = c;
  }
  if (!cfg.ok()) return cfg.status();
  impl->cfg = *cfg;
  impl->cfg.opts.create = opts.create;

  storage::LogOptions lo;
  lo.segment_size = impl->cfg.opts.segment_size;
  // Longer lengths are no records (bounds recovery); a message's extension may add to it.
  lo.max_payload = impl->cfg.opts.max_payload + format::kMaxExtSize;
  lo.read_only = impl->read_only;
  lo.dir_mode = impl->modes.dir;
  lo.file_mode = impl->modes.data;
  lo.io = impl->io;
  // Only where nothing syncs on its own: a sync writes a dirty 2 MiB folio whole.
  lo.huge_pages = impl->cfg.opts.sync == SyncPolicy::kNever;
  auto log = storage::Log::open(dir + "/segments", lo);
  if (!log.ok()) return log.status();
  impl->log = std::move(log).value();
  impl->syncer = std::make_unique<queue::Syncer>(impl->dir, impl->cfg.opts, impl->idx, *impl->log);

  if (impl->read_only) {
    // No write access: replay the log into a private index; nothing can change state.
    if (Status s = impl->idx.attach("", true, true); !s.ok()) return s;
    SPOOL_LOCK_OR_RETURN(held, *impl, lock_to_change());
    if (Status s = impl->rebuild(); !s.ok()) return s;
    if (!sys::still_names(dir_fd.get(), dir, follow)) return replaced();
    return std::unique_ptr<Queue>(new Queue(std::move(impl)));
  }

  // The index's crash points are the queue's Env's (the Env outlives impl, which holds it).
  const auto crash = [env = impl->env.get()](const char* name) { env->crashpoint(name); };
  impl->lock_fd = sys::open_state_file(dir + "/lock", impl->modes);
  if (impl->lock_fd < 0) return sys::queue_file_error(errno, "open", dir + "/lock");
  bool first = ::flock(impl->lock_fd, LOCK_EX | LOCK_NB) == 0;
  std::string index_path = dir + "/index";
  if (first) {
    impl->log->remove_leftovers();
    for (const char* f : {"/owners", "/compact.lock"}) sys::fix_state_file(dir + f, impl->modes);
    // Nobody else is attached: reuse the index only if it is intact, from this boot, and
    // not behind the log; otherwise start it afresh (this also re-creates the mutexes,
    // which after a reboot would be locked forever).
    // The entries are checked too, not only the header: a damaged region behind a sound
    // header would otherwise be trusted (out-of-bounds slots, lost or invented messages).
    // The mutexes are kept: a lock holder that was killed left EOWNERDEAD in the index lock,
    // and lock() below must see it and rebuild (re-creating them erased that state).
    // Decided before taking the lock: lock() releases dead processes' bound leases, which
    // appends to the log at the index's log end, and a stale index (log ahead of it) would
    // have those records overwrite newer ones.
    // A seal from the last clean close must still match: that catches damage the
    // invariants cannot see (a flipped record position or receive count).
    bool reuse = impl->idx.attach(index_path, false, false, impl->modes.state, impl->io, crash).ok() && impl->idx.refresh().ok();
    if (reuse && !impl->idx.unseal()) {
      spool::log().warn("{}: the index changed since the queue was last closed; rebuilding it", dir);
      reuse = false;
    }
    impl->idx.assert_held();  // the first opener: the gate keeps every other process out
    reuse = reuse && impl->idx.check_invariants().empty() && !impl->log_ahead_of_index();
    if (reuse) {
      if (std::string bad = impl->views_sound(); !bad.empty()) {
        spool::log().warn("spool: {}: {}; rebuilding the index", dir, bad);
        reuse = false;
      }
    }
    if (reuse) reuse = impl->lock_to_change().ok();
    if (!reuse) {
      // The index is a cache of the log: a new one, rebuilt from the log. Made beside the old
      // one and renamed over it, so that the directory's permission decides, not the old
      // file's (a user who may write the queue may replace an index another user left).
      impl->idx.~SharedIndex();
      new (&impl->idx) index::SharedIndex();
      const std::string fresh_path = index_path + ".new";
      if (Status s = impl->idx.attach(fresh_path, true, false, impl->modes.state, impl->io, crash); !s.ok()) return s;
      if (int r = impl->io->rename(fresh_path, index_path); r != 0) {
        return errno_status(-r, "rename " + fresh_path + " to " + index_path);
      }
      SPOOL_LOCK_OR_RETURN(held, *impl, lock_to_change());
      if (Status s = impl->rebuild(); !s.ok()) return s;
    }
    impl->idx.drop_resident();
  } else {
    if (Status s = sys::flock_waiting(impl->lock_fd, LOCK_SH, dir + "/lock", st); !s.ok()) return s;
    if (Status s = impl->idx.attach(index_path, false, false, 0600, impl->io, crash); !s.ok()) return s;
  }
  if (first && ::flock(impl->lock_fd, LOCK_SH) != 0) return errno_status(errno, "lock " + dir + "/lock");
  if (!sys::still_names(dir_fd.get(), dir, follow)) return replaced();
  return std::unique_ptr<Queue>(new Queue(std::move(impl)));
}

// ---- attributes and deduplication ------------------------------------------------------

namespace {

// kInvalidArgument naming what is wrong with `a`; `what` names the message ("" or "item 3: ").
Status check_attributes(const Attributes& a, const std::string& what) {
  auto bad = [&](const std::string& why) { return Status(Code::kInvalidArgument, what + why); };
  if (a.size() > format::kMaxAttributes) {
    return bad(std::to_string(a.size()) + " attributes: a message carries at most " +
               std::to_string(format::kMaxAttributes));
  }
  uint64_t total = 0;
  for (const auto& [k, v] : a) {
    if (k.empty() || k.size() > format::kMaxAttrKey) {
      return bad("attribute key '" + k + "' must be 1 to " + std::to_string(format::kMaxAttrKey) + " bytes");
    }
    for (char c : k) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
        return bad("attribute key '" + k + "' may hold only letters, digits, '.', '_' and '-'");
      }
    }
    if (v.size() > format::kMaxAttrValue) {
      return bad("attribute '" + k + "' has a value of " + std::to_string(v.size()) + " bytes; at most " +
                 std::to_string(format::kMaxAttrValue));
    }
    total += k.size() + v.size();
  }
  if (total > format::kMaxAttrTotal) {
    return bad("attributes of " + std::to_string(total) + " bytes (keys and values); at most " +
               std::to_string(format::kMaxAttrTotal));
  }
  return {};
}

// kInvalidArgument for a lease or delay `d` past a year (queue::kMaxVisibilityMs): its
// deadline in nanoseconds overflowed, so that a message leased that long could be received
// again at once, and one delayed that long was ready at once (issue 48).
Status at_most_a_year(const char* what, Millis d) {
  if (d.count() <= 0 || static_cast<uint64_t>(d.count()) <= queue::kMaxVisibilityMs) return {};
  return Status(Code::kInvalidArgument, std::string(what) + " of " + std::to_string(d.count()) +
                                            " ms is more than a year (at most " +
                                            std::to_string(queue::kMaxVisibilityMs) + " ms)");
}

}  // namespace

uint64_t Queue::Impl::find_dedup(std::string_view dedup_id, const Clocks& now) {
  uint64_t found = 0;
  idx.dedup_probe(queue::dedup_hash(dedup_id), [&](uint64_t loc, uint64_t expires) {
    if (expires <= now.boot) return false;
    std::shared_ptr<storage::Segment> keep;
    const Pos at = Pos::unpack(loc);
    auto r = log->read(at, &keep);
    if (!r.ok() || r->type != RecordType::kMsg || r->ext.empty() ||
        queue::enqueue_key(idx, at.pack(), r->t1, now) + dedup_window_ns() <= now.boot) {
      return false;
    }
    auto ext = storage::decode_ext(r->ext);
    if (!ext.ok() || ext->dedup_id != dedup_id) return false;  // another id with the same hash
    found = r->id;
    return true;
  });
  return found;
}

// Where a message with entry `e` and key `key` stands at boot time `now`.
static MessageState state_at(const Entry& e, uint64_t key, uint64_t now) {
  if (e.state == State::kBlocked) return MessageState::kBlocked;
  if (key <= now) return MessageState::kReady;
  return e.state == State::kLeased ? MessageState::kInFlight : MessageState::kDelayed;
}

// The slots of the `max` lowest ids above `after` among the messages whose state at boot
// time `now` is in `states`, lowest first. Queued messages (never received, not delayed: all
// ready) are in id order from the cursor on, so only the first `max` of them above `after`
// are read; the heap (messages in flight, delayed or redelivered) is read whole, sequential
// memory.
std::vector<uint32_t> Queue::Impl::lowest_ids(size_t max, StateFilter states, uint64_t now, uint64_t after) {
  if (max == 0) return {};
  index::SharedIndex& v = vw();  // (the handle's view: stats of a subscription)
  v.assert_held();
  std::vector<std::pair<uint64_t, uint32_t>> best;  // a max-heap of (id, slot), at most `max`
  auto offer = [&](uint64_t id, uint32_t slot) {
    if (id <= after || (best.size() == max && id >= best.front().first)) return;
    if (best.size() == max) {
      std::pop_heap(best.begin(), best.end());
      best.pop_back();
    }
    best.emplace_back(id, slot);
    std::push_heap(best.begin(), best.end());
  };
  const bool every = states.ready && states.in_flight && states.delayed && states.blocked;
  const index::HeapItem* items = v.heap_begin();
  for (uint64_t i = 0; i < v.heap_size(); ++i) {
    // The key alone tells ready from not: the entry is looked up only for what may be taken.
    const bool ready = items[i].key <= now;
    if (!every && (ready ? !states.ready : !states.in_flight && !states.delayed)) continue;
    const auto slot = static_cast<uint32_t>(v.find(items[i].id));
    if (!every && !ready && !states.has(state_at(v.entry(slot), items[i].key, now))) continue;
    offer(items[i].id, slot);
  }
  if (states.blocked) v.for_each_blocked([&](uint32_t slot, uint64_t id) { offer(id, slot); });
  if (states.ready) {
    const index::HeapItem* due = v.due_begin();
    for (uint64_t i = 0; i < v.due_size(); ++i) offer(due[i].id, static_cast<uint32_t>(v.find(due[i].id)));
    size_t seen = 0;
    v.for_each_queued(
        [&](uint32_t slot, uint64_t id) {
          offer(id, slot);
          return ++seen < max;
        },
        std::max(after, after + 1));  // (after + 1 but at UINT64_MAX, where offer() refuses all)
  }
  std::sort_heap(best.begin(), best.end());
  std::vector<uint32_t> slots;
  slots.reserve(best.size());
  for (auto& b : best) slots.push_back(b.second);
  return slots;
}

// ---- send ------------------------------------------------------------------------------

// The one send path. `exts` is empty (no message has an extension) or holds one encoded
// extension per payload ("" for none); `dedup` is empty or holds one dedup id per payload.
// `duplicates`, if not null, gets one flag per payload. Each message's id goes into `ids`,
// one per payload.
Status Queue::Impl::send_core(std::span<const std::string_view> payloads, std::span<const std::string> exts, std::span<const std::string_view> dedup, const SendOptions& opts, std::span<uint64_t> ids, std::vector<bool>* duplicates, std::optional<std::string_view> for_view) {
  Impl& q = *this;
  if (Status s = q.writable(); !s.ok()) return s;
  if (payloads.empty()) return {};
  for (auto p : payloads) {
    if (p.size() > q.cfg.opts.max_payload) {
      return Status(Code::kTooLarge, "message of " + std::to_string(p.size()) +
                                         " bytes exceeds the queue's max_payload of " +
                                         std::to_string(q.cfg.opts.max_payload) + " bytes");
    }
  }
  if (opts.delay.count() < 0 || opts.wait_for_room.count() < 0) {
    return Status(Code::kInvalidArgument, "delay and wait_for_room must not be negative");
  }
  if (Status s = at_most_a_year("delay", opts.delay); !s.ok()) return s;
  const uint64_t d = ms_to_ns(opts.delay);
  uint64_t give_up = 0;  // set when the queue is first found full (a clock read saved otherwise)
  uint64_t end;
  bool spares_low = false;
  bool compacted = false;  // a full disk made this send compact once already
  for (;;) {
    SPOOL_LOCK_OR_RETURN(held, q, lock_to_change());
    auto& h = q.idx.hdr();
    Clocks now = q.clocks();
    // For one view (a redrive or a replay): the subscription named, under the lock; the
    // queue's own is flagged only while it has subscriptions (else it is every view).
    uint16_t one_view = 0;
    bool flag_one = false;
    if (for_view) {
      auto k = q.view_named(*for_view);
      if (!k.ok()) return k.status();
      one_view = *k;
      flag_one = one_view != 0 || !queue::active_views(q.idx).empty();
    }
    // Duplicates first (under the lock, so two processes sending one dedup id at once queue
    // it once): `first[i]` is the id a duplicate returns, or 0 for a message to queue;
    // `from[i]` names the earlier message of this batch it repeats.
    // Without dedup ids every message is queued and none of this is allocated.
    std::vector<uint64_t> first;
    std::vector<size_t> keep;  // indexes of the messages to queue, when some are not
    std::vector<size_t> from;
    uint64_t fresh_dedup = 0;
    if (!dedup.empty()) {
      first.assign(payloads.size(), 0);
      from.assign(payloads.size(), SIZE_MAX);
      std::unordered_map<std::string_view, size_t> in_batch;
      for (size_t i = 0; i < payloads.size(); ++i) {
        if (!dedup[i].empty()) {
          if (auto it = in_batch.find(dedup[i]); it != in_batch.end()) {
            from[i] = it->second;
            continue;
          }
          if ((first[i] = q.find_dedup(dedup[i], now)) != 0) continue;
          in_batch.emplace(dedup[i], i);
          ++fresh_dedup;
        }
        keep.push_back(i);
      }
    }
    const size_t n_new = dedup.empty() ? payloads.size() : keep.size();
    auto kept = [&](size_t k) { return dedup.empty() ? k : keep[k]; };
    uint64_t total = 0, record_bytes = 0, largest = 0;
    for (size_t k = 0; k < n_new; ++k) {
      const size_t i = kept(k);
      total += payloads[i].size();
      const uint64_t rb = format::record_size((exts.empty() ? 0 : exts[i].size()) + payloads[i].size());
      record_bytes += rb;
      largest = std::max(largest, rb);
    }
    if ((q.cfg.opts.max_ready != 0 && n_new > q.cfg.opts.max_ready) ||
        (q.cfg.opts.max_bytes != 0 && total > q.cfg.opts.max_bytes)) {
      return Status(Code::kQueueFull, "a batch of " + std::to_string(n_new) + " messages (" +
                                          std::to_string(total) + " bytes) can never fit " + q.dir +
                                          "'s max_ready / max_bytes; send it in smaller batches");
    }
    uint32_t seen = h.coord.room_seq.load(std::memory_order_acquire);
    if (std::string full = n_new == 0 ? "" : q.full_reason(n_new, total); !full.empty()) {
      uint64_t t = q.env->boot_ns();
      if (give_up == 0) give_up = t + ms_to_ns(opts.wait_for_room);
      if (t >= give_up) {
        return Status(Code::kQueueFull, "queue full: " + q.dir + " has " + full +
                                            "; consumers must catch up, or raise the limit");
      }
      // Wait outside the lock; the Locked guard releases it when `held` goes out of scope.
      auto wait_ns = std::min(give_up - t, kMaxWaitSliceNs);
      Queue::Impl::Locked::release(std::move(held).value());
      h.coord.room_waiters.fetch_add(1);
      sys::futex_wait(&h.coord.room_seq, seen, wait_ns);
      (void)q.idx.check_file();  // before the header is touched again: see lock()
      h.coord.room_waiters.fetch_sub(1);
      continue;
    }
    // Room for the drain and the index slots first: a send fails before its records are
    // written, never after. Spares are made outside the lock, then it looks again.
    auto tail = q.log_tail();
    if (!tail.ok()) return tail.status();
    const auto short_by = q.spares_short(*tail, n_new, record_bytes, largest);
    if (short_by.n != 0) {
      Queue::Impl::Locked::release(std::move(held).value());
      if (Status s = q.make_spares(short_by); !s.ok()) {
        // The disk may be full of segments only acked messages use: compaction runs in the
        // background of the process that rolled, which a command that exits at once (spool
        // send, recv, ack) never lets run (issue 48). Compact once, then look again.
        if (s.code() != Code::kNoSpace || short_by.n == Queue::Impl::kNoSegmentNumbers) return s;
        if (!compacted) {
          compacted = true;
          auto freed = q.compact(true, true, {});
          if (freed.ok() && freed->segments_removed > 0) continue;
          if (!freed.ok()) return Status(s.code(), s.message() + "; compaction failed too: " + freed.status().message());
        }
        // In KiB below a MiB: on a small device "0 MiB" said nothing.
        const uint64_t next = std::max(short_by.size, short_by.at_least);
        const std::string size = next >= (1u << 20) ? std::to_string(next >> 20) + " MiB"
                                                    : std::to_string((next + 1023) >> 10) + " KiB";
        return Status(s.code(), s.message() + "; compaction has removed every segment it could, and the next " +
                                    "segment (" + size + ") does not fit: ack or purge " +
                                    "messages, end readers holding removed segments (spool stats shows them), "
                                    "free disk space or give the queue a smaller segment_size, then retry");
      }
      continue;
    }
    spares_low = short_by.low;
    if (Status s = q.idx.reserve(n_new, d != 0); !s.ok()) return s;
    if (fresh_dedup != 0) {
      if (Status s = q.idx.dedup_reserve(fresh_dedup, now.boot); !s.ok()) return s;
    }
    uint64_t grouped = 0;
    for (size_t k = 0; k < n_new && !exts.empty(); ++k) {
      grouped += storage::ext_entry(exts[kept(k)], format::ExtType::kGroup).has_value();
    }
    if (grouped != 0) {
      // A member and maybe its group; a heap item for when it becomes its group's first.
      if (Status s = q.idx.group_reserve(2 * grouped); !s.ok()) return s;
      if (Status s = q.idx.reserve_heap(grouped); !s.ok()) return s;
    }
    // A single message's record stays on the stack: a vector was one allocation per send().
    Record single;
    std::vector<Record> several;
    several.reserve(n_new > 1 ? n_new : 0);
    for (size_t k = 0; k < n_new; ++k) {
      const size_t i = kept(k);
      Record r{RecordType::kMsg, 0, h.cache.next_id + k, now.rt, now.rt + d, payloads[i]};
      if (!exts.empty()) r.ext = exts[i];
      if (flag_one) {
        r.flags = format::kFlagOneView;
        r.view = one_view;
      }
      if (n_new == 1) {
        single = r;
      } else {
        several.push_back(r);
      }
    }
    const std::span<const Record> recs =
        n_new == 1 ? std::span<const Record>(&single, 1) : std::span<const Record>(several);
    if (!recs.empty()) {
      if (auto res = q.commit(recs, now, *tail); !res.ok()) return res.status();
    }
    for (size_t k = 0; k < n_new; ++k) ids[kept(k)] = recs[k].id;
    if (duplicates != nullptr) duplicates->assign(payloads.size(), false);
    for (size_t i = 0; i < first.size(); ++i) {
      if (first[i] != 0) ids[i] = first[i];
      if (from[i] != SIZE_MAX) ids[i] = ids[from[i]];
      if (duplicates != nullptr) (*duplicates)[i] = first[i] != 0 || from[i] != SIZE_MAX;
    }
    if (recs.empty()) return {};  // every message was a duplicate: nothing written
    // Retention, in every view (the records go after the messages just written): by bytes
    // at each send; by age at most every eighth of retention_max_age (at least 10 ms
    // apart), as it reads the oldest messages' records. Receives and compaction check too.
    bool by_age = false;
    if (const uint64_t age = ms_to_ns(q.cfg.opts.retention_max_age); age != 0) {
      const uint64_t last = q.retained_at.load(std::memory_order_relaxed);
      by_age = now.boot - std::min(now.boot, last) >= std::max<uint64_t>(age / 8, 10'000'000);
      if (by_age) q.retained_at.store(now.boot, std::memory_order_relaxed);
    }
    if (Status s = q.retain(now, by_age); !s.ok()) return s;
    end = h.cache.log_end;
    break;
  }
  if (spares_low) q.background.spares_low();
  if (Status s = q.written(end, opts.durability); !s.ok()) return s;
  return {};
}

// No attribute, priority or group: nothing for the record's extension area.
static bool payload_only(const SendOptions& o) {
  return o.attributes.empty() && o.priority == kDefaultPriority && o.group.empty();
}

// The extension of a message with the attributes, dedup id, priority and group of `f` (a
// SendOptions or a SendItem), encoded once they are checked; `what` names the message, as
// for check_attributes().
template <class Fields>
static Result<std::string> checked_ext(const Fields& f, const std::string& what) {
  if (Status s = check_attributes(f.attributes, what); !s.ok()) return s;
  auto too_long = [&](const char* field, size_t size, size_t max) {
    return Status(Code::kInvalidArgument, what + field + " of " + std::to_string(size) +
                                              " bytes; at most " + std::to_string(max));
  };
  if (f.dedup_id.size() > format::kMaxDedupId) {
    return too_long("dedup id", f.dedup_id.size(), format::kMaxDedupId);
  }
  if (f.group.size() > format::kMaxGroupKey) {
    return too_long("group key", f.group.size(), format::kMaxGroupKey);
  }
  storage::MessageExt e;
  e.attributes.assign(f.attributes.begin(), f.attributes.end());
  e.dedup_id = f.dedup_id;
  e.priority = f.priority;
  e.group = f.group;
  return storage::encode_ext(e);
}

// send_core() into a vector of ids.
Result<std::vector<uint64_t>> Queue::Impl::send_ids(std::span<const std::string_view> payloads, std::span<const std::string> exts, std::span<const std::string_view> dedup, const SendOptions& opts, std::vector<bool>* duplicates, std::optional<std::string_view> for_view) {
  Impl& q = *this;
  std::vector<uint64_t> ids(payloads.size());
  if (Status s = q.send_core(payloads, exts, dedup, opts, ids, duplicates, for_view); !s.ok()) return s;
  return ids;
}

Result<uint64_t> Queue::send(std::string_view payload, Millis delay) {
  return send(payload, SendOptions{.delay = delay});
}

Result<std::vector<uint64_t>> Queue::send_batch(std::span<const std::string_view> payloads, Millis delay) {
  return send_batch(payloads, SendOptions{.delay = delay});
}

Result<uint64_t> Queue::send(std::string_view payload, const SendOptions& opts) {
  return send(payload, opts, nullptr);
}

Result<uint64_t> Queue::send(std::string_view payload, const SendOptions& opts, bool* duplicate) {
  uint64_t id = 0;  // one message: no vector of ids
  if (payload_only(opts) && opts.dedup_id.empty()) {  // no extension, no dedup id: no allocation
    if (Status s = impl_->send_core(std::span(&payload, 1), {}, {}, opts, std::span(&id, 1)); !s.ok()) return s;
    if (duplicate != nullptr) *duplicate = false;
    return id;
  }
  auto ext = checked_ext(opts, "");
  if (!ext.ok()) return ext.status();
  const std::string_view dedup = opts.dedup_id;
  std::vector<bool> dup;
  if (Status s = impl_->send_core(std::span(&payload, 1), std::span(&*ext, 1),
                           std::span(&dedup, dedup.empty() ? 0 : 1), opts, std::span(&id, 1),
                           duplicate != nullptr ? &dup : nullptr);
      !s.ok()) {
    return s;
  }
  if (duplicate != nullptr) *duplicate = dup.front();
  return id;
}

Result<std::vector<uint64_t>> Queue::send_batch(std::span<const std::string_view> payloads,
                                                const SendOptions& opts) {
  if (!opts.dedup_id.empty()) {
    return Status(Code::kInvalidArgument, "a batch of payloads cannot share one dedup id (all but the first would "
                                          "be duplicates); give each message its own with SendItem");
  }
  if (payload_only(opts)) {
    return impl_->send_ids(payloads, {}, {}, opts);  // payload-only: no cost
  }
  auto ext = checked_ext(opts, "");
  if (!ext.ok()) return ext.status();
  return impl_->send_ids(payloads, std::vector<std::string>(payloads.size(), *ext), {}, opts);
}

Result<std::vector<uint64_t>> Queue::send_batch(std::span<const SendItem> items, const SendOptions& opts) {
  return send_batch(items, opts, nullptr);
}

Result<std::vector<uint64_t>> Queue::send_batch(std::span<const SendItem> items, const SendOptions& opts,
                                                std::vector<bool>* duplicates) {
  return impl_->send_items(items, opts, duplicates);
}

auto Queue::Impl::send_items(std::span<const SendItem> items, const SendOptions& opts, std::vector<bool>* duplicates,
                             std::optional<std::string_view> for_view) -> Result<std::vector<uint64_t>> {
  if (duplicates != nullptr) duplicates->clear();  // an empty batch returns before send_core sets it
  if (!payload_only(opts) || !opts.dedup_id.empty()) {
    return Status(Code::kInvalidArgument, "send_batch of SendItems takes attributes, dedup ids, priorities and groups "
                                          "from each item, not from SendOptions");
  }
  std::vector<std::string_view> payloads;
  std::vector<std::string> exts;
  std::vector<std::string_view> dedup;
  payloads.reserve(items.size());
  exts.reserve(items.size());
  dedup.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    auto ext = checked_ext(items[i], items.size() == 1 ? "" : "message " + std::to_string(i) + " of the batch: ");
    if (!ext.ok()) return ext.status();
    payloads.push_back(items[i].payload);
    exts.push_back(std::move(*ext));
    dedup.push_back(items[i].dedup_id);
  }
  return send_ids(payloads, exts, dedup, opts, duplicates, for_view);
}

// receive() and receive_views(): with `mapped`, payloads are left in the segments and their
// views returned there, one per message.
Result<std::vector<Message>> Queue::Impl::receive_impl(size_t max, Millis visibility, Millis wait, std::vector<Queue::Impl::Mapped>* mapped) {
  Impl& q = *this;
  if (Status s = q.writable(); !s.ok()) return s;
  if (max == 0) return Status(Code::kInvalidArgument, "receive of 0 messages");
  if (visibility.count() < 0 || wait.count() < 0) {
    return Status(Code::kInvalidArgument, "visibility and wait must not be negative");
  }
  if (Status s = at_most_a_year("visibility", visibility); !s.ok()) return s;
  uint64_t vis = ms_to_ns(visibility.count() == 0 ? q.cfg.opts.visibility : visibility);
  if (q.cfg.opts.max_receives != 0 || q.view_k != 0) q.dlq.open_early();  // (a subscription may have its own)
  uint64_t give_up = 0;  // set when nothing is found the first time (a clock read saved otherwise)
  auto& h = q.idx.hdr();
  for (;;) {
    std::vector<Message> out;
    uint64_t end = 0;
    uint64_t next_key = UINT64_MAX;
    uint32_t seen;
    bool paused = false;
    {
      SPOOL_LOCK_OR_RETURN(held, q, lock_to_change());
      seen = h.coord.wake_seq.load(std::memory_order_acquire);
      Clocks now = q.clocks();
      // The view this handle reads (the queue's own, or a subscription's).
      auto viewed = q.here();
      if (!viewed.ok()) return viewed.status();
      index::SharedIndex& v = **viewed;
      v.assert_held();
      // Every queued message taken gets a heap item: room for them first, so that taking
      // one cannot fail halfway (the others have theirs).
      if (Status s = v.reserve_heap(std::min<uint64_t>(max, v.hdr().layout.queued)); !s.ok()) return s;
      // Paused (Queue::pause): nothing is taken, and the wait below lasts until resume()
      // bumps wake_seq or the wait runs out. A pause is the queue's: every subscription too.
      paused = q.idx.hdr().cache.paused != 0;
      for (int64_t slot; !paused && out.size() < max && (slot = v.next(now.boot)) >= 0;) {
        Queue::Impl::Mapped m;
        auto taken = q.take(static_cast<uint32_t>(slot), now, vis, &end, mapped != nullptr ? &m : nullptr);
        if (!taken.ok()) {
          // The LEASEs of the messages taken before were applied and are not in the log:
          // the unlock's rebuild from the log undoes them (none was handed out).
          if (!out.empty()) q.idx.damaged("a receive failed after taking " + std::to_string(out.size()) + " message(s)");
          return taken.status();
        }
        if (!*taken) continue;
        out.push_back(std::move(**taken));
        if (mapped != nullptr) mapped->push_back(std::move(m));
      }
      if (Status s = q.log_leases(out, now, vis, &end); !s.ok()) return s;
      next_key = paused ? UINT64_MAX : v.next_key();
    }
    if (end != 0) {
      if (Status s = q.written(end); !s.ok()) return s;
    }
    if (!out.empty()) return out;
    uint64_t now = q.env->boot_ns();
    if (give_up == 0) give_up = now + ms_to_ns(wait);
    if (now >= give_up) {
      if (paused) return Status(Code::kEmpty, q.dir + " is paused (spool resume delivers again)");
      return Status(Code::kEmpty, "no message ready in " + q.dir);
    }
    uint64_t until = std::min(give_up, next_key);
    uint64_t slice = std::min(until > now ? until - now : 0,
                              h.registry.owners_claimed != 0 ? kBoundWaitSliceNs : kMaxWaitSliceNs);
    if (slice == 0) continue;
    h.coord.waiters.fetch_add(1);
    sys::futex_wait(&h.coord.wake_seq, seen, slice);
    (void)q.idx.check_file();  // before the header is touched again: see lock()
    h.coord.waiters.fetch_sub(1);
  }
}

Result<std::vector<Message>> Queue::receive(size_t max, Millis visibility, Millis wait) {
  return impl_->receive_impl(max, visibility, wait, nullptr);
}

Result<std::vector<MessageView>> Queue::receive_views(size_t max, Millis visibility, Millis wait) {
  std::vector<Impl::Mapped> mapped;
  auto msgs = impl_->receive_impl(max, visibility, wait, &mapped);
  if (!msgs.ok()) return msgs.status();
  std::vector<MessageView> out;
  out.reserve(msgs->size());
  for (size_t i = 0; i < msgs->size(); ++i) {
    Message& m = (*msgs)[i];
    out.push_back(MessageView{m.id, mapped[i].view, m.receive_count, m.enqueued, std::move(m.receipt),
                              std::move(mapped[i].keep), std::move(m.attributes), m.priority, std::move(m.group)});
  }
  return out;
}

Result<Message> Queue::receive_id(uint64_t id, Millis visibility) { return impl_->receive_id(id, visibility); }

Result<Message> Queue::Impl::receive_id(uint64_t id, Millis visibility) {
  Impl& q = *this;
  if (Status s = q.writable(); !s.ok()) return s;
  if (visibility.count() < 0) return Status(Code::kInvalidArgument, "visibility must not be negative");
  if (Status s = at_most_a_year("visibility", visibility); !s.ok()) return s;
  return q.receive_one(id, ms_to_ns(visibility.count() == 0 ? q.cfg.opts.visibility : visibility), false);
}

auto Queue::Impl::receive_one(uint64_t id, uint64_t vis, bool even_paused) -> Result<Message> {
  Impl& q = *this;
  if (q.cfg.opts.max_receives != 0 || q.view_k != 0) q.dlq.open_early();  // (a subscription may have its own)
  uint64_t end = 0;
  std::vector<Message> out;
  bool dropped = false;  // dead-lettered or expired by take(); its sync waits for the unlock
  {
    SPOOL_LOCK_OR_RETURN(held, q, lock_to_change());
    // The view this handle reads (the queue's own, or a subscription's), as receive_impl.
    auto viewed = q.here();
    if (!viewed.ok()) return viewed.status();
    index::SharedIndex& v = **viewed;
    v.assert_held();
    if (q.idx.hdr().cache.paused != 0 && !even_paused) {  // (the queue's pause: every view's)
      return Status(Code::kEmpty, q.dir + " is paused (spool resume delivers again)");
    }
    if (Status s = v.reserve_heap(1); !s.ok()) return s;  // before find: it may remap
    int64_t slot = v.find(id);
    if (slot < 0) {
      return Status(Code::kNotFound, "message " + std::to_string(id) + " is not in the " +
                                         (q.view_k != 0 ? "subscription '" + q.view_name + "'" : std::string("queue")));
    }
    Clocks now = q.clocks();
    const Entry& e = v.entry(static_cast<uint32_t>(slot));
    if (e.state == State::kBlocked) {
      return Status(Code::kEmpty, "message " + std::to_string(id) + " waits for message " +
                                      std::to_string(v.group_first(id)) + " of its group");
    }
    if (v.key(static_cast<uint32_t>(slot)) > now.boot) {
      return Status(Code::kEmpty, "message " + std::to_string(id) +
                                      (e.state == State::kLeased ? " is leased" : " is delayed"));
    }
    auto taken = q.take(static_cast<uint32_t>(slot), now, vis, &end);
    if (!taken.ok()) return taken.status();
    if (!*taken) {
      dropped = true;
    } else {
      out.push_back(std::move(**taken));
      if (Status s = q.log_leases(out, now, vis, &end); !s.ok()) return s;
    }
  }
  if (dropped) {
    (void)q.written(end);
    return Status(Code::kNotFound, "message " + std::to_string(id) + " was dropped (dead-lettered or past retention)");
  }
  if (Status s = q.written(end); !s.ok()) return s;
  return std::move(out.front());
}

StateFilter StateFilter::only(MessageState s) {
  return StateFilter{s == MessageState::kReady, s == MessageState::kInFlight, s == MessageState::kDelayed,
                     s == MessageState::kBlocked};
}

bool StateFilter::has(MessageState s) const {
  switch (s) {
    case MessageState::kReady: return ready;
    case MessageState::kInFlight: return in_flight;
    case MessageState::kDelayed: return delayed;
    case MessageState::kBlocked: return blocked;
  }
  return false;
}

const char* state_name(MessageState s) {
  switch (s) {
    case MessageState::kReady: return "ready";
    case MessageState::kInFlight: return "in_flight";
    case MessageState::kDelayed: return "delayed";
    case MessageState::kBlocked: return "blocked";
  }
  return "unknown";
}

// The owner slot of a lease bound to a live process (bind_leases), or -1.
static int bound_owner(const index::IndexHeader& h, const Entry& e) {
  if (e.owner == 0 || e.owner > index::kOwnerSlots || h.registry.owner_claimed[e.owner - 1] == 0) return -1;
  return static_cast<int>(e.owner) - 1;
}

// The id a dead letter had in its queue, from its spool.dead.original_id; 0 if none.
static uint64_t original_id_in(const storage::MessageExt& ext) {
  for (const auto& [k, v] : ext.attributes) {
    if (k != "spool.dead.original_id") continue;
    uint64_t id = 0;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), id);
    return ec == std::errc{} && end == v.data() + v.size() ? id : 0;
  }
  return 0;
}

// Where the message in `slot` stands at `now`, and what its record says of it.
Result<MessageInfo> Queue::Impl::info_of(uint32_t slot, const Clocks& now) {
  index::SharedIndex& v = vw();  // the handle's view: its slots
  v.assert_held();
  const Entry& e = v.entry(slot);
  const uint64_t key = v.key(slot);
  MessageInfo m{v.id_of(slot), e.len, e.count, key <= now.boot && e.state != State::kBlocked};
  std::shared_ptr<storage::Segment> keep;
  auto stored = read_stored(slot, &keep, now);
  if (!stored.ok()) return stored.status();
  m.priority = stored->ext.priority;
  m.group = std::move(stored->ext.group);
  m.enqueued = queue::wall_time(now.real() - stored->age_ns);
  m.original_id = original_id_in(stored->ext);
  if (m.ready) return m;
  m.state = state_at(e, key, now.boot);
  if (m.state == MessageState::kBlocked) return m;  // due: when the one before it goes
  m.due = queue::wall_time(now.real() + (key - now.boot));
  const auto& h = idx.hdr();
  if (int k = bound_owner(h, e); m.state == MessageState::kInFlight && k >= 0) m.holder_pid = h.registry.owner_pid[k];
  return m;
}

Result<std::vector<MessageInfo>> Queue::list(size_t max, StateFilter states, uint64_t after) {
  return impl_->list(max, states, after);
}

Result<std::vector<MessageInfo>> Queue::Impl::list(size_t max, StateFilter states, uint64_t after) {
  Impl& q = *this;
  SPOOL_LOCK_OR_RETURN(held, q, lock());
  if (auto viewed = q.here(); !viewed.ok()) return viewed.status();
  const Clocks now = queue::read_clocks(q.idx.hdr(), *q.env);  // list() writes nothing, no CLOCK record either
  std::vector<MessageInfo> out;
  for (uint32_t slot : q.lowest_ids(max, states, now.boot, after)) {
    auto info = q.info_of(slot, now);
    if (!info.ok()) return info.status();
    out.push_back(std::move(*info));
  }
  return out;
}

Result<uint64_t> Queue::count(StateFilter states, uint64_t after) { return impl_->count(states, after); }

Result<uint64_t> Queue::Impl::count(StateFilter states, uint64_t after) {
  Impl& q = *this;
  SPOOL_LOCK_OR_RETURN(held, q, lock());
  auto viewed = q.here();
  if (!viewed.ok()) return viewed.status();
  index::SharedIndex& v = **viewed;
  v.assert_held();
  const uint64_t now = queue::read_clocks(q.idx.hdr(), *q.env).boot;
  uint64_t n = 0;
  // What lowest_ids() reads whole, counted as it takes them; then the queued above `after`.
  const index::HeapItem* items = v.heap_begin();
  for (uint64_t i = 0; i < v.heap_size(); ++i) {
    if (items[i].id <= after) continue;
    const int64_t slot = v.find(items[i].id);
    if (slot >= 0 && states.has(state_at(v.entry(static_cast<uint32_t>(slot)), items[i].key, now))) ++n;
  }
  if (states.blocked) v.for_each_blocked([&](uint32_t, uint64_t id) { n += id > after ? 1 : 0; });
  if (states.ready) {
    const index::HeapItem* due = v.due_begin();
    for (uint64_t i = 0; i < v.due_size(); ++i) n += due[i].id > after ? 1 : 0;
    n += v.queued_above(after);
  }
  return n;
}

// kNotFound for a message id the queue does not hold.
static Status not_in_queue(uint64_t id) {
  return Status(Code::kNotFound, "message " + std::to_string(id) +
                                     " is not in the queue (never sent, or already acked, removed, "
                                     "dead-lettered or purged)");
}

Result<std::pair<Message, MessageInfo>> Queue::show(uint64_t id) { return impl_->show(id); }

Result<std::pair<Message, MessageInfo>> Queue::Impl::show(uint64_t id) {
  Impl& q = *this;
  SPOOL_LOCK_OR_RETURN(held, q, lock());
  auto viewed = q.here();
  if (!viewed.ok()) return viewed.status();
  index::SharedIndex& v = **viewed;
  v.assert_held();
  const int64_t slot = v.find(id);
  if (slot < 0) return not_in_queue(id);
  const Clocks now = queue::read_clocks(q.idx.hdr(), *q.env);
  auto m = q.load(static_cast<uint32_t>(slot), nullptr, &now);
  if (!m.ok()) return m.status();
  auto info = q.info_of(static_cast<uint32_t>(slot), now);
  if (!info.ok()) return info.status();
  return std::make_pair(std::move(*m), std::move(*info));
}

Status Queue::Impl::change(std::string_view receipt, Change what, uint64_t ns, Durability durability) {
  Impl& q = *this;
  if (Status s = q.writable(); !s.ok()) return s;
  uint64_t end;
  {
    SPOOL_LOCK_OR_RETURN(f, q, lock_fenced(receipt));
    Clocks now = q.clocks();
    Record rec{RecordType::kAck, f->gen, f->id, 0, 0, {}};
    if (what == Change::kNack) {
      rec = {RecordType::kRelease, f->gen, f->id, now.rt, now.rt + ns, {}, format::kFlagNack};
    }
    if (what == Change::kExtend) {
      rec = {RecordType::kLease, f->gen, f->id, now.rt, now.rt + ns, {}};
      index::SharedIndex& v = q.vw();  // (lock_fenced() found the slot in the handle's view)
      v.assert_held();
      auto& h = q.idx.hdr();
      if (int k = bound_owner(h, v.entry(f->slot)); k >= 0) h.registry.owner_renew_ds[k] = index::renew_stamp(now.boot);
    }
    rec.view = q.view_k;
    auto res = q.commit(std::span(&rec, 1), now);
    if (!res.ok()) return res.status();
    end = res->end.pack();
  }
  return q.written(end, durability);
}

Status Queue::dead_letter(std::string_view receipt, const Attributes& extra) { return impl_->dead_letter(receipt, extra); }

Status Queue::Impl::dead_letter(std::string_view receipt, const Attributes& extra) {
  Impl& q = *this;
  if (Status s = q.writable(); !s.ok()) return s;
  if (Status s = check_attributes(extra, "dead_letter: "); !s.ok()) return s;
  q.dlq.open_early();
  uint64_t end;
  uint64_t m_id;
  {
    SPOOL_LOCK_OR_RETURN(f, q, lock_fenced(receipt));
    m_id = f->id;
    const Clocks now = q.clocks();
    auto m = q.load(f->slot, nullptr, &now);
    if (!m.ok()) return m.status();
    const std::string body = std::move(m->payload);
    // A consumer giving up on the last delivery max_receives allows dead-letters what the
    // next receive would have for that reason.
    const uint32_t max = q.max_receives_here();
    index::SharedIndex& v = q.vw();
    v.assert_held();
    const bool spent = max != 0 && v.entry(f->slot).count >= max;
    if (Status s = q.bury(f->slot, *m, body, spent ? "max_receives" : "consumer", extra, now); !s.ok()) return s;
    end = q.idx.hdr().cache.log_end;
  }
  // The caller asked for it and is told it happened: info, not a warning (delivery.cc).
  spool::log().info("{}: message {} moved to the dead-letter queue, as its consumer asked", q.dir, m_id);
  return q.written(end);
}

Status Queue::ack(std::string_view receipt, Durability durability) {
  return impl_->change(receipt, Impl::Change::kAck, 0, durability);
}

Result<std::vector<Status>> Queue::ack_batch(std::span<const std::string_view> receipts, Durability durability) {
  return impl_->ack_batch(receipts, durability);
}

Result<std::vector<Status>> Queue::Impl::ack_batch(std::span<const std::string_view> receipts, Durability durability) {
  Impl& q = *this;
  if (Status s = q.writable(); !s.ok()) return s;
  std::vector<Status> out(receipts.size());
  std::vector<std::optional<ReceiptRef>> refs(receipts.size());
  bool any = false;
  for (size_t i = 0; i < receipts.size(); ++i) {
    auto ref = q.parse_receipt(receipts[i]);
    if (!ref.ok()) {
      out[i] = ref.status();
    } else {
      refs[i] = *ref;
      any = true;
    }
  }
  if (!any) return out;
  uint64_t end;
  {
    SPOOL_LOCK_OR_RETURN(held, q, lock_to_change());
    auto viewed = q.here();
    if (!viewed.ok()) return viewed.status();
    index::SharedIndex& v = **viewed;
    v.assert_held();
    std::vector<std::pair<uint32_t, uint64_t>> acked;  // (delivery, id)
    std::unordered_set<uint64_t> seen;
    for (size_t i = 0; i < refs.size(); ++i) {
      if (!refs[i]) continue;
      // A message acked by an earlier receipt of this batch is gone, as a second ack() finds it.
      auto slot = seen.contains(refs[i]->id) ? Result<uint32_t>(not_in_queue(refs[i]->id)) : q.fence(v, *refs[i]);
      if (!slot.ok()) {
        out[i] = slot.status();
        continue;
      }
      seen.insert(refs[i]->id);
      acked.emplace_back(refs[i]->gen, refs[i]->id);
    }
    if (acked.empty()) return out;
    std::deque<std::string> payloads;
    const std::vector<Record> recs =
        listed_records(Record{RecordType::kAck, 0, 0, 0, 0, {}, 0, {}, q.view_k}, std::move(acked), payloads);
    auto res = q.commit(recs, q.clocks());
    if (!res.ok()) return res.status();
    end = res->end.pack();
  }
  if (Status s = q.written(end, durability); !s.ok()) return s;
  return out;
}

Status Queue::remove(uint64_t id, Durability durability) { return impl_->remove(id, durability); }

Status Queue::Impl::remove(uint64_t id, Durability durability) {
  if (Status s = whole_queue_only("remove"); !s.ok()) return s;
  Impl& q = *this;
  if (Status s = q.writable(); !s.ok()) return s;
  uint64_t end;
  {
    SPOOL_LOCK_OR_RETURN(held, q, lock_to_change());
    int64_t slot = q.idx.find(id);
    if (slot < 0) return not_in_queue(id);
    // An ACK record with the message's current delivery number: replay drops the message
    // whatever its state, and a receipt of that delivery finds nothing to fence. Flagged
    // DELETED: deleted means gone, so replay after ack does not send it again.
    Record rec{RecordType::kAck, q.idx.entry(static_cast<uint32_t>(slot)).count, id, 0, 0, {},
               format::kFlagDeleted};
    auto res = q.commit(std::span(&rec, 1), q.clocks());
    if (!res.ok()) return res.status();
    end = res->end.pack();
  }
  return q.written(end, durability);
}

Status Queue::bind_leases() { return impl_->bind_leases(); }

Status Queue::Impl::bind_leases() {
  Impl& q = *this;
  if (Status s = q.writable(); !s.ok()) return s;
  SPOOL_LOCK_OR_RETURN(held, q, lock_to_change());
  if (Status s = q.claim_owner_slot(); !s.ok()) return s;
  q.owners.bind_all();
  return {};
}

Status Queue::bind(std::string_view receipt) { return impl_->bind(receipt); }

Status Queue::Impl::bind(std::string_view receipt) {
  Impl& q = *this;
  if (Status s = q.writable(); !s.ok()) return s;
  SPOOL_LOCK_OR_RETURN(f, q, lock_fenced(receipt));
  if (Status s = q.claim_owner_slot(); !s.ok()) return s;
  index::SharedIndex& v = q.vw();  // (lock_fenced() found the slot in the handle's view)
  v.assert_held();
  Entry& e = v.entry(f->slot);
  if (e.state != State::kLeased) {
    return Status(Code::kLeaseLost, "message " + std::to_string(f->id) + " is not leased (it was nacked)");
  }
  e.owner = q.owners.tag(q.idx);
  return {};
}

uint64_t Queue::durable_id() { return impl_->durable_id(); }
uint64_t Queue::Impl::durable_id() { return idx.hdr().coord.durable_id.load(std::memory_order_acquire); }
Status Queue::nack(std::string_view receipt, Millis delay) {
  if (Status s = at_most_a_year("nack delay", delay); !s.ok()) return s;
  return impl_->change(receipt, Impl::Change::kNack, ms_to_ns(delay));
}
Status Queue::extend(std::string_view receipt, Millis visibility) {
  if (visibility.count() <= 0) return Status(Code::kInvalidArgument, "extend needs a visibility > 0");
  if (Status s = at_most_a_year("visibility", visibility); !s.ok()) return s;
  return impl_->change(receipt, Impl::Change::kExtend, ms_to_ns(visibility));
}

Result<std::vector<Message>> Queue::peek(size_t max) { return impl_->peek(max); }

Result<std::vector<Message>> Queue::Impl::peek(size_t max) {
  Impl& q = *this;
  SPOOL_LOCK_OR_RETURN(held, q, lock());
  if (auto viewed = q.here(); !viewed.ok()) return viewed.status();
  std::vector<Message> out;
  for (uint32_t slot : q.lowest_ids(max, StateFilter{}, 0)) {
    auto m = q.load(slot);
    if (!m.ok()) return m.status();
    out.push_back(std::move(*m));
  }
  return out;
}

Result<uint64_t> Queue::purge() { return impl_->purge(); }

Result<uint64_t> Queue::Impl::purge() {
  if (Status s = whole_queue_only("purge"); !s.ok()) return s;
  Impl& q = *this;
  if (Status s = q.writable(); !s.ok()) return s;
  uint64_t n, end;
  {
    SPOOL_LOCK_OR_RETURN(held, q, lock_to_change());
    auto& h = q.idx.hdr();
    Record rec{RecordType::kPurge, 0, h.cache.next_id - 1, 0, 0, {}};
    if (h.cache.next_id == 1) return uint64_t{0};
    n = h.layout.count;
    auto res = q.commit(std::span(&rec, 1), q.clocks());
    if (!res.ok()) return res.status();
    end = res->end.pack();
  }
  if (Status s = q.written(end); !s.ok()) return s;
  return n;
}

// pause() and resume(): a PAUSE record, applied, synced whatever the sync policy (an
// operator's action that returned holds across a power cut).
Status Queue::Impl::set_paused(bool on) {
  if (Status s = whole_queue_only("pause and resume"); !s.ok()) return s;
  Impl& q = *this;
  if (Status s = q.writable(); !s.ok()) return s;
  uint64_t end;
  {
    SPOOL_LOCK_OR_RETURN(held, q, lock_to_change());
    auto& h = q.idx.hdr();
    if ((h.cache.paused != 0) == on) return {};
    Record rec{RecordType::kPause, on ? 1u : 0u, 0, 0, 0, {}};
    auto res = q.commit(std::span(&rec, 1), q.clocks());  // a resume wakes every long poll
    if (!res.ok()) return res.status();
    end = res->end.pack();
  }
  return q.written(end, Durability::kSync);
}

Status Queue::pause() { return impl_->set_paused(true); }
Status Queue::resume() { return impl_->set_paused(false); }

Status Queue::release(uint64_t id) { return impl_->release(id); }

Status Queue::Impl::release(uint64_t id) {
  if (Status s = whole_queue_only("release"); !s.ok()) return s;
  Impl& q = *this;
  if (Status s = q.writable(); !s.ok()) return s;
  uint64_t end;
  {
    SPOOL_LOCK_OR_RETURN(held, q, lock_to_change());
    const int64_t slot = q.idx.find(id);
    if (slot < 0) return not_in_queue(id);
    const Entry& e = q.idx.entry(static_cast<uint32_t>(slot));
    if (e.state != State::kLeased) {
      return Status(Code::kInvalidArgument, "message " + std::to_string(id) + " is not leased");
    }
    Clocks now = q.clocks();
    // Not flagged NACK: no consumer gave it back, so nacked_total does not count it. Ready
    // now (t2 == t1): the unlock wakes a long poll for it.
    Record rec{RecordType::kRelease, e.count, id, now.rt, now.rt, {}};
    auto res = q.commit(std::span(&rec, 1), now);
    if (!res.ok()) return res.status();
    end = res->end.pack();
  }
  return q.written(end);
}

Result<Stats> Queue::stats() { return impl_->stats(); }

Result<Stats> Queue::Impl::stats() {
  Impl& q = *this;
  Stats st;
  {
    SPOOL_LOCK_OR_RETURN(held, q, lock());
    // The handle's view (a subscription's counts and totals); the lease owners, the dedup
    // ids and the disk are the queue's.
    auto viewed = q.here();
    if (!viewed.ok()) return viewed.status();
    index::SharedIndex& v = **viewed;
    v.assert_held();
    auto& h = v.hdr();
    auto& owners_h = q.idx.hdr();
    uint64_t now = q.env->boot_ns();
    // Queued messages are ready and counted; the heap is read whole (in flight, delayed,
    // redelivered: not the backlog).
    st.ready = h.layout.queued + v.due_size();
    st.blocked = h.layout.blocked;
    auto head = q.lowest_ids(1, StateFilter::only(MessageState::kReady), now);
    const index::HeapItem* items = v.heap_begin();
    std::array<uint64_t, index::kOwnerSlots> bound{};
    for (uint64_t i = 0; i < v.heap_size(); ++i) {
      if (items[i].key <= now) {
        ++st.ready;
        continue;
      }
      const int64_t slot = v.find(items[i].id);
      if (slot < 0) continue;  // damage, recorded by find(); the next lock repairs it
      const Entry& e = v.entry(static_cast<uint32_t>(slot));
      if (e.state != State::kLeased) {
        ++st.delayed;
        continue;
      }
      ++st.in_flight;
      if (int k = bound_owner(owners_h, e); k >= 0) ++bound[k];
    }
    for (uint32_t k = 0; k < index::kOwnerSlots; ++k) {
      if (bound[k] == 0) continue;
      const uint32_t stamp = owners_h.registry.owner_renew_ds[k];
      const uint64_t renewed = index::renew_stamp_ns(stamp);
      const double ago = stamp != 0 && renewed <= now ? static_cast<double>(now - renewed) / 1e9 : -1;
      st.holders.push_back({owners_h.registry.owner_pid[k], bound[k], ago});
    }
    std::sort(st.holders.begin(), st.holders.end(), [](const auto& a, const auto& b) { return a.pid < b.pid; });
    if (!head.empty()) {
      uint64_t age = 0;
      if (auto m = q.load(head.front(), nullptr, nullptr, &age); m.ok()) st.oldest_ready_age_s = static_cast<double>(age) / 1e9;
    }
    st.sent_total = h.cache.sent_total;
    st.acked_total = h.cache.acked_total;
    st.dead_lettered_total = h.cache.dead_total;
    st.expired_total = h.cache.expired_total;
    st.nacked_total = h.cache.nacked_total;
    st.received_total = h.cache.received_total;
    st.redelivered_total = h.cache.redelivered_total;
    st.bytes = h.cache.bytes_live;
    st.next_id = h.cache.next_id;
    st.paused = h.cache.paused != 0;
    st.held_back_bytes = q.held_back(q.view_k);
    st.dedup_ids = q.idx.dedup_live(now);  // expiries are boot-clock keys
    v.kept_live(now, ms_to_ns(q.cfg.opts.keep_acked), &st.kept_acked, &st.kept_acked_bytes);
  }
  if (auto seqs = q.log->segments(); seqs.ok()) {
    st.segments = seqs->size();
    for (uint64_t s : *seqs) {
      struct stat sb {};
      if (::stat(q.log->segment_path(s).c_str(), &sb) == 0) st.bytes_on_disk += static_cast<uint64_t>(sb.st_blocks) * 512;
    }
  }
  struct stat dst {};
  if (::stat((q.dir + "/dlq/spool.conf").c_str(), &dst) == 0) {
    auto dead_q = q.dlq.get();
    if (dead_q.ok()) {
      auto ds = (*dead_q)->stats();
      if (ds.ok()) st.dead = ds->ready + ds->in_flight + ds->delayed;
    }
  }
  return st;
}

Status Queue::sync() { return impl_->sync(); }

Status Queue::Impl::sync() {
  if (read_only) return {};
  return syncer->sync_to(__atomic_load_n(&idx.hdr().cache.log_end, __ATOMIC_ACQUIRE));
}

Result<Queue*> Queue::dead_letters() { return impl_->dead_letters(); }

// The subscription a dead letter died in (its spool.dead.subscription); "" for the queue's
// own view (no mark).
static std::string dead_subscription(const Message& m) {
  for (const auto& [k, v] : m.attributes) {
    if (k == "spool.dead.subscription") return v;
  }
  return "";
}

// One received dead letter back as a new message, whose history starts afresh (the dead
// letter's spool.dead.* stay behind), for the view it died in only: a subscription's goes to
// that subscription (kNotFound, and nothing sent, once it is removed), the queue's own to
// the queue's own view (no subscription gets it again). Send first, then ack: a crash in
// between duplicates, never loses.
auto Queue::Impl::redrive_one(Queue& dead, Message& m) -> Result<uint64_t> {
  const std::string view = dead_subscription(m);
  std::erase_if(m.attributes, [](const auto& kv) { return kv.first.starts_with("spool.dead."); });
  SendItem item{m.payload, m.attributes, {}, m.priority, m.group};
  auto ids = send_items(std::span(&item, 1), SendOptions{}, nullptr, view);
  if (!ids.ok()) return ids.status();
  env->crashpoint("redrive.after_send");
  if (Status s = dead.ack(m.receipt); !s.ok()) return s;
  return ids->front();
}

Result<uint64_t> Queue::redrive(size_t max) { return redrive(max, impl_->subscription_name()); }

Result<uint64_t> Queue::redrive(size_t max, std::string_view subscription) {
  if (Status s = impl_->writable(); !s.ok()) return s;
  auto dlq = dead_letters();
  if (!dlq.ok()) return dlq.status();
  // Dead letters of another subscription than the one asked for, or of one removed since,
  // stay leased (so that the loop does not take them again) until the end, then are
  // released (their lease only: a receive count is all they keep of it).
  std::vector<uint64_t> skipped;
  auto release_skipped = [&] {
    for (uint64_t id : skipped) (void)(*dlq)->release(id);
  };
  uint64_t moved = 0;
  while (moved < max) {
    auto msgs = (*dlq)->receive(std::min<size_t>(max - moved, 256), Millis(60000));
    if (!msgs.ok()) {
      if (msgs.status().code() == Code::kEmpty) break;
      release_skipped();
      return msgs.status();
    }
    for (auto& m : *msgs) {
      if (!subscription.empty() && dead_subscription(m) != subscription) {
        skipped.push_back(m.id);
        continue;
      }
      auto id = impl_->redrive_one(**dlq, m);
      if (!id.ok() && id.status().code() == Code::kNotFound) {  // its subscription was removed
        skipped.push_back(m.id);
        continue;
      }
      if (!id.ok()) {
        release_skipped();
        return id.status();
      }
      ++moved;
    }
  }
  release_skipped();
  return moved;
}

Result<uint64_t> Queue::redrive_id(uint64_t dead_id) {
  if (Status s = impl_->writable(); !s.ok()) return s;
  auto dlq = dead_letters();
  if (!dlq.ok()) return dlq.status();
  auto m = (*dlq)->receive_id(dead_id, Millis(60000));
  if (!m.ok()) {
    if (m.status().code() == Code::kNotFound) {
      return Status(Code::kNotFound, dir() + ": no dead letter " + std::to_string(dead_id));
    }
    return m.status();
  }
  auto id = impl_->redrive_one(**dlq, *m);
  if (!id.ok()) {
    (void)(*dlq)->release(dead_id);  // (it stays a dead letter)
    if (id.status().code() == Code::kNotFound) {
      return Status(Code::kNotFound, "dead letter " + std::to_string(dead_id) + " stays: " + id.status().message());
    }
  }
  return id;
}

std::string Queue::check_index() { return impl_->check_index(); }

std::string Queue::Impl::check_index() {
  auto held = lock();
  if (!held.ok()) return held.status().to_string();
  holds(*held);
  if (std::string bad = idx.check_invariants(); !bad.empty()) return bad;
  if (view_k == 0) return "";
  auto viewed = here();
  if (!viewed.ok()) return viewed.status().to_string();
  index::SharedIndex& v = **viewed;
  v.assert_held();  // guarded by view 0's lock, held here
  if (std::string bad = v.check_invariants(); !bad.empty()) return "subscription " + view_name + "'s index: " + bad;
  return "";
}

}  // namespace spool
