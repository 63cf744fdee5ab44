// spoolfs: one spool queue as a directory (docs/filesystem.md is the user's contract).
//
//   ls MNT              ready messages, one file per id (the first --limit of them)
//   cat MNT/ID          receives that message (lease); the payload is fixed at open
//   rm MNT/ID           acks a message this mount received
//   touch MNT/ID        extends the lease of a message this mount received
//   echo x > MNT/name   sends one message when the file is released (last close)
//   MNT/.stats(.json)   queue statistics
//
// Built on the low-level libfuse API (inode based, no hidden files, no path cache) and the
// public queue API only (include/spool/queue.h): Queue::list for listings (no payloads,
// ready messages only), Queue::receive_id to lease the one message a reader opened, then
// ack, extend, send and stats. What the kernel sends for each shell command, and so the
// choices below, are in docs/filesystem.md ("How it works"); in short:
//  - every open file is direct_io and entry/attr timeouts are 0: the kernel must neither
//    serve a cached payload nor keep dentries of messages that are gone;
//  - a message is sent on RELEASE (one per open), never on FLUSH (one per close() of any
//    duplicate fd, possibly before any WRITE);
//  - rm arrives as UNLINK(parent, name) with no file handle, so acks go by name through a
//    map id -> receipt of the messages this mount received;
//  - readdir cookies are message ids, so entries acked between two READDIRs are neither
//    skipped nor repeated.
//
// Inode numbers are a pure function of what they name and are never reused (message ids
// only increase; new files take numbers from a counter), so lookup counts need no
// bookkeeping: FORGET is a no-op and a stale inode simply answers ENOENT.
//
// Threads: handlers run concurrently on fuse_session_loop_mt's workers. The Queue is
// thread-safe; SpoolFs's own maps are guarded by SpoolFs::mu_, never held across a queue call.
#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cli/output.h"
#include "cli/units.h"
#include "spool/queue.h"

namespace {

using namespace spool;
using Clock = std::chrono::steady_clock;

constexpr const char* kVersion = "spoolfs 0.1.0";

// ---------------------------------------------------------------------------------------
// Inodes.

constexpr fuse_ino_t kRootIno = FUSE_ROOT_ID;  // 1
constexpr fuse_ino_t kStatsIno = 2;
constexpr fuse_ino_t kStatsJsonIno = 3;
constexpr fuse_ino_t kMsgBase = 256;         // message id N is inode kMsgBase + N
constexpr fuse_ino_t kNewBase = 1ull << 62;  // files being written: kNewBase + counter
static_assert(sizeof(fuse_ino_t) == 8, "inode numbers must hold a message id");

bool is_msg_ino(fuse_ino_t ino) {
  return ino > kMsgBase && ino < kNewBase;
}
uint64_t msg_id(fuse_ino_t ino) {
  return ino - kMsgBase;
}

// Readdir cookies ("off"): 1 ".", 2 "..", 3 ".stats", 4 ".stats.json", then message id N
// has cookie kDirMsgBase + N. The kernel passes back the cookie of the last entry it took.
constexpr off_t kDirMsgBase = 4;

// How long after its lease ran out this mount still remembers a message it received (for a
// late rm or touch).
constexpr auto kHeldGrace = std::chrono::minutes(10);

// Canonical decimal id ("0" and leading zeros excluded, so each id has one name).
bool parse_id(std::string_view name, uint64_t* id) {
  if (name.empty() || name.size() > 19 || name[0] == '0') return false;
  uint64_t v = 0;
  for (char c : name) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *id = v;
  return true;
}

int errno_of(const Status& s) {
  switch (s.code()) {
    case Code::kOk:
      return 0;
    case Code::kEmpty:
      return EBUSY;  // exists but leased elsewhere or delayed
    case Code::kLeaseLost:
      return ESTALE;  // our lease ran out and someone else has it now
    case Code::kNotFound:
      return ENOENT;
    case Code::kInvalidArgument:
      return EINVAL;
    case Code::kTooLarge:
      return EFBIG;
    case Code::kQueueFull:
      return EAGAIN;
    case Code::kNoSpace:
      return ENOSPC;
    case Code::kReadOnly:
      return EROFS;
    default:
      return EIO;
  }
}


// ---------------------------------------------------------------------------------------
// File handles (fuse_file_info::fh). Owned by the kernel's open file: created at OPEN or
// CREATE, deleted at RELEASE.

struct Handle {
  enum class Kind { kMessage, kText, kNew } kind;
  fuse_ino_t ino = 0;
  // kMessage: the payload received at OPEN; kText: the rendering at OPEN. Immutable, so
  // READs need no lock; shared so that a READ keeps its bytes alive until its reply is
  // written, even if the RELEASE that the reply lets happen runs first on another thread.
  std::shared_ptr<const std::string> snapshot;
  // kNew: the bytes written so far (under mu).
  std::string data;
  std::mutex mu;           // kNew only
  std::string name;        // kNew: the name it was created under
  bool sent = false;       // kNew: sent by FSYNC already; RELEASE does not send again
  bool discarded = false;  // kNew: unlinked before release, or a write failed; never sent
};

Handle* handle_of(fuse_file_info* fi) {
  return reinterpret_cast<Handle*>(fi->fh);
}

// What a directory listing or GETATTR needs of a message.
struct Meta {
  uint64_t size = 0;
  uint32_t receive_count = 0;
  std::chrono::system_clock::time_point enqueued;  // the listing's time unless enqueued_known
  bool enqueued_known = false;
};

// A message this mount received and has not acked: what rm, touch and the xattrs need.
struct Held {
  std::string receipt;
  Meta meta;
  Clock::time_point lease_end;  // our estimate; the queue's clock decides
};

struct Options {
  std::string queue_dir;
  std::string mountpoint;
  Millis visibility{0};  // 0: the queue's default
  size_t limit = 1000;
  bool foreground = false;
  bool debug = false;
  std::string fuse_opts;  // passed on to libfuse
};

class SpoolFs {
 public:
  explicit SpoolFs(Options o) : opts_(std::move(o)), uid_(::getuid()), gid_(::getgid()) {}

