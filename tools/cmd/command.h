// A subcommand of `spool`: the flags it adds to the app, and what it does once they are
// parsed. tools/spool.cc builds the app from these, parses, refuses a closed standard
// descriptor where a command's data goes, and runs the one command given. Each command maps
// onto the library API; the contract (commands, flags, exit codes) is docs/cli.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "spool/queue.h"

namespace CLI {
class App;
class Error;
}

namespace spool::cmd {

inline constexpr int kExitError = 1;
inline constexpr int kExitEmpty = 2;
inline constexpr int kExitLeaseLost = 3;
inline constexpr int kExitUsage = 64;
// A full queue (back-pressure limits): EX_TEMPFAIL, try again later; the same on every
// command, as pull --once has it.
inline constexpr int kExitTryLater = 75;

// A flag value found wrong after parsing: "spool: MESSAGE" on stderr, exit kExitUsage.
struct UsageError {
  std::string message;
};

struct Command {
  CLI::App* sub = nullptr;
  std::function<int()> run;
  // Asked after parsing. What the command writes to stdout that is its data ("the payload",
  // "its output"), or nullptr; and whether it reads its data from stdin.
  std::function<const char*()> stdout_data = [] { return nullptr; };
  std::function<bool()> reads_stdin = [] { return false; };
};

// Each adds its subcommands to `app`.
Command add_init(CLI::App& app);
Command add_send(CLI::App& app);
std::vector<Command> add_message_commands(CLI::App& app);  // recv ack nack extend peek list show purge delete
Command add_dlq(CLI::App& app);
Command add_stats(CLI::App& app);
Command add_replay(CLI::App& app);
std::vector<Command> add_admin_commands(CLI::App& app);  // mount umount compact verify serve
Command add_work(CLI::App& app);
// `spool work DIR [OPTIONS] CMD ARGS...`: spool's options end at CMD, so CMD's own options
// (`grep -v x`) are CMD's. Puts "--" before CMD in `args` (argv as given; args[1] is
// "work") unless the user wrote one; `work` is the subcommand add_work made, whose options
// tell which flags take a value.
void end_work_options_at_command(CLI::App& work, std::vector<std::string>& args);
std::vector<Command> add_nats_commands(CLI::App& app);  // forward pull
std::vector<Command> add_ops_commands(CLI::App& app);   // pause resume release move
Command add_top(CLI::App& app);
Command add_sub(CLI::App& app);  // sub add|list|rm

// What the commands share.
void add_dir(CLI::App* sub, std::string& dir);  // the DIR argument every command takes
// --sub NAME: the command reads subscription NAME of the queue (open_existing's `subscription`).
void add_subscription_flag(CLI::App* sub, std::string& name);
// Names what each flag of every command takes, for --help: DUR (a duration), SIZE, N (a
// count or number), ID, in place of CLI11's TEXT, UINT or FLOAT.
void name_flag_values(CLI::App& app);
// CLI11's failure_message hook: a parse error in spool's words, "spool CMD: what is wrong;
// what to do" (the command, the flag or argument at fault and what it takes, from the app
// as parsed so far), for an error CLI11 throws while parsing `app`.
std::string parse_failure(const CLI::App* app, const CLI::Error& e);
// Flag values: a bad one throws UsageError naming the flag and the accepted forms.
Millis duration_arg(const std::string& flag, const std::string& text);
uint64_t size_arg(const std::string& flag, const std::string& text);
uint64_t count_arg(const std::string& flag, const std::string& text);  // digits only
// Prints `s` on stderr (for a path that is not a queue, with what `spool init` would say of
// it) and returns the exit code it stands for.
int fail(const Status& s, const std::string& dir = "");
// The queue in `dir`, never created, read through `subscription` (QueueOptions::subscription;
// empty: the queue's own view); nullptr with `err` set if it cannot be opened.
std::unique_ptr<Queue> open_existing(const std::string& dir, Status* err, const std::string& subscription = "");
// Flushes stdout; false (errno set to the first failure's) if anything written to it was
// lost (disk full, EIO).
bool stdout_ok();
// Messages as recv (`receipts`: payload on stdout, receipt on stderr), peek and dlq list
// print them.
void print_messages(const std::vector<Message>& msgs, bool json, bool receipts, bool dead_letters = false);

}  // namespace spool::cmd
