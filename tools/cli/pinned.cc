#include "cli/pinned.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <set>
#include <utility>

namespace spool::cli {

namespace {

// The target of the link `path`, or "".
std::string link_target(const std::string& path) {
  char buf[PATH_MAX];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Names in the directory `path`, without . and ..; false if it cannot be read.
bool entries(const std::string& path, std::vector<std::string>* out) {
  DIR* d = ::opendir(path.c_str());
  if (!d) return false;
  while (const dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out->push_back(std::move(n));
  }
  ::closedir(d);
  return true;
}

}  // namespace

Pinned pinned_segments(const std::string& dir) {
  Pinned p;
  char* real = ::realpath((dir + "/segments").c_str(), nullptr);
  if (!real) return p;
  const std::string prefix = std::string(real) + "/";
  std::free(real);
  constexpr std::string_view kDeleted = " (deleted)";
  std::set<std::pair<dev_t, ino_t>> seen;
  std::set<pid_t> pids;
  std::vector<std::string> procs;
  entries("/proc", &procs);
  for (const std::string& name : procs) {
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str()));
    const std::string base = "/proc/" + name;
    bool examined = false;
    for (const char* where : {"/fd", "/map_files"}) {
      std::vector<std::string> links;
      if (!entries(base + where, &links)) continue;
      examined = true;
      for (const std::string& l : links) {
        const std::string path = base + where + "/" + l;
        const std::string t = link_target(path);
        if (!t.starts_with(prefix) || !t.ends_with(kDeleted)) continue;
        pids.insert(pid);
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0) continue;  // map_files may be root's only
        if (seen.insert({st.st_dev, st.st_ino}).second) {
          ++p.segments;
          p.bytes += static_cast<uint64_t>(st.st_blocks) * 512;
        }
      }
    }
    if (!examined) ++p.unexamined;
  }
  p.pids.assign(pids.begin(), pids.end());
  return p;
}

}  // namespace spool::cli
