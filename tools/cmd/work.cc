// spool work: its flags; the worker itself is cli/work.cc.
#include <CLI/CLI.hpp>

#include "cli/work.h"
#include "cmd/command.h"

namespace spool::cmd {
namespace {

struct WorkArgs {
  std::string dir, visibility, max_runtime, grace, max_messages;
  std::vector<std::string> command;
  size_t jobs = 1;
  bool until_empty = false, verbose = false;
};

int run_work(const WorkArgs& a) {
  cli::WorkOptions o;
  o.jobs = a.jobs;
  if (!a.visibility.empty()) o.visibility = duration_arg("--visibility", a.visibility);
  if (!a.max_runtime.empty()) o.max_runtime = duration_arg("--max-runtime", a.max_runtime);
  if (!a.grace.empty() && !a.until_empty) throw UsageError{"--grace goes with --until-empty"};
  if (!a.grace.empty()) o.grace = duration_arg("--grace", a.grace);
  o.until_empty = a.until_empty;
  if (!a.max_messages.empty()) {
    o.max_messages = count_arg("--max-messages", a.max_messages);
    if (*o.max_messages == 0) throw UsageError{"--max-messages must be at least 1"};
  }
  o.verbose = a.verbose;
  o.command = a.command;
  Status err;
  auto q = open_existing(a.dir, &err);
  if (!q) return fail(err, a.dir);
  return cli::run_work(*q, o);
}

}  // namespace

Command add_work(CLI::App& app) {
  auto a = std::make_shared<WorkArgs>();
  auto* work = app.add_subcommand("work", "Run CMD once per message, payload on stdin");
  add_dir(work, a->dir);
  work->add_option("-j", a->jobs, "Run up to N commands at once (default 1)")->check(CLI::Range(size_t{1}, size_t{1024}));
  work->add_option("--visibility", a->visibility, "Lease length, renewed while CMD runs (default: the queue's)");
  work->add_option("--max-runtime", a->max_runtime, "Stop CMD (SIGTERM, then SIGKILL) and nack after this long");
  work->add_flag("--until-empty", a->until_empty, "Exit 0 once the queue has been empty (nothing ready, delayed or in flight) for --grace");
  work->add_option("--grace", a->grace, "With --until-empty: how long the queue must stay empty (default 1s)");
  work->add_option("--max-messages", a->max_messages, "Take at most N messages, let their commands finish, exit 0");
  work->add_flag("-v,--verbose", a->verbose, "Log each message's outcome and duration");
  work->add_option("CMD", a->command, "Command and arguments, after --")->required();
  work->footer("CMD gets SPOOL_QUEUE, SPOOL_MESSAGE_ID, SPOOL_RECEIVE_COUNT and SPOOL_RECEIPT in its environment.\n"
               "Exit 0 acks; non-zero nacks with exponential backoff (1s, 2s, 4s, ... 10m). CMD's stderr\n"
               "passes through; a dead letter keeps its last 512 bytes (spool.work.stderr).\n"
               "SIGTERM/SIGINT: stop taking messages, wait for running commands; a second signal\n"
               "stops them too (SIGTERM, SIGKILL 5s later) and nacks their messages.\n"
               "Example: spool work /var/spool/jobs -j 4 -- sh -c 'convert - out/$SPOOL_MESSAGE_ID.png'");
  return {work, [a] { return run_work(*a); }};
}

}  // namespace spool::cmd