  void attach(std::unique_ptr<Queue> q) {
    q_ = std::move(q);
    max_payload_ = q_->options().max_payload ? q_->options().max_payload : (1u << 20);
    lease_ = opts_.visibility.count() > 0 ? opts_.visibility : q_->options().visibility;
  }

  // ------------------------------------------------------------------ operations
  void lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
    if (parent != kRootIno) return (void)fuse_reply_err(req, ENOENT);
    std::string_view n(name);
    fuse_entry_param e{};
    int err = 0;
    if (n == ".stats") {
      err = attr_of(kStatsIno, &e.attr);
    } else if (n == ".stats.json") {
      err = attr_of(kStatsJsonIno, &e.attr);
    } else if (uint64_t id; parse_id(n, &id)) {
      err = attr_of(kMsgBase + id, &e.attr);
    } else {
      std::lock_guard lock(mu_);
      auto it = new_names_.find(std::string(n));
      if (it == new_names_.end()) {
        err = ENOENT;
      } else {
        fill_new_attr(it->second, &e.attr);
      }
    }
    if (err) return (void)fuse_reply_err(req, err);
    e.ino = e.attr.st_ino;
    e.generation = 1;
    e.attr_timeout = 0;
    e.entry_timeout = 0;
    fuse_reply_entry(req, &e);
  }

  void getattr(fuse_req_t req, fuse_ino_t ino) {
    struct stat st {};
    if (int err = attr_of(ino, &st)) return (void)fuse_reply_err(req, err);
    fuse_reply_attr(req, &st, 0);
  }

