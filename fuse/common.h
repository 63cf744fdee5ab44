// What every part of spoolfs shares: errno mapping, names, attributes and replies.
#pragma once

#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "spool/status.h"

namespace spoolfs {

// Names. These are all spoolfs decides about a name by itself, so fuzz/fuzz_fuse_names.cc
// checks them against their definitions.
// Canonical decimal number: no sign, no leading zero, no overflow (so "0" is not one).
bool parse_id(std::string_view text, uint64_t* out);
// All-digit names are message names, reserved: a new file cannot take one. Returns false
// for any other name; else true, with *id the message, or 0 if no message can have that
// name (a leading zero, or an id past the inode range).
bool message_name(std::string_view name, uint64_t* id);
// Whether `name` can name a queue in the root of a --root mount (a directory entry of DIR).
bool queue_name_ok(std::string_view name);

// The errno a FUSE reply gives for a failed queue call.
int errno_of(const spool::Status& s);

// Attributes, owned by the user running spoolfs. Directories are 0700 (a mount is private:
// opening a file receives a message) and dated when spoolfs started.
void fill_dir(struct stat* st, fuse_ino_t ino);
void fill_reg(struct stat* st, fuse_ino_t ino, mode_t perm, uint64_t size,
              std::chrono::system_clock::time_point mtime);

// Replies to LOOKUP, MKDIR or the like with `st`. Entry timeouts are 0: the kernel must
// not keep dentries of messages (or queues) that are gone, nor miss new ones. So are the
// attribute timeouts of files (sizes and times change); directories' attributes never
// change, and caching them saves the kernel a GETATTR of the parent for every permission
// check (default_permissions), which is a fifth of the requests of a send.
void reply_entry(fuse_req_t req, const struct stat& st);
// Replies to GETATTR or SETATTR with `st`, with the same attribute timeouts.
void reply_attr(fuse_req_t req, const struct stat& st);
// Replies to GETXATTR or LISTXATTR: the size when asked for it (size 0), else the value.
void reply_sized(fuse_req_t req, const std::string& value, size_t size);

// A READDIR reply of at most `size` bytes, filled entry by entry.
class DirBuffer {
 public:
  DirBuffer(fuse_req_t req, size_t size) : req_(req), buf_(size) {}
  // Adds an entry; once one does not fit, this and every later add does nothing and
  // returns false. `cookie` is the entry's offset: the kernel passes back the cookie of the
  // last entry it took, so it must name a position that survives changes to the directory.
  bool add(const char* name, fuse_ino_t ino, mode_t type, off_t cookie);
  void reply() { fuse_reply_buf(req_, buf_.data(), used_); }

 private:
  fuse_req_t req_;
  std::vector<char> buf_;
  size_t used_ = 0;
  bool full_ = false;
};

}  // namespace spoolfs
