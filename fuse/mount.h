// The whole spoolfs mount: which view owns each inode (inode.h), one slot per queue, and
// the root directory of a --root mount.
//
// A single-queue mount has one slot, whose queue directory is the mount root. A --root
// mount of DIR shows every queue of DIR (a subdirectory holding a spool.conf) as a
// subdirectory; queues are found when looked up or listed, so those created by others
// after the mount appear too, and `mkdir MNT/name` creates one. Each queue, and the
// dead-letter queue under it as .dlq, is a QueueView.
#pragma once

#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "queue_view.h"
#include "spool/queue.h"

namespace spoolfs {

class Mount {
 public:
  struct Config {
    std::string dir;  // the queue; with root_mode, the directory of queues
    bool root_mode = false;
    spool::Millis visibility{0};  // lease of a message opened for reading; 0: the queue's
    size_t limit = 1000;          // list at most this many messages per directory
    std::string subscription;     // --sub: the subscription a single-queue mount reads
  };

  explicit Mount(Config cfg);
  ~Mount();
  Mount(const Mount&) = delete;
  Mount& operator=(const Mount&) = delete;

  // A single-queue mount opens its queue here, after fuse_daemonize (a Queue must not
  // cross a fork), so that a queue that cannot be opened stops the daemon at once. A
  // --root mount opens each queue when first used.
  spool::Status open_single();
  // Answers every read waiting on a .next with `err`: after the session loop, before the
  // session is destroyed.
  void stop_waiting(int err);

  // FUSE operations: each goes to the view that owns the inode (or the parent directory),
  // except those on the root of a --root mount, answered here.
  void lookup(fuse_req_t req, fuse_ino_t parent, const char* name);
  void getattr(fuse_req_t req, fuse_ino_t ino);
  void setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi);
  void open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void create(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_file_info* fi);
  void unlink(fuse_req_t req, fuse_ino_t parent, const char* name);
  void mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode);
  void opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off);
  void getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size);
  void listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);

 private:
  struct Slot;
  struct QueueId;
  // What an inode is: the root of a --root mount, or local inode `local` of `view`
  // (neither: no such inode).
  struct Target {
    bool root = false;
    QueueView* view = nullptr;
    uint64_t local = 0;
  };

  Target resolve(fuse_ino_t ino);
  void dispatch(fuse_req_t req, fuse_ino_t ino,
                const std::function<void(QueueView&, uint64_t)>& on_view,
                const std::function<void()>& on_root);
  void dispatch_dir(fuse_req_t req, fuse_ino_t parent,
                    const std::function<void(QueueView&)>& on_view,
                    const std::function<void()>& on_root);

  static int open_queue_dir(const std::string& dir, QueueId* id);
  Slot* add_slot(const std::string& dir, const QueueId& id);
  int find_queue(std::string_view name, Slot** out);
  int scan_root(std::vector<std::pair<size_t, std::string>>* queues);
  void root_lookup(fuse_req_t req, std::string_view name);
  void root_readdir(fuse_req_t req, size_t size, off_t off);
  void root_mkdir(fuse_req_t req, std::string_view name, mode_t mode);

  const Config cfg_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Slot>> slots_;           // by slot number; never shrinks
  std::map<std::string, Slot*, std::less<>> by_name_;  // --root: the current slot of each name
};

}  // namespace spoolfs
