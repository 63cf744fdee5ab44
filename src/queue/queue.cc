// The queue: the public API over the segment log (truth) and the shared index (cache).
//
// Every state change follows one order, under the index lock: append the record to the log,
// then update the index, then (outside the lock) sync per policy. So a process that dies at
// any point leaves the log holding every change the index shows, and the repair after
// EOWNERDEAD is simply "rebuild the index from the log".
#include <dirent.h>
#include <fcntl.h>
#include "logging.h"  // spool::log()
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "index/index.h"
#include "queue/config.h"
#include "spool/queue.h"
#include "storage/log.h"
#include "sys/clock.h"
#include "sys/futex.h"

namespace spool {

using format::RecordType;
using index::Entry;
using index::State;
using storage::Pos;
using storage::Record;

namespace {

constexpr uint64_t kMaxWaitSliceNs = 1'000'000'000;  // bounded futex waits (PITFALLS §1)

uint64_t ms_to_ns(Millis m) { return m.count() <= 0 ? 0 : static_cast<uint64_t>(m.count()) * 1'000'000ull; }

// Converts a CLOCK_REALTIME instant from the log into a CLOCK_BOOTTIME key for this boot.
struct Clocks {
  uint64_t rt = sys::real_ns();
  uint64_t boot = sys::boot_ns();
  uint64_t to_key(uint64_t t_rt) const {
    if (t_rt >= rt) return boot + (t_rt - rt);
    uint64_t past = rt - t_rt;
    return past >= boot ? 0 : boot - past;
  }
};

}  // namespace

struct Queue::Impl {
  std::string dir;
  queue::Config cfg;
  bool read_only = false;
  std::unique_ptr<storage::Log> log;
  index::SharedIndex idx;
  int gate_fd = -1;
  int lock_fd = -1;
  // Test hooks (crash tests): park inside the critical section, right after taking the
  // lock or right after a send's log append, until the named file is removed.
  std::string park_path;          // SPOOL_TEST_PARK_IN_LOCK
  std::string park_append_path;   // SPOOL_TEST_PARK_AFTER_APPEND

  std::mutex dlq_mu;
  std::unique_ptr<Queue> dlq;

  std::thread flusher;
  std::mutex flush_mu;
  std::condition_variable flush_cv;
  bool stopping = false;

  ~Impl() {
    if (flusher.joinable()) {
      {
        std::lock_guard lock(flush_mu);
        stopping = true;
      }
      flush_cv.notify_all();
      flusher.join();
    }
    if (log && !read_only && cfg.opts.sync != SyncPolicy::kNever) (void)sync_to(idx.hdr().log_end);
    if (lock_fd >= 0) ::close(lock_fd);
    if (gate_fd >= 0) ::close(gate_fd);
  }

  // ---- locking -------------------------------------------------------------------------

  class Locked {
   public:
    explicit Locked(Impl* impl) : impl_(impl) {}
    Locked(Locked&& o) noexcept : impl_(std::exchange(o.impl_, nullptr)) {}
    Locked& operator=(Locked&&) = delete;
    ~Locked() {
      if (impl_ != nullptr) impl_->idx.hdr().mu.unlock();
    }

   private:
    Impl* impl_;
  };

  // The one lock path. On EOWNERDEAD the index is rebuilt from the log before the mutex is
  // marked consistent; if that fails the mutex is left unrecoverable and every user gets a
  // clear error until the last process closes the queue and the next opener rebuilds.
  Result<Locked> lock() {
    auto& mu = idx.hdr().mu;
    switch (mu.lock()) {
      case sys::RobustMutex::LockResult::kOk:
        break;
      case sys::RobustMutex::LockResult::kOwnerDied: {
        spool::log().warn("spool: {}: a process died holding the index lock; rebuilding from the log", dir);
        Status s = rebuild();
        if (!s.ok()) {
          mu.unlock();
          return Status(s.code(), "repair after a dead lock holder failed: " + s.message());
        }
        mu.mark_consistent();
        break;
      }
      case sys::RobustMutex::LockResult::kUnrecoverable:
        return Status(Code::kCorrupt, dir + ": index lock is unrecoverable after a failed repair; "
                                            "close every process using the queue, then reopen");
      case sys::RobustMutex::LockResult::kError:
        return Status(Code::kIo, dir + ": cannot lock the index");
    }
    Locked held(this);
    if (Status s = idx.refresh(); !s.ok()) return s;
    if (!park_path.empty()) park(park_path);
    return held;
  }

