// spoolfs: spool queues as directories (docs/filesystem.md is the user's contract).
//
//   spoolfs QUEUE_DIR MNT          the queue is MNT (queue_view.h: ls, cat, rm, touch, ...)
//   spoolfs --root DIR MNT         every queue in DIR is MNT/name; mkdir MNT/name makes one
//
// This file is the command line, the FUSE operations table and the session. The rest:
// inode.h (inode numbers), mount.h (which view owns an inode; the --root directory),
// queue_view.h (one queue, or its dead-letter queue, as a directory), common.h (shared
// helpers), dead_mount.h (a mount left behind by a killed spoolfs). Built on the low-level
// libfuse API (inode based, no hidden files, no path cache) and the public queue API only.
#include <dirent.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "cli/std_fds.h"
#include "cli/units.h"
#include "common.h"
#include "daemon_log.h"
#include "dead_mount.h"
#include "mount.h"
#include "queue_view.h"
#include "spool/queue.h"

namespace {

using spool::Code;
using spool::Queue;
using spoolfs::Mount;
using spoolfs::QueueView;

constexpr const char* kVersion = "spoolfs 0.1.0";

struct Options {
  Mount::Config mount;
  std::string mountpoint;
  bool foreground = false;
  bool debug = false;
  std::string fuse_opts;  // passed on to libfuse
  std::string log_file;   // --log: the daemon's messages go here, not to syslog
};

Mount* mount_of(fuse_req_t req) {
  return static_cast<Mount*>(fuse_req_userdata(req));
}

// The operations table: thin trampolines onto Mount, or onto the view that made an open
// file. What is refused everywhere is refused here:
//  - rename: `mv` would otherwise fall back to copy + unlink, silently receiving,
//    re-sending and acking;
//  - link, symlink, mknod: a queue holds only messages;
//  - rmdir: removing a queue (every message in it) by rmdir is too easy to do by accident
//    (rm -r, a file manager); `rm -rf DIR/name` on the real directory does it on purpose.
const fuse_lowlevel_ops kOps = [] {
  fuse_lowlevel_ops o{};
  o.init = [](void* userdata, fuse_conn_info* conn) {
    (void)userdata;
    // No writeback cache: every write must reach us in order, and sizes are ours.
    conn->want &= ~static_cast<unsigned>(FUSE_CAP_WRITEBACK_CACHE);
  };
  o.lookup = [](fuse_req_t r, fuse_ino_t p, const char* n) { mount_of(r)->lookup(r, p, n); };
  // Inode numbers need no lookup counts (inode.h).
  o.forget = [](fuse_req_t r, fuse_ino_t, uint64_t) { fuse_reply_none(r); };
  o.getattr = [](fuse_req_t r, fuse_ino_t i, fuse_file_info*) { mount_of(r)->getattr(r, i); };
  o.setattr = [](fuse_req_t r, fuse_ino_t i, struct stat* a, int s, fuse_file_info* fi) {
    mount_of(r)->setattr(r, i, a, s, fi);
  };
  o.open = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { mount_of(r)->open(r, i, fi); };
  o.create = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t, fuse_file_info* fi) {
    mount_of(r)->create(r, p, n, fi);
  };
  o.read = [](fuse_req_t r, fuse_ino_t, size_t s, off_t off, fuse_file_info* fi) {
    QueueView::owner(fi)->read(r, s, off, fi);
  };
  o.write = [](fuse_req_t r, fuse_ino_t, const char* b, size_t s, off_t off, fuse_file_info* fi) {
    QueueView::owner(fi)->write(r, b, s, off, fi);
  };
  // FLUSH (every close()) sends nothing, a new file is sent on RELEASE (queue_view.h), but
  // it is where a full queue fails the writer's close() with EAGAIN.
  o.flush = [](fuse_req_t r, fuse_ino_t, fuse_file_info* fi) { QueueView::owner(fi)->flush(r, fi); };
  o.fsync = [](fuse_req_t r, fuse_ino_t, int, fuse_file_info* fi) {
    QueueView::owner(fi)->fsync(r, fi);
  };
  o.release = [](fuse_req_t r, fuse_ino_t, fuse_file_info* fi) {
    QueueView::owner(fi)->release(r, fi);
  };
  o.unlink = [](fuse_req_t r, fuse_ino_t p, const char* n) { mount_of(r)->unlink(r, p, n); };
  o.mkdir = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m) {
    mount_of(r)->mkdir(r, p, n, m);
  };
  o.opendir = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) {
    mount_of(r)->opendir(r, i, fi);
  };
  o.readdir = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t off, fuse_file_info*) {
    mount_of(r)->readdir(r, i, s, off);
  };
  o.releasedir = [](fuse_req_t r, fuse_ino_t, fuse_file_info*) { fuse_reply_err(r, 0); };
  o.getxattr = [](fuse_req_t r, fuse_ino_t i, const char* n, size_t s) {
    mount_of(r)->getxattr(r, i, n, s);
  };
  o.listxattr = [](fuse_req_t r, fuse_ino_t i, size_t s) { mount_of(r)->listxattr(r, i, s); };
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
  o.rmdir = [](fuse_req_t r, fuse_ino_t, const char*) { fuse_reply_err(r, EPERM); };
  return o;
}();

