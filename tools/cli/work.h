// `spool work`: runs a command once per message, payload on stdin (PRODUCT.md §6).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "spool/queue.h"

namespace spool::cli {

struct WorkOptions {
  size_t jobs = 1;                  // commands running at once
  Millis visibility{0};             // 0: the queue's default
  std::optional<Millis> max_runtime;  // a command running longer is stopped and nacked
  std::vector<std::string> command;   // argv; argv[0] is looked up in PATH
};

// Runs until SIGTERM or SIGINT, then waits for running commands; returns the exit code.
int run_work(Queue& q, const WorkOptions& opts);

}  // namespace spool::cli
