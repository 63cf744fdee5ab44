// `spool work`: runs a command once per message, payload on stdin (docs/cli.md, "spool work").
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cli/autoscale.h"
#include "spool/queue.h"

namespace spool::cli {

struct WorkOptions {
  size_t jobs = 1;                  // commands running at once (with autoscale, the most)
  // Run as many commands as the ready backlog needs, between 1 and autoscale->max (which the
  // caller sets to `jobs`) (docs/cli.md, "Autoscale").
  std::optional<AutoscaleOptions> autoscale;
  Millis visibility{0};             // 0: the queue's default
  std::optional<Millis> max_runtime;  // a command running longer is stopped and nacked
  // Exit (0) once the queue has held no ready, delayed or leased message, and no command of
  // ours has run, for `grace`.
  bool until_empty = false;
  Millis grace{1000};
  std::optional<uint64_t> max_messages;  // take at most this many messages, then finish and exit 0
  bool verbose = false;                  // log each message's outcome and duration (info)
  std::vector<std::string> command;   // argv; argv[0] is looked up in PATH
};

// Runs until SIGTERM or SIGINT (or until_empty / max_messages says so), then waits for
// running commands; returns the exit code.
int run_work(Queue& q, const WorkOptions& opts);

}  // namespace spool::cli