  static void park(const std::string& path) {
    int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
    if (fd >= 0) ::close(fd);
    while (::access(path.c_str(), F_OK) == 0) ::usleep(1000);
  }

  // ---- rebuild from the log (first opener, repair) -------------------------------------

  Status rebuild() {
    auto& h = idx.hdr();
    ++h.region_gen;  // forces every process (and us) to remap before the next access
    if (Status s = idx.refresh(); !s.ok()) return s;
    if (Status s = idx.reset(); !s.ok()) return s;
    h.next_id = 1;
    h.purged_through = 0;
    h.sent_total = h.acked_total = h.dead_total = h.bytes_live = 0;
    Clocks now;
    Status failed;
    auto drop = [&](int64_t slot) {
      Entry& e = idx.entry(static_cast<uint32_t>(slot));
      if (e.state == State::kLeased) --h.leased;
      h.bytes_live -= e.len;
      idx.erase(static_cast<uint32_t>(slot));
    };
    auto rec = log->recover([&](Pos pos, const storage::RecordView& r) {
      if (!failed.ok()) return;
      h.next_id = std::max(h.next_id, r.id + 1);
      int64_t slot = r.type == RecordType::kMsg || r.type == RecordType::kPurge ? -1 : idx.find(r.id);
      switch (r.type) {
        case RecordType::kMsg: {
          if (r.id <= h.purged_through || idx.find(r.id) >= 0) return;
          Entry e{r.id, pos.pack(), static_cast<uint32_t>(r.payload.size()), index::kNoPos, 0, State::kReady};
          auto ins = idx.insert(e, now.to_key(r.t2));
          if (!ins.ok()) failed = ins.status();
          ++h.sent_total;
          h.bytes_live += r.payload.size();
          return;
        }
        case RecordType::kLease:
          if (slot < 0) return;
          if (idx.entry(slot).state != State::kLeased) ++h.leased;
          idx.entry(slot).state = State::kLeased;
          idx.entry(slot).count = r.count;
          idx.set_key(static_cast<uint32_t>(slot), now.to_key(r.t2));
          return;
        case RecordType::kRelease:
          if (slot < 0) return;
          if (idx.entry(slot).state == State::kLeased) --h.leased;
          idx.entry(slot).state = State::kReady;
          idx.set_key(static_cast<uint32_t>(slot), now.to_key(r.t2));
          return;
        case RecordType::kAck:
          ++h.acked_total;
          if (slot >= 0) drop(slot);
          return;
        case RecordType::kDead:
          ++h.dead_total;
          if (slot >= 0) drop(slot);
          return;
        case RecordType::kPurge: {
          std::vector<uint64_t> ids;
          idx.for_each_entry([&](uint32_t, const Entry& e) {
            if (e.id <= r.id) ids.push_back(e.id);
          });
          for (uint64_t id : ids) drop(idx.find(id));
          h.purged_through = std::max(h.purged_through, r.id);
          return;
        }
      }
    });
    if (!rec.ok()) return rec.status();
    if (!failed.ok()) return failed;
    h.log_end = rec->end.pack();
    h.durable_end.store(0);
    if (!rec->corrupt.empty()) {
      spool::log().error("spool: {}: {} corrupt region(s) skipped while rebuilding the index", dir,
                    rec->corrupt.size());
    }
    return {};
  }

  // True when the log holds records the index has not seen (the index is stale).
  bool log_ahead_of_index() {
    Pos end = Pos::unpack(idx.hdr().log_end);
    auto seqs = log->segments();
    if (!seqs.ok() || seqs->empty()) return end.seq != 0;
    if (seqs->back() != end.seq) return true;
    auto seg = log->segment(end.seq);
    return !seg.ok() || (*seg)->record_at(end.off).has_value();
  }

  // ---- durability ----------------------------------------------------------------------

