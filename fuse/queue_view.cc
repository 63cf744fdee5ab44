#include "queue_view.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include <spdlog/spdlog.h>

#include "cli/output.h"
#include "common.h"
#include "inode.h"

namespace spoolfs {

using spool::Code;
using spool::Queue;
using spool::Status;
using Clock = std::chrono::steady_clock;
using SysClock = std::chrono::system_clock;

namespace {

// A message's attribute KEY is the xattr user.spool.attr.KEY (attribute keys are valid
// xattr name parts by their bounds: docs/semantics.md).
constexpr std::string_view kAttrXattr = "user.spool.attr.";
// Any bytes, as the key was sent: a group key may hold what no attribute value can name.
constexpr std::string_view kGroupXattr = "user.spool.group";
// The xattrs listxattr names when the message has them (the attributes' come after).
constexpr std::string_view kFixedXattrs[] = {"user.spool.id", "user.spool.receive_count", "user.spool.enqueued_at",
                                             "user.spool.receipt", kGroupXattr};

// How long after its lease ran out a view still remembers a message it received (for a
// late rm or touch).
constexpr auto kHeldGrace = std::chrono::minutes(10);
// How long a listing answers lookups before it is refreshed.
constexpr auto kListingFresh = std::chrono::milliseconds(200);
// An open .stats that tail -f follows grows by a rendering per change; past this it keeps
// only the newest (its offsets go on growing), so a follower left running for days does not
// grow without bound.
constexpr size_t kTextKeep = 256 * 1024;

// Readdir cookies: fixed entries first, then message N at kCookieMsgBase + N.
constexpr off_t kCookieDot = 1;
constexpr off_t kCookieDotDot = 2;
constexpr off_t kCookieStats = 3;
constexpr off_t kCookieStatsJson = 4;
constexpr off_t kCookieDlq = 5;
constexpr off_t kCookieMsgBase = 6;  // 6 was .next's, no longer listed

uint64_t payload_limit(Queue* q) {
  uint64_t max = q->options().max_payload;
  return max ? max : (1u << 20);
}

}  // namespace

// A file handle (fuse_file_info::fh). Owned by the kernel's open file: created at OPEN or
// CREATE, deleted at RELEASE.
struct QueueView::Handle {
  enum class Kind { kMessage, kText, kNext, kNew } kind;
  QueueView* view = nullptr;
  uint64_t local = 0;
  // kMessage: the payload received at OPEN. Immutable, so READs need no lock; shared so
  // that a READ keeps its bytes alive until its reply is written, even if the RELEASE that
  // the reply lets happen runs first on another thread.
  // kNext: the id line and payload of the message its first READ waited for; set once,
  // under mu, then immutable.
  std::shared_ptr<const std::string> snapshot;
  // kText, guarded by mu: the renderings so far, from file offset `base` on; the newest
  // (`last`); who opened it (only its own fstat makes it grow); whether a READ has reached
  // its end since it last grew.
  std::string log, last;
  uint64_t base = 0;
  pid_t pid = 0;
  bool caught_up = false;
  // kNew: where it goes (kept open by this file even if the mount drops its queue as
  // replaced, so that a release still sends to the queue the file was created in) and how
  // big it may grow.
  std::shared_ptr<Queue> q;
  uint64_t max_payload = 0;
  std::string name;        // kNew: the name it was created under
  std::mutex mu;           // kNew: guards the fields below
  std::string data;        // kNew: the bytes written so far
  bool sent = false;       // kNew: sent by FSYNC already; RELEASE does not send again
  bool discarded = false;  // kNew: unlinked before release, or a write failed; never sent
  int refused = EIO;       // kNew: what later writes and closes of a discarded file get
};

QueueView::Handle* QueueView::handle_of(fuse_file_info* fi) {
  return reinterpret_cast<Handle*>(fi->fh);
}

QueueView::QueueView(Config cfg, Source source)
    : cfg_(std::move(cfg)), source_(std::move(source)) {
  if (has_next()) {
    next_ = std::make_unique<NextReader>(
        [this](size_t n, spool::Millis wait) { return receive_next(n, wait); },
        [this](fuse_req_t req, void* key, size_t size, off_t off, spool::Message& m) {
          return deliver_next(req, static_cast<Handle*>(key), size, off, m);
        },
        [this](const spool::Message& m) { give_back(m); });
  }
}
QueueView::~QueueView() = default;

void QueueView::stop_waiting(int err) {
  if (next_) next_->stop(err);
}

QueueView* QueueView::owner(fuse_file_info* fi) {
  return handle_of(fi)->view;
}

spool::Millis QueueView::lease(Queue* q) const {
  return cfg_.visibility.count() > 0 ? cfg_.visibility : q->options().visibility;
}

bool QueueView::is_fixed_name(std::string_view name) const {
  if (has_stats() && (name == ".stats" || name == ".stats.json")) return true;
  if (has_next() && name == ".next") return true;
  return cfg_.dlq_ino != 0 && name == ".dlq";
}

fuse_ino_t QueueView::ino(uint64_t local) const {
  return local == ino::kDir ? cfg_.dir_ino : ino::make(cfg_.view, local);
}

// ------------------------------------------------------------------ directory entries

void QueueView::lookup(fuse_req_t req, std::string_view name) {
  struct stat st {};
  if (int err = child_attr(name, &st)) return (void)fuse_reply_err(req, err);
  reply_entry(req, st);
}

void QueueView::create(fuse_req_t req, std::string_view name, fuse_file_info* fi) {
  // Dead letters come only from their queue.
  if (cfg_.kind == Kind::kDeadLetters) return (void)fuse_reply_err(req, EPERM);
  // Names of messages are reserved: creating one is EEXIST if the message is listed, else
  // ENOTSUP, whose text ("Operation not supported") says what ENOENT did not: a message
  // cannot be sent under a name of its own (`echo x > MNT/123`, or a touch after the ack).
  if (uint64_t id; message_name(name, &id))
    return (void)fuse_reply_err(req, id && exists(id) ? EEXIST : ENOTSUP);
  if (is_fixed_name(name)) return (void)fuse_reply_err(req, EEXIST);
  // Dot files are refused so that editors' swap and backup files are not sent.
  if (name.empty() || name[0] == '.') return (void)fuse_reply_err(req, EPERM);
  auto q = queue();
  if (!q.ok()) return (void)fuse_reply_err(req, errno_of(q.status()));
  // Even open(O_CREAT|O_RDONLY) makes a new file: an empty message on release.
  auto h = std::make_unique<Handle>();
  h->kind = Handle::Kind::kNew;
  h->view = this;
  h->local = ino::kNewBase + next_new_.fetch_add(1);
  h->name = std::string(name);
  h->q = *q;
  h->max_payload = payload_limit(q->get());
  fuse_entry_param e{};
  {
    std::lock_guard lock(mu_);
    new_files_[h->local] = h.get();
    new_names_[h->name] = h.get();
    fill_new_attr(h.get(), &e.attr);
  }
  e.ino = e.attr.st_ino;
  e.generation = 1;
  fi->direct_io = 1;
  fi->keep_cache = 0;
  fi->fh = reinterpret_cast<uint64_t>(h.release());
  if (fuse_reply_create(req, &e, fi) != 0) {
    // The kernel will not send RELEASE for an open it never saw (the caller was
    // interrupted): drop the file unsent.
    forget_new(handle_of(fi));
    delete handle_of(fi);
  }
}

void QueueView::unlink(fuse_req_t req, std::string_view name) {
  if (is_fixed_name(name)) return (void)fuse_reply_err(req, EPERM);
  uint64_t id;
  if (!message_name(name, &id)) return discard_new(req, name);
  if (id == 0) return (void)fuse_reply_err(req, ENOENT);
  ack(req, id);
}

// rm of a file being written: it is discarded (nothing is sent at release).
void QueueView::discard_new(fuse_req_t req, std::string_view name) {
  std::lock_guard lock(mu_);
  auto it = new_names_.find(std::string(name));
  if (it == new_names_.end()) return (void)fuse_reply_err(req, ENOENT);
  Handle* h = it->second;
  new_names_.erase(it);
  std::lock_guard hl(h->mu);
  h->discarded = true;
  fuse_reply_err(req, 0);
}

// rm of a message: acks it with the receipt of this view's receive.
void QueueView::ack(fuse_req_t req, uint64_t id) {
  std::string receipt = receipt_of(id);
  // Not received through this mount: nothing to ack with.
  if (receipt.empty()) return (void)fuse_reply_err(req, exists(id) ? EPERM : ENOENT);
  auto q = queue();
  if (!q.ok()) return (void)fuse_reply_err(req, errno_of(q.status()));
  Status s = (*q)->ack(receipt);
  {
    std::lock_guard lock(mu_);
    auto it = held_.find(id);
    if (it != held_.end() && it->second.receipt == receipt) held_.erase(it);
    if (s.ok() || s.code() == Code::kNotFound) listing_.erase(id);
  }
  fuse_reply_err(req, errno_of(s));
}

// ------------------------------------------------------------------ inodes

void QueueView::getattr(fuse_req_t req, uint64_t local) {
  if (has_stats() && (local == ino::kStats || local == ino::kStatsJson)) return stats_attr(req, local);
  struct stat st {};
  if (int err = attr_of(local, &st)) return (void)fuse_reply_err(req, err);
  reply_attr(req, st);
}

void QueueView::setattr(fuse_req_t req, uint64_t local, struct stat* attr, int to_set,
                        fuse_file_info* fi) {
  constexpr int kTimes = FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_ATIME_NOW |
                         FUSE_SET_ATTR_MTIME_NOW | FUSE_SET_ATTR_CTIME;
  if (local >= ino::kNewBase) {
    // A file being written: truncation (the shell's `>` on a file just created) and times
    // are fine; ownership and mode are not ours to change.
    if (to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))
      return (void)fuse_reply_err(req, EPERM);
    if (to_set & FUSE_SET_ATTR_SIZE) return truncate_new(req, local, attr->st_size, fi);
    return getattr(req, local);
  }
  if (!ino::is_msg(local)) return (void)fuse_reply_err(req, EPERM);
  if (to_set & FUSE_SET_ATTR_SIZE) return (void)fuse_reply_err(req, EACCES);
  if ((to_set & ~kTimes) || !(to_set & kTimes)) return (void)fuse_reply_err(req, EPERM);
  extend_lease(req, local);  // touch
}

