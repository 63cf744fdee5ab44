#include "sys/lock_holders.h"

#include <pwd.h>
#include <sys/file.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "logging.h"
#include "spool/status.h"

namespace spool::sys {

namespace {

// The name of user `uid`, or "" if it has none.
std::string user_name(uid_t uid) {
  struct passwd pw {}, *out = nullptr;
  char buf[1024];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &out) != 0 || !out) return "";
  return out->pw_name;
}

}  // namespace

void read_credentials(LockHolder& h, const struct stat& dir) {
  std::ifstream in("/proc/" + std::to_string(h.pid) + "/status");
  if (!in) return;
  std::string line;
  // Uid and Gid lines: real, effective, saved, file-system; access checks use the last.
  long fsuid = -1, fsgid = -1;
  std::vector<long> groups;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string key;
    f >> key;
    long a, b, c, d;
    if (key == "Uid:" && (f >> a >> b >> c >> d)) fsuid = d;
    if (key == "Gid:" && (f >> a >> b >> c >> d)) fsgid = d;
    if (key == "Groups:") {
      for (long g; f >> g;) groups.push_back(g);
    }
  }
  if (fsuid < 0 || fsgid < 0) return;
  h.known = true;
  h.uid = static_cast<uid_t>(fsuid);
  bool in_group = static_cast<gid_t>(fsgid) == dir.st_gid;
  for (long g : groups) in_group = in_group || static_cast<gid_t>(g) == dir.st_gid;
  if (fsuid == 0) {
    h.may_write = true;
  } else if (h.uid == dir.st_uid) {
    h.may_write = (dir.st_mode & S_IWUSR) != 0;
  } else if (in_group) {
    h.may_write = (dir.st_mode & S_IWGRP) != 0;
  } else {
    h.may_write = (dir.st_mode & S_IWOTH) != 0;
  }
}

std::vector<LockHolder> flock_holders(int fd, const struct stat& queue_dir) {
  std::vector<LockHolder> out;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return out;
  // Lines: "N: FLOCK  ADVISORY  WRITE PID MAJ:MIN:INODE START END"; a waiter is "N: -> ...".
  char want[64];
  std::snprintf(want, sizeof want, "%02x:%02x:%lu", ::major(st.st_dev), ::minor(st.st_dev),
                static_cast<unsigned long>(st.st_ino));
  std::ifstream in("/proc/locks");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string n, kind, adv, type, dev;
    long pid = 0;
    if (!(f >> n >> kind) || kind != "FLOCK") continue;
    if (!(f >> adv >> type >> pid >> dev) || dev != want || pid <= 0) continue;
    LockHolder h;
    h.pid = static_cast<pid_t>(pid);
    read_credentials(h, queue_dir);
    out.push_back(h);
  }
  return out;
}

std::string describe(const std::vector<LockHolder>& holders) {
  std::string s;
  for (const LockHolder& h : holders) {
    if (!s.empty()) s += ", ";
    s += "pid " + std::to_string(h.pid);
    if (!h.known) {
      s += " (exited; a process it passed the descriptor to holds it)";
      continue;
    }
    s += " (uid " + std::to_string(h.uid);
    if (std::string name = user_name(h.uid); !name.empty()) s += ", user " + name;
    s += ")";
  }
  return s;
}

Status flock_waiting(int fd, int op, const std::string& path, const struct stat& queue_dir) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  // The first look at the holders after 100 ms: most waits (another opener, a closing
  // writer) end sooner, and a look reads /proc/locks whole.
  auto next_look = start + std::chrono::milliseconds(100);
  bool warned = false;
  auto pause = std::chrono::microseconds(200);
  while (::flock(fd, op | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return errno_status(errno, "lock " + path);
    const auto now = Clock::now();
    if (now >= next_look) {
      next_look = now + std::chrono::milliseconds(500);
      std::vector<LockHolder> holders = flock_holders(fd, queue_dir), outsiders;
      for (const LockHolder& h : holders) {
        if (h.known && !h.may_write) outsiders.push_back(h);
      }
      if (!outsiders.empty()) {
        return Status(Code::kIo,
                      path + " is locked by " + describe(outsiders) +
                          ", which may not write the queue, so spool does not wait for it: end "
                          "that process. It opened the lock file while its mode let others read "
                          "it (chmod -R a+rX, or an older spool's 0644 lock files); spool "
                          "tightens the mode at the next open (docs/security.md)");
      }
      if (!warned && now - start > std::chrono::seconds(10)) {
        warned = true;
        spool::log().warn("{}: waiting for over 10 s for the lock held by {}", path,
                          holders.empty() ? std::string("an unknown process") : describe(holders));
      }
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
  return {};
}

}  // namespace spool::sys
