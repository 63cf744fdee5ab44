// Running a check in a forked child, for tests where the code under test may crash (SIGSEGV,
// SIGBUS) or hang: the crash then fails the test instead of ending the test binary. The
// child reports through a file the parent opened before the fork (gtest assertions would
// stay in the child): the child writes to the inherited descriptor, so the report arrives
// even when the child has dropped its privileges (setuid to nobody) or changed directory.
// The child's last line says it finished its body; a report without it fails the test.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "proc_util.h"
#include "test_util.h"

namespace spool::test {

class Report {
 public:
  // Writes to `fd` (open, O_APPEND); does not own it.
  explicit Report(int fd) : fd_(fd) {}
  void fail(const std::string& what) { line("F " + what); }
  void info(const std::string& what) { line("I " + what); }
  // A named count, summed by the parent (see in_child's `counts`).
  void count(const std::string& name, long n = 1) { line("C " + name + " " + std::to_string(n)); }
  bool check(bool cond, const std::string& what) {
    ++checks_;
    if (!cond) fail(what);
    return cond;
  }
  // The last line: the body returned, after `check` was called this many times.
  void done() { line("E " + std::to_string(checks_)); }

 private:
  // One write(2) per line. A line that cannot be written ends the child with exit status 3:
  // a report that silently lost a failure would pass.
  void line(std::string s) {
    std::replace(s.begin(), s.end(), '\n', ' ');
    s += "\n";
    if (::write(fd_, s.data(), s.size()) != static_cast<ssize_t>(s.size())) ::_exit(3);
  }
  int fd_;
  long checks_ = 0;
};

// A child started by start_child(): its report file and pid, for finish_child().
struct ChildRun {
  std::string what;
  std::unique_ptr<TempDir> tmp;
  std::string path;
  pid_t pid = -1;
};

// Forks a child that runs `body` and reports to a file; the parent may act meanwhile (damage
// the queue the child has open, say) and then collects it with finish_child().
inline ChildRun start_child(const std::string& what, const std::function<void(Report&)>& body) {
  ChildRun run{what, std::make_unique<TempDir>(), "", -1};
  run.path = *run.tmp / "report";
  int fd = ::open(run.path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) {
    ADD_FAILURE() << what << ": cannot create the report file " << run.path;
    return run;
  }
  run.pid = spawn([&] {
    Report r(fd);
    body(r);
    r.done();
    return 0;
  });
  ::close(fd);
  return run;
}

// Waits for the child (at most `limit`): every fail() becomes a test failure here, every
// info() is printed, every count() is added to `*counts` if given. A child killed by a
// signal (or still running after `limit`) fails the test, and so does a report that does
// not end with the child's "body returned" line (a child that could not write it, or exited
// early). Returns the child's exit status.
inline int finish_child(ChildRun& run, std::chrono::milliseconds limit = std::chrono::seconds(120),
                        std::map<std::string, long>* counts = nullptr, bool print_info = true) {
  if (run.pid < 0) return -1;
  const std::string& what = run.what;
  int rc = wait_exit_for(run.pid, limit);
  std::ifstream in(run.path);
  bool finished = false;
  for (std::string line; std::getline(in, line);) {
    finished = false;
    if (line.starts_with("F ")) ADD_FAILURE() << what << ": " << line.substr(2);
    if (line.starts_with("I ") && print_info) std::printf("[ %s ] %s\n", what.c_str(), line.c_str() + 2);
    if (line.starts_with("C ") && counts != nullptr) {
      auto sp = line.rfind(' ');
      (*counts)[line.substr(2, sp - 2)] += std::stol(line.substr(sp + 1));
    }
    if (line.starts_with("E ")) finished = true;
  }
  EXPECT_EQ(rc, 0) << what << ": the child "
                   << (rc > 128 ? "was killed by signal " + std::to_string(rc - 128) : "exited with " + std::to_string(rc))
                   << (rc == 128 + SIGKILL ? " (or timed out)" : "");
  EXPECT_TRUE(finished || rc != 0) << what << ": the child exited 0 but its report is missing or does not end with "
                                   << "the line that says its body returned; what it checked is unknown";
  return rc;
}

// Runs `body` in a forked child and collects it (start_child, then finish_child).
inline int in_child(const std::string& what, const std::function<void(Report&)>& body,
                    std::chrono::milliseconds limit = std::chrono::seconds(120),
                    std::map<std::string, long>* counts = nullptr, bool print_info = true) {
  ChildRun run = start_child(what, body);
  return finish_child(run, limit, counts, print_info);
}

}  // namespace spool::test