void QueueView::truncate_new(fuse_req_t req, uint64_t local, off_t size, fuse_file_info* fi) {
  struct stat st {};
  int err = 0;
  {
    // Without a file handle the file may be released concurrently: find it and change it
    // under mu_.
    std::lock_guard lock(mu_);
    Handle* h = fi ? handle_of(fi) : nullptr;
    if (!h) {
      auto it = new_files_.find(local);
      h = it == new_files_.end() ? nullptr : it->second;
    }
    if (!h) {
      err = ENOENT;
    } else if (size < 0 || static_cast<uint64_t>(size) > h->max_payload) {
      err = EFBIG;
    } else {
      {
        std::lock_guard hl(h->mu);
        h->data.resize(static_cast<size_t>(size));
      }
      fill_new_attr(h, &st);
    }
  }
  if (err) return (void)fuse_reply_err(req, err);
  reply_attr(req, st);
}

// touch of a message: extends the lease of a message this view holds.
void QueueView::extend_lease(fuse_req_t req, uint64_t local) {
  uint64_t id = ino::msg_id(local);
  std::string receipt = receipt_of(id);
  if (receipt.empty()) return (void)fuse_reply_err(req, exists(id) ? EPERM : ENOENT);
  auto q = queue();
  if (!q.ok()) return (void)fuse_reply_err(req, errno_of(q.status()));
  Status s = (*q)->extend(receipt, lease(q->get()));
  {
    std::lock_guard lock(mu_);
    auto it = held_.find(id);
    if (it != held_.end() && it->second.receipt == receipt) {
      if (s.ok()) {
        it->second.lease_end = Clock::now() + lease(q->get());
      } else {
        held_.erase(it);  // gone or taken over: this view no longer holds it
      }
    }
  }
  if (!s.ok()) return (void)fuse_reply_err(req, errno_of(s));
  getattr(req, local);
}

