// One queue as a directory of a spoolfs mount (docs/filesystem.md is the user's contract):
//
//   ls DIR              ready messages, one file per id (the first `limit` of them)
//   cat DIR/ID          receives that message (lease); the payload is fixed at open
//   rm DIR/ID           acks a message this mount received
//   touch DIR/ID        extends the lease of a message this mount received
//   echo x > DIR/name   sends one message when the file is released (last close)
//   DIR/.stats(.json)   queue statistics; an open copy grows by a fresh rendering when its
//                       reader, having read to its end, stats it again (tail -f)
//   DIR/.next           a read waits for a message and receives it: its id, a newline, the
//                       payload (next_reader.h waits, so no FUSE worker does)
//   DIR/.dlq            the dead-letter queue: a view of its own (Kind::kDeadLetters) that
//                       has the same message files but takes no new files and has no
//                       .stats or .dlq of its own
//
// Uses the public queue API only (include/spool/queue.h): Queue::list for listings (no
// payloads, ready messages only), Queue::receive_id to lease the one message a reader
// opened, then ack, extend, send and stats. Why each operation is answered the way it is
// (what the kernel sends for each shell command) is in docs/filesystem.md ("How it works");
// in short:
//  - every open file is direct_io and entry/attr timeouts are 0: the kernel must neither
//    serve a cached payload nor keep dentries of messages that are gone;
//  - a message is sent on RELEASE (one per open), never on FLUSH (one per close() of any
//    duplicate fd, possibly before any WRITE); a WRITE or FLUSH to a queue that is full
//    fails with EAGAIN and discards the file, so the writer hears it (RELEASE's reply goes
//    nowhere);
//  - rm arrives as UNLINK(parent, name) with no file handle, so acks go by name through a
//    map id -> receipt of the messages this view received;
//  - readdir cookies are message ids, so entries acked between two READDIRs are neither
//    skipped nor repeated.
//
// Threads: handlers run concurrently on fuse_session_loop_mt's workers. The Queue is
// thread-safe; the view's own maps are guarded by mu_, never held across a queue call.
#pragma once

#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "next_reader.h"
#include "spool/queue.h"

namespace spoolfs {

class QueueView {
 public:
  enum class Kind { kQueue, kDeadLetters };

  // Where the view finds its queue, each time it needs it (the source opens it once). A
  // caller keeps the queue open for as long as it holds the pointer, even if the mount
  // drops it meanwhile (mount.h). kNotFound means there is no queue yet, which the view shows as an empty directory: a
  // dead-letter queue is created by the first dead letter, and spoolfs must not create it.
  using Source = std::function<spool::Result<std::shared_ptr<spool::Queue>>()>;

  struct Config {
    Kind kind = Kind::kQueue;
    uint64_t view = 0;            // the view number of this view's inodes (inode.h)
    fuse_ino_t dir_ino = 0;       // this directory
    fuse_ino_t parent_ino = 0;    // its parent, for ".."
    fuse_ino_t dlq_ino = 0;       // kQueue: the directory of its dead-letter queue's view
    std::string label;            // the queue's path, for .stats
    spool::Millis visibility{0};  // lease of a message opened for reading; 0: the queue's
    size_t limit = 1000;          // list at most this many messages
  };

  QueueView(Config cfg, Source source);
  ~QueueView();
  QueueView(const QueueView&) = delete;
  QueueView& operator=(const QueueView&) = delete;

  fuse_ino_t dir_ino() const { return cfg_.dir_ino; }
  // Answers every read waiting on .next with `err`; before the session ends.
  void stop_waiting(int err);

  // Entries of this view's directory.
  void lookup(fuse_req_t req, std::string_view name);
  void create(fuse_req_t req, std::string_view name, fuse_file_info* fi);
  void unlink(fuse_req_t req, std::string_view name);
  // Inodes of this view, by their local part (inode.h).
  void getattr(fuse_req_t req, uint64_t local);
  void setattr(fuse_req_t req, uint64_t local, struct stat* attr, int to_set, fuse_file_info* fi);
  void open(fuse_req_t req, uint64_t local, fuse_file_info* fi);
  void opendir(fuse_req_t req, uint64_t local, fuse_file_info* fi);
  void readdir(fuse_req_t req, uint64_t local, size_t size, off_t off);
  void getxattr(fuse_req_t req, uint64_t local, const char* name, size_t size);
  void listxattr(fuse_req_t req, uint64_t local, size_t size);

