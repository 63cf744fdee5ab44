#include "dead_mount.h"

#include <limits.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

extern char** environ;

namespace spoolfs {
namespace {

// /proc/self/mountinfo writes space, tab, newline and backslash in paths as \ooo.
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    auto oct = [&](size_t j) { return j < s.size() && s[j] >= '0' && s[j] <= '7'; };
    if (s[i] == '\\' && oct(i + 1) && oct(i + 2) && oct(i + 3)) {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

struct Mounted {
  std::string type;    // "" if nothing is mounted there
  std::string source;  // spoolfs's: "spool:QUEUE_DIR"
};

// The topmost mount on `path` (an absolute, resolved path). Later lines of mountinfo are
// mounted on top of earlier ones.
Mounted mounted_at(const std::string& path) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  Mounted top;
  while (std::getline(in, line)) {
    // id parent major:minor root MOUNTPOINT options [optional...] - TYPE source ...
    std::istringstream fields(line);
    std::string f, point;
    for (int i = 0; i < 5 && fields >> f; ++i) point = f;
    while (fields >> f && f != "-") {
    }
    Mounted m;
    if (fields >> m.type && unescape(point) == path) {
      fields >> m.source;
      m.source = unescape(m.source);
      top = m;
    }
  }
  return top;
}

// `mountpoint` made absolute without touching its last component, which cannot be
// resolved: every access to a dead mount fails.
std::string resolve(const std::string& mountpoint) {
  namespace fs = std::filesystem;
  fs::path p = fs::absolute(mountpoint).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "mnt/" -> "mnt"
  char real[PATH_MAX];
  if (!::realpath(p.parent_path().c_str(), real)) return p.string();
  return (fs::path(real) / p.filename()).string();
}

}  // namespace

bool refuse_live_mount(const std::string& mountpoint, std::string* error) {
  // A dead mount (stat fails with ENOTCONN; realpath does not notice) is clear_dead_mount's;
  // a missing directory, FUSE's mount reports.
  struct stat st {};
  char real[PATH_MAX];
  if (::stat(mountpoint.c_str(), &st) != 0 || !::realpath(mountpoint.c_str(), real)) return true;
  Mounted m = mounted_at(real);
  if (m.type != "fuse.spoolfs") return true;
  std::string queue = m.source.rfind("spool:", 0) == 0 ? m.source.substr(6) : m.source;
  *error = mountpoint + " already holds a spoolfs mount (of " + queue +
           "); a second one would hide it: unmount it first with: fusermount3 -u '" + mountpoint + "'";
  return false;
}

bool clear_dead_mount(const std::string& mountpoint, std::string* notice, std::string* error) {
  struct stat st {};
  if (::stat(mountpoint.c_str(), &st) == 0 || errno != ENOTCONN) return true;
  const std::string path = resolve(mountpoint);
  const std::string type = mounted_at(path).type;
  if (type != "fuse.spoolfs") {
    *error = mountpoint + " holds a dead mount" + (type.empty() ? "" : " of " + type) +
             ", not spoolfs's; unmount it first: fusermount3 -u -z '" + mountpoint + "'";
    return false;
  }
  const char* argv[] = {"fusermount3", "-u", "-z", "--", path.c_str(), nullptr};
  pid_t pid;
  int status = 0;
  int rc = ::posix_spawnp(&pid, "fusermount3", nullptr, nullptr, const_cast<char**>(argv),
                          environ);
  if (rc == 0) {
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    *error = mountpoint + " holds the dead mount of a killed spoolfs and fusermount3 " +
             (rc != 0 ? std::string("could not run: ") + std::strerror(rc)
                      : std::string("failed to unmount it")) +
             "; unmount it with: fusermount3 -u -z '" + mountpoint + "'";
    return false;
  }
  *notice = "removed the dead mount a killed spoolfs left on " + mountpoint;
  return true;
}

}  // namespace spoolfs