void QueueView::open(fuse_req_t req, uint64_t local, fuse_file_info* fi) {
  bool read_only = (fi->flags & O_ACCMODE) == O_RDONLY;
  if (has_stats() && (local == ino::kStats || local == ino::kStatsJson)) {
    if (!read_only) return (void)fuse_reply_err(req, EACCES);
    return open_stats(req, local, fi);
  }
  if (has_next() && local == ino::kNext) {
    if (!read_only || (fi->flags & O_TRUNC)) return (void)fuse_reply_err(req, EACCES);
    return open_next(req, fi);
  }
  if (local >= ino::kNewBase)
    return (void)fuse_reply_err(req, EBUSY);  // being written by another open
  if (local == ino::kDir) return (void)fuse_reply_err(req, EISDIR);
  if (!ino::is_msg(local)) return (void)fuse_reply_err(req, ENOENT);
  // Writing to a message is refused before anything is received.
  if (!read_only || (fi->flags & O_TRUNC)) return (void)fuse_reply_err(req, EACCES);
  uint64_t id = ino::msg_id(local);
  {
    // One open per delivery: a second reader on this mount (a competing worker, or the
    // same one opening twice) would otherwise process the message concurrently.
    std::lock_guard lock(mu_);
    auto it = held_.find(id);
    if (it != held_.end() && it->second.lease_end > Clock::now()) {
      return (void)fuse_reply_err(req, EBUSY);
    }
  }
  auto q = queue();
  if (!q.ok()) return (void)fuse_reply_err(req, errno_of(q.status()));
  // Lease exactly this message: kNotFound (ENOENT) if it is gone, kEmpty (EBUSY) if
  // another consumer holds it or it is delayed.
  spool::Millis vis = lease(q->get());
  auto m = (*q)->receive_id(id, vis);
  if (!m.ok()) return (void)fuse_reply_err(req, errno_of(m.status()));
  hold(*m, vis);
  auto h = std::make_unique<Handle>();
  h->kind = Handle::Kind::kMessage;
  h->local = local;
  h->snapshot = std::make_shared<const std::string>(std::move(m->payload));
  reply_open(req, fi, std::move(h));
}

