#include "queue/config.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <map>
#include <sstream>

#include "storage/format.h"
#include "sys/file_modes.h"

namespace spool::queue {

const char* sync_name(SyncPolicy p) {
  switch (p) {
    case SyncPolicy::kAlways: return "always";
    case SyncPolicy::kInterval: return "interval";
    case SyncPolicy::kNever: return "never";
  }
  return "?";
}

Status write_config(const std::string& dir, const Config& c, io::Io& io) {
  std::ostringstream out;
  out << "spool-queue " << kConfigVersion << "\n"
      << "uid = " << c.uid << "\n"
      << "visibility_ms = " << c.opts.visibility.count() << "\n"
      << "max_receives = " << c.opts.max_receives << "\n"
      << "sync = " << sync_name(c.opts.sync) << "\n"
      << "sync_interval_ms = " << c.opts.sync_interval.count() << "\n"
      << "segment_size = " << c.opts.segment_size << "\n"
      << "max_payload = " << c.opts.max_payload << "\n"
      << "retention_max_age_ms = " << c.opts.retention_max_age.count() << "\n"
      << "retention_max_bytes = " << c.opts.retention_max_bytes << "\n"
      << "max_ready = " << c.opts.max_ready << "\n"
      << "max_bytes = " << c.opts.max_bytes << "\n"
      << "dedup_window_ms = " << c.opts.dedup_window.count() << "\n";
  // Only when set: a queue without it reads as before, also by a spool that predates it.
  if (c.opts.keep_acked.count() != 0) out << "keep_acked_ms = " << c.opts.keep_acked.count() << "\n";
  std::string text = out.str();
  std::string tmp = dir + "/spool.conf.tmp." + std::to_string(::getpid());
  (void)io.unlink(tmp);  // a leftover with our pid; never written through if it is a link
  int fd = io.open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0666);
  if (fd < 0) return errno_status(-fd, "create " + tmp);
  // Readable by whoever may read the directory, whatever the umask (sys/file_modes.h).
  struct stat dst {};
  if (::stat(dir.c_str(), &dst) == 0) (void)::fchmod(fd, sys::modes_for(dst.st_mode).data);
  iovec iov{text.data(), text.size()};
  int r = io.write_all(fd, &iov, 1, 0);
  if (r == 0) r = io.datasync(fd);
  ::close(fd);
  if (r == 0) r = io.rename(tmp, dir + "/spool.conf");
  if (r != 0) {
    (void)io.unlink(tmp);
    return errno_status(-r, "write " + dir + "/spool.conf");
  }
  // The rename must last too: a queue whose spool.conf a power cut took away is no queue.
  if (int d = io.sync_dir(dir); d != 0) return errno_status(-d, "sync " + dir);
  return {};
}

namespace {

constexpr uint64_t kMaxSyncIntervalMs = 24ull * 3600 * 1000;           // a day
constexpr uint64_t kMaxRetentionAgeMs = 100ull * 365 * 24 * 3600 * 1000;  // a century
// Every id remembered within the window takes a slot of a bounded table: a week is far
// more than redelivery or retry loops need (SQS keeps 5 minutes).
constexpr uint64_t kMaxDedupWindowMs = 7ull * 24 * 3600 * 1000;
// Replay after ack keeps acked messages' segments this long at most: the disk it costs is
// a window of traffic, so the window is bounded.
constexpr uint64_t kMaxKeepAckedMs = 30ull * 24 * 3600 * 1000;

std::string range_text(uint64_t lo, uint64_t hi) { return std::to_string(lo) + " to " + std::to_string(hi); }

}  // namespace

Status validate(QueueOptions& o, const std::string& where) {
  const std::string at = where.empty() ? "" : where + ": ";
  auto bad = [&](const char* key, long long have, const std::string& allowed) {
    return Status(Code::kInvalidArgument, at + key + " = " + std::to_string(have) + " is out of range: it must be " +
                                              allowed);
  };
  // The durations, in milliseconds. visibility_ms 0 would hand one message to several
  // consumers at once (a lease that has already ended); sync_interval_ms 0 would make the
  // interval flusher spin.
  struct MsRange {
    const char* key;
    Millis QueueOptions::*field;
    uint64_t lo, hi;
    const char* unit = "";
  };
  using O = QueueOptions;
  for (const MsRange& r : {MsRange{"visibility_ms", &O::visibility, 1, kMaxVisibilityMs},
                           MsRange{"sync_interval_ms", &O::sync_interval, 1, kMaxSyncIntervalMs},
                           MsRange{"retention_max_age_ms", &O::retention_max_age, 0,
                                   kMaxRetentionAgeMs, "; 0: no limit"},
                           MsRange{"dedup_window_ms", &O::dedup_window, 1, kMaxDedupWindowMs},
                           MsRange{"keep_acked_ms", &O::keep_acked, 0, kMaxKeepAckedMs,
                                   ", 30 days; 0: off"}}) {
    const long long v = (o.*r.field).count();
    if (v < 0 || static_cast<uint64_t>(v) < r.lo || static_cast<uint64_t>(v) > r.hi) {
      return bad(r.key, v, range_text(r.lo, r.hi) + " (milliseconds" + r.unit + ")");
    }
  }
  if (o.segment_size < format::kMinSegmentSize || o.segment_size >= (1ull << 40)) {
    return Status(Code::kInvalidArgument, at + "segment_size = " + std::to_string(o.segment_size) +
                                              " is out of range: it must be " +
                                              range_text(format::kMinSegmentSize, (1ull << 40) - 1) +
                                              " (bytes: 4 KiB to 1 TiB)");
  }
  const uint64_t room = ((o.segment_size - format::kSegmentHeaderSize) & ~7ull) - format::kRecordHeaderSize;
  if (o.max_payload == 0) o.max_payload = std::min<uint64_t>(1ull << 20, room);
  const uint64_t most = std::min<uint64_t>(room, UINT32_MAX);
  if (o.max_payload > most) {
    return Status(Code::kInvalidArgument, at + "max_payload = " + std::to_string(o.max_payload) +
                                              " does not fit a segment of " + std::to_string(o.segment_size) +
                                              " bytes: it must be " + range_text(1, most));
  }
  return {};
}

