#include "cli/bridge_status.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>

namespace spool::cli {
namespace {

constexpr const char kPrefix[] = "bridge.";
constexpr size_t kMaxStatusBytes = 8192;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The JSON text of a file of the open directory `dir_fd`, or "" (no such regular file, a
// link, too large).
std::string read_small(int dir_fd, const char* name) {
  const int fd = ::openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "";
  std::string out;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= static_cast<off_t>(kMaxStatusBytes)) {
    char buf[kMaxStatusBytes];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) out.assign(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace

BridgeStatusFile::BridgeStatusFile(std::string dir)
    : dir_(std::move(dir)), name_(kPrefix + std::to_string(::getpid())) {
  dir_fd_ = ::open(dir_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
}

BridgeStatusFile::~BridgeStatusFile() {
  remove();
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

bool BridgeStatusFile::due() const { return std::chrono::steady_clock::now() - last_ >= std::chrono::seconds(1); }

void BridgeStatusFile::write(BridgeStatus s) {
  last_ = std::chrono::steady_clock::now();
  if (dir_fd_ < 0) return;
  s.pid = static_cast<int>(::getpid());
  s.updated_at = unix_now();
  const nlohmann::json j{{"kind", s.kind},   {"pid", s.pid},         {"peer", s.peer},   {"moved", s.moved},
                         {"last_id", s.last_id}, {"last_at", s.last_at}, {"lag", s.lag}, {"lag_s", s.lag_s},
                         {"updated_at", s.updated_at}};
  const std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  // As readable as the queue's settings (docs/security.md: the directory's mode decides).
  mode_t mode = 0600;
  struct stat conf {};
  if (::fstatat(dir_fd_, "spool.conf", &conf, AT_SYMLINK_NOFOLLOW) == 0) mode = conf.st_mode & 0666;
  const std::string tmp = name_ + ".tmp";
  ::unlinkat(dir_fd_, tmp.c_str(), 0);  // a leftover of a killed bridge with this pid
  const int fd = ::openat(dir_fd_, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return;
  ::fchmod(fd, mode);  // not narrowed by the umask
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!ok || ::renameat(dir_fd_, tmp.c_str(), dir_fd_, name_.c_str()) != 0) ::unlinkat(dir_fd_, tmp.c_str(), 0);
}

void BridgeStatusFile::remove() {
  if (dir_fd_ >= 0) ::unlinkat(dir_fd_, name_.c_str(), 0);
}

std::vector<BridgeStatus> read_bridges(const std::string& dir) {
  std::vector<BridgeStatus> out;
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return out;
  DIR* d = ::fdopendir(dir_fd);
  if (d == nullptr) {
    ::close(dir_fd);
    return out;
  }
  const double now = unix_now();
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(kPrefix, 0) != 0 || name.find(".tmp") != std::string::npos) continue;
    const auto j = nlohmann::json::parse(read_small(dir_fd, e->d_name), nullptr, false);
    if (!j.is_object()) continue;
    BridgeStatus s;
    s.kind = j.value("kind", "");
    s.pid = j.value("pid", 0);
    s.peer = j.value("peer", "");
    s.moved = j.value("moved", uint64_t{0});
    s.last_id = j.value("last_id", uint64_t{0});
    s.last_at = j.value("last_at", 0.0);
    s.lag = j.value("lag", int64_t{-1});
    s.lag_s = j.value("lag_s", 0.0);
    s.updated_at = j.value("updated_at", 0.0);
    // A bridge that died (kill -9 leaves its file) or stopped reporting is no bridge.
    const bool alive = s.pid > 0 && (::kill(s.pid, 0) == 0 || errno == EPERM);
    if (!alive || now - s.updated_at > static_cast<double>(kBridgeStaleAfter.count())) continue;
    out.push_back(std::move(s));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(), [](const BridgeStatus& a, const BridgeStatus& b) { return a.pid < b.pid; });
  return out;
}

}  // namespace spool::cli