void QueueView::open_stats(fuse_req_t req, uint64_t local, fuse_file_info* fi) {
  auto text = render_stats(local == ino::kStatsJson);
  if (!text.ok()) return (void)fuse_reply_err(req, errno_of(text.status()));
  auto h = std::make_unique<Handle>();
  h->kind = Handle::Kind::kText;
  h->local = local;
  h->last = *text;
  h->log = std::move(*text);
  h->pid = fuse_req_ctx(req)->pid;
  {
    std::lock_guard lock(mu_);
    texts_.insert(h.get());
  }
  reply_open(req, fi, std::move(h));
}

// .next opens at once; its first READ waits (read_next).
void QueueView::open_next(fuse_req_t req, fuse_file_info* fi) {
  auto h = std::make_unique<Handle>();
  h->kind = Handle::Kind::kNext;
  h->local = ino::kNext;
  reply_open(req, fi, std::move(h));
}

// GETATTR of .stats: for the process that has it open (tail -f polls with fstat), the copy
// it opened grows by a fresh rendering when the figures changed and the reader has read
// what it had. The size is then the end of that copy, so tail sees it grow and reads on from
// where it was, never "file truncated". Everyone else sees the size of a fresh rendering.
void QueueView::stats_attr(fuse_req_t req, uint64_t local) {
  auto text = render_stats(local == ino::kStatsJson);
  if (!text.ok()) return (void)fuse_reply_err(req, errno_of(text.status()));
  pid_t pid = fuse_req_ctx(req)->pid;
  uint64_t size = text->size();
  bool own = false;
  {
    std::lock_guard lock(mu_);
    for (Handle* h : texts_) {
      if (h->local != local || h->pid != pid) continue;
      std::lock_guard hl(h->mu);
      if (h->caught_up && *text != h->last) {
        h->log += *text;
        h->last = *text;
        h->caught_up = false;
        if (h->log.size() > kTextKeep) {
          h->base += h->log.size() - h->last.size();
          h->log = h->last;
        }
      }
      uint64_t end = h->base + h->log.size();
      size = own ? std::max(size, end) : end;
      own = true;
    }
  }
  struct stat st {};
  fill_reg(&st, ino(local), 0444, size, SysClock::now());
  reply_attr(req, st);
}

void QueueView::opendir(fuse_req_t req, uint64_t local, fuse_file_info* fi) {
  if (local != ino::kDir) return (void)fuse_reply_err(req, ENOTDIR);
  fi->fh = 0;
  fi->cache_readdir = 0;
  fuse_reply_open(req, fi);
}

void QueueView::readdir(fuse_req_t req, uint64_t local, size_t size, off_t off) {
  if (local != ino::kDir) return (void)fuse_reply_err(req, ENOTDIR);
  // Each READDIR lists afresh from the cookie on: entries are keyed by id, so a message
  // acked in between is just absent, and none is repeated or skipped.
  std::vector<uint64_t> ids;
  uint64_t after = off > kCookieMsgBase ? static_cast<uint64_t>(off - kCookieMsgBase) : 0;
  if (int err = listed_after(after, &ids)) return (void)fuse_reply_err(req, err);
  DirBuffer buf(req, size);
  if (off < kCookieDot) buf.add(".", cfg_.dir_ino, S_IFDIR, kCookieDot);
  if (off < kCookieDotDot) buf.add("..", cfg_.parent_ino, S_IFDIR, kCookieDotDot);
  if (has_stats() && off < kCookieStats) buf.add(".stats", ino(ino::kStats), S_IFREG, kCookieStats);
  if (has_stats() && off < kCookieStatsJson)
    buf.add(".stats.json", ino(ino::kStatsJson), S_IFREG, kCookieStatsJson);
  if (cfg_.dlq_ino != 0 && off < kCookieDlq) buf.add(".dlq", cfg_.dlq_ino, S_IFDIR, kCookieDlq);
  // .next is not listed, though it can be opened: a walk of the tree (grep -r, find -exec,
  // an indexer) would open it and wait forever on an empty queue. It is a name you open.
  for (uint64_t id : ids) {
    if (!buf.add(std::to_string(id).c_str(), ino(ino::msg_local(id)), S_IFREG,
                 kCookieMsgBase + static_cast<off_t>(id)))
      break;
  }
  buf.reply();
}

