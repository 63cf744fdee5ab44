#include "mount.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "common.h"
#include "inode.h"

namespace spoolfs {

using spool::Code;
using spool::Queue;
using spool::Status;

namespace {

// Root readdir cookies: ".", "..", then the queue of slot s at kCookieSlotBase + s.
constexpr off_t kCookieDot = 1;
constexpr off_t kCookieDotDot = 2;
constexpr off_t kCookieSlotBase = 3;

}  // namespace

// A queue of a --root mount is its directory, told apart by device and inode: nothing a
// writer of the queue does to its files (a touch of spool.conf, say) makes it another queue.
// The slot holds the directory open (dir_fd) for as long as it serves it, so the file system
// cannot give that inode number to a queue made later under the same name.
struct Mount::QueueId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const QueueId&) const = default;
};

// Opens DIR/name if it is a queue (a directory holding a regular spool.conf); returns its
// descriptor (O_PATH) and identity, or -1.
int Mount::open_queue_dir(const std::string& dir, QueueId* id) {
  int fd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {}, conf {};
  if (::fstat(fd, &st) != 0 || ::fstatat(fd, "spool.conf", &conf, AT_SYMLINK_NOFOLLOW) != 0 ||
      !S_ISREG(conf.st_mode)) {
    ::close(fd);
    return -1;
  }
  *id = {st.st_dev, st.st_ino};
  return fd;
}

// A queue of the mount and its two views. Slots are never removed, so that inode numbers
// are never reused. In a --root mount, a queue that is removed, or replaced by another under
// the same name, makes its slot gone: its inodes answer ENOENT, its queue is closed once no
// open file uses it (files already open keep working), and a replacement gets a new slot,
// so the mount never serves a new queue through the old one's Queue object and inodes.
struct Mount::Slot {
  size_t index = 0;
  std::string dir;
  std::string subscription;  // the one this slot's Queue reads ("": the queue's own view)
  QueueId id;         // --root: which queue
  bool gone = false;  // guarded by Mount::mu_
  std::unique_ptr<QueueView> view, dlq_view;

  std::mutex mu;                         // guards the fields below
  int dir_fd = -1;                       // --root: pins the queue's directory until retired
  bool retired = false;                  // gone, and the queue given up: never reopened
  std::shared_ptr<Queue> queue;          // opened when first needed
  Queue* dlq = nullptr;                  // owned by queue; found when first needed

  ~Slot() {
    if (dir_fd >= 0) ::close(dir_fd);
  }

  spool::Result<std::shared_ptr<Queue>> open() {
    std::lock_guard lock(mu);
    if (retired) return Status(Code::kNotFound, dir + ": the queue was removed or replaced");
    if (!queue) {
      spool::QueueOptions o;
      o.create = false;
      o.subscription = subscription;
      auto q = Queue::open(dir, o);
      if (!q.ok()) return q.status();
      queue = std::move(*q);
      bind(*queue);
    }
    return queue;
  }

  // Takes `q`, just created in dir, unless the slot has opened the queue already.
  void adopt(std::unique_ptr<Queue> q) {
    std::lock_guard lock(mu);
    if (queue || retired) return;
    queue = std::move(q);
    bind(*queue);
  }

  // The dead-letter queue if it exists, else kNotFound: Queue::dead_letters() would
  // create it, and looking at .dlq must change nothing. The pointer shares the ownership
  // of the main queue, which owns it.
  spool::Result<std::shared_ptr<Queue>> dead_letters() {
    auto q = open();
    if (!q.ok()) return q.status();
    std::lock_guard lock(mu);
    if (!dlq) {
      if (::access((dir + "/dlq/spool.conf").c_str(), F_OK) != 0)
        return Status(Code::kNotFound, "no dead letters yet");
      auto d = (*q)->dead_letters();
      if (!d.ok()) return d.status();
      dlq = *d;
      bind(*dlq);
    }
    return std::shared_ptr<Queue>(*q, dlq);
  }

