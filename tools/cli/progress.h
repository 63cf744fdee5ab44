// A progress bar for long CLI operations, drawn on stderr only when stderr is a terminal
// (scripts and logs see nothing), at most ten times a second.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace spool::cli {

class ProgressBar {
 public:
  // `enabled` defaults to isatty(stderr).
  explicit ProgressBar(std::string label);
  ProgressBar(std::string label, bool enabled);
  ~ProgressBar();  // clears the bar
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void update(uint64_t done, uint64_t total);

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

// One line of live status on stderr (`spool work`'s progress), drawn only when stderr is a
// terminal: each show() replaces the line; clear() removes it, so that a log line written
// next starts at the left margin. Thread-safe.
class LiveLine {
 public:
  // `enabled` defaults to isatty(stderr).
  LiveLine();
  explicit LiveLine(bool enabled);
  ~LiveLine();  // clears the line
  LiveLine(const LiveLine&) = delete;
  LiveLine& operator=(const LiveLine&) = delete;

  bool enabled() const { return enabled_; }
  void show(const std::string& text);
  void clear();

 private:
  const bool enabled_;
  std::mutex mu_;
  bool drawn_ = false;  // guarded by mu_
};

}  // namespace spool::cli