  void setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi) {
    constexpr int kTimes = FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_ATIME_NOW |
                           FUSE_SET_ATTR_MTIME_NOW | FUSE_SET_ATTR_CTIME;
    if (ino >= kNewBase) {
      // A file being written: truncation (shell `>` on a file just created) and times are
      // fine; ownership and mode are not ours to change.
      if (to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
        return (void)fuse_reply_err(req, EPERM);
      }
      if (to_set & FUSE_SET_ATTR_SIZE) {
        if (static_cast<uint64_t>(attr->st_size) > max_payload_)
          return (void)fuse_reply_err(req, EFBIG);
        // Without a file handle the file may be released concurrently: look it up and
        // change it under mu_.
        std::lock_guard lock(mu_);
        Handle* h = fi ? handle_of(fi) : nullptr;
        if (!h) {
          auto it = new_files_.find(ino);
          if (it == new_files_.end()) return (void)fuse_reply_err(req, ENOENT);
          h = it->second;
        }
        std::lock_guard hl(h->mu);
        h->data.resize(static_cast<size_t>(attr->st_size));
      }
      if (fi) {
        struct stat st {};
        std::lock_guard lock(mu_);
        fill_new_attr(handle_of(fi), &st);
        return (void)fuse_reply_attr(req, &st, 0);
      }
      return getattr(req, ino);
    }
    if (!is_msg_ino(ino)) return (void)fuse_reply_err(req, EPERM);
    if (to_set & FUSE_SET_ATTR_SIZE) return (void)fuse_reply_err(req, EACCES);
    if ((to_set & ~kTimes) || !(to_set & kTimes)) return (void)fuse_reply_err(req, EPERM);
    // touch: extend the lease of a message this mount holds.
    uint64_t id = msg_id(ino);
    std::string receipt;
    {
      std::lock_guard lock(mu_);
      auto it = held_.find(id);
      if (it == held_.end()) return (void)fuse_reply_err(req, exists(id) ? EPERM : ENOENT);
      receipt = it->second.receipt;
    }
    Status s = q_->extend(receipt, lease_);
    {
      std::lock_guard lock(mu_);
      auto it = held_.find(id);
      if (s.ok() && it != held_.end() && it->second.receipt == receipt) {
        it->second.lease_end = Clock::now() + lease_;
      } else if (!s.ok() && it != held_.end() && it->second.receipt == receipt) {
        held_.erase(it);  // gone or taken over: this mount no longer holds it
      }
    }
    if (!s.ok()) return (void)fuse_reply_err(req, errno_of(s));
    getattr(req, ino);
  }

  void open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    bool read_only = (fi->flags & O_ACCMODE) == O_RDONLY;
    if (ino == kStatsIno || ino == kStatsJsonIno) {
      if (!read_only) return (void)fuse_reply_err(req, EACCES);
      auto text = render_stats(ino == kStatsJsonIno);
      if (!text.ok()) return (void)fuse_reply_err(req, errno_of(text.status()));
      auto h = std::make_unique<Handle>();
      h->kind = Handle::Kind::kText;
      h->ino = ino;
      h->snapshot = std::make_shared<const std::string>(std::move(*text));
      return reply_open(req, fi, std::move(h));
    }
    if (ino >= kNewBase) return (void)fuse_reply_err(req, EBUSY);  // being written by another open
    if (!is_msg_ino(ino)) return (void)fuse_reply_err(req, EISDIR);
    // Writing to a message is refused before anything is received.
    if (!read_only || (fi->flags & O_TRUNC)) return (void)fuse_reply_err(req, EACCES);
    uint64_t id = msg_id(ino);
    {
      // One open per delivery: a second reader on this mount (a competing worker, or the
      // same one opening twice) would otherwise process the message concurrently.
      std::lock_guard lock(mu_);
      auto it = held_.find(id);
      if (it != held_.end() && it->second.lease_end > Clock::now()) {
        return (void)fuse_reply_err(req, EBUSY);
      }
    }
    // Lease exactly this message: kNotFound (ENOENT) if it is gone, kEmpty (EBUSY) if
    // another consumer holds it or it is delayed.
    auto m = q_->receive_id(id, lease_);
    if (!m.ok()) return (void)fuse_reply_err(req, errno_of(m.status()));
    auto h = std::make_unique<Handle>();
    h->kind = Handle::Kind::kMessage;
    h->ino = ino;
    {
      std::lock_guard lock(mu_);
      Held& held = held_[id];
      held.receipt = m->receipt;
      held.meta = Meta{m->payload.size(), m->receive_count, m->enqueued, true};
      held.lease_end = Clock::now() + lease_;
    }
    h->snapshot = std::make_shared<const std::string>(std::move(m->payload));
    reply_open(req, fi, std::move(h));
  }

  void create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
              fuse_file_info* fi) {
    (void)mode;
    if (parent != kRootIno) return (void)fuse_reply_err(req, ENOENT);
    std::string_view n(name);
    // Names of messages are reserved: creating one (touch of an acked message, say) is
    // ENOENT if no such message is listed, EEXIST if it is.
    uint64_t id;
    if (parse_id(n, &id)) return (void)fuse_reply_err(req, exists(id) ? EEXIST : ENOENT);
    if (n == ".stats" || n == ".stats.json") return (void)fuse_reply_err(req, EEXIST);
    // Dot files are refused so that editors' swap and backup files are not sent.
    if (n.empty() || n[0] == '.') return (void)fuse_reply_err(req, EPERM);
    // Even open(O_CREAT|O_RDONLY) makes a new file: an empty message on release.
    auto h = std::make_unique<Handle>();
    h->kind = Handle::Kind::kNew;
    h->ino = kNewBase + next_new_.fetch_add(1);
    h->name = std::string(n);
    fuse_entry_param e{};
    {
      std::lock_guard lock(mu_);
      new_files_[h->ino] = h.get();
      new_names_[h->name] = h.get();
      fill_new_attr(h.get(), &e.attr);
    }
    e.ino = h->ino;
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

  void read(fuse_req_t req, size_t size, off_t off, fuse_file_info* fi) {
    Handle* h = handle_of(fi);
    if (h->kind == Handle::Kind::kNew) return (void)fuse_reply_err(req, EBADF);
    if (off < 0) return (void)fuse_reply_err(req, EINVAL);
    size_t o = static_cast<size_t>(off);
    std::shared_ptr<const std::string> data = h->snapshot;
    if (o >= data->size()) return (void)fuse_reply_buf(req, nullptr, 0);  // EOF
    fuse_reply_buf(req, data->data() + o, std::min(size, data->size() - o));
  }

  void write(fuse_req_t req, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
    Handle* h = handle_of(fi);
    if (h->kind != Handle::Kind::kNew) return (void)fuse_reply_err(req, EBADF);
    if (off < 0) return (void)fuse_reply_err(req, EINVAL);
    uint64_t end = static_cast<uint64_t>(off) + size;
    std::lock_guard lock(h->mu);
    if (end > max_payload_) {
      // A message is all or nothing: after a refused write the file is never sent (dd and
      // cp stop at the error, but the close that follows must not send the first part).
      if (!h->discarded) {
        h->discarded = true;
        send_failures_.fetch_add(1);
      }
      return (void)fuse_reply_err(req, EFBIG);
    }
    if (h->discarded) return (void)fuse_reply_err(req, EIO);
    if (h->sent) return (void)fuse_reply_err(req, EPERM);  // already sent by fsync
    if (h->data.size() < end) h->data.resize(end);
    std::memcpy(h->data.data() + off, buf, size);
    fuse_reply_write(req, size);
  }

  // FSYNC of a new file sends it now (and makes the queue durable), so a writer that needs
  // the message queued when its command returns can have it (`dd conv=fsync`).
  void fsync(fuse_req_t req, fuse_file_info* fi) {
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
      if (int err = send(h->name, data)) {
        std::lock_guard lock(h->mu);
        h->sent = false;  // RELEASE tries again
        return (void)fuse_reply_err(req, err);
      }
    }
    Status s = q_->sync();
    fuse_reply_err(req, errno_of(s));
  }

  void release(fuse_req_t req, fuse_file_info* fi) {
    std::unique_ptr<Handle> h(handle_of(fi));
    if (h->kind == Handle::Kind::kNew) {
      // After forget_new no other request can reach h: the kernel sends nothing for this
      // open after RELEASE, and lookups no longer find it.
      forget_new(h.get());
      // RELEASE comes once per open, after the last close of every duplicate; its reply
      // goes nowhere, so a failure here can only be counted (.stats) and logged.
      if (!h->sent && !h->discarded) (void)send(h->name, h->data);
    }
    fuse_reply_err(req, 0);
  }

  void unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
    if (parent != kRootIno) return (void)fuse_reply_err(req, ENOENT);
    std::string_view n(name);
    if (n == ".stats" || n == ".stats.json") return (void)fuse_reply_err(req, EPERM);
    uint64_t id;
    if (!parse_id(n, &id)) {
      // A file being written: removing it discards it (nothing is sent).
      std::lock_guard lock(mu_);
      auto it = new_names_.find(std::string(n));
      if (it == new_names_.end()) return (void)fuse_reply_err(req, ENOENT);
      Handle* h = it->second;
      new_names_.erase(it);
      std::lock_guard hl(h->mu);
      h->discarded = true;
      return (void)fuse_reply_err(req, 0);
    }
    std::string receipt;
    {
      std::lock_guard lock(mu_);
      auto it = held_.find(id);
      if (it != held_.end()) receipt = it->second.receipt;
    }
    if (receipt.empty()) {
      // Not received through this mount: nothing to ack with.
      return (void)fuse_reply_err(req, exists(id) ? EPERM : ENOENT);
    }
    Status s = q_->ack(receipt);
    {
      std::lock_guard lock(mu_);
      auto it = held_.find(id);
      if (it != held_.end() && it->second.receipt == receipt) held_.erase(it);
      if (s.ok() || s.code() == Code::kNotFound) listing_.erase(id);
    }
    fuse_reply_err(req, errno_of(s));
  }

  void opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    if (ino != kRootIno) return (void)fuse_reply_err(req, ENOTDIR);
    fi->fh = 0;
    fi->cache_readdir = 0;
    fuse_reply_open(req, fi);
  }

  void readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
    (void)fi;
    if (ino != kRootIno) return (void)fuse_reply_err(req, ENOTDIR);
    // Each READDIR lists afresh from the cookie on: entries are keyed by id, so a message
    // acked in between is just absent, and none is repeated or skipped.
    std::vector<std::pair<uint64_t, uint64_t>> msgs;  // id, size
    if (off == 0 || off >= kDirMsgBase) {
      if (Status s = refresh(); !s.ok()) return (void)fuse_reply_err(req, errno_of(s));
      std::lock_guard lock(mu_);
      auto now = Clock::now();
      uint64_t after = off >= kDirMsgBase ? static_cast<uint64_t>(off - kDirMsgBase) : 0;
      for (auto it = listing_.upper_bound(after); it != listing_.end(); ++it) {
        auto h = held_.find(it->first);
        if (h != held_.end() && h->second.lease_end > now) continue;  // leased by us
        msgs.emplace_back(it->first, it->second.size);
      }
    }
    std::vector<char> buf(size);
    size_t used = 0;
    auto add = [&](const char* name, fuse_ino_t child, mode_t mode, off_t cookie) {
      struct stat st {};
      st.st_ino = child;
      st.st_mode = mode;
      size_t n = fuse_add_direntry(req, buf.data() + used, size - used, name, &st, cookie);
      if (n > size - used) return false;
      used += n;
      return true;
    };
    bool full = false;
    if (off < 1) full = !add(".", kRootIno, S_IFDIR, 1);
    if (!full && off < 2) full = !add("..", kRootIno, S_IFDIR, 2);
    if (!full && off < 3) full = !add(".stats", kStatsIno, S_IFREG, 3);
    if (!full && off < 4) full = !add(".stats.json", kStatsJsonIno, S_IFREG, 4);
    for (size_t i = 0; !full && i < msgs.size(); ++i) {
      std::string name = std::to_string(msgs[i].first);
      full = !add(name.c_str(), kMsgBase + msgs[i].first, S_IFREG,
                  kDirMsgBase + static_cast<off_t>(msgs[i].first));
    }
    fuse_reply_buf(req, buf.data(), used);
  }

  void getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
    std::string value;
    if (int err = xattr_value(ino, name, &value)) return (void)fuse_reply_err(req, err);
    reply_sized(req, value, size);
  }

  void listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
    std::string list;
    if (is_msg_ino(ino)) {
      std::string v;
      for (const char* n : {"user.spool.id", "user.spool.receive_count", "user.spool.enqueued_at",
                            "user.spool.receipt"}) {
        if (xattr_value(ino, n, &v) == 0) list.append(n).push_back('\0');
      }
    }
    reply_sized(req, list, size);
  }

  // ------------------------------------------------------------------ refusals
  // rename: `mv` would otherwise fall back to copy + unlink, silently receiving, re-sending
  // and acking (PITFALLS §4). Link, mknod, mkdir, symlink: a queue holds only messages.

 private:
  void reply_open(fuse_req_t req, fuse_file_info* fi, std::unique_ptr<Handle> h) {
    fi->direct_io = 1;  // every READ reaches us, whatever st_size says
    fi->keep_cache = 0;
    fi->fh = reinterpret_cast<uint64_t>(h.release());
    if (fuse_reply_open(req, fi) != 0) delete handle_of(fi);  // interrupted: no RELEASE will come
  }

  static void reply_sized(fuse_req_t req, const std::string& value, size_t size) {
    if (size == 0) return (void)fuse_reply_xattr(req, value.size());
    if (size < value.size()) return (void)fuse_reply_err(req, ERANGE);
    fuse_reply_buf(req, value.data(), value.size());
  }

  int xattr_value(fuse_ino_t ino, std::string_view name, std::string* out) {
    if (!is_msg_ino(ino)) return ENODATA;
    uint64_t id = msg_id(ino);
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
    } else {
      return ENODATA;
    }
    return 0;
  }

  // Sends the bytes of the new file `name`. Returns an errno.
  int send(const std::string& name, std::string_view data) {
    auto id = q_->send(data);
    if (!id.ok()) {
      send_failures_.fetch_add(1);
      std::fprintf(stderr, "spoolfs: sending %s (%zu bytes) failed: %s\n", name.c_str(),
                   data.size(), id.status().to_string().c_str());
      return errno_of(id.status());
    }
    sent_.fetch_add(1);
    return 0;
  }

  void forget_new(Handle* h) {
    std::lock_guard lock(mu_);
    new_files_.erase(h->ino);
    auto it = new_names_.find(h->name);
    if (it != new_names_.end() && it->second == h) new_names_.erase(it);
  }

  void fill_new_attr(Handle* h, struct stat* st) {
    std::lock_guard lock(h->mu);
    fill_reg(st, h->ino, 0600, h->data.size(), std::chrono::system_clock::now());
  }

  void fill_reg(struct stat* st, fuse_ino_t ino, mode_t perm, uint64_t size,
                std::chrono::system_clock::time_point t) {
    *st = {};
    st->st_ino = ino;
    st->st_mode = S_IFREG | perm;
    st->st_nlink = 1;
    st->st_uid = uid_;
    st->st_gid = gid_;
    st->st_size = static_cast<off_t>(size);
    st->st_blksize = 4096;
    st->st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
    st->st_mtim.tv_sec = st->st_atim.tv_sec = st->st_ctim.tv_sec =
        static_cast<time_t>(ns / 1000000000);
    st->st_mtim.tv_nsec = st->st_atim.tv_nsec = st->st_ctim.tv_nsec =
        static_cast<long>(ns % 1000000000);
  }

  int attr_of(fuse_ino_t ino, struct stat* st) {
    if (ino == kRootIno) {
      *st = {};
      st->st_ino = kRootIno;
      st->st_mode = S_IFDIR | 0700;
      st->st_nlink = 2;
      st->st_uid = uid_;
      st->st_gid = gid_;
      return 0;
    }
    if (ino == kStatsIno || ino == kStatsJsonIno) {
      auto text = render_stats(ino == kStatsJsonIno);
      if (!text.ok()) return errno_of(text.status());
      fill_reg(st, ino, 0444, text->size(), std::chrono::system_clock::now());
      return 0;
    }
    if (ino >= kNewBase) {
      Handle* h = nullptr;
      std::lock_guard lock(mu_);
      auto it = new_files_.find(ino);
      if (it == new_files_.end()) return ENOENT;
      h = it->second;
      fill_new_attr(h, st);
      return 0;
    }
    if (!is_msg_ino(ino)) return ENOENT;
    Meta meta;
    if (int err = find(msg_id(ino), &meta)) return err;
    fill_reg(st, ino, 0600, meta.size, meta.enqueued);
    return 0;
  }

  // A message's metadata: held by us, or in the listing (refreshed when stale or missing).
  int find(uint64_t id, Meta* out) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      {
        std::lock_guard lock(mu_);
        auto h = held_.find(id);
        if (h != held_.end()) {
          *out = h->second.meta;
          return 0;
        }
        bool fresh = Clock::now() - listed_at_ < std::chrono::milliseconds(200);
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

  bool exists(uint64_t id) {
    Meta m;
    return find(id, &m) == 0;
  }

  // Replaces the listing with the first opts_.limit ready messages of the queue (leased
  // and delayed ones are not listed). Queue::list reads no payloads and tells no enqueue
  // time; such files show the time of the listing until this mount receives them.
  Status refresh() {
    auto msgs = q_->list(opts_.limit, /*ready_only=*/true);
    if (!msgs.ok()) return msgs.status();
    auto now = std::chrono::system_clock::now();
    std::map<uint64_t, Meta> fresh;
    for (const MessageInfo& m : *msgs) fresh[m.id] = Meta{m.size, m.receive_count, now, false};
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

  Result<std::string> render_stats(bool json) {
    auto st = q_->stats();
    if (!st.ok()) return st.status();
    const Stats& s = *st;
    size_t held;
    {
      std::lock_guard lock(mu_);
      held = held_.size();
    }
    // The queue's part is the CLI's `spool stats` output; the mount adds its own counters.
    if (json) {
      auto j = spool::cli::stats_json(s);
      j["mount_held"] = held;
      j["mount_sent"] = sent_.load();
      j["mount_send_failures"] = send_failures_.load();
      j["listing_limit"] = opts_.limit;
      return j.dump() + "\n";
    }
    return spool::cli::human_stats(opts_.queue_dir, s) + "mount: held " + std::to_string(held) +
           ", sent " + std::to_string(sent_.load()) + ", send failures " +
           std::to_string(send_failures_.load()) + ", listing limit " + std::to_string(opts_.limit) +
           "\n";
  }

  Options opts_;
  uid_t uid_;
  gid_t gid_;
  std::unique_ptr<Queue> q_;
  uint64_t max_payload_ = 1u << 20;
  Millis lease_{30000};

  std::mutex mu_;
  std::map<uint64_t, Meta> listing_;  // id -> meta, the first opts_.limit messages
  Clock::time_point listed_at_{};
  std::unordered_map<uint64_t, Held> held_;            // received here, not acked
  std::unordered_map<fuse_ino_t, Handle*> new_files_;  // files being written, by inode
  std::map<std::string, Handle*> new_names_;           // ... and by name (the newest of a name)
  std::atomic<uint64_t> next_new_{0};
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> send_failures_{0};
};

SpoolFs* fs_of(fuse_req_t req) {
  return static_cast<SpoolFs*>(fuse_req_userdata(req));
}

// The operations table: thin trampolines onto SpoolFs.
const fuse_lowlevel_ops kOps = [] {
  fuse_lowlevel_ops o{};
  o.init = [](void* userdata, fuse_conn_info* conn) {
    (void)userdata;
    // No writeback cache: every write must reach us in order, and sizes are ours.
    conn->want &= ~static_cast<unsigned>(FUSE_CAP_WRITEBACK_CACHE);
  };
  o.lookup = [](fuse_req_t r, fuse_ino_t p, const char* n) { fs_of(r)->lookup(r, p, n); };
  o.forget = [](fuse_req_t r, fuse_ino_t, uint64_t) { fuse_reply_none(r); };
  o.getattr = [](fuse_req_t r, fuse_ino_t i, fuse_file_info*) { fs_of(r)->getattr(r, i); };
  o.setattr = [](fuse_req_t r, fuse_ino_t i, struct stat* a, int s, fuse_file_info* fi) {
    fs_of(r)->setattr(r, i, a, s, fi);
  };
  o.open = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { fs_of(r)->open(r, i, fi); };
  o.create = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m, fuse_file_info* fi) {
    fs_of(r)->create(r, p, n, m, fi);
  };
  o.read = [](fuse_req_t r, fuse_ino_t, size_t s, off_t off, fuse_file_info* fi) {
    fs_of(r)->read(r, s, off, fi);
  };
  o.write = [](fuse_req_t r, fuse_ino_t, const char* b, size_t s, off_t off, fuse_file_info* fi) {
    fs_of(r)->write(r, b, s, off, fi);
  };
  o.flush = [](fuse_req_t r, fuse_ino_t, fuse_file_info*) { fuse_reply_err(r, 0); };
  o.fsync = [](fuse_req_t r, fuse_ino_t, int, fuse_file_info* fi) { fs_of(r)->fsync(r, fi); };
  o.release = [](fuse_req_t r, fuse_ino_t, fuse_file_info* fi) { fs_of(r)->release(r, fi); };
  o.unlink = [](fuse_req_t r, fuse_ino_t p, const char* n) { fs_of(r)->unlink(r, p, n); };
  o.opendir = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { fs_of(r)->opendir(r, i, fi); };
  o.readdir = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t off, fuse_file_info* fi) {
    fs_of(r)->readdir(r, i, s, off, fi);
  };
  o.releasedir = [](fuse_req_t r, fuse_ino_t, fuse_file_info*) { fuse_reply_err(r, 0); };
  o.getxattr = [](fuse_req_t r, fuse_ino_t i, const char* n, size_t s) {
    fs_of(r)->getxattr(r, i, n, s);
  };
  o.listxattr = [](fuse_req_t r, fuse_ino_t i, size_t s) { fs_of(r)->listxattr(r, i, s); };
  o.setxattr = [](fuse_req_t r, fuse_ino_t, const char*, const char*, size_t, int) {
    fuse_reply_err(r, ENOTSUP);
  };
  o.removexattr = [](fuse_req_t r, fuse_ino_t, const char*) { fuse_reply_err(r, ENOTSUP); };
  o.rename = [](fuse_req_t r, fuse_ino_t, const char*, fuse_ino_t, const char*, unsigned) {
    fuse_reply_err(r, EPERM);
  };
  o.link = [](fuse_req_t r, fuse_ino_t, fuse_ino_t, const char*) { fuse_reply_err(r, EPERM); };
  o.symlink = [](fuse_req_t r, const char*, fuse_ino_t, const char*) { fuse_reply_err(r, EPERM); };
  o.mknod = [](fuse_req_t r, fuse_ino_t, const char*, mode_t, dev_t) { fuse_reply_err(r, EPERM); };
  o.mkdir = [](fuse_req_t r, fuse_ino_t, const char*, mode_t) { fuse_reply_err(r, EPERM); };
  o.rmdir = [](fuse_req_t r, fuse_ino_t, const char*) { fuse_reply_err(r, EPERM); };
  return o;
}();