  // Gives the queue up after the slot went gone: waiting .next reads are answered ENOENT,
  // and the queue and its descriptors close when the last open file using it is released.
  // Without it, each replaced queue kept its descriptors for the life of the mount.
  void retire() {
    view->stop_waiting(ENOENT);
    dlq_view->stop_waiting(ENOENT);
    std::lock_guard lock(mu);
    retired = true;
    dlq = nullptr;
    queue.reset();
    if (dir_fd >= 0) ::close(dir_fd);
    dir_fd = -1;
  }

  // Binds the leases this mount takes to the spoolfs process: if it dies, or is unmounted,
  // messages read and not yet removed come back at once instead of when their leases run
  // out (docs/semantics.md). Without a binding they still come back, later.
  static void bind(Queue& q) {
    if (Status s = q.bind_leases(); !s.ok()) {
      std::fprintf(stderr,
                   "spoolfs: %s: leases not bound to spoolfs (%s); if it dies, they come back "
                   "only when they run out\n",
                   q.dir().c_str(), s.to_string().c_str());
    }
  }
};

Mount::Mount(Config cfg) : cfg_(std::move(cfg)) {
  if (!cfg_.root_mode) {
    std::lock_guard lock(mu_);
    add_slot(cfg_.dir, QueueId{});
  }
}

Mount::~Mount() = default;

Status Mount::open_single() {
  Slot* slot;
  {
    std::lock_guard lock(mu_);
    slot = slots_.at(0).get();
  }
  auto q = slot->open();
  return q.ok() ? Status() : q.status();
}

void Mount::stop_waiting(int err) {
  std::lock_guard lock(mu_);
  for (auto& s : slots_) s->view->stop_waiting(err);
}

// mu_ held.
Mount::Slot* Mount::add_slot(const std::string& dir, const QueueId& id) {
  auto slot = std::make_unique<Slot>();
  Slot* s = slot.get();
  s->index = slots_.size();
  s->dir = dir;
  s->subscription = cfg_.subscription;
  s->id = id;
  // A single-queue mount shows the queue as the mount root; a --root mount, as a child of it.
  fuse_ino_t dir_ino =
      cfg_.root_mode ? ino::make(ino::queue_view(s->index), ino::kDir) : FUSE_ROOT_ID;
  fuse_ino_t dlq_ino = ino::make(ino::dlq_view(s->index), ino::kDir);
  s->view = std::make_unique<QueueView>(
      QueueView::Config{QueueView::Kind::kQueue, ino::queue_view(s->index), dir_ino, FUSE_ROOT_ID,
                        dlq_ino, dir, cfg_.visibility, cfg_.limit},
      [s] { return s->open(); });
  s->dlq_view = std::make_unique<QueueView>(
      QueueView::Config{QueueView::Kind::kDeadLetters, ino::dlq_view(s->index), dlq_ino, dir_ino, 0,
                        dir + "/dlq", cfg_.visibility, cfg_.limit},
      [s] { return s->dead_letters(); });
  slots_.push_back(std::move(slot));
  return s;
}

Mount::Target Mount::resolve(fuse_ino_t ino) {
  if (ino == FUSE_ROOT_ID && cfg_.root_mode) return {.root = true};
  // A single-queue mount's root is the directory of slot 0's queue view.
  uint64_t view = ino == FUSE_ROOT_ID ? ino::queue_view(0) : ino::view_of(ino);
  uint64_t local = ino == FUSE_ROOT_ID ? ino::kDir : ino::local_of(ino);
  if (view < ino::queue_view(0)) return {};
  std::lock_guard lock(mu_);
  size_t index = ino::slot_of(view);
  if (index >= slots_.size() || slots_[index]->gone) return {};
  Slot* s = slots_[index].get();
  return {false, ino::is_dlq_view(view) ? s->dlq_view.get() : s->view.get(), local};
}