  // Files opened by this view's open or create: the view that made one, and operations on it.
  static QueueView* owner(fuse_file_info* fi);
  void read(fuse_req_t req, size_t size, off_t off, fuse_file_info* fi);
  void write(fuse_req_t req, const char* buf, size_t size, off_t off, fuse_file_info* fi);
  void fsync(fuse_req_t req, fuse_file_info* fi);
  void flush(fuse_req_t req, fuse_file_info* fi);
  void release(fuse_req_t req, fuse_file_info* fi);

 private:
  struct Handle;
  // What a directory listing or GETATTR needs of a message.
  struct Meta {
    uint64_t size = 0;
    uint32_t receive_count = 0;
    std::chrono::system_clock::time_point enqueued;
    bool enqueued_known = false;  // for the xattr: the message is held (the mtime is always it)
    spool::Attributes attributes = {};  // known, like enqueued, only for messages held
    std::string group = {};             // likewise; empty: none
  };
  // A message this view received and has not acked: what rm, touch and the xattrs need.
  struct Held {
    std::string receipt;
    Meta meta;
    std::chrono::steady_clock::time_point lease_end;  // our estimate; the queue's clock decides
  };

  static Handle* handle_of(fuse_file_info* fi);
  spool::Result<std::shared_ptr<spool::Queue>> queue() { return source_(); }
  spool::Millis lease(spool::Queue* q) const;
  bool has_stats() const { return cfg_.kind == Kind::kQueue; }
  bool has_next() const { return cfg_.kind == Kind::kQueue; }
  bool is_fixed_name(std::string_view name) const;
  fuse_ino_t ino(uint64_t local) const;

  int child_attr(std::string_view name, struct stat* st);
  int attr_of(uint64_t local, struct stat* st);
  int find(uint64_t id, Meta* out);
  bool exists(uint64_t id);
  spool::Status refresh();
  int listed_after(uint64_t after, std::vector<uint64_t>* ids);
  std::string receipt_of(uint64_t id);
  spool::Result<std::string> render_stats(bool json);
  int refuse_if_full(Handle* h, uint64_t size);
  int xattr_value(uint64_t local, std::string_view name, std::string* out);

  void open_stats(fuse_req_t req, uint64_t local, fuse_file_info* fi);
  void open_next(fuse_req_t req, fuse_file_info* fi);
  void stats_attr(fuse_req_t req, uint64_t local);
  void read_text(fuse_req_t req, Handle* h, size_t size, off_t off);
  void read_next(fuse_req_t req, Handle* h, size_t size, off_t off);
  static void reply_slice(fuse_req_t req, const std::string& data, size_t size, off_t off);
  void hold(const spool::Message& m, spool::Millis vis);
  bool deliver_next(fuse_req_t req, Handle* h, size_t size, off_t off, spool::Message& m);
  spool::Result<std::vector<spool::Message>> receive_next(size_t n, spool::Millis wait);
  void give_back(const spool::Message& m);
  void forget_text(Handle* h);
  void extend_lease(fuse_req_t req, uint64_t local);
  void truncate_new(fuse_req_t req, uint64_t local, off_t size, fuse_file_info* fi);
  void discard_new(fuse_req_t req, std::string_view name);
  void ack(fuse_req_t req, uint64_t id);
  void reply_open(fuse_req_t req, fuse_file_info* fi, std::unique_ptr<Handle> h);
  int send(Handle* h, std::string_view data);
  void forget_new(Handle* h);
  void fill_new_attr(Handle* h, struct stat* st);

  const Config cfg_;
  const Source source_;

  std::mutex mu_;
  std::map<uint64_t, Meta> listing_;  // id -> meta, the first cfg_.limit ready messages
  std::chrono::steady_clock::time_point listed_at_{};
  std::unordered_map<uint64_t, Held> held_;          // received here, not acked
  std::unordered_map<uint64_t, Handle*> new_files_;  // files being written, by local inode
  std::map<std::string, Handle*> new_names_;         // ... and by name (the newest of a name)
  std::unordered_set<Handle*> texts_;                // open .stats and .stats.json files
  std::atomic<uint64_t> next_new_{0};
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> send_failures_{0};
  std::unique_ptr<NextReader> next_;  // kQueue only; its thread starts with the first wait
};

}  // namespace spoolfs
