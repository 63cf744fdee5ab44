#include "queue/config.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <map>
#include <sstream>

namespace spool::queue {

const char* sync_name(SyncPolicy p) {
  switch (p) {
    case SyncPolicy::kAlways: return "always";
    case SyncPolicy::kInterval: return "interval";
    case SyncPolicy::kNever: return "never";
  }
  return "?";
}

Status write_config(const std::string& dir, const Config& c) {
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
      << "max_bytes = " << c.opts.max_bytes << "\n";
  std::string text = out.str();
  std::string tmp = dir + "/spool.conf.tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return errno_status(errno, "create " + tmp);
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
            ::fsync(fd) == 0;
  int err = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), (dir + "/spool.conf").c_str()) != 0) {
    if (ok) err = errno;
    ::unlink(tmp.c_str());
    return errno_status(err, "write " + dir + "/spool.conf");
  }
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return {};
}

Result<Config> read_config(const std::string& dir) {
  std::string path = dir + "/spool.conf";
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) return Status(Code::kNotFound, path + " does not exist");
    return errno_status(errno, "read " + path);
  }
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
  Config c;
  try {
    c.uid = std::stoull(kv.at("uid"));
    c.opts.visibility = Millis(std::stoll(kv.at("visibility_ms")));
    c.opts.max_receives = static_cast<uint32_t>(std::stoul(kv.at("max_receives")));
    const std::string& s = kv.at("sync");
    c.opts.sync = s == "always" ? SyncPolicy::kAlways
                  : s == "never" ? SyncPolicy::kNever
                                 : SyncPolicy::kInterval;
    c.opts.sync_interval = Millis(std::stoll(kv.at("sync_interval_ms")));
    c.opts.segment_size = std::stoull(kv.at("segment_size"));
    c.opts.max_payload = std::stoull(kv.at("max_payload"));
    if (kv.count("retention_max_age_ms")) c.opts.retention_max_age = Millis(std::stoll(kv["retention_max_age_ms"]));
    if (kv.count("retention_max_bytes")) c.opts.retention_max_bytes = std::stoull(kv["retention_max_bytes"]);
    if (kv.count("max_ready")) c.opts.max_ready = std::stoull(kv["max_ready"]);
    if (kv.count("max_bytes")) c.opts.max_bytes = std::stoull(kv["max_bytes"]);
  } catch (const std::exception&) {
    return Status(Code::kCorrupt, path + ": missing or malformed setting");
  }
  return c;
}

}  // namespace spool::queue
