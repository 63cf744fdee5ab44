// What a command of `spool work` writes to its stderr: passed on to spool work's own stderr
// as it comes, with the last bytes kept for the dead letter's spool.work.stderr
// (docs/cli.md, "Outcome").
#pragma once

#include <atomic>
#include <cstddef>
#include <string>
#include <thread>

namespace spool::cli {

// Reads `fd`, the read end of the command's stderr pipe (taken over: made non-blocking and
// closed by finish), on a thread of its own, writes everything it reads to descriptor `out`
// and keeps the last `keep` bytes. Should writing to `out` fail (closed, EPIPE), the rest
// is dropped, but the tail is still kept. Not copyable; used by the thread that made it.
class StderrTee {
 public:
  StderrTee(int fd, int out, size_t keep);
  ~StderrTee();  // finish(false) unless finish was called
  StderrTee(const StderrTee&) = delete;
  StderrTee& operator=(const StderrTee&) = delete;

  // Stops reading and returns the tail. With `to_eof`, once every writer has closed the pipe
  // (the supervisor has exited and killed what the command left); without, after what the
  // pipe holds now (writers may live on when the supervisor itself was killed). A tail cut
  // from longer output starts at a UTF-8 character boundary, so UTF-8 output stays UTF-8.
  // Call it once.
  std::string finish(bool to_eof);

 private:
  void loop();
  void pass_on(const char* p, size_t n);

  const int fd_;
  int out_;  // -1 once a write to it failed; the thread's
  const size_t keep_;
  std::atomic<bool> draining_{false};  // finish(false): stop once the pipe is empty
  std::string tail_;                   // the thread's until finish joins it
  bool cut_ = false;                   // tail_ lost bytes at its front; likewise
  std::thread thread_;
};

}  // namespace spool::cli
