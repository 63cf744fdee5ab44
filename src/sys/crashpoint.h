// Hooks for crash tests, as the default Env gives them (env/env.cc; the library reaches
// them only through its queue's Env, the CLI's pull loop calls crashpoint() directly). Named
// crash points: SPOOL_CRASHPOINT=NAME or NAME:N makes the
// process SIGKILL itself the N-th time (default 1st) it reaches crashpoint(NAME). Costs one
// getenv per call: the points are on rare paths (compaction, an index resize, the
// dead-letter hand-off, redrive), and a cached answer was inherited by fork children, so a
// test process that had passed any crash point before forking a child that sets the
// variable never saw that child crash. park(): hold the process where it is until a test
// lets it go (or kills it there). Only in a testing build (meson -Dtesting=true, the
// default; debian/rules turns it off): elsewhere both do nothing and cost nothing.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

namespace spool {

#ifdef SPOOL_TESTING
inline constexpr bool kTestHooks = true;

inline void crashpoint(const char* name) {
  const char* spec = std::getenv("SPOOL_CRASHPOINT");
  if (spec == nullptr) return;
  std::string s(spec);
  auto colon = s.find(':');
  if (s.substr(0, colon) != name) return;
  int n = colon == std::string::npos ? 1 : std::atoi(s.c_str() + colon + 1);
  // A count belongs to one value of the variable: a process that sets another value counts
  // from 0, not on from the hits under the last.
  static std::atomic<size_t> counted{0};
  static std::atomic<int> hits{0};
  const size_t setting = std::hash<std::string>{}(s) | 1;
  if (counted.exchange(setting) != setting) hits = 0;
  if (++hits >= n) ::kill(::getpid(), SIGKILL);
}

// Creates the file `path`, then waits while it exists.
inline void park(const std::string& path) {
  int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
  if (fd >= 0) ::close(fd);
  while (::access(path.c_str(), F_OK) == 0) ::usleep(1000);
}
#else
inline constexpr bool kTestHooks = false;
inline void crashpoint(const char*) {}
inline void park(const std::string&) {}
#endif

}  // namespace spool