// The listed messages with ids above `after` that this view does not hold, in id order.
int QueueView::listed_after(uint64_t after, std::vector<uint64_t>* ids) {
  Status s = refresh();
  if (s.code() == Code::kNotFound) return 0;  // no queue yet: an empty directory
  if (!s.ok()) return errno_of(s);
  std::lock_guard lock(mu_);
  auto now = Clock::now();
  for (auto it = listing_.upper_bound(after); it != listing_.end(); ++it) {
    auto h = held_.find(it->first);
    if (h != held_.end() && h->second.lease_end > now) continue;  // leased by us
    ids->push_back(it->first);
  }
  return 0;
}

void QueueView::getxattr(fuse_req_t req, uint64_t local, const char* name, size_t size) {
  std::string value;
  if (int err = xattr_value(local, name, &value)) return (void)fuse_reply_err(req, err);
  reply_sized(req, value, size);
}

void QueueView::listxattr(fuse_req_t req, uint64_t local, size_t size) {
  std::string list;
  if (ino::is_msg(local)) {
    std::string v;
    for (std::string_view n : kFixedXattrs) {
      if (xattr_value(local, n, &v) == 0) list.append(n).push_back('\0');
    }
    std::lock_guard lock(mu_);
    if (auto it = held_.find(ino::msg_id(local)); it != held_.end()) {
      for (const auto& kv : it->second.meta.attributes) list.append(kAttrXattr).append(kv.first).push_back('\0');
    }
  }
  reply_sized(req, list, size);
}

// ------------------------------------------------------------------ open files

void QueueView::read(fuse_req_t req, size_t size, off_t off, fuse_file_info* fi) {
  Handle* h = handle_of(fi);
  if (h->kind == Handle::Kind::kNew) return (void)fuse_reply_err(req, EBADF);
  if (off < 0) return (void)fuse_reply_err(req, EINVAL);
  if (h->kind == Handle::Kind::kText) return read_text(req, h, size, off);
  if (h->kind == Handle::Kind::kNext) return read_next(req, h, size, off);
  std::shared_ptr<const std::string> data = h->snapshot;
  reply_slice(req, *data, size, off);
}

// Answers a READ of `size` bytes at `off` (>= 0) of `data`: empty at or past its end (EOF).
void QueueView::reply_slice(fuse_req_t req, const std::string& data, size_t size, off_t off) {
  auto o = static_cast<size_t>(off);
  if (o >= data.size()) return (void)fuse_reply_buf(req, nullptr, 0);
  fuse_reply_buf(req, data.data() + o, std::min(size, data.size() - o));
}

// `m` is now held by this view for `vis`: rm acks it, touch extends it, .stats counts it.
void QueueView::hold(const spool::Message& m, spool::Millis vis) {
  std::lock_guard lock(mu_);
  held_[m.id] = Held{m.receipt,
                     Meta{m.payload.size(), m.receive_count, m.enqueued, true, m.attributes, m.group},
                     Clock::now() + vis};
}

void QueueView::read_text(fuse_req_t req, Handle* h, size_t size, off_t off) {
  std::string part;
  {
    std::lock_guard lock(h->mu);
    auto o = static_cast<uint64_t>(off);
    // Only a follower that seeks back finds the start of a long copy gone (kTextKeep).
    if (o < h->base) return (void)fuse_reply_err(req, EIO);
    uint64_t end = h->base + h->log.size();
    if (o < end) part = h->log.substr(static_cast<size_t>(o - h->base), size);
    if (o + part.size() >= end) h->caught_up = true;
  }
  fuse_reply_buf(req, part.data(), part.size());
}

// A READ of .next before its message came waits for one in next_; after, it reads the
// message like any file (bash's `read` reads ahead and seeks back, then cat reads on).
void QueueView::read_next(fuse_req_t req, Handle* h, size_t size, off_t off) {
  std::shared_ptr<const std::string> data;
  {
    std::lock_guard lock(h->mu);
    data = h->snapshot;
  }
  if (!data) return next_->add(req, h, size, off);
  reply_slice(req, *data, size, off);
}

spool::Result<std::vector<spool::Message>> QueueView::receive_next(size_t n, spool::Millis wait) {
  auto q = queue();
  if (!q.ok()) return q.status();
  return (*q)->receive(n, lease(q->get()), wait);
}