// ---------------------------------------------------------------------------------------
// Command line.

void usage(FILE* out) {
  std::fprintf(
      out,
      "usage: spoolfs QUEUE_DIR MOUNTPOINT [-o OPT[,OPT...]] [--limit N] [-f] [-d]\n"
      "\n"
      "Mounts the spool queue in QUEUE_DIR (it must exist: spool init QUEUE_DIR) as a\n"
      "directory: ls lists messages, cat receives one, rm acks it, touch extends its\n"
      "lease, and a file written and closed in it is sent. See docs/filesystem.md.\n"
      "\n"
      "  -o visibility=DUR  lease of a message opened for reading (500ms, 30s, 5m, 2h;\n"
      "                     default: the queue's)\n"
      "  -o limit=N, --limit N\n"
      "                     list at most the first N messages (default 1000)\n"
      "  -o OPT             any other option is passed to FUSE (auto_unmount is always on)\n"
      "  -f                 stay in the foreground\n"
      "  -d                 FUSE debug output (implies -f)\n"
      "  -h, --help         this text;  -V, --version  the version\n"
      "\n"
      "Warning: any program that opens files under MOUNTPOINT receives messages (grep -r,\n"
      "indexers, backup tools). Mount in a private directory.\n");
}

bool parse_limit(std::string_view text, size_t* out) {
  uint64_t v;
  if (!parse_id(text, &v) || v > 10'000'000) return false;
  *out = static_cast<size_t>(v);
  return true;
}