// ---------------------------------------------------------------------------------------
// Command line.

void usage(FILE* out) {
  std::fprintf(
      out,
      "usage: spoolfs QUEUE_DIR MOUNTPOINT [--sub NAME] [-o OPT[,OPT...]] [--limit N] [--log FILE] [-f] [-d]\n"
      "       spoolfs --root DIR MOUNTPOINT [...]\n"
      "\n"
      "Mounts the spool queue in QUEUE_DIR (it must exist: spool init QUEUE_DIR) as a\n"
      "directory on MOUNTPOINT (an empty directory, else refused): ls lists messages, cat receives one, rm acks it, touch extends its\n"
      "lease, and a file written and closed in it is sent. .dlq holds the dead letters.\n"
      "Reading .next waits for a message and receives it: its id on the first line, then\n"
      "the payload (rm MOUNTPOINT/ID acks it). .stats follows changes under tail -f.\n"
      "With --root, every queue in DIR (a subdirectory holding a spool.conf) is a\n"
      "subdirectory of the mount, and mkdir MOUNTPOINT/name creates the queue DIR/name.\n"
      "See docs/filesystem.md.\n"
      "\n"
      "  --root             the first argument is a directory of queues\n"
      "  --sub NAME         read subscription NAME of the queue (spool sub add): cat\n"
      "                     receives and rm acks in it only (not with --root)\n"
      "  -o visibility=DUR  lease of a message opened for reading (500ms, 30s, 5m, 2h;\n"
      "                     default: the queue's)\n"
      "  -o limit=N, --limit N\n"
      "                     list at most the first N messages (default 1000)\n"
      "  -o OPT             any other option is passed to FUSE (auto_unmount is always on)\n"
      "  --log FILE, -o log=FILE\n"
      "                     append the daemon's errors to FILE (default: syslog, as\n"
      "                     'spoolfs', facility daemon; with -f: stderr)\n"
      "  -f                 stay in the foreground\n"
      "  -d                 FUSE debug output (implies -f)\n"
      "  -h, --help         this text;  -V, --version  the version\n"
      "\n"
      "Warning: any program that opens files under MOUNTPOINT receives messages (grep -r,\n"
      "indexers, backup tools). Mount in a private directory.\n");
}

bool parse_limit(std::string_view text, size_t* out) {
  uint64_t v;
  if (!spoolfs::parse_id(text, &v) || v > 10'000'000) return false;
  *out = static_cast<size_t>(v);
  return true;
}

int bad_usage(const std::string& msg) {
  std::fprintf(stderr, "spoolfs: %s (run 'spoolfs --help' for usage)\n", msg.c_str());
  return 64;
}

// One -o list: spoolfs's own options are taken out, the rest go to FUSE. Returns an exit
// code >= 0 to exit with, or -1 to go on.
int parse_o(const std::string& list, Options* o) {
  if (list.empty()) return bad_usage("-o needs options");
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string opt = list.substr(start, comma - start);
    start = comma + 1;
    if (opt.empty()) continue;
    if (opt.rfind("visibility=", 0) == 0) {
      auto d = spool::cli::parse_duration(opt.substr(11));
      if (!d || d->count() <= 0)
        return bad_usage("bad visibility '" + opt.substr(11) + "' (e.g. 500ms, 30s, 5m)");
      o->mount.visibility = *d;
    } else if (opt.rfind("limit=", 0) == 0) {
      if (!parse_limit(opt.substr(6), &o->mount.limit))
        return bad_usage("bad limit '" + opt.substr(6) + "'");
    } else if (opt.rfind("log=", 0) == 0 && opt.size() > 4) {
      o->log_file = opt.substr(4);
    } else {
      if (!o->fuse_opts.empty()) o->fuse_opts += ',';
      o->fuse_opts += opt;
    }
  }
  return -1;
}

