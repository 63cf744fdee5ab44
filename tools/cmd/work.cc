// spool work: its flags; the worker itself is cli/work.cc.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "cli/work.h"
#include "cmd/command.h"

namespace spool::cmd {
namespace {

struct WorkArgs {
  std::string dir, visibility, max_runtime, grace, max_messages, latency, rate, subscription;
  std::vector<std::string> command;
  size_t jobs = 1;
  bool until_empty = false, verbose = false, autoscale = false;
  const CLI::App* sub = nullptr;  // to tell -j given from its default
};

std::optional<cli::AutoscaleOptions> autoscale_arg(const WorkArgs& a) {
  if (!a.autoscale && !a.latency.empty()) throw UsageError{"--latency goes with --autoscale"};
  if (!a.autoscale && !a.rate.empty()) throw UsageError{"--rate goes with --autoscale"};
  if (!a.autoscale) return std::nullopt;
  cli::AutoscaleOptions o;
  if (a.latency.empty()) throw UsageError{"--autoscale needs --latency DUR: how long the ready backlog may wait"};
  o.latency = duration_arg("--latency", a.latency);
  if (o.latency.count() <= 0) throw UsageError{"--latency must be above 0"};
  if (!a.rate.empty()) {
    char* end = nullptr;
    errno = 0;
    o.rate = std::strtod(a.rate.c_str(), &end);
    if (*end != '\0' || errno != 0 || !std::isfinite(o.rate) || o.rate <= 0) {
      throw UsageError{"bad rate '" + a.rate + "' for --rate (messages per second one command handles, above 0: 20, 0.5)"};
    }
  }
  if (a.sub->count("-j") == 0 || a.jobs < 2) {
    throw UsageError{"--autoscale needs -j MAX of 2 or more: the most commands it may run at once"};
  }
  o.max = a.jobs;
  return o;
}

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
  o.autoscale = autoscale_arg(a);
  Status err;
  auto q = open_existing(a.dir, &err, a.subscription);
  if (!q) return fail(err, a.dir);
  return cli::run_work(*q, o);
}

}  // namespace

void end_work_options_at_command(CLI::App& work, std::vector<std::string>& args) {
  bool dir_seen = false;
  for (size_t i = 2; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") return;  // the user's own: CLI11 handles it
    if (a.size() > 1 && a[0] == '-') {
      // An option of spool's. A value written apart ("-j 4", "--grace 2s") is skipped with
      // it; "-j4" and "--grace=2s" carry theirs.
      if (a.find('=') != std::string::npos || (a[1] != '-' && a.size() > 2)) continue;
      for (const CLI::Option* o : work.get_options()) {
        if (!o->get_positional() && o->check_name(a) && o->get_items_expected_max() > 0) {
          ++i;
          break;
        }
      }
      continue;
    }
    if (!dir_seen) {
      dir_seen = true;  // DIR
      continue;
    }
    args.insert(args.begin() + static_cast<std::ptrdiff_t>(i), "--");
    return;
  }
}

Command add_work(CLI::App& app) {
  auto a = std::make_shared<WorkArgs>();
  auto* work = app.add_subcommand("work", "Run CMD once per message, payload on stdin");
  add_dir(work, a->dir);
  add_subscription_flag(work, a->subscription);
  work->add_option("-j", a->jobs, "Run up to N commands at once (default 1)")->check(CLI::Range(size_t{1}, size_t{1024}));
  work->add_option("--visibility", a->visibility, "Lease length, renewed while CMD runs (default: the queue's)");
  work->add_option("--max-runtime", a->max_runtime, "Stop CMD (SIGTERM, then SIGKILL) and nack after this long");
  work->add_flag("--until-empty", a->until_empty, "Exit 0 once the queue has been empty (nothing ready, delayed or in flight) for --grace");
  work->add_option("--grace", a->grace, "With --until-empty: how long the queue must stay empty (default 1s)");
  work->add_option("--max-messages", a->max_messages, "Take at most N messages, let their commands finish, exit 0");
  work->add_flag("-v,--verbose", a->verbose, "Log each message's outcome and duration");
  work->add_flag("--autoscale", a->autoscale,
                 "Run 1 to -j commands: as many as the ready backlog needs to wait at most --latency");
  work->add_option("--latency", a->latency, "With --autoscale: how long the ready backlog may wait (e.g. 30s)");
  work->add_option("--rate", a->rate, "With --autoscale: messages/s one command handles (default: measured from its runs)");
  work->add_option("CMD", a->command,
                   "Command and its arguments: spool's options end at CMD (-- before it is optional)")->required();
  work->footer("CMD gets SPOOL_QUEUE, SPOOL_MESSAGE_ID, SPOOL_RECEIVE_COUNT and SPOOL_RECEIPT in its environment.\n"
               "Exit 0 acks; non-zero nacks with exponential backoff (1s, 2s, 4s, ... 10m). CMD's stderr\n"
               "passes through; a dead letter keeps its last 512 bytes (spool.work.stderr).\n"
               "SIGTERM/SIGINT: stop taking messages, wait for running commands; a second signal\n"
               "stops them too (SIGTERM, SIGKILL 5s later) and nacks their messages.\n"
               "--autoscale keeps ceil(ready / (rate x latency)) commands running, 1 to -j; -v logs each new target.\n"
               "Example: spool work /var/spool/jobs -j 4 -- sh -c 'convert - out/$SPOOL_MESSAGE_ID.png'\n"
               "Example: spool work /var/spool/jobs --autoscale --latency 30s -j 16 -v -- ./process.sh");
  a->sub = work;
  return {work, [a] { return run_work(*a); }};
}

}  // namespace spool::cmd