Result<Config> read_config(const std::string& dir, io::Io& io) {
  std::string path = dir + "/spool.conf";
  // Not followed if a link, not waited on if a FIFO, not read past what a configuration
  // can hold: whoever may write the directory can put anything under this name.
  int fd = io.open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK, 0);
  if (fd < 0) {
    if (fd == -ENOENT) return Status(Code::kNotFound, path + " does not exist");
    return sys::queue_file_error(-fd, "read", path);
  }
  struct stat st {};
  const int stat_err = ::fstat(fd, &st) == 0 ? 0 : errno;
  const bool regular = stat_err == 0 && S_ISREG(st.st_mode);
  constexpr off_t kMaxConfigBytes = 64 << 10;
  std::string text;
  int read_err = 0;
  if (regular && st.st_size <= kMaxConfigBytes) {
    text.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < text.size()) {
      ssize_t n = ::pread(fd, text.data() + got, text.size() - got, static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        read_err = n < 0 ? errno : EIO;  // 0: the file shrank under us
        break;
      }
      got += static_cast<size_t>(n);
    }
    text.resize(got);
  }
  ::close(fd);
  if (stat_err != 0) return errno_status(stat_err, "stat " + path);
  if (!regular) return sys::queue_file_error(EINVAL, "read", path);
  if (st.st_size > kMaxConfigBytes) {
    return Status(Code::kNotAQueue, path + ": " + std::to_string(st.st_size) +
                                        " bytes, more than a spool queue configuration holds");
  }
  if (text.size() != static_cast<size_t>(st.st_size)) return errno_status(read_err, "read " + path);
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  int version = 0;
  if (std::sscanf(line.c_str(), "spool-queue %d", &version) != 1) {
    return Status(Code::kNotAQueue, path + ": not a spool queue configuration");
  }
  if (version > kConfigVersion) {
    return Status(Code::kIncompatible, path + ": queue format " + std::to_string(version) +
                                           " is newer than this spool; upgrade spool");
  }
  std::map<std::string, std::string> kv;
  while (std::getline(in, line)) {
    auto eq = line.find(" = ");
    if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 3);
  }
  // Every value is read strictly (decimal digits only, no sign, nothing after) and checked
  // against its range here, at every open, not only when the queue was created: the file
  // may have been edited since.
  Status err;
  auto number = [&](const char* key, bool required, uint64_t hi, uint64_t fallback) -> uint64_t {
    auto it = kv.find(key);
    if (it == kv.end()) {
      if (required && err.ok()) err = Status(Code::kCorrupt, path + ": the setting " + key + " is missing");
      return fallback;
    }
    const std::string& v = it->second;
    uint64_t n = 0;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if ((ec != std::errc() || end != v.data() + v.size() || n > hi) && err.ok()) {
      err = Status(Code::kCorrupt, path + ": " + key + " = " + v + " is not a number from 0 to " + std::to_string(hi));
    }
    return n;
  };
  constexpr uint64_t kMs = INT64_MAX;
  Config c;
  c.uid = number("uid", true, UINT64_MAX, 0);
  c.opts.visibility = Millis(static_cast<int64_t>(number("visibility_ms", true, kMs, 0)));
  c.opts.max_receives = static_cast<uint32_t>(number("max_receives", true, UINT32_MAX, 0));
  c.opts.sync_interval = Millis(static_cast<int64_t>(number("sync_interval_ms", true, kMs, 0)));
  c.opts.segment_size = number("segment_size", true, UINT64_MAX, 0);
  c.opts.max_payload = number("max_payload", true, UINT64_MAX, 0);
  c.opts.retention_max_age = Millis(static_cast<int64_t>(number("retention_max_age_ms", false, kMs, 0)));
  c.opts.retention_max_bytes = number("retention_max_bytes", false, UINT64_MAX, 0);
  c.opts.max_ready = number("max_ready", false, UINT64_MAX, 0);
  c.opts.max_bytes = number("max_bytes", false, UINT64_MAX, 0);
  // Queues made before deduplication have no such line: the default.
  c.opts.dedup_window = Millis(static_cast<int64_t>(number("dedup_window_ms", false, kMs, 300000)));
  c.opts.keep_acked = Millis(static_cast<int64_t>(number("keep_acked_ms", false, kMs, 0)));
  if (!err.ok()) return err;
  const auto sync = kv.find("sync");
  if (sync == kv.end()) return Status(Code::kCorrupt, path + ": the setting sync is missing");
  const SyncPolicy policies[] = {SyncPolicy::kAlways, SyncPolicy::kInterval, SyncPolicy::kNever};
  auto named = std::find_if(std::begin(policies), std::end(policies),
                            [&](SyncPolicy p) { return sync->second == sync_name(p); });
  if (named == std::end(policies)) {
    return Status(Code::kCorrupt, path + ": sync = " + sync->second + " is not one of always, interval, never");
  }
  c.opts.sync = *named;
  if (c.uid == 0) return Status(Code::kCorrupt, path + ": uid = 0 is out of range: it must be 1 to " +
                                                    std::to_string(UINT64_MAX));
  if (Status s = validate(c.opts, path); !s.ok()) return Status(Code::kCorrupt, s.message());
  return c;
}

}  // namespace spool::queue