void Mount::dispatch(fuse_req_t req, fuse_ino_t ino,
                     const std::function<void(QueueView&, uint64_t)>& on_view,
                     const std::function<void()>& on_root) {
  Target t = resolve(ino);
  if (t.root) return on_root();
  if (!t.view) return (void)fuse_reply_err(req, ENOENT);
  on_view(*t.view, t.local);
}

// dispatch for operations on an entry of the directory `parent`.
void Mount::dispatch_dir(fuse_req_t req, fuse_ino_t parent,
                         const std::function<void(QueueView&)>& on_view,
                         const std::function<void()>& on_root) {
  dispatch(
      req, parent,
      [&](QueueView& v, uint64_t local) {
        if (local != ino::kDir) return (void)fuse_reply_err(req, ENOTDIR);
        on_view(v);
      },
      on_root);
}

// ------------------------------------------------------------------ operations

void Mount::lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  dispatch_dir(
      req, parent, [&](QueueView& v) { v.lookup(req, name); }, [&] { root_lookup(req, name); });
}

void Mount::getattr(fuse_req_t req, fuse_ino_t ino) {
  dispatch(
      req, ino, [&](QueueView& v, uint64_t local) { v.getattr(req, local); },
      [&] {
        struct stat st {};
        fill_dir(&st, FUSE_ROOT_ID);
        reply_attr(req, st);
      });
}

void Mount::setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
                    fuse_file_info* fi) {
  dispatch(
      req, ino, [&](QueueView& v, uint64_t local) { v.setattr(req, local, attr, to_set, fi); },
      [&] { fuse_reply_err(req, EPERM); });
}

void Mount::open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  dispatch(
      req, ino, [&](QueueView& v, uint64_t local) { v.open(req, local, fi); },
      [&] { fuse_reply_err(req, EISDIR); });
}

// The root of a --root mount holds only queues: files are refused.
void Mount::create(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_file_info* fi) {
  dispatch_dir(
      req, parent, [&](QueueView& v) { v.create(req, name, fi); },
      [&] { fuse_reply_err(req, EPERM); });
}

void Mount::unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  dispatch_dir(
      req, parent, [&](QueueView& v) { v.unlink(req, name); }, [&] { fuse_reply_err(req, EPERM); });
}

// Queues hold only messages: mkdir works only in the root of a --root mount.
void Mount::mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  dispatch_dir(
      req, parent, [&](QueueView&) { fuse_reply_err(req, EPERM); },
      [&] { root_mkdir(req, name, mode); });
}

void Mount::opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  dispatch(
      req, ino, [&](QueueView& v, uint64_t local) { v.opendir(req, local, fi); },
      [&] {
        fi->fh = 0;
        fi->cache_readdir = 0;
        fuse_reply_open(req, fi);
      });
}

void Mount::readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off) {
  dispatch(
      req, ino, [&](QueueView& v, uint64_t local) { v.readdir(req, local, size, off); },
      [&] { root_readdir(req, size, off); });
}

void Mount::getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  dispatch(
      req, ino, [&](QueueView& v, uint64_t local) { v.getxattr(req, local, name, size); },
      [&] { fuse_reply_err(req, ENODATA); });
}

void Mount::listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  dispatch(
      req, ino, [&](QueueView& v, uint64_t local) { v.listxattr(req, local, size); },
      [&] { reply_sized(req, "", size); });
}

// ------------------------------------------------------------------ the root of --root