// Returns an exit code >= 0 to exit with, or -1 to go on.
int parse_args(int argc, char** argv, Options* o) {
  std::vector<std::string> pos;
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
    } else if (a == "--root") {
      o->mount.root_mode = true;
    } else if (a == "--sub" || a.rfind("--sub=", 0) == 0) {
      o->mount.subscription = a == "--sub" ? (i + 1 < argc ? argv[++i] : "") : a.substr(6);
      if (o->mount.subscription.empty()) return bad_usage("--sub needs a subscription name");
    } else if (a == "--limit" || a.rfind("--limit=", 0) == 0) {
      std::string v = a == "--limit" ? (i + 1 < argc ? argv[++i] : "") : a.substr(8);
      if (!parse_limit(v, &o->mount.limit))
        return bad_usage("--limit needs a positive number, got '" + v + "'");
    } else if (a == "--log" || a.rfind("--log=", 0) == 0) {
      o->log_file = a == "--log" ? (i + 1 < argc ? argv[++i] : "") : a.substr(6);
      if (o->log_file.empty()) return bad_usage("--log needs a file name");
    } else if (a == "-o" || (a.rfind("-o", 0) == 0 && a.size() > 2)) {
      if (int rc = parse_o(a == "-o" ? (i + 1 < argc ? argv[++i] : "") : a.substr(2), o); rc >= 0)
        return rc;
    } else if (!a.empty() && a[0] == '-') {
      return bad_usage("unknown option '" + a + "'");
    } else {
      pos.push_back(a);
    }
  }
  // A --root mount opens every queue in DIR, which need not share subscription names.
  if (o->mount.root_mode && !o->mount.subscription.empty())
    return bad_usage("--sub mounts one queue's subscription: it cannot be used with --root");
  if (pos.size() != 2)
    return bad_usage(o->mount.root_mode ? "expected DIR and MOUNTPOINT"
                                        : "expected QUEUE_DIR and MOUNTPOINT");
  char real[PATH_MAX];
  if (!::realpath(pos[0].c_str(), real)) {
    if (errno == ENOENT && !o->mount.root_mode) {
      return std::fprintf(stderr, "spoolfs: %s: no such queue directory; create the queue with 'spool init %s'\n",
                          pos[0].c_str(), pos[0].c_str()), 1;
    }
    return std::fprintf(stderr, "spoolfs: %s: %s\n", pos[0].c_str(), std::strerror(errno)), 1;
  }
  o->mount.dir = real;
  o->mountpoint = pos[1];
  return -1;
}

// Whether the directory `dir` holds no entry but . and .. (true if it cannot be read).
bool dir_is_empty(const std::string& dir) {
  bool empty = true;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) empty = false;
    }
    ::closedir(d);
  }
  return empty;
}

// Checks the queue before mounting, so that mistakes are reported here and not by a
// daemon. The Queue is closed again: it must not be used across the fork of
// fuse_daemonize. Returns false (having said why) if it cannot be mounted.
bool check_queue(const std::string& dir, const std::string& subscription) {
  spool::QueueOptions qo;
  qo.create = false;  // spoolfs never creates a queue it is asked to mount
  qo.subscription = subscription;
  auto q = Queue::open(dir, qo);
  if (q.ok()) return true;
  if (q.status().code() == Code::kNotAQueue) {
    // spool init makes a queue only in an empty or new directory: suggest it only there.
    if (dir_is_empty(dir)) {
      std::fprintf(stderr, "spoolfs: %s; spoolfs never creates a queue: create one with 'spool init %s'\n",
                   q.status().message().c_str(), dir.c_str());
    } else {
      std::fprintf(stderr,
                   "spoolfs: %s; it holds other files, so it cannot become one: mount a queue "
                   "directory (create one with 'spool init NEW_DIR')\n",
                   q.status().message().c_str());
    }
  } else {
    std::fprintf(stderr, "spoolfs: cannot open queue %s: %s\n", dir.c_str(),
                 q.status().to_string().c_str());
  }
  return false;
}

// The directory of a --root mount must be a directory, and not a queue itself (its dlq/
// would show as a queue, and its messages not at all).
bool check_root(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    std::fprintf(stderr, "spoolfs: %s is not a directory\n", dir.c_str());
    return false;
  }
  if (::access((dir + "/spool.conf").c_str(), F_OK) == 0) {
    std::fprintf(stderr,
                 "spoolfs: %s is a queue, not a directory of queues: mount it without --root\n",
                 dir.c_str());
    return false;
  }
  return true;
}

// `opt` as one item of a libfuse -o list, whatever characters it holds: escaped by libfuse
// itself, so that its parser surely reads it back as it was.
std::string fuse_opt_escaped(const std::string& opt) {
  char* list = nullptr;
  if (fuse_opt_add_opt_escaped(&list, opt.c_str()) != 0) throw std::bad_alloc();
  std::string out = list;
  std::free(list);
  return out;
}