  Status sync_to(uint64_t end) {
    auto& h = idx.hdr();
    if (h.durable_end.load(std::memory_order_acquire) >= end) return {};
    if (h.sync_mu.lock() == sys::RobustMutex::LockResult::kOwnerDied) {
      h.sync_mu.mark_consistent();  // durable_end only ever moves after a successful sync
    }
    Status s;
    if (h.durable_end.load(std::memory_order_acquire) < end) {
      // Everything published up to now rides along: this is the group commit.
      uint64_t target = std::max(end, __atomic_load_n(&h.log_end, __ATOMIC_ACQUIRE));
      s = log->sync(Pos::unpack(target).seq);
      if (s.ok()) {
        uint64_t cur = h.durable_end.load();
        while (cur < target && !h.durable_end.compare_exchange_weak(cur, target)) {
        }
        h.last_sync_ns.store(sys::boot_ns());
      }
    }
    h.sync_mu.unlock();
    return s;
  }

  // After a write returned by the lock holder: honour the sync policy.
  Status written(uint64_t end) {
    switch (cfg.opts.sync) {
      case SyncPolicy::kAlways:
        return sync_to(end);
      case SyncPolicy::kInterval:
        if (sys::boot_ns() - idx.hdr().last_sync_ns.load() >= ms_to_ns(cfg.opts.sync_interval)) {
          return sync_to(end);
        }
        start_flusher();
        return {};
      case SyncPolicy::kNever:
        return {};
    }
    return {};
  }

  // Bounds the loss window of "interval" when writes stop: a thread that syncs what this
  // process wrote once the interval has passed.
  void start_flusher() {
    std::lock_guard lock(flush_mu);
    if (flusher.joinable() || stopping) return;
    flusher = std::thread([this] {
      std::unique_lock lk(flush_mu);
      while (!stopping) {
        flush_cv.wait_for(lk, cfg.opts.sync_interval);
        if (stopping) break;
        lk.unlock();
        uint64_t end = __atomic_load_n(&idx.hdr().log_end, __ATOMIC_ACQUIRE);
        if (Status s = sync_to(end); !s.ok()) spool::log().error("spool: {}: {}", dir, s.to_string());
        lk.lock();
      }
    });
  }

  // ---- helpers -------------------------------------------------------------------------

  Status writable() const {
    if (read_only) return Status(Code::kReadOnly, dir + ": read-only (no write permission on the queue)");
    return {};
  }

  std::string receipt(uint64_t id, uint32_t gen) const {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%" PRIu64 ".%u.%08x", id, gen, static_cast<uint32_t>(cfg.uid));
    return buf;
  }

  Result<std::pair<uint64_t, uint32_t>> parse_receipt(std::string_view r) const {
    uint64_t id = 0;
    unsigned gen = 0, tag = 0;
    int used = 0;
    std::string s(r);
    if (std::sscanf(s.c_str(), "%" SCNu64 ".%u.%8x%n", &id, &gen, &tag, &used) != 3 ||
        used != static_cast<int>(s.size()) || id == 0 || gen == 0) {
      return Status(Code::kInvalidArgument,
                    "malformed receipt '" + s + "' (expected ID.GEN.TAG as printed by receive)");
    }
    if (tag != static_cast<uint32_t>(cfg.uid)) {
      return Status(Code::kInvalidArgument, "receipt '" + s + "' belongs to another queue than " + dir);
    }
    return std::make_pair(id, static_cast<uint32_t>(gen));
  }

  // Finds the entry a receipt names and checks its fence. Lock held.
  Result<uint32_t> fenced(uint64_t id, uint32_t gen) {
    int64_t slot = idx.find(id);
    if (slot < 0) {
      return Status(Code::kNotFound, "message " + std::to_string(id) +
                                         " is not in the queue (already acked, dead-lettered or purged)");
    }
    const Entry& e = idx.entry(static_cast<uint32_t>(slot));
    if (e.count != gen) {
      return Status(Code::kLeaseLost,
                    "lease lost: message " + std::to_string(id) + " was received again (delivery " +
                        std::to_string(e.count) + "; this receipt is for delivery " +
                        std::to_string(gen) + ")");
    }
    return static_cast<uint32_t>(slot);
  }

