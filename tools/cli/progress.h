// A progress bar for long CLI operations, drawn on stderr only when stderr is a terminal
// (scripts and logs see nothing), at most ten times a second.
#pragma once

#include <chrono>
#include <cstdint>
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

}  // namespace spool::cli