// Mounts, daemonizes unless -f, and serves until unmounted. Returns the exit code.
int serve(fuse_session* se, Mount& mount, const Options& o) {
  // The log file is opened here, on the terminal, so a bad path is reported (and a relative
  // one means what the user meant: fuse_daemonize moves to /).
  int log_fd = -1;
  if (!o.log_file.empty() && (log_fd = spoolfs::open_log_file(o.log_file)) < 0) {
    std::fprintf(stderr, "spoolfs: cannot open log file %s: %s\n", o.log_file.c_str(), std::strerror(errno));
    return 1;
  }
  std::string notice, error;
  if (!spoolfs::refuse_live_mount(o.mountpoint, &error) ||
      !spoolfs::clear_dead_mount(o.mountpoint, &notice, &error)) {
    return std::fprintf(stderr, "spoolfs: %s\n", error.c_str()), 1;
  }
  if (!notice.empty()) std::fprintf(stderr, "spoolfs: %s\n", notice.c_str());
  // Mounted over, its files would be hidden while the mount lasts (and a user would think
  // them sent or lost): an empty directory, as the usage says.
  if (!dir_is_empty(o.mountpoint)) {
    return std::fprintf(stderr, "spoolfs: %s is not empty: its files would be hidden while mounted; mount on an "
                                "empty directory\n", o.mountpoint.c_str()), 1;
  }
  if (fuse_session_mount(se, o.mountpoint.c_str()) != 0) {
    std::fprintf(stderr,
                 "spoolfs: cannot mount on %s (see the message above; is /dev/fuse "
                 "available and fusermount3 installed?)\n",
                 o.mountpoint.c_str());
    return 1;
  }
  fuse_daemonize(o.foreground ? 1 : 0);
  if ((log_fd >= 0 || !o.foreground) && !spoolfs::redirect_stderr(log_fd)) {
    // Too late for the terminal; syslog directly is all that is left.
    ::syslog(LOG_ERR, "spoolfs: cannot set up its log (%s); its errors are lost", std::strerror(errno));
  }
  int rc = 1;
  // Requests wait in the kernel until the loop below reads them, so none arrives before
  // the queue is open.
  spool::Status s = o.mount.root_mode ? spool::Status() : mount.open_single();
  if (!s.ok()) {
    std::fprintf(stderr, "spoolfs: cannot open queue %s: %s\n", o.mount.dir.c_str(),
                 s.to_string().c_str());
  } else {
    fuse_loop_config* cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(cfg, 16);
    rc = fuse_session_loop_mt(se, cfg) == 0 ? 0 : 1;
    fuse_loop_cfg_destroy(cfg);
  }
  // Readers still waiting on .next (spoolfs was told to stop) are answered now, while the
  // session can still carry the replies; else they would hang until the kernel gives up.
  mount.stop_waiting(ENOTCONN);
  fuse_session_unmount(se);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  spoolfs::log_to_stderr();
  // Before the queue is opened (check_queue): none of its files may become stdout or
  // stderr (cli/std_fds.h); a closed one gets /dev/null, as fuse_daemonize gives them all.
  spool::cli::StdFds closed;
  if (!spool::cli::ensure_std_fds(&closed)) {
    std::fprintf(stderr, "spoolfs: cannot open /dev/null onto a closed standard descriptor: %s\n",
                 std::strerror(errno));
    return 1;
  }
  Options o;
  if (int rc = parse_args(argc, argv, &o); rc >= 0) return rc;
  if (!(o.mount.root_mode ? check_root(o.mount.dir) : check_queue(o.mount.dir, o.mount.subscription))) return 1;

  // auto_unmount: fusermount3 unmounts when the daemon dies, even by SIGKILL, so a crash
  // leaves no "Transport endpoint is not connected" mount behind (dead_mount.h: where it
  // cannot).
  // The queue's path is escaped (a ',' or '\\' gets a '\\' before it): pasted in as it
  // is, a directory named "q,allow_other" would mount with allow_other (issue 23). libfuse
  // takes the escapes out again when it parses -o, so the file system's name is the path.
  std::string mount_opts = fuse_opt_escaped("fsname=spool:" + o.mount.dir) +
                           ",subtype=spoolfs,auto_unmount,default_permissions";
  if (!o.fuse_opts.empty()) mount_opts += "," + o.fuse_opts;
  std::vector<std::string> fargs = {argv[0], "-o", mount_opts};
  if (o.debug) fargs.push_back("-d");
  std::vector<char*> fargv;
  for (auto& s : fargs) fargv.push_back(s.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(fargv.size()), fargv.data());

  Mount mount(o.mount);
  fuse_session* se = fuse_session_new(&args, &kOps, sizeof kOps, &mount);
  if (!se) {
    std::fprintf(stderr, "spoolfs: bad FUSE options '%s'\n", mount_opts.c_str());
    return 1;
  }
  int rc = 1;
  if (fuse_set_signal_handlers(se) == 0) {
    rc = serve(se, mount, o);
    fuse_remove_signal_handlers(se);
  }
  fuse_session_destroy(se);
  fuse_opt_free_args(&args);
  return rc;
}
