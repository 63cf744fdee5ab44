// spool: the command-line face of the queue. This file builds the app from the commands
// (tools/cmd/), parses, and runs the one given; the contract (commands, flags, exit codes)
// is docs/cli.md.
//
// Exit codes: 0 success; 2 recv got no message within --wait; 3 lease lost (stale
// receipt); 64 usage error; 75 a full queue (try again later); 1 any other error.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cli/nats_conn.h"
#include "cli/std_fds.h"
#include "cmd/command.h"

namespace {

using namespace spool::cmd;

constexpr char kMark = '\x1e';  // see "[a,b]" in run()

const char* kExamples = R"(
Examples:
  spool init /var/spool/jobs --visibility 5m --max-receives 5
  echo "resize 42.jpg" | spool send /var/spool/jobs
  spool send /var/spool/jobs --lines < tasks.txt
  spool recv /var/spool/jobs --wait 20s --json
  spool ack /var/spool/jobs 17.1.9f3a22c1
  spool work /var/spool/jobs -j 4 -- ./process.sh
  spool stats /var/spool/jobs --json

'spool help COMMAND' (or 'spool COMMAND --help') shows a command's flags.
Durations: 500ms, 30s, 5m, 2h, or a plain number of seconds. Sizes: 4096, 64K, 64M, 1G.
Exit codes: 0 ok, 2 no message within --wait, 3 lease lost (stale receipt), 64 usage error,
75 queue full (try again later), 1 any other error. See docs/cli.md.)";

int run(int argc, char** argv, const spool::cli::StdFds& closed) {
  // Named, so that usage lines say "spool" (CLI11 would take argv[0], a full path, and before
  // parsing nothing: `spool` alone printed "Usage: [OPTIONS] SUBCOMMAND").
  CLI::App app{"spool: a persistent, brokerless message queue for worker processes on one host", "spool"};
  app.require_subcommand(1);
  app.footer(kExamples);
  app.set_version_flag("--version", "spool 0.1.0");

  std::vector<Command> commands;
  commands.push_back(add_init(app));
  commands.push_back(add_send(app));
  for (auto& c : add_message_commands(app)) commands.push_back(std::move(c));
  commands.push_back(add_dlq(app));
  commands.push_back(add_stats(app));
  commands.push_back(add_replay(app));
  for (auto& c : add_admin_commands(app)) commands.push_back(std::move(c));
  commands.push_back(add_work(app));
  for (auto& c : add_nats_commands(app)) commands.push_back(std::move(c));
  for (auto& c : add_ops_commands(app)) commands.push_back(std::move(c));
  commands.push_back(add_top(app));
  commands.push_back(add_sub(app));

  // `spool` alone lists the commands, as git does (on stdout; the error is still one line on
  // stderr, and exit 64); `spool help` is `spool --help`, `spool help CMD` is `spool CMD --help`.
  if (argc == 1) {
    std::printf("%s", app.help().c_str());
    std::fflush(stdout);
    std::fprintf(stderr, "spool: a command is required (the commands are listed above; 'spool help COMMAND' shows one's flags)\n");
    return kExitUsage;
  }
  std::vector<char*> help_argv;
  if (std::strcmp(argv[1], "help") == 0 && argc <= 3) {
    static char help_flag[] = "--help";
    help_argv = {argv[0]};
    if (argc == 3) help_argv.push_back(argv[2]);
    help_argv.push_back(help_flag);
    argc = static_cast<int>(help_argv.size());
    argv = help_argv.data();
  }
  // An unknown command is named (CLI11 would only say that a subcommand is required).
  bool known_command = true;
  if (argc > 1 && argv[1][0] != '-') {
    try {
      app.get_subcommand(argv[1]);
    } catch (const CLI::OptionNotFound&) {
      known_command = false;
    }
  }
  if (!known_command) {
    std::string names;
    for (auto* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    std::fprintf(stderr, "spool: unknown command '%s' (commands: %s; run 'spool --help')\n", argv[1], names.c_str());
    return kExitUsage;
  }
  // CLI11 splits an argument written "[a,b]" into the values "a" and "b" wherever an option
  // takes several: `spool send q '[1,2]'` sent two messages, and `spool work q -- sh -c
  // '[ -f x ]'` ran ' -f x '. Such arguments go in with a mark that stops the split, which
  // a transform on every option that takes a value takes off again.
  std::vector<std::string> marked(argv, argv + argc);
  for (size_t i = 1; i < marked.size(); ++i) {
    if (marked[i].size() >= 2 && marked[i].front() == '[' && marked[i].back() == ']') marked[i].insert(0, 1, kMark);
  }
  if (argc > 1 && std::strcmp(argv[1], "work") == 0) end_work_options_at_command(*app.get_subcommand("work"), marked);
  std::vector<char*> marked_argv;
  for (auto& a : marked) marked_argv.push_back(a.data());
  for (auto* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    for (auto* opt : sub->get_options([](CLI::Option* o) { return o->get_items_expected_max() > 0; })) {
      opt->transform([](std::string v) { return !v.empty() && v[0] == kMark ? v.substr(1) : v; });
    }
  }
  name_flag_values(app);
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    std::string msg = parse_failure(a, e);
    std::erase(msg, kMark);
    return msg;
  });
  try {
    app.parse(static_cast<int>(marked_argv.size()), marked_argv.data());
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    (void)app.exit(e);  // prints the failure_message above on stderr
    return kExitUsage;
  }
  Command* cmd = nullptr;
  for (auto& c : commands) {
    if (c.sub->parsed()) cmd = &c;
  }
  if (cmd == nullptr) return kExitUsage;
  const std::string name = cmd->sub->get_name();

  // The --nats URL's password leaves /proc/PID/cmdline now that CLI11 has a copy of it.
  if (name == "forward" || name == "pull") spool::cli::hide_url_secrets(argc, argv);

  // A command whose output is the data refuses a closed stdout before it touches the queue:
  // with /dev/null there a received message would be lost silently (docs/cli.md).
  if (const char* what = cmd->stdout_data(); closed.out_closed && what != nullptr) {
    const bool recv = name == "recv";
    std::fprintf(stderr, "spool: standard output is closed, and %s writes %s there; nothing was %s "
                         "(redirect it, e.g. > FILE, instead of closing it)\n",
                 name == "dlq" ? "dlq list" : name.c_str(), what, recv ? "received" : "read");
    return kExitUsage;
  }
  if (closed.in_closed && cmd->reads_stdin()) {
    std::fprintf(stderr, "spool: standard input is closed, and send reads the message from it; nothing was sent "
                         "(give MESSAGE arguments, or redirect stdin, e.g. < FILE or < /dev/null for an empty "
                         "message)\n");
    return kExitUsage;
  }
  try {
    return cmd->run();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "spool: %s\n", e.message.c_str());
    return kExitUsage;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything is opened: a queue file must never become stdout (cli/std_fds.h).
  spool::cli::StdFds closed;
  if (!spool::cli::ensure_std_fds(&closed)) {
    std::fprintf(stderr, "spool: cannot open /dev/null onto a closed standard descriptor: %s\n",
                 std::strerror(errno));
    return kExitError;
  }
  int rc = run(argc, argv, closed);
  if (rc == 0 && !stdout_ok()) {
    std::fprintf(stderr, "spool: writing output failed: %s\n", std::strerror(errno));
    rc = kExitError;
  }
  return rc;
}