// Called by next_'s thread: the message becomes one this view holds (rm acks it, touch
// extends it) before the reader can learn its name.
bool QueueView::deliver_next(fuse_req_t req, Handle* h, size_t size, off_t off, spool::Message& m) {
  std::shared_ptr<const std::string> data;
  bool taken = false;
  {
    std::lock_guard lock(h->mu);
    // Two READs of one open can wait at once (threads sharing the descriptor): the second
    // reads the message the first got, and this one goes back.
    if (!h->snapshot) {
      h->snapshot = std::make_shared<const std::string>(std::to_string(m.id) + "\n" + m.payload);
      taken = true;
    }
    data = h->snapshot;
  }
  if (taken) {
    auto q = queue();
    hold(m, q.ok() ? lease(q->get()) : spool::Millis{0});
  }
  reply_slice(req, *data, size, off);
  return taken;
}

void QueueView::give_back(const spool::Message& m) {
  auto q = queue();
  if (!q.ok()) return;
  if (Status s = (*q)->nack(m.receipt); !s.ok()) {
    spdlog::warn("{}: giving back message {} failed ({}); it comes back when its lease ends",
                 cfg_.label, m.id, s.to_string());
  }
}

void QueueView::forget_text(Handle* h) {
  std::lock_guard lock(mu_);
  texts_.erase(h);
}

void QueueView::write(fuse_req_t req, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
  Handle* h = handle_of(fi);
  if (h->kind != Handle::Kind::kNew) return (void)fuse_reply_err(req, EBADF);
  if (off < 0) return (void)fuse_reply_err(req, EINVAL);
  uint64_t end = static_cast<uint64_t>(off) + size;
  std::lock_guard lock(h->mu);
  if (end > h->max_payload) {
    // A message is all or nothing: after a refused write the file is never sent (dd and
    // cp stop at the error, but the close that follows must not send the first part).
    if (!h->discarded) {
      h->discarded = true;
      send_failures_.fetch_add(1);
    }
    return (void)fuse_reply_err(req, EFBIG);
  }
  if (h->discarded) return (void)fuse_reply_err(req, h->refused);
  if (h->sent) return (void)fuse_reply_err(req, EPERM);  // already sent by fsync
  if (int err = refuse_if_full(h, end)) return (void)fuse_reply_err(req, err);
  if (h->data.size() < end) h->data.resize(end);
  std::memcpy(h->data.data() + off, buf, size);
  fuse_reply_write(req, size);
}

// FSYNC of a new file sends it now (and makes the queue durable), so a writer that needs
// the message queued when its command returns can have it (`dd conv=fsync`).
void QueueView::fsync(fuse_req_t req, fuse_file_info* fi) {
  Handle* h = handle_of(fi);
  if (h->kind != Handle::Kind::kNew) return (void)fuse_reply_err(req, 0);
  std::string data;
  bool claimed = false;
  {
    // Claim the send under h->mu, send outside it (GETATTR takes h->mu under mu_).
    std::lock_guard lock(h->mu);
    if (!h->sent && !h->discarded) {
      h->sent = claimed = true;
      data = h->data;
    }
  }
  if (claimed) {
    if (int err = send(h, data)) {
      std::lock_guard lock(h->mu);
      h->sent = false;  // RELEASE tries again
      return (void)fuse_reply_err(req, err);
    }
  }
  fuse_reply_err(req, errno_of(h->q->sync()));
}

// FLUSH comes with every close() of the file (and of each duplicate), before RELEASE; its
// error is what close() returns. The message is sent only at RELEASE (queue_view.h), but a
// queue at its max_ready / max_bytes would refuse it there, where no one hears: so a full
// queue fails the close() now (EAGAIN), and the file is discarded, never sent later.
void QueueView::flush(fuse_req_t req, fuse_file_info* fi) {
  Handle* h = handle_of(fi);
  if (h->kind != Handle::Kind::kNew) return (void)fuse_reply_err(req, 0);
  std::lock_guard lock(h->mu);
  if (h->sent) return (void)fuse_reply_err(req, 0);
  if (h->discarded) return (void)fuse_reply_err(req, h->refused == EIO ? 0 : h->refused);
  fuse_reply_err(req, refuse_if_full(h, h->data.size()));
}

// Under h->mu. If the queue has a back-pressure limit and a message of `size` bytes would not
// fit now, discards the file (nothing will be sent) and returns EAGAIN; else 0. A queue
// that fills between the last close and RELEASE can still refuse the send there: that
// failure is counted (.stats) and logged (docs/filesystem.md, "Errors").
int QueueView::refuse_if_full(Handle* h, uint64_t size) {
  const spool::QueueOptions& o = h->q->options();
  if (o.max_ready == 0 && o.max_bytes == 0) return 0;
  auto st = h->q->stats();
  if (!st.ok()) return 0;  // the send at RELEASE will say what is wrong
  uint64_t waiting = st->ready + st->delayed + st->blocked;
  bool full = (o.max_ready != 0 && waiting + 1 > o.max_ready) ||
              (o.max_bytes != 0 && st->bytes + size > o.max_bytes);
  if (!full) return 0;
  h->discarded = true;
  h->refused = EAGAIN;
  send_failures_.fetch_add(1);
  spdlog::error("{} not sent to {}: the queue is full ({} messages waiting, max_ready {}; "
                "{} bytes queued, max_bytes {}); the writer was told EAGAIN",
                h->name, cfg_.label, waiting, o.max_ready, st->bytes, o.max_bytes);
  return EAGAIN;
}