  Result<Pos> append(std::span<const Record> recs) {
    auto res = log->append(Pos::unpack(idx.hdr().log_end), recs, idx.hdr().next_id);
    if (!res.ok()) return res.status();
    __atomic_store_n(&idx.hdr().log_end, res->end.pack(), __ATOMIC_RELEASE);
    return res->at.empty() ? res->end : res->at.front();
  }

  void wake() {
    auto& h = idx.hdr();
    h.wake_seq.fetch_add(1, std::memory_order_release);
    if (h.waiters.load(std::memory_order_acquire) > 0) sys::futex_wake_all(&h.wake_seq);
  }

  Result<Message> load(const Entry& e) {
    std::shared_ptr<storage::Segment> keep;
    auto r = log->read(Pos::unpack(e.loc), &keep);
    if (!r.ok()) return r.status();
    if (r->id != e.id || r->type != RecordType::kMsg) {
      return Status(Code::kCorrupt, "index points at the wrong record for message " + std::to_string(e.id));
    }
    Message m;
    m.id = e.id;
    m.payload.assign(r->payload);
    m.receive_count = e.count;
    m.enqueued = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::nanoseconds(r->t1)));
    return m;
  }

  Result<Queue*> dead_letters() {
    std::lock_guard lock(dlq_mu);
    if (!dlq) {
      QueueOptions o = cfg.opts;
      o.max_receives = 0;
      o.create = !read_only;
      auto q = Queue::open(dir + "/dlq", o);
      if (!q.ok()) return q.status();
      dlq = std::move(q).value();
    }
    return dlq.get();
  }
};

// ---- Queue ---------------------------------------------------------------------------------

