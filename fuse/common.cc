#include "common.h"

#include <unistd.h>

#include <cerrno>

#include "inode.h"

namespace spoolfs {

using spool::Code;

bool parse_id(std::string_view text, uint64_t* out) {
  if (text.empty() || text[0] == '0') return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    auto d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

bool message_name(std::string_view name, uint64_t* id) {
  if (name.empty() || name.find_first_not_of("0123456789") != std::string_view::npos) return false;
  if (!parse_id(name, id) || *id > ino::kMaxMsgId) *id = 0;
  return true;
}

bool queue_name_ok(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

int errno_of(const spool::Status& s) {
  switch (s.code()) {
    case Code::kOk:
      return 0;
    case Code::kEmpty:
      return EBUSY;  // exists but leased elsewhere or delayed
    case Code::kLeaseLost:
      return ESTALE;  // our lease ran out and someone else has it now
    case Code::kNotFound:
    case Code::kNotAQueue:  // a queue directory removed or replaced under the mount
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

namespace {

constexpr double kDirAttrTimeout = 60;  // seconds; see reply_entry

double attr_timeout(const struct stat& st) {
  return S_ISDIR(st.st_mode) ? kDirAttrTimeout : 0;
}

void fill_times(struct stat* st, std::chrono::system_clock::time_point t) {
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  st->st_mtim.tv_sec = st->st_atim.tv_sec = st->st_ctim.tv_sec =
      static_cast<time_t>(ns / 1000000000);
  st->st_mtim.tv_nsec = st->st_atim.tv_nsec = st->st_ctim.tv_nsec =
      static_cast<long>(ns % 1000000000);
}

void fill_owner(struct stat* st) {
  static const uid_t uid = ::getuid();
  static const gid_t gid = ::getgid();
  st->st_uid = uid;
  st->st_gid = gid;
}

}  // namespace

void fill_dir(struct stat* st, fuse_ino_t ino) {
  *st = {};
  st->st_ino = ino;
  st->st_mode = S_IFDIR | 0700;
  st->st_nlink = 2;
  fill_owner(st);
  static const auto started = std::chrono::system_clock::now();
  fill_times(st, started);
}

void fill_reg(struct stat* st, fuse_ino_t ino, mode_t perm, uint64_t size,
              std::chrono::system_clock::time_point mtime) {
  *st = {};
  st->st_ino = ino;
  st->st_mode = S_IFREG | perm;
  st->st_nlink = 1;
  fill_owner(st);
  st->st_size = static_cast<off_t>(size);
  st->st_blksize = 4096;
  st->st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
  fill_times(st, mtime);
}

void reply_entry(fuse_req_t req, const struct stat& st) {
  fuse_entry_param e{};
  e.ino = st.st_ino;
  e.generation = 1;
  e.attr = st;
  e.attr_timeout = attr_timeout(st);
  e.entry_timeout = 0;
  fuse_reply_entry(req, &e);
}

void reply_attr(fuse_req_t req, const struct stat& st) {
  fuse_reply_attr(req, &st, attr_timeout(st));
}

void reply_sized(fuse_req_t req, const std::string& value, size_t size) {
  if (size == 0) return (void)fuse_reply_xattr(req, value.size());
  if (size < value.size()) return (void)fuse_reply_err(req, ERANGE);
  fuse_reply_buf(req, value.data(), value.size());
}

bool DirBuffer::add(const char* name, fuse_ino_t ino, mode_t type, off_t cookie) {
  if (full_) return false;
  struct stat st {};
  st.st_ino = ino;
  st.st_mode = type;
  size_t room = buf_.size() - used_;
  size_t n = fuse_add_direntry(req_, buf_.data() + used_, room, name, &st, cookie);
  if (n > room) {
    full_ = true;
    return false;
  }
  used_ += n;
  return true;
}

}  // namespace spoolfs