void QueueView::release(fuse_req_t req, fuse_file_info* fi) {
  std::unique_ptr<Handle> h(handle_of(fi));
  if (h->kind == Handle::Kind::kText) forget_text(h.get());
  if (h->kind == Handle::Kind::kNew) {
    // After forget_new no other request can reach h: the kernel sends nothing for this
    // open after RELEASE, and lookups no longer find it.
    forget_new(h.get());
    // RELEASE comes once per open, after the last close of every duplicate; its reply
    // goes nowhere, so a failure here can only be counted (.stats) and logged.
    if (!h->sent && !h->discarded) (void)send(h.get(), h->data);
  }
  fuse_reply_err(req, 0);
}

// ------------------------------------------------------------------ helpers

void QueueView::reply_open(fuse_req_t req, fuse_file_info* fi, std::unique_ptr<Handle> h) {
  h->view = this;
  fi->direct_io = 1;  // every READ reaches us, whatever st_size says
  fi->keep_cache = 0;
  fi->fh = reinterpret_cast<uint64_t>(h.release());
  if (fuse_reply_open(req, fi) != 0) {  // interrupted: no RELEASE will come
    Handle* opened = handle_of(fi);
    if (opened->kind == Handle::Kind::kText) forget_text(opened);
    delete opened;
  }
}

std::string QueueView::receipt_of(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = held_.find(id);
  return it == held_.end() ? std::string() : it->second.receipt;
}

// The attributes of the entry `name` of this directory, or an errno.
int QueueView::child_attr(std::string_view name, struct stat* st) {
  if (has_stats() && name == ".stats") return attr_of(ino::kStats, st);
  if (has_stats() && name == ".stats.json") return attr_of(ino::kStatsJson, st);
  if (has_next() && name == ".next") return attr_of(ino::kNext, st);
  if (cfg_.dlq_ino != 0 && name == ".dlq") {
    fill_dir(st, cfg_.dlq_ino);
    return 0;
  }
  if (uint64_t id; message_name(name, &id)) return id ? attr_of(ino::msg_local(id), st) : ENOENT;
  std::lock_guard lock(mu_);
  auto it = new_names_.find(std::string(name));
  if (it == new_names_.end()) return ENOENT;
  fill_new_attr(it->second, st);
  return 0;
}

int QueueView::attr_of(uint64_t local, struct stat* st) {
  if (local == ino::kDir) {
    fill_dir(st, cfg_.dir_ino);
    return 0;
  }
  if (has_stats() && (local == ino::kStats || local == ino::kStatsJson)) {
    auto text = render_stats(local == ino::kStatsJson);
    if (!text.ok()) return errno_of(text.status());
    fill_reg(st, ino(local), 0444, text->size(), SysClock::now());
    return 0;
  }
  if (has_next() && local == ino::kNext) {
    // Its content exists only once a read has waited for it.
    fill_reg(st, ino(local), 0444, 0, SysClock::now());
    return 0;
  }
  if (local >= ino::kNewBase) {
    std::lock_guard lock(mu_);
    auto it = new_files_.find(local);
    if (it == new_files_.end()) return ENOENT;
    fill_new_attr(it->second, st);
    return 0;
  }
  if (!ino::is_msg(local)) return ENOENT;
  Meta meta;
  if (int err = find(ino::msg_id(local), &meta)) return err;
  fill_reg(st, ino(local), 0600, meta.size, meta.enqueued);
  return 0;
}

// A message's metadata: held by us, or in the listing (refreshed when stale or missing).
int QueueView::find(uint64_t id, Meta* out) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    {
      std::lock_guard lock(mu_);
      auto h = held_.find(id);
      if (h != held_.end()) {
        *out = h->second.meta;
        return 0;
      }
      bool fresh = Clock::now() - listed_at_ < kListingFresh;
      auto it = listing_.find(id);
      if (it != listing_.end() && fresh) {
        *out = it->second;
        return 0;
      }
      if (attempt == 1) return ENOENT;
    }
    if (Status s = refresh(); !s.ok()) return errno_of(s);
  }
  return ENOENT;
}

bool QueueView::exists(uint64_t id) {
  Meta m;
  return find(id, &m) == 0;
}

