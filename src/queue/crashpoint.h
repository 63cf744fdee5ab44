// Named crash points for crash tests: SPOOL_CRASHPOINT=NAME or NAME:N makes the process
// SIGKILL itself the N-th time (default 1st) it reaches crashpoint(NAME). Costs one
// getenv per process when unset.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

namespace spool {

inline void crashpoint(const char* name) {
  static const char* spec = std::getenv("SPOOL_CRASHPOINT");
  if (spec == nullptr) return;
  static std::atomic<int> hits{0};
  std::string s(spec);
  auto colon = s.find(':');
  if (s.substr(0, colon) != name) return;
  int n = colon == std::string::npos ? 1 : std::atoi(s.c_str() + colon + 1);
  if (++hits >= n) ::kill(::getpid(), SIGKILL);
}

}  // namespace spool