// Returns an exit code >= 0 to exit with, or -1 to go on.
int parse_args(int argc, char** argv, Options* o) {
  std::vector<std::string> pos;
  auto bad = [](const std::string& msg) {
    std::fprintf(stderr, "spoolfs: %s (run 'spoolfs --help' for usage)\n", msg.c_str());
    return 64;
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else if (a == "-V" || a == "--version") {
      std::printf("%s\n", kVersion);
      return 0;
    } else if (a == "-f") {
      o->foreground = true;
    } else if (a == "-d") {
      o->debug = o->foreground = true;
    } else if (a == "--limit" || a.rfind("--limit=", 0) == 0) {
      std::string v = a == "--limit" ? (i + 1 < argc ? argv[++i] : "") : a.substr(8);
      if (!parse_limit(v, &o->limit))
        return bad("--limit needs a positive number, got '" + v + "'");
    } else if (a == "-o" || (a.rfind("-o", 0) == 0 && a.size() > 2)) {
      std::string list = a == "-o" ? (i + 1 < argc ? argv[++i] : "") : a.substr(2);
      if (list.empty()) return bad("-o needs options");
      size_t start = 0;
      while (start <= list.size()) {
        size_t comma = list.find(',', start);
        if (comma == std::string::npos) comma = list.size();
        std::string opt = list.substr(start, comma - start);
        start = comma + 1;
        if (opt.empty()) continue;
        if (opt.rfind("visibility=", 0) == 0) {
          auto d = spool::cli::parse_duration(std::string(opt.substr(11)));
          if (!d || d->count() <= 0)
            return bad("bad visibility '" + opt.substr(11) + "' (e.g. 500ms, 30s, 5m)");
          o->visibility = *d;
        } else if (opt.rfind("limit=", 0) == 0) {
          if (!parse_limit(opt.substr(6), &o->limit))
            return bad("bad limit '" + opt.substr(6) + "'");
        } else {
          if (!o->fuse_opts.empty()) o->fuse_opts += ',';
          o->fuse_opts += opt;
        }
      }
    } else if (!a.empty() && a[0] == '-') {
      return bad("unknown option '" + a + "'");
    } else {
      pos.push_back(a);
    }
  }
  if (pos.size() != 2) return bad("expected QUEUE_DIR and MOUNTPOINT");
  char real[PATH_MAX];
  if (!::realpath(pos[0].c_str(), real)) {
    return std::fprintf(stderr, "spoolfs: %s: %s\n", pos[0].c_str(), std::strerror(errno)), 1;
  }
  o->queue_dir = real;
  o->mountpoint = pos[1];
  return -1;
}