Queue::Queue(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Queue::~Queue() = default;
const std::string& Queue::dir() const { return impl_->dir; }
const QueueOptions& Queue::options() const { return impl_->cfg.opts; }

uint64_t Stats::workers_needed(double rate_per_worker, double latency_target_s) const {
  if (ready == 0) return 0;
  double per_worker = rate_per_worker * latency_target_s;
  if (per_worker <= 0) return ready;
  return static_cast<uint64_t>(std::ceil(static_cast<double>(ready) / per_worker));
}

namespace {

Status validate(QueueOptions& o) {
  if (o.visibility.count() <= 0) return Status(Code::kInvalidArgument, "visibility must be > 0");
  if (o.sync_interval.count() <= 0) return Status(Code::kInvalidArgument, "sync interval must be > 0");
  if (o.segment_size < format::kMinSegmentSize || o.segment_size >= (1ull << 40)) {
    return Status(Code::kInvalidArgument, "segment size must be between 4 KiB and 1 TiB");
  }
  uint64_t room = ((o.segment_size - format::kSegmentHeaderSize) & ~7ull) - format::kRecordHeaderSize;
  if (o.max_payload == 0) o.max_payload = std::min<uint64_t>(1ull << 20, room);
  if (o.max_payload > room || o.max_payload > UINT32_MAX) {
    return Status(Code::kInvalidArgument, "max payload " + std::to_string(o.max_payload) +
                                              " does not fit a segment of " + std::to_string(o.segment_size) +
                                              " bytes (at most " + std::to_string(room) + ")");
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

Result<std::unique_ptr<Queue>> Queue::open(const std::string& dir_in, const QueueOptions& opts) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  if (opts.create && ::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST) {
    return errno_status(errno, "create queue directory " + dir);
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status(Code::kNotAQueue, dir + ": no such queue");
    return errno_status(errno, "open queue " + dir);
  }
  if (!S_ISDIR(st.st_mode)) return Status(Code::kNotAQueue, dir + ": not a directory, so not a queue");
  impl->read_only = ::access(dir.c_str(), W_OK) != 0;

  // The gate serialises attach/detach decisions; see "First opener" in docs/durability.md.
  if (!impl->read_only) {
    impl->gate_fd = ::open((dir + "/gate").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (impl->gate_fd < 0) return errno_status(errno, "open " + dir + "/gate");
    while (::flock(impl->gate_fd, LOCK_EX) != 0) {
      if (errno != EINTR) return errno_status(errno, "lock " + dir + "/gate");
    }
  }
  struct GateRelease {
    int fd;
    ~GateRelease() {
      if (fd >= 0) ::flock(fd, LOCK_UN);
    }
  } gate_release{impl->gate_fd};

  auto cfg = queue::read_config(dir);
  if (!cfg.ok() && cfg.status().code() == Code::kNotFound) {
    if (impl->read_only || !opts.create) return Status(Code::kNotAQueue, dir + ": not a spool queue (no spool.conf)");
    if (has_foreign_files(dir)) {
      return Status(Code::kNotAQueue, dir + " holds other files and is not a spool queue; "
                                            "use an empty or new directory");
    }
    queue::Config c;
    c.opts = opts;
    if (Status s = validate(c.opts); !s.ok()) return s;
    while (c.uid == 0) {
      if (::getrandom(&c.uid, sizeof c.uid, 0) != sizeof c.uid) c.uid = sys::real_ns();
    }
    if (Status s = queue::write_config(dir, c); !s.ok()) return s;
    cfg = c;
  }
  if (!cfg.ok()) return cfg.status();
  impl->cfg = *cfg;
  impl->cfg.opts.create = opts.create;

  storage::LogOptions lo;
  lo.segment_size = impl->cfg.opts.segment_size;
  lo.sync_on_roll = impl->cfg.opts.sync != SyncPolicy::kNever;
  lo.read_only = impl->read_only;
  auto log = storage::Log::open(dir + "/segments", lo);
  if (!log.ok()) return log.status();
  impl->log = std::move(log).value();

  if (const char* park = std::getenv("SPOOL_TEST_PARK_IN_LOCK")) impl->park_path = park;
  if (const char* park = std::getenv("SPOOL_TEST_PARK_AFTER_APPEND")) impl->park_append_path = park;

  if (impl->read_only) {
    // No write access: replay the log into a private index; nothing can change state.
    if (Status s = impl->idx.attach("", true, true); !s.ok()) return s;
    auto held = impl->lock();
    if (!held.ok()) return held.status();
    if (Status s = impl->rebuild(); !s.ok()) return s;
    return std::unique_ptr<Queue>(new Queue(std::move(impl)));
  }

  impl->lock_fd = ::open((dir + "/lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (impl->lock_fd < 0) return errno_status(errno, "open " + dir + "/lock");
  bool first = ::flock(impl->lock_fd, LOCK_EX | LOCK_NB) == 0;
  std::string index_path = dir + "/index";
  if (first) {
    // Nobody else is attached: reuse the index only if it is intact, from this boot, and
    // not behind the log; otherwise start it afresh (this also re-creates the mutexes,
    // which after a reboot would be locked forever).
    bool reuse = impl->idx.attach(index_path, false).ok();
    if (reuse) {
      auto held = impl->lock();
      reuse = held.ok() && !impl->log_ahead_of_index();
    }
    if (!reuse) {
      impl->idx.~SharedIndex();
      new (&impl->idx) index::SharedIndex();
      if (Status s = impl->idx.attach(index_path, true); !s.ok()) return s;
      auto held = impl->lock();
      if (!held.ok()) return held.status();
      if (Status s = impl->rebuild(); !s.ok()) return s;
    }
  } else {
    while (::flock(impl->lock_fd, LOCK_SH) != 0) {
      if (errno != EINTR) return errno_status(errno, "lock " + dir + "/lock");
    }
    if (Status s = impl->idx.attach(index_path, false); !s.ok()) return s;
  }
  if (first && ::flock(impl->lock_fd, LOCK_SH) != 0) return errno_status(errno, "lock " + dir + "/lock");
  return std::unique_ptr<Queue>(new Queue(std::move(impl)));
}

Result<uint64_t> Queue::send(std::string_view payload, Millis delay) {
  auto ids = send_batch(std::span(&payload, 1), delay);
  if (!ids.ok()) return ids.status();
  return ids->front();
}

Result<std::vector<uint64_t>> Queue::send_batch(std::span<const std::string_view> payloads, Millis delay) {
  Impl& q = *impl_;
  if (Status s = q.writable(); !s.ok()) return s;
  if (payloads.empty()) return std::vector<uint64_t>{};
  for (auto p : payloads) {
    if (p.size() > q.cfg.opts.max_payload) {
      return Status(Code::kTooLarge, "message of " + std::to_string(p.size()) +
                                         " bytes exceeds the queue's max_payload of " +
                                         std::to_string(q.cfg.opts.max_payload) + " bytes");
    }
  }
  Clocks now;
  uint64_t d = ms_to_ns(delay);
  uint64_t end;
  std::vector<uint64_t> ids;
  {
    auto held = q.lock();
    if (!held.ok()) return held.status();
    auto& h = q.idx.hdr();
    std::vector<Record> recs;
    recs.reserve(payloads.size());
    for (size_t i = 0; i < payloads.size(); ++i) {
      recs.push_back(Record{RecordType::kMsg, 0, h.next_id + i, now.rt, now.rt + d, payloads[i]});
    }
    auto res = q.log->append(Pos::unpack(h.log_end), recs, h.next_id);
    if (!res.ok()) return res.status();
    if (!q.park_append_path.empty()) Impl::park(q.park_append_path);
    for (size_t i = 0; i < recs.size(); ++i) {
      Entry e{recs[i].id, res->at[i].pack(), static_cast<uint32_t>(payloads[i].size()), index::kNoPos, 0,
              State::kReady};
      if (auto ins = q.idx.insert(e, now.boot + d); !ins.ok()) {
        // The log already holds the messages; only the index could not grow. Rebuilding
        // from the log keeps the two in step (the messages stay queued).
        __atomic_store_n(&h.log_end, res->end.pack(), __ATOMIC_RELEASE);
        h.next_id += recs.size();
        (void)q.rebuild();
        return ins.status();
      }
      ids.push_back(recs[i].id);
      h.bytes_live += payloads[i].size();
    }
    h.next_id += recs.size();
    h.sent_total += recs.size();
    __atomic_store_n(&h.log_end, res->end.pack(), __ATOMIC_RELEASE);
    end = res->end.pack();
    if (d == 0) q.wake();
  }
  if (Status s = q.written(end); !s.ok()) return s;
  return ids;
}

Result<std::vector<Message>> Queue::receive(size_t max, Millis visibility, Millis wait) {
  Impl& q = *impl_;
  if (Status s = q.writable(); !s.ok()) return s;
  if (max == 0) return Status(Code::kInvalidArgument, "receive of 0 messages");
  if (visibility.count() < 0 || wait.count() < 0) {
    return Status(Code::kInvalidArgument, "visibility and wait must not be negative");
  }
  uint64_t vis = ms_to_ns(visibility.count() == 0 ? q.cfg.opts.visibility : visibility);
  const uint64_t give_up = sys::boot_ns() + ms_to_ns(wait);
  auto& h = q.idx.hdr();
  for (;;) {
    std::vector<Message> out;
    uint64_t end = 0;
    uint64_t next_key = UINT64_MAX;
    uint32_t seen;
    {
      auto held = q.lock();
      if (!held.ok()) return held.status();
      seen = h.wake_seq.load(std::memory_order_acquire);
      Clocks now;
      std::vector<uint32_t> slots;
      while (out.size() < max && !q.idx.heap_empty() && q.idx.heap_top().key <= now.boot) {
        uint32_t slot = q.idx.heap_top().slot;
        Entry& e = q.idx.entry(slot);
        auto msg = q.load(e);
        bool poison = q.cfg.opts.max_receives != 0 && e.count >= q.cfg.opts.max_receives;
        if (poison || !msg.ok()) {
          std::string body = msg.ok() ? std::move(msg->payload)
                                      : "spool: message " + std::to_string(e.id) +
                                            " could not be read: " + msg.status().to_string();
          if (!msg.ok()) spool::log().error("spool: {}: {}", q.dir, body);
          auto dlq = q.dead_letters();
          if (!dlq.ok()) return dlq.status();
          if (auto sent = (*dlq)->send(body); !sent.ok()) return sent.status();
          Record dead{RecordType::kDead, e.count, e.id, 0, 0, {}};
          auto at = q.append(std::span(&dead, 1));
          if (!at.ok()) return at.status();
          if (e.state == State::kLeased) --h.leased;
          h.bytes_live -= e.len;
          ++h.dead_total;
          q.idx.erase(slot);
          end = h.log_end;
          continue;
        }
        // Lease it now (the record is written below, in one batch with the others).
        if (e.state != State::kLeased) ++h.leased;
        e.state = State::kLeased;
        ++e.count;
        q.idx.set_key(slot, now.boot + vis);
        msg->receive_count = e.count;
        msg->receipt = q.receipt(e.id, e.count);
        out.push_back(std::move(*msg));
        slots.push_back(slot);
      }
      if (!out.empty()) {
        std::vector<Record> recs;
        for (const auto& m : out) recs.push_back(Record{RecordType::kLease, m.receive_count, m.id, 0, now.rt + vis, {}});
        auto at = q.append(recs);
        if (!at.ok()) {
          // The leases are not in the log: undo them in the index (rebuild = log's truth).
          (void)q.rebuild();
          return at.status();
        }
        end = h.log_end;
      }
      if (!q.idx.heap_empty()) next_key = q.idx.heap_top().key;
    }
    if (end != 0) {
      if (Status s = q.written(end); !s.ok()) return s;
    }
    if (!out.empty()) return out;
    uint64_t now = sys::boot_ns();
    if (now >= give_up) return Status(Code::kEmpty, "no message ready in " + q.dir);
    uint64_t until = std::min(give_up, next_key);
    uint64_t slice = std::min(until > now ? until - now : 0, kMaxWaitSliceNs);
    if (slice == 0) continue;
    h.waiters.fetch_add(1);
    sys::futex_wait(&h.wake_seq, seen, slice);
    h.waiters.fetch_sub(1);
  }
}

namespace {
enum class Change { kAck, kNack, kExtend };
}

static Status change(Queue::Impl& q, std::string_view receipt, Change what, uint64_t ns) {
  if (Status s = q.writable(); !s.ok()) return s;
  auto r = q.parse_receipt(receipt);
  if (!r.ok()) return r.status();
  auto [id, gen] = *r;
  uint64_t end;
  {
    auto held = q.lock();
    if (!held.ok()) return held.status();
    auto slot = q.fenced(id, gen);
    if (!slot.ok()) return slot.status();
    auto& h = q.idx.hdr();
    Entry& e = q.idx.entry(*slot);
    Clocks now;
    Record rec{RecordType::kAck, gen, id, 0, 0, {}};
    if (what == Change::kNack) rec = {RecordType::kRelease, gen, id, 0, now.rt + ns, {}};
    if (what == Change::kExtend) rec = {RecordType::kLease, gen, id, 0, now.rt + ns, {}};
    auto at = q.append(std::span(&rec, 1));
    if (!at.ok()) return at.status();
    bool was_leased = e.state == State::kLeased;
    switch (what) {
      case Change::kAck:
        if (was_leased) --h.leased;
        h.bytes_live -= e.len;
        ++h.acked_total;
        q.idx.erase(*slot);
        break;
      case Change::kNack:
        if (was_leased) --h.leased;
        e.state = State::kReady;
        q.idx.set_key(*slot, now.boot + ns);
        if (ns == 0) q.wake();
        break;
      case Change::kExtend:
        if (!was_leased) ++h.leased;
        e.state = State::kLeased;
        q.idx.set_key(*slot, now.boot + ns);
        break;
    }
    end = h.log_end;
  }
  return q.written(end);
}

Status Queue::ack(std::string_view receipt) { return change(*impl_, receipt, Change::kAck, 0); }
Status Queue::nack(std::string_view receipt, Millis delay) {
  return change(*impl_, receipt, Change::kNack, ms_to_ns(delay));
}
Status Queue::extend(std::string_view receipt, Millis visibility) {
  if (visibility.count() <= 0) return Status(Code::kInvalidArgument, "extend needs a visibility > 0");
  return change(*impl_, receipt, Change::kExtend, ms_to_ns(visibility));
}

Result<std::vector<Message>> Queue::peek(size_t max) {
  Impl& q = *impl_;
  auto held = q.lock();
  if (!held.ok()) return held.status();
  std::vector<std::pair<uint64_t, uint32_t>> ids;
  q.idx.for_each_entry([&](uint32_t slot, const Entry& e) { ids.emplace_back(e.id, slot); });
  size_t n = std::min(max, ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(n), ids.end());
  std::vector<Message> out;
  for (size_t i = 0; i < n; ++i) {
    auto m = q.load(q.idx.entry(ids[i].second));
    if (!m.ok()) return m.status();
    out.push_back(std::move(*m));
  }
  return out;
}

Result<uint64_t> Queue::purge() {
  Impl& q = *impl_;
  if (Status s = q.writable(); !s.ok()) return s;
  uint64_t n, end;
  {
    auto held = q.lock();
    if (!held.ok()) return held.status();
    auto& h = q.idx.hdr();
    Record rec{RecordType::kPurge, 0, h.next_id - 1, 0, 0, {}};
    if (h.next_id == 1) return uint64_t{0};
    auto at = q.append(std::span(&rec, 1));
    if (!at.ok()) return at.status();
    n = h.count;
    h.purged_through = h.next_id - 1;
    h.leased = 0;
    h.bytes_live = 0;
    if (Status s = q.idx.reset(); !s.ok()) return s;
    h.heap_size = 0;
    end = h.log_end;
  }
  if (Status s = q.written(end); !s.ok()) return s;
  return n;
}

Result<Stats> Queue::stats() {
  Impl& q = *impl_;
  Stats st;
  {
    auto held = q.lock();
    if (!held.ok()) return held.status();
    auto& h = q.idx.hdr();
    uint64_t now = sys::boot_ns();
    uint64_t oldest_id = UINT64_MAX;
    uint32_t oldest_slot = 0;
    const index::HeapItem* items = q.idx.heap_begin();
    for (uint64_t i = 0; i < q.idx.heap_size(); ++i) {
      const Entry& e = q.idx.entry(items[i].slot);
      if (items[i].key <= now) {
        ++st.ready;
        if (e.id < oldest_id) {
          oldest_id = e.id;
          oldest_slot = items[i].slot;
        }
      } else if (e.state == State::kLeased) {
        ++st.in_flight;
      } else {
        ++st.delayed;
      }
    }
    if (oldest_id != UINT64_MAX) {
      if (auto m = q.load(q.idx.entry(oldest_slot)); m.ok()) {
        st.oldest_ready_age_s = std::max(0.0, std::chrono::duration<double>(
                                                  std::chrono::system_clock::now() - m->enqueued).count());
      }
    }
    st.sent_total = h.sent_total;
    st.acked_total = h.acked_total;
    st.dead_lettered_total = h.dead_total;
    st.next_id = h.next_id;
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
    auto dlq = q.dead_letters();
    if (dlq.ok()) {
      auto ds = (*dlq)->stats();
      if (ds.ok()) st.dead = ds->ready + ds->in_flight + ds->delayed;
    }
  }
  return st;
}

Status Queue::sync() {
  if (impl_->read_only) return {};
  return impl_->sync_to(__atomic_load_n(&impl_->idx.hdr().log_end, __ATOMIC_ACQUIRE));
}

Result<Queue*> Queue::dead_letters() { return impl_->dead_letters(); }

Result<uint64_t> Queue::redrive(size_t max) {
  if (Status s = impl_->writable(); !s.ok()) return s;
  auto dlq = dead_letters();
  if (!dlq.ok()) return dlq.status();
  uint64_t moved = 0;
  while (moved < max) {
    auto msgs = (*dlq)->receive(std::min<size_t>(max - moved, 256), Millis(60000));
    if (!msgs.ok()) {
      if (msgs.status().code() == Code::kEmpty) break;
      return msgs.status();
    }
    for (auto& m : *msgs) {
      // Send first, then ack: a crash in between duplicates, never loses.
      if (auto id = send(m.payload); !id.ok()) return id.status();
      if (Status s = (*dlq)->ack(m.receipt); !s.ok()) return s;
      ++moved;
    }
  }
  return moved;
}

std::string Queue::check_index() {
  auto held = impl_->lock();
  if (!held.ok()) return held.status().to_string();
  return impl_->idx.check_invariants();
}

}  // namespace spool
