// Running a check in a forked child, for tests where the code under test may crash (SIGSEGV,
// SIGBUS) or hang: the crash then fails the test instead of ending the test binary. The
// child reports through a file; gtest assertions would stay in the child.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include "proc_util.h"
#include "test_util.h"

namespace spool::test {

class Report {
 public:
  explicit Report(std::string path) : path_(std::move(path)) {}
  void fail(const std::string& what) { line("F " + what); }
  void info(const std::string& what) { line("I " + what); }
  // A named count, summed by the parent (see in_child's `counts`).
  void count(const std::string& name, long n = 1) { line("C " + name + " " + std::to_string(n)); }
  bool check(bool cond, const std::string& what) {
    if (!cond) fail(what);
    return cond;
  }

 private:
  void line(std::string s) {
    std::replace(s.begin(), s.end(), '\n', ' ');
    std::ofstream(path_, std::ios::app) << s << "\n";
  }
  std::string path_;
};

// Runs `body` in a forked child; every fail() becomes a test failure here, every info() is
// printed, every count() is added to `*counts` if given. A child killed by a signal (or
// still running after `limit`) fails the test. Returns the child's exit status.
inline int in_child(const std::string& what, const std::function<void(Report&)>& body,
                    std::chrono::milliseconds limit = std::chrono::seconds(120),
                    std::map<std::string, long>* counts = nullptr, bool print_info = true) {
  TempDir tmp;
  std::string path = tmp / "report";
  pid_t pid = spawn([&] {
    Report r(path);
    body(r);
    return 0;
  });
  int rc = wait_exit_for(pid, limit);
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("F ")) ADD_FAILURE() << what << ": " << line.substr(2);
    if (line.starts_with("I ") && print_info) std::printf("[ %s ] %s\n", what.c_str(), line.c_str() + 2);
    if (line.starts_with("C ") && counts != nullptr) {
      auto sp = line.rfind(' ');
      (*counts)[line.substr(2, sp - 2)] += std::stol(line.substr(sp + 1));
    }
  }
  EXPECT_EQ(rc, 0) << what << ": the child "
                   << (rc > 128 ? "was killed by signal " + std::to_string(rc - 128) : "exited with " + std::to_string(rc))
                   << (rc == 128 + SIGKILL ? " (or timed out)" : "");
  return rc;
}

}  // namespace spool::test