// Replaces the listing with the first cfg_.limit ready messages of the queue (leased and
// delayed ones are not listed). Queue::list reads no payloads; a listed file's mtime is
// the enqueue time it gives (its xattrs wait until this view receives the message).
Status QueueView::refresh() {
  auto q = queue();
  if (!q.ok()) return q.status();
  auto msgs = (*q)->list(cfg_.limit, spool::StateFilter::only(spool::MessageState::kReady));
  if (!msgs.ok()) return msgs.status();
  std::map<uint64_t, Meta> fresh;
  for (const spool::MessageInfo& m : *msgs) {
    if (m.id > ino::kMaxMsgId) break;  // no inode for it (inode.h); ids only grow
    fresh[m.id] = Meta{m.size, m.receive_count, m.enqueued, false};
  }
  std::lock_guard lock(mu_);
  listing_ = std::move(fresh);
  listed_at_ = Clock::now();
  // Forget messages held long past their lease, so a mount whose readers never rm does
  // not grow without bound. (Until then a late rm still acks, if no one received the
  // message since: the queue accepts an expired but unreplaced receipt.)
  auto horizon = listed_at_ - kHeldGrace;
  std::erase_if(held_, [&](const auto& kv) { return kv.second.lease_end < horizon; });
  return {};
}

spool::Result<std::string> QueueView::render_stats(bool json) {
  auto q = queue();
  if (!q.ok()) return q.status();
  auto st = (*q)->stats();
  if (!st.ok()) return st.status();
  size_t held;
  {
    // held_ keeps messages for a while after their leases ran out (kHeldGrace, for a late
    // rm); those are no longer held.
    std::lock_guard lock(mu_);
    auto now = Clock::now();
    held = static_cast<size_t>(
        std::count_if(held_.begin(), held_.end(), [&](const auto& kv) { return kv.second.lease_end > now; }));
  }
  // The queue's part is the CLI's `spool stats` output; the mount adds its own counters.
  if (json) {
    auto j = spool::cli::stats_json(*st);
    j["mount_held"] = held;
    j["mount_sent"] = sent_.load();
    j["mount_send_failures"] = send_failures_.load();
    j["listing_limit"] = cfg_.limit;
    return j.dump() + "\n";
  }
  return spool::cli::human_stats(cfg_.label, *st) + "mount: held " + std::to_string(held) +
         ", sent " + std::to_string(sent_.load()) + ", send failures " +
         std::to_string(send_failures_.load()) + ", listing limit " + std::to_string(cfg_.limit) +
         "\n";
}

int QueueView::xattr_value(uint64_t local, std::string_view name, std::string* out) {
  if (!ino::is_msg(local)) return ENODATA;
  uint64_t id = ino::msg_id(local);
  Meta meta;
  std::string receipt;
  {
    std::lock_guard lock(mu_);
    auto it = held_.find(id);
    if (it != held_.end()) {
      meta = it->second.meta;
      receipt = it->second.receipt;
    }
  }
  if (receipt.empty()) {
    if (int err = find(id, &meta)) return err;
  }
  if (name == "user.spool.id") {
    *out = std::to_string(id);
  } else if (name == "user.spool.receive_count") {
    *out = std::to_string(meta.receive_count);
  } else if (name == "user.spool.enqueued_at" && meta.enqueued_known) {
    *out = spool::cli::iso_time(meta.enqueued);
  } else if (name == "user.spool.receipt" && !receipt.empty()) {
    *out = receipt;
  } else if (name == kGroupXattr && !meta.group.empty()) {
    *out = meta.group;
  } else if (name.starts_with(kAttrXattr) && meta.attributes.contains(std::string(name.substr(kAttrXattr.size())))) {
    *out = meta.attributes.at(std::string(name.substr(kAttrXattr.size())));
  } else {
    return ENODATA;
  }
  return 0;
}

// Sends the bytes of the new file `h`. Returns an errno.
int QueueView::send(Handle* h, std::string_view data) {
  auto id = h->q->send(data);
  if (!id.ok()) {
    send_failures_.fetch_add(1);
    spdlog::error("sending {} ({} bytes) to {} failed: {}", h->name, data.size(),
                  cfg_.label, id.status().to_string());
    return errno_of(id.status());
  }
  sent_.fetch_add(1);
  return 0;
}

void QueueView::forget_new(Handle* h) {
  std::lock_guard lock(mu_);
  new_files_.erase(h->local);
  auto it = new_names_.find(h->name);
  if (it != new_names_.end() && it->second == h) new_names_.erase(it);
}

void QueueView::fill_new_attr(Handle* h, struct stat* st) {
  std::lock_guard lock(h->mu);
  fill_reg(st, ino(h->local), 0600, h->data.size(), SysClock::now());
}

}  // namespace spoolfs