// The queue DIR/name (a directory holding a spool.conf), with its slot. Returns an errno.
int Mount::find_queue(std::string_view name, Slot** out) {
  if (!queue_name_ok(name)) return ENOENT;
  std::string dir = cfg_.dir + "/" + std::string(name);
  QueueId id;
  int fd = open_queue_dir(dir, &id);
  Slot* retired = nullptr;
  int err = 0;
  {
    std::lock_guard lock(mu_);
    auto it = by_name_.find(name);
    if (it != by_name_.end() && fd >= 0 && it->second->id == id) {
      *out = it->second;
    } else {
      if (it != by_name_.end()) {
        retired = it->second;  // removed, or replaced by another queue
        retired->gone = true;
        by_name_.erase(it);
      }
      if (fd < 0) {
        err = ENOENT;
      } else if (slots_.size() >= ino::kMaxSlots) {
        err = EMFILE;  // no view numbers left (inode.h)
      } else {
        Slot* s = add_slot(dir, id);
        s->dir_fd = std::exchange(fd, -1);
        by_name_.emplace(std::string(name), s);
        *out = s;
      }
    }
  }
  if (fd >= 0) ::close(fd);
  // Outside mu_: retiring waits for the slot's .next reader to end.
  if (retired) retired->retire();
  return err;
}

void Mount::root_lookup(fuse_req_t req, std::string_view name) {
  Slot* s;
  if (int err = find_queue(name, &s)) return (void)fuse_reply_err(req, err);
  struct stat st {};
  fill_dir(&st, s->view->dir_ino());
  reply_entry(req, st);
}

// Every queue in DIR now, with its slot number (new queues get one). Returns an errno.
int Mount::scan_root(std::vector<std::pair<size_t, std::string>>* queues) {
  DIR* d = ::opendir(cfg_.dir.c_str());
  if (!d) return errno;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_type != DT_DIR && e->d_type != DT_LNK && e->d_type != DT_UNKNOWN) continue;
    Slot* s;
    if (find_queue(e->d_name, &s) == 0) queues->emplace_back(s->index, e->d_name);
  }
  ::closedir(d);
  return 0;
}

// Queues are listed in slot order, the cookie of each naming its slot: a queue that appears
// between two READDIRs has a higher slot than any listed, so none is skipped or repeated.
void Mount::root_readdir(fuse_req_t req, size_t size, off_t off) {
  std::vector<std::pair<size_t, std::string>> queues;
  if (int err = scan_root(&queues)) return (void)fuse_reply_err(req, err);
  std::sort(queues.begin(), queues.end());
  DirBuffer buf(req, size);
  if (off < kCookieDot) buf.add(".", FUSE_ROOT_ID, S_IFDIR, kCookieDot);
  if (off < kCookieDotDot) buf.add("..", FUSE_ROOT_ID, S_IFDIR, kCookieDotDot);
  for (const auto& [slot, name] : queues) {
    off_t cookie = kCookieSlotBase + static_cast<off_t>(slot);
    if (cookie <= off) continue;
    if (!buf.add(name.c_str(), ino::make(ino::queue_view(slot), ino::kDir), S_IFDIR, cookie)) break;
  }
  buf.reply();
}

// mkdir MNT/name: creates the queue DIR/name, with the default settings (spool init makes
// queues with others).
void Mount::root_mkdir(fuse_req_t req, std::string_view name, mode_t mode) {
  // Dot names are refused, like dot files in a queue: file managers make .Trash-UID.
  if (name.empty() || name[0] == '.') return (void)fuse_reply_err(req, EPERM);
  std::string dir = cfg_.dir + "/" + std::string(name);
  // mkdir(2) first: it fails with EEXIST if anything has that name, so an existing
  // directory is never turned into a queue, and of two racing mkdirs one wins.
  if (::mkdir(dir.c_str(), (mode & 0777) | 0700) != 0) return (void)fuse_reply_err(req, errno);
  spool::QueueOptions o;
  o.create = true;
  auto q = Queue::open(dir, o);
  if (!q.ok()) {
    ::rmdir(dir.c_str());  // best effort: fails, harmlessly, if the failed open left files
    return (void)fuse_reply_err(req, errno_of(q.status()));
  }
  Slot* s;
  if (int err = find_queue(name, &s)) return (void)fuse_reply_err(req, err);
  s->adopt(std::move(*q));
  struct stat st {};
  fill_dir(&st, s->view->dir_ino());
  reply_entry(req, st);
}

}  // namespace spoolfs