// Opens the queue, never creating one.
Result<std::unique_ptr<Queue>> open_queue(const std::string& dir) {
  QueueOptions qo;
  qo.create = false;
  return Queue::open(dir, qo);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (int rc = parse_args(argc, argv, &o); rc >= 0) return rc;

  // Check the queue before mounting, so that mistakes are reported here and not by a
  // daemon. The Queue is closed again: it must not be used across the fork of fuse_daemonize.
  {
    auto q = open_queue(o.queue_dir);
    if (!q.ok()) {
      if (q.status().code() == Code::kNotAQueue) {
        std::fprintf(
            stderr, "spoolfs: %s; spoolfs never creates a queue: create one with 'spool init %s'\n",
            q.status().message().c_str(), o.queue_dir.c_str());
      } else {
        std::fprintf(stderr, "spoolfs: cannot open queue %s: %s\n", o.queue_dir.c_str(),
                     q.status().to_string().c_str());
      }
      return 1;
    }
  }

  // auto_unmount: fusermount3 unmounts when the daemon dies, even by SIGKILL, so a crash
  // leaves no "Transport endpoint is not connected" mount behind.
  std::string mount_opts =
      "fsname=spool:" + o.queue_dir + ",subtype=spoolfs,auto_unmount,default_permissions";
  if (!o.fuse_opts.empty()) mount_opts += "," + o.fuse_opts;
  std::vector<std::string> fargs = {argv[0], "-o", mount_opts};
  if (o.debug) fargs.push_back("-d");
  std::vector<char*> fargv;
  for (auto& s : fargs) fargv.push_back(s.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(fargv.size()), fargv.data());

  SpoolFs fs(o);
  fuse_session* se = fuse_session_new(&args, &kOps, sizeof kOps, &fs);
  if (!se) {
    std::fprintf(stderr, "spoolfs: bad FUSE options '%s'\n", mount_opts.c_str());
    return 1;
  }
  int rc = 1;
  if (fuse_set_signal_handlers(se) != 0) {
    fuse_session_destroy(se);
    return 1;
  }
  if (fuse_session_mount(se, o.mountpoint.c_str()) != 0) {
    std::fprintf(stderr,
                 "spoolfs: cannot mount on %s (see the message above; is /dev/fuse "
                 "available and fusermount3 installed?)\n",
                 o.mountpoint.c_str());
  } else {
    fuse_daemonize(o.foreground ? 1 : 0);
    // Requests wait in the kernel until the loop below reads them, so none arrives before
    // the queue is attached.
    auto q = open_queue(o.queue_dir);
    if (!q.ok()) {
      std::fprintf(stderr, "spoolfs: cannot open queue %s: %s\n", o.queue_dir.c_str(),
                   q.status().to_string().c_str());
    } else {
      fs.attach(std::move(*q));
      fuse_loop_config* cfg = fuse_loop_cfg_create();
      fuse_loop_cfg_set_max_threads(cfg, 16);
      rc = fuse_session_loop_mt(se, cfg) == 0 ? 0 : 1;
      fuse_loop_cfg_destroy(cfg);
    }
    fuse_session_unmount(se);
  }
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  fuse_opt_free_args(&args);
  return rc;
}
