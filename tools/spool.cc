// spool: the command-line face of the queue. Every command maps onto the library API;
// the contract (commands, flags, exit codes) is docs/cli.md.
//
// Exit codes: 0 success; 2 recv got no message within --wait; 3 lease lost (stale
// receipt); 64 usage error; 75 pull --once stopped by a full queue; 1 any other error.
#include <cinttypes>
#include <dirent.h>
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <optional>
#include <thread>

#include "cli/forward.h"
#include "cli/pull.h"
#include "cli/output.h"
#include "cli/progress.h"
#include "cli/std_fds.h"
#include "cli/units.h"
#include "cli/work.h"
#include "spool/queue.h"

namespace {

using namespace spool;
using spool::cli::parse_duration;
using spool::cli::parse_size;

constexpr int kExitError = 1;
constexpr int kExitEmpty = 2;
constexpr int kExitLeaseLost = 3;
constexpr int kExitUsage = 64;
constexpr char kMark = '\x1e';  // see "[a,b]" in run()

struct UsageError {
  std::string message;
};

Millis duration_arg(const std::string& flag, const std::string& text) {
  auto d = parse_duration(text);
  if (!d) throw UsageError{"bad duration '" + text + "' for " + flag + " (use 500ms, 30s, 5m, 2h or seconds)"};
  return *d;
}

uint64_t size_arg(const std::string& flag, const std::string& text) {
  auto s = parse_size(text);
  if (!s) throw UsageError{"bad size '" + text + "' for " + flag + " (use 4096, 64K, 64M or 1G)"};
  return *s;
}

// A count of messages: digits only (a K or M suffix would mean 1024s, which no one expects).
uint64_t count_arg(const std::string& flag, const std::string& text) {
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos) {
    throw UsageError{"bad count '" + text + "' for " + flag + " (a whole number, such as 100000)"};
  }
  return std::stoull(text);
}

// A group by name or number (as chgrp takes it).
int64_t group_arg(const std::string& text) {
  if (!text.empty() && text.size() <= 9 && text.find_first_not_of("0123456789") == std::string::npos) {
    return static_cast<int64_t>(std::stoul(text));
  }
  struct group gr {};
  struct group* found = nullptr;
  std::vector<char> buf(16384);
  if (::getgrnam_r(text.c_str(), &gr, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    throw UsageError{"--group " + text + ": no such group"};
  }
  return static_cast<int64_t>(found->gr_gid);
}

// What to suggest for a path that is not a queue: `spool init` only works on a new or empty
// directory (one holding just what a failed open leaves behind: gate, lock).
std::string init_hint(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return "; create it with: spool init " + dir;
  if (!S_ISDIR(st.st_mode)) return "; it is a file: spool init needs a new or empty directory";
  bool foreign = false;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != ".." && name != "gate" && name != "lock") foreign = true;
    }
    ::closedir(d);
  }
  if (foreign) return "; it holds other files: spool init needs a new or empty directory";
  return "; create it with: spool init " + dir;
}

int fail(const Status& s, const std::string& dir = "") {
  std::string msg = s.message();
  if (s.code() == Code::kNotAQueue && !dir.empty()) msg += init_hint(dir);
  if (s.code() == Code::kLeaseLost) {
    std::fprintf(stderr, "spool: %s\n", msg.c_str());
    return kExitLeaseLost;
  }
  if (s.code() == Code::kEmpty) {
    std::fprintf(stderr, "spool: %s\n", msg.c_str());
    return kExitEmpty;
  }
  if (s.code() == Code::kNoSpace) msg += " (free disk space, then retry)";
  std::fprintf(stderr, "spool: %s\n", msg.c_str());
  return kExitError;
}

std::unique_ptr<Queue> open_existing(const std::string& dir, Status* err) {
  QueueOptions o;
  o.create = false;
  auto q = Queue::open(dir, o);
  if (!q.ok()) {
    *err = q.status();
    return nullptr;
  }
  return std::move(q).value();
}

// All of `f`; a read error (stdin is a directory, EIO) is an error, not a short message.
Result<std::string> read_all(FILE* f) {
  std::string s;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  if (std::ferror(f)) return errno_status(errno, "read stdin");
  return s;
}

// Flushes stdout; false (errno set to the first failure's) if anything written to it was
// lost (disk full, EIO).
bool stdout_ok() {
  static int first_errno = 0;
  if (std::fflush(stdout) != 0 && first_errno == 0) first_errno = errno != 0 ? errno : EIO;
  if (std::ferror(stdout) && first_errno == 0) first_errno = EIO;
  errno = first_errno;
  return first_errno == 0;
}

volatile sig_atomic_t g_interrupted = 0;
void on_interrupt(int) { g_interrupted = 1; }

// `q`, or its dead-letter queue for the --dlq of show and delete.
Result<Queue*> queue_or_dead_letters(Queue& q, bool dlq) {
  if (!dlq) return &q;
  return q.dead_letters();
}

void print_messages(const std::vector<Message>& msgs, bool json, bool receipts) {
  for (const auto& m : msgs) {
    if (json) {
      std::printf("%s\n", cli::message_json(m).dump().c_str());
    } else if (receipts) {
      std::fwrite(m.payload.data(), 1, m.payload.size(), stdout);
      // No receipt for a payload that did not get through (recv then returns it and fails).
      if (!stdout_ok()) return;
      std::fprintf(stderr, "receipt: %s\n", m.receipt.c_str());
      for (const auto& [k, v] : m.attributes) std::fprintf(stderr, "attribute: %s=%s\n", k.c_str(), v.c_str());
    } else {
      std::printf("--- message %" PRIu64 " (received %u times, enqueued %s, %zu bytes)\n", m.id,
                  m.receive_count, cli::iso_time(m.enqueued).c_str(), m.payload.size());
      for (const auto& [k, v] : m.attributes) std::printf("attribute: %s=%s\n", k.c_str(), v.c_str());
      std::fwrite(m.payload.data(), 1, m.payload.size(), stdout);
      std::printf("\n");
    }
  }
}

const char* kExamples = R"(
Examples:
  spool init /var/spool/jobs --visibility 5m --max-receives 5
  echo "resize 42.jpg" | spool send /var/spool/jobs
  spool send /var/spool/jobs --lines < tasks.txt
  spool recv /var/spool/jobs --wait 20s --json
  spool ack /var/spool/jobs 17.1.9f3a22c1
  spool work /var/spool/jobs -j 4 -- ./process.sh
  spool stats /var/spool/jobs --json

Durations: 500ms, 30s, 5m, 2h, or a plain number of seconds. Sizes: 4096, 64K, 64M, 1G.
Exit codes: 0 ok, 2 no message within --wait, 3 lease lost (stale receipt), 64 usage error,
75 pull --once stopped by a full queue (try again later), 1 any other error. See docs/cli.md.)";

}  // namespace

static int run(int argc, char** argv, const cli::StdFds& closed);

int main(int argc, char** argv) {
  // Before anything is opened: a queue file must never become stdout (cli/std_fds.h).
  cli::StdFds closed;
  if (!cli::ensure_std_fds(&closed)) {
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

static int run(int argc, char** argv, const cli::StdFds& closed) {
  CLI::App app{"spool: a persistent, brokerless message queue for worker processes on one host"};
  app.require_subcommand(1);
  app.footer(kExamples);
  app.set_version_flag("--version", "spool 0.1.0");

  std::string dir, receipt, sync = "interval", visibility, wait, delay, segment_size, max_payload,
                                dur, max_runtime, target;
  std::vector<std::string> messages, receipts, command;
  uint32_t max_receives = 10;
  size_t n = 1, jobs = 1;
  double rate = 0;
  bool json = false, lines = false, yes = false, watch = false, prom = false;
  std::string dlq_action;

  auto dir_opt = [&](CLI::App* c) { c->add_option("DIR", dir, "Queue directory")->required(); };

  auto* init = app.add_subcommand("init", "Create a queue in DIR (settings are fixed at creation)");
  dir_opt(init);
  init->add_option("--visibility", visibility, "Default lease length of recv (default 30s)");
  init->add_option("--max-receives", max_receives, "Deliveries before dead-lettering; 0: never (default 10)");
  init->add_option("--sync", sync, "Durability: always, interval (default) or never")
      ->check(CLI::IsMember({"always", "interval", "never"}));
  init->add_option("--segment-size", segment_size, "Bytes per segment file (default 64M)");
  init->add_option("--max-payload", max_payload, "Largest message (default 1M)");
  std::string retention_age, retention_bytes;
  init->add_option("--retention-max-age", retention_age, "Drop ready messages older than this (default off)");
  init->add_option("--retention-max-bytes", retention_bytes, "Drop the oldest ready messages above this much payload (default off)");
  std::string max_ready, max_bytes;
  init->add_option("--max-ready", max_ready, "Back-pressure: refuse sends beyond N messages waiting (default off)");
  init->add_option("--max-bytes", max_bytes, "Back-pressure: refuse sends beyond this much payload queued (default off)");
  std::string dedup_window;
  init->add_option("--dedup-window", dedup_window, "How long a send's --dedup-id is remembered (default 5m, at most 7d)");
  std::string mode, group;
  init->add_option("--mode", mode, "Octal mode of the queue's files, e.g. 0660 for a queue a group shares (default: from the umask)");
  init->add_option("--group", group, "Group (name or number) that owns the queue; every file made later, by anyone, takes it");
  init->footer("Example: spool init /var/spool/jobs --visibility 5m --sync always --max-ready 100000\n"
               "Shared by a group: spool init /srv/q --group workers --mode 0660");

  auto* send = app.add_subcommand("send", "Send messages; prints each id");
  dir_opt(send);
  send->add_option("MESSAGE", messages, "Messages (none: all of stdin is one message)");
  send->add_option("--delay", delay, "Deliver no earlier than this from now");
  send->add_flag("--lines", lines, "One message per line of stdin (sent in batches)");
  bool durable = false;
  send->add_flag("--durable", durable, "Return only once the messages are on disk, whatever the queue's --sync");
  send->add_option("--wait", wait, "When the queue is full (--max-ready/--max-bytes), wait up to this long for room (per batch)");
  std::vector<std::string> attrs;
  send->add_option("-a,--attribute", attrs, "Attribute KEY=VALUE of every message sent (repeatable)")
      ->allow_extra_args(false);  // one KEY=VALUE per -a: the MESSAGE arguments are not attributes
  std::string dedup_id;
  send->add_option("--dedup-id", dedup_id, "Deduplication id of the one message sent: a second send with it within the "
                                           "queue's --dedup-window queues nothing and prints the first message's id");
  std::string batch;
  send->add_option("--batch", batch, "Messages per batch (default 1000; at most half the queue's --max-ready/--max-bytes)");
  send->footer("Exit code 1 with 'queue full' when a back-pressure limit is reached (after --wait, if given).\n"
               "Examples: spool send q 'hello'   |   tar c dir | spool send q   |   spool send q --lines < list");

  auto* recv = app.add_subcommand("recv", "Receive (lease) messages");
  dir_opt(recv);
  recv->add_option("-n", n, "Up to this many messages (default 1)")->check(CLI::Range(size_t{1}, size_t{100000}));
  recv->add_option("--visibility", visibility, "Lease length (default: the queue's)");
  recv->add_option("--wait", wait, "Long poll: wait up to this long for a message (default 0)");
  recv->add_flag("--json", json, "One JSON object per line: id, receipt, receive_count, enqueued_at, payload");
  recv->footer("Plain output: the payload byte for byte on stdout, 'receipt: R' on stderr.\n"
               "Exit code 2 when no message arrived within --wait.\n"
               "Example: spool recv q --wait 20s > job && ... && spool ack q RECEIPT");

  auto* ack = app.add_subcommand("ack", "Acknowledge (delete) received messages");
  dir_opt(ack);
  ack->add_option("RECEIPT", receipts, "Receipts printed by recv")->required();
  ack->add_flag("--durable", durable, "Return only once the ack is on disk, whatever the queue's --sync");
  ack->footer("Exit code 3 when a receipt is stale (its lease expired and the message was received again).\n"
              "Examples: spool ack q 17.1.9f3a22c1   |   spool recv q -n 10 --json | jq -r .receipt | xargs spool ack q");

  auto* nack = app.add_subcommand("nack", "Return a received message to the queue");
  dir_opt(nack);
  nack->add_option("RECEIPT", receipt, "Receipt printed by recv")->required();
  nack->add_option("--delay", delay, "Ready again after this long (default now)");
  nack->footer("Exit codes as for ack. Example: spool nack q 17.1.9f3a22c1 --delay 30s");

  auto* extend = app.add_subcommand("extend", "Renew a lease to DUR from now");
  dir_opt(extend);
  extend->add_option("RECEIPT", receipt, "Receipt printed by recv")->required();
  extend->add_option("DUR", dur, "New lease length")->required();
  extend->footer("Exit codes as for ack. Example: spool extend q 17.1.9f3a22c1 5m   (spool work renews its leases itself)");

  auto* peek = app.add_subcommand("peek", "Show messages without receiving them");
  dir_opt(peek);
  peek->add_option("-n", n, "Up to this many, oldest first (default 1)");
  peek->add_flag("--json", json, "One JSON object per line");
  peek->footer("Ready, in flight and delayed messages alike; nothing is received.\n"
               "Examples: spool peek q -n 5   |   spool peek q -n 100 --json | jq -r .payload");

  bool in_dlq = false;
  std::vector<std::string> list_states;
  auto* list = app.add_subcommand("list", "List messages with their state, without payloads");
  dir_opt(list);
  list->add_option("-n", n, "Up to this many, lowest ids first (default 100)");
  list->add_option("--state", list_states, "Only these: ready, in_flight, delayed, dead (the dead letters)")
      ->delimiter(',')
      ->check(CLI::IsMember({"ready", "in_flight", "delayed", "dead"}));
  list->add_flag("--json", json, "One JSON object per line");
  list->footer("Columns: ID STATE RECEIVES BYTES DUE (lease end or delay end) HOLDER (pid of a process whose\n"
               "lease is bound to its life). Nothing is received, and nothing is written to the queue.\n"
               "Examples: spool list q   |   spool list q --state in_flight,delayed   |   spool list q --json | jq .id");

  uint64_t show_id = 0;
  auto* show = app.add_subcommand("show", "Show one message by id, in any state, without receiving it");
  dir_opt(show);
  show->add_option("ID", show_id, "Message id, as send, list or peek print it")->required();
  show->add_flag("--dlq", in_dlq, "ID is a dead letter's (as dlq list prints it)");
  show->add_flag("--json", json, "One JSON object");
  show->footer("Prints the state, receive count, enqueue and due time, holder, attributes, then the payload.\n"
               "Exit 1 when the queue holds no message ID. Examples: spool show q 17   |   spool show q 17 --json");

  auto* purge = app.add_subcommand("purge", "Delete every message");
  dir_opt(purge);
  purge->add_flag("--yes", yes, "Confirm");
  purge->footer("Deletes every message (not the dead letters). Example: spool purge /var/spool/jobs --yes");

  std::vector<std::string> delete_ids;
  auto* del = app.add_subcommand("delete", "Delete messages by id, in any state, without a receipt");
  dir_opt(del);
  del->add_option("ID", delete_ids, "Message ids, as send, peek or dlq list print them")->required();
  del->add_flag("--dlq", in_dlq, "The ids are those of dead letters (as dlq list prints them)");
  del->footer("Ready, in flight and delayed messages alike; a receipt held for a deleted message then fails.\n"
              "An id not in the queue is reported and the others are still deleted (exit 1).\n"
              "Examples: spool delete q 17 18   |   spool delete q --dlq 3");

  auto* dlq = app.add_subcommand("dlq", "Dead letters: list them, redrive them into the queue, or purge them");
  dir_opt(dlq);
  dlq->add_option("ACTION", dlq_action, "list, redrive or purge")->required()->check(CLI::IsMember({"list", "redrive", "purge"}));
  dlq->add_option("-n", n, "list: up to this many (default 100); redrive: at most this many, oldest first (default all)");
  dlq->add_flag("--json", json, "list: one JSON object per line; redrive, purge: the count as JSON");
  dlq->add_flag("--yes", yes, "purge: confirm");
  dlq->footer("Examples: spool dlq q list -n 10   |   spool dlq q list --json | jq -r .payload   |   spool dlq q redrive\n"
              "          spool dlq q redrive -n 5   |   spool dlq q purge --yes");

  auto* stats = app.add_subcommand("stats", "Show queue depth and totals");
  dir_opt(stats);
  stats->add_flag("--json", json, "As one JSON object");
  stats->add_flag("--watch", watch, "Refresh every second until interrupted");
  stats->add_flag("--prometheus", prom, "Prometheus text exposition format");
  stats->add_option("--rate", rate, "Messages per second one worker handles (for recommended_workers)");
  stats->add_option("--target", target, "Latency target for the backlog (for recommended_workers)");
  stats->footer("--json and --prometheus are two formats: give at most one.\n"
                "Examples: spool stats q --watch   |   spool stats q --json --rate 20 --target 30s\n"
                "          spool stats q --prometheus > /var/lib/node_exporter/textfile/spool_q.prom");

  std::string mountpoint;
  std::vector<std::string> mount_args;
  auto* mount = app.add_subcommand("mount", "Mount the queue as a directory (runs spoolfs)");
  dir_opt(mount);
  mount->add_option("MOUNTPOINT", mountpoint, "Where to mount (an empty directory)")->required();
  mount->add_option("SPOOLFS_ARGS", mount_args, "Further spoolfs options, after --: -o visibility=DUR, --limit N, -f, -d");
  mount->footer("Example: spool mount /var/spool/jobs ~/jobs -- -o visibility=5m\n"
                "Unmount with: fusermount3 -u MOUNTPOINT. See docs/filesystem.md.");

  bool repair = false;
  auto* compact = app.add_subcommand("compact", "Reclaim the disk of acked messages now");
  dir_opt(compact);
  compact->add_flag("--json", json, "Print the result as JSON");
  compact->footer("Also runs on its own in the background (docs/compaction.md). Example: spool compact /var/spool/jobs");

  auto* verify = app.add_subcommand("verify", "Check segments, index and counters (fsck)");
  dir_opt(verify);
  verify->add_flag("--repair", repair, "Rebuild the index from the log if they disagree");
  verify->add_flag("--json", json, "Print the report as JSON");
  verify->footer("Exit code 0 when the queue is sound (after --repair, if given), 1 when problems remain.\n"
                 "Examples: spool verify /var/spool/jobs   |   spool verify /var/spool/jobs --repair --json");

  auto* work = app.add_subcommand("work", "Run CMD once per message, payload on stdin");
  dir_opt(work);
  work->add_option("-j", jobs, "Run up to N commands at once (default 1)")->check(CLI::Range(size_t{1}, size_t{1024}));
  work->add_option("--visibility", visibility, "Lease length, renewed while CMD runs (default: the queue's)");
  work->add_option("--max-runtime", max_runtime, "Stop CMD (SIGTERM, then SIGKILL) and nack after this long");
  bool until_empty = false, verbose = false;
  std::string grace, max_messages;
  work->add_flag("--until-empty", until_empty, "Exit 0 once the queue has been empty (nothing ready, delayed or in flight) for --grace");
  work->add_option("--grace", grace, "With --until-empty: how long the queue must stay empty (default 1s)");
  work->add_option("--max-messages", max_messages, "Take at most N messages, let their commands finish, exit 0");
  work->add_flag("-v,--verbose", verbose, "Log each message's outcome and duration");
  work->add_option("CMD", command, "Command and arguments, after --")->required();
  work->footer("CMD gets SPOOL_QUEUE, SPOOL_MESSAGE_ID, SPOOL_RECEIVE_COUNT and SPOOL_RECEIPT in its environment.\n"
               "Exit 0 acks; non-zero nacks with exponential backoff (1s, 2s, 4s, ... 10m).\n"
               "SIGTERM/SIGINT: stop taking messages, wait for running commands; a second signal\n"
               "stops them too (SIGTERM, SIGKILL 5s later) and nacks their messages.\n"
               "Example: spool work /var/spool/jobs -j 4 -- sh -c 'convert - out/$SPOOL_MESSAGE_ID.png'");

  cli::ForwardArgs forward_args;
  auto* forward = cli::add_forward_command(app, dir, forward_args);
  cli::PullArgs pull_args;
  auto* pull = cli::add_pull_command(app, dir, pull_args);

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
  std::vector<char*> marked_argv;
  for (auto& a : marked) marked_argv.push_back(a.data());
  for (auto* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    for (auto* opt : sub->get_options([](CLI::Option* o) { return o->get_items_expected_max() > 0; })) {
      opt->transform([](std::string v) { return !v.empty() && v[0] == kMark ? v.substr(1) : v; });
    }
  }
  try {
    app.parse(argc, marked_argv.data());
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::string help = "spool --help";
    for (auto* sub : app.get_subcommands()) help = "spool " + sub->get_name() + " --help";
    std::string what = e.what();
    std::erase(what, kMark);
    std::fprintf(stderr, "spool: %s (run '%s' for usage)\n", what.c_str(), help.c_str());
    return kExitUsage;
  }

  // The --nats URL's password leaves /proc/PID/cmdline now that CLI11 has a copy of it.
  if (*forward || *pull) cli::hide_url_secrets(argc, argv);

  // A command whose output is the data refuses a closed stdout before it touches the queue:
  // with /dev/null there a received message would be lost silently (docs/cli.md).
  if (closed.out_closed) {
    const char* what = *recv ? "recv" : *peek ? "peek" : *list ? "list" : *show ? "show" : *stats ? "stats"
                     : (*dlq && dlq_action == "list") ? "dlq list" : nullptr;
    if (what != nullptr) {
      std::fprintf(stderr, "spool: standard output is closed, and %s writes %s there; nothing was %s "
                           "(redirect it, e.g. > FILE, instead of closing it)\n",
                   what, *recv ? "the payload" : "its output", *recv ? "received" : "read");
      return kExitUsage;
    }
  }
  if (closed.in_closed && *send && messages.empty()) {
    std::fprintf(stderr, "spool: standard input is closed, and send reads the message from it; nothing was sent "
                         "(give MESSAGE arguments, or redirect stdin, e.g. < FILE or < /dev/null for an empty "
                         "message)\n");
    return kExitUsage;
  }

  try {
    Status err;
    if (*init) {
      QueueOptions o;
      if (!visibility.empty()) o.visibility = duration_arg("--visibility", visibility);
      if (o.visibility.count() <= 0) throw UsageError{"--visibility must be more than 0"};
      o.max_receives = max_receives;
      o.sync = sync == "always" ? SyncPolicy::kAlways : sync == "never" ? SyncPolicy::kNever : SyncPolicy::kInterval;
      if (!segment_size.empty()) o.segment_size = size_arg("--segment-size", segment_size);
      if (!max_payload.empty()) o.max_payload = size_arg("--max-payload", max_payload);
      if (!retention_age.empty()) o.retention_max_age = duration_arg("--retention-max-age", retention_age);
      if (!retention_bytes.empty()) o.retention_max_bytes = size_arg("--retention-max-bytes", retention_bytes);
      if (!max_ready.empty()) o.max_ready = count_arg("--max-ready", max_ready);
      if (!max_bytes.empty()) o.max_bytes = size_arg("--max-bytes", max_bytes);
      if (!dedup_window.empty()) o.dedup_window = duration_arg("--dedup-window", dedup_window);
      if (!mode.empty()) {
        const bool octal = mode.size() <= 4 && mode.find_first_not_of("01234567") == std::string::npos;
        o.mode = octal ? static_cast<uint32_t>(std::stoul(mode, nullptr, 8)) : 01000;
        if (!octal || o.mode == 0) throw UsageError{"--mode " + mode + ": an octal file mode such as 0660 or 0640"};
      }
      if (!group.empty()) o.group = group_arg(group);
      QueueOptions probe;
      probe.create = false;
      if (Queue::open(dir, probe).ok()) {
        std::fprintf(stderr, "spool: %s is already a queue (its settings were fixed when it was created)\n", dir.c_str());
        return kExitError;
      }
      // A refused init leaves nothing behind: not the directory (later commands would call
      // it "not a spool queue"), nor the files the open made in an empty one.
      struct stat before {};
      const bool existed = ::stat(dir.c_str(), &before) == 0;
      std::vector<std::string> made;
      for (const char* f : {"gate", "lock"}) {
        if (::access((dir + "/" + f).c_str(), F_OK) != 0) made.push_back(dir + "/" + f);
      }
      auto q = Queue::open(dir, o);
      if (!q.ok()) {
        for (const auto& f : made) ::unlink(f.c_str());
        if (!existed) ::rmdir(dir.c_str());
        // The library rejects out-of-range settings (segment size, max payload) this way.
        if (q.status().code() == Code::kInvalidArgument) throw UsageError{q.status().message()};
        return fail(q.status(), "");
      }
      return 0;
    }
    if (*send) {
      SendOptions so;
      if (!delay.empty()) so.delay = duration_arg("--delay", delay);
      if (!wait.empty()) so.wait_for_room = duration_arg("--wait", wait);
      if (durable) so.durability = Durability::kSync;
      for (const std::string& a : attrs) {
        size_t eq = a.find('=');
        if (eq == std::string::npos || eq == 0) throw UsageError{"-a takes KEY=VALUE, not '" + a + "'"};
        if (!so.attributes.emplace(a.substr(0, eq), a.substr(eq + 1)).second) {
          throw UsageError{"-a names the attribute '" + a.substr(0, eq) + "' twice"};
        }
      }
      uint64_t max_batch = 1000;
      if (!batch.empty()) max_batch = count_arg("--batch", batch);
      if (max_batch == 0 || max_batch > 100000) throw UsageError{"--batch must be 1 to 100000"};
      auto q = open_existing(dir, &err);
      if (!q) return fail(err, dir);
      std::vector<std::string> bodies = messages;
      if (bodies.empty()) {
        auto read = read_all(stdin);
        if (!read.ok()) return fail(read.status());
        std::string in = std::move(read).value();
        if (!lines) {
          bodies.push_back(std::move(in));
        } else {
          size_t start = 0;
          while (start < in.size()) {
            size_t end = in.find('\n', start);
            if (end == std::string::npos) end = in.size();
            bodies.push_back(in.substr(start, end - start));
            start = end + 1;
          }
        }
      } else if (lines) {
        throw UsageError{"--lines reads stdin; give either MESSAGE arguments or --lines"};
      }
      auto bad_arg = [](const Status& s) {
        // The library names what is wrong with an attribute or a dedup id.
        if (s.code() == Code::kInvalidArgument) throw UsageError{s.message()};
        return s;
      };
      if (!dedup_id.empty()) {
        if (bodies.size() != 1) throw UsageError{"--dedup-id names one message; send exactly one"};
        so.dedup_id = dedup_id;
        auto id = q->send(bodies.front(), so);
        if (!id.ok()) return fail(bad_arg(id.status()), dir);
        std::printf("%" PRIu64 "\n", *id);
        return 0;
      }
      // Batches that fit a bounded queue: a batch larger than max_ready (or max_bytes) could
      // never be sent, and one of half of it fits as soon as the queue is half drained.
      const QueueOptions& qo = q->options();
      uint64_t per_batch = max_batch;
      if (qo.max_ready > 0) per_batch = std::min<uint64_t>(per_batch, std::max<uint64_t>(1, qo.max_ready / 2));
      const uint64_t batch_bytes = qo.max_bytes > 0 ? std::max<uint64_t>(1, qo.max_bytes / 2) : UINT64_MAX;
      for (size_t i = 0; i < bodies.size();) {
        std::vector<std::string_view> chunk;
        uint64_t bytes = 0;
        for (; i < bodies.size() && chunk.size() < per_batch; ++i) {
          if (!chunk.empty() && bytes + bodies[i].size() > batch_bytes) break;
          bytes += bodies[i].size();
          chunk.push_back(bodies[i]);
        }
        auto ids = q->send_batch(chunk, so);
        if (!ids.ok()) return fail(bad_arg(ids.status()), dir);
        for (uint64_t id : *ids) std::printf("%" PRIu64 "\n", id);
        std::fflush(stdout);
      }
      return 0;
    }
    if (*recv) {
      Millis vis = visibility.empty() ? Millis(0) : duration_arg("--visibility", visibility);
      Millis w = wait.empty() ? Millis(0) : duration_arg("--wait", wait);
      auto q = open_existing(dir, &err);
      if (!q) return fail(err, dir);
      auto msgs = q->receive(n, vis, w);
      if (!msgs.ok()) return fail(msgs.status(), dir);
      print_messages(*msgs, json, true);
      if (!stdout_ok()) {
        // The payload did not reach its destination: give the messages back at once rather
        // than exit 0 and let a script ack what it never got.
        int write_errno = errno;
        for (const auto& m : *msgs) (void)q->nack(m.receipt);
        std::fprintf(stderr, "spool: writing the payload failed: %s; the message was returned to the queue\n",
                     std::strerror(write_errno));
        return kExitError;
      }
      return 0;
    }
    if (*ack) {
      auto q = open_existing(dir, &err);
      if (!q) return fail(err, dir);
      int rc = 0;
      for (const auto& r : receipts) {
        Status s = q->ack(r, durable ? Durability::kSync : Durability::kQueuePolicy);
        if (!s.ok()) {
          int code = fail(s, dir);
          if (rc == 0 || code == kExitLeaseLost) rc = code;
        }
      }
      return rc;
    }
    if (*nack) {
      Millis d = delay.empty() ? Millis(0) : duration_arg("--delay", delay);
      auto q = open_existing(dir, &err);
      if (!q) return fail(err, dir);
      Status s = q->nack(receipt, d);
      return s.ok() ? 0 : fail(s, dir);
    }
    if (*extend) {
      Millis d = duration_arg("DUR", dur);
      if (d.count() <= 0) throw UsageError{"DUR must be more than 0"};
      auto q = open_existing(dir, &err);
      if (!q) return fail(err, dir);
      Status s = q->extend(receipt, d);
      return s.ok() ? 0 : fail(s, dir);
    }
    if (*peek) {
      auto q = open_existing(dir, &err);
      if (!q) return fail(err, dir);
      auto msgs = q->peek(n);
      if (!msgs.ok()) return fail(msgs.status(), dir);
      print_messages(*msgs, json, false);
      return 0;
    }
    if (*list) {
      const size_t max = list->count("-n") != 0 ? n : 100;
      StateFilter states{false, false, false};
      bool dead = list_states.empty();
      for (const auto& st : list_states) {
        if (st == "ready") states.ready = true;
        if (st == "in_flight") states.in_flight = true;
        if (st == "delayed") states.delayed = true;
        if (st == "dead") dead = true;
      }
      if (list_states.empty()) states = StateFilter{};
      auto q = open_existing(dir, &err);
      if (!q) return fail(err, dir);
      std::vector<MessageInfo> infos;
      if (states.ready || states.in_flight || states.delayed) {
        auto got = q->list(max, states);
        if (!got.ok()) return fail(got.status(), dir);
        infos = std::move(*got);
      }
      // Dead letters after the queue's messages, under their ids in the dead-letter queue
      // (as dlq list, show --dlq and delete --dlq take them). A queue that never had one
      // has none: list creates nothing (and a read-only user could not).
      std::vector<MessageInfo> dead_infos;
      struct stat dlq_conf {};
      if (dead && infos.size() < max && ::stat((dir + "/dlq/spool.conf").c_str(), &dlq_conf) == 0) {
        auto d = q->dead_letters();
        if (!d.ok()) return fail(d.status(), dir);
        auto got = (*d)->list(max - infos.size());
        if (!got.ok()) return fail(got.status(), dir);
        dead_infos = std::move(*got);
      }
      if (!json) std::printf("%s\n", cli::list_header().c_str());
      for (const auto& m : infos) {
        std::printf("%s\n", json ? cli::info_json(m).dump().c_str() : cli::info_line(m).c_str());
      }
      for (const auto& m : dead_infos) {
        std::printf("%s\n", json ? cli::info_json(m, true).dump().c_str() : cli::info_line(m, true).c_str());
      }
      return 0;
    }
    if (*show) {
      auto q = open_existing(dir, &err);
      if (!q) return fail(err, dir);
      auto which = queue_or_dead_letters(*q, in_dlq);
      if (!which.ok()) return fail(which.status(), dir);
      Queue* target_q = *which;
      auto got = target_q->show(show_id);
      if (!got.ok()) return fail(got.status(), dir);
      const auto& [m, info] = *got;
      const char* state = in_dlq ? "dead" : state_name(info.state);
      if (json) {
        auto j = cli::message_json(m);
        j.update(cli::info_json(info, in_dlq));  // state, size, due_at, holder_pid
        std::printf("%s\n", j.dump().c_str());
        return 0;
      }
      std::printf("id: %" PRIu64 "\nstate: %s\nreceive_count: %u\nsize: %u\nenqueued: %s\n", m.id, state,
                  info.receive_count, info.size, cli::iso_time(m.enqueued).c_str());
      if (!in_dlq && info.state != MessageState::kReady) std::printf("due: %s\n", cli::iso_time(info.due).c_str());
      if (!in_dlq && info.holder_pid != 0) std::printf("holder_pid: %d\n", info.holder_pid);
      for (const auto& [k, v] : m.attributes) std::printf("attribute: %s=%s\n", k.c_str(), v.c_str());
      std::printf("---\n");
      std::fwrite(m.payload.data(), 1, m.payload.size(), stdout);
      std::printf("\n");
      return 0;
    }
    if (*purge) {
      if (!yes) throw UsageError{"purge deletes every message in " + dir + "; add --yes to confirm"};
      auto q = open_existing(dir, &err);
      if (!q) return fail(err, dir);
      auto count = q->purge();
      if (!count.ok()) return fail(count.status(), dir);
      std::fprintf(stderr, "purged %" PRIu64 " messages\n", *count);
      return 0;
    }
    if (*del) {
      // Every id is checked before anything is deleted: a typo among them is a usage error
      // that changes nothing, not half a deletion.
      std::vector<uint64_t> ids;
      for (const auto& text : delete_ids) {
        uint64_t id = count_arg("ID", text);
        if (id == 0) throw UsageError{"bad ID '0' (message ids start at 1)"};
        ids.push_back(id);
      }
      auto q = open_existing(dir, &err);
      if (!q) return fail(err, dir);
      auto which = queue_or_dead_letters(*q, in_dlq);
      if (!which.ok()) return fail(which.status(), dir);
      Queue* target_q = *which;
      // An id that is not there does not stop the others: a script deleting a list wants as
      // much of it gone as can be, and the error names each id that was not there.
      int rc = 0;
      for (uint64_t id : ids) {
        if (Status s = target_q->remove(id); !s.ok()) rc = fail(s, dir);
      }
      return rc;
    }
    if (*dlq) {
      if (dlq_action == "purge" && !yes) {
        throw UsageError{"dlq purge deletes every dead letter of " + dir + "; add --yes to confirm"};
      }
      if (dlq_action == "purge" && dlq->count("-n") != 0) {
        throw UsageError{"-n is for dlq list and dlq redrive; dlq purge deletes every dead letter"};
      }
      if (dlq_action == "redrive" && dlq->count("-n") != 0 && n == 0) {
        throw UsageError{"-n must be at least 1 for dlq redrive"};
      }
      auto q = open_existing(dir, &err);
      if (!q) return fail(err, dir);
      if (dlq_action == "purge") {
        auto d = q->dead_letters();
        if (!d.ok()) return fail(d.status(), dir);
        auto count = (*d)->purge();
        if (!count.ok()) return fail(count.status(), dir);
        if (json) {
          std::printf("{\"purged\":%" PRIu64 "}\n", *count);
        } else {
          std::fprintf(stderr, "purged %" PRIu64 " dead letters\n", *count);
        }
        return 0;
      }
      if (dlq_action == "redrive") {
        // In chunks, for the progress bar: the total is the dead-letter depth at the start
        // (or the -n limit, if lower).
        const uint64_t limit = dlq->count("-n") != 0 ? n : UINT64_MAX;
        uint64_t total = 0, moved = 0;
        if (auto d = q->dead_letters(); d.ok()) {
          if (auto ds = (*d)->stats(); ds.ok()) total = std::min(limit, ds->ready + ds->delayed + ds->in_flight);
        }
        cli::ProgressBar bar("redrive");
        while (moved < limit) {
          const uint64_t want = std::min<uint64_t>(1000, limit - moved);
          auto chunk = q->redrive(static_cast<size_t>(want));
          if (!chunk.ok()) return fail(chunk.status(), dir);
          moved += *chunk;
          bar.update(moved, std::max(total, moved));
          if (*chunk < want) break;
        }
        if (json) {
          std::printf("{\"redriven\":%" PRIu64 "}\n", moved);
        } else {
          std::fprintf(stderr, "redrove %" PRIu64 " messages\n", moved);
        }
        return 0;
      }
      auto d = q->dead_letters();
      if (!d.ok()) return fail(d.status(), dir);
      auto msgs = (*d)->peek(dlq->count("-n") ? n : 100);
      if (!msgs.ok()) return fail(msgs.status(), dir);
      print_messages(*msgs, json, false);
      return 0;
    }
    if (*stats) {
      double target_s = 0;
      if (!target.empty()) target_s = static_cast<double>(duration_arg("--target", target).count()) / 1000.0;
      if ((rate > 0) != (target_s > 0)) throw UsageError{"--rate and --target go together, both above 0"};
      if (prom && json) throw UsageError{"--prometheus and --json are two output formats: choose one"};
      auto q = open_existing(dir, &err);
      if (!q) return fail(err, dir);
      ::signal(SIGINT, on_interrupt);
      ::signal(SIGTERM, on_interrupt);
      bool tty = ::isatty(1);
      std::optional<Stats> prev;
      auto prev_at = std::chrono::steady_clock::now();
      do {
        auto st = q->stats();
        if (!st.ok()) return fail(st.status(), dir);
        auto now = std::chrono::steady_clock::now();
        double seconds = std::chrono::duration<double>(now - prev_at).count();
        std::string out;
        if (prom) {
          out = cli::prometheus(dir, *st);
          if (rate > 0) {
            out += "# HELP spool_recommended_workers Workers needed to meet the latency target.\n"
                   "# TYPE spool_recommended_workers gauge\nspool_recommended_workers{queue=\"" + dir +
                   "\"} " + std::to_string(st->workers_needed(rate, target_s)) + "\n";
          }
        } else if (json) {
          auto j = cli::stats_json(*st);
          if (rate > 0) j["recommended_workers"] = st->workers_needed(rate, target_s);
          out = j.dump() + "\n";
        } else {
          out = cli::human_stats(dir, *st, prev ? &*prev : nullptr, seconds);
          if (rate > 0) out += "workers needed " + std::to_string(st->workers_needed(rate, target_s)) + "\n";
        }
        prev = *st;
        prev_at = now;
        if (watch && tty) std::fputs("\033[H\033[2J", stdout);
        std::fputs(out.c_str(), stdout);
        if (!stdout_ok()) break;  // reported by main()
        for (int i = 0; watch && i < 10 && !g_interrupted; ++i) std::this_thread::sleep_for(Millis(100));
      } while (watch && !g_interrupted);
      return 0;
    }
    if (*mount) {
      // spoolfs sits beside spool when installed, in ../fuse/ in a build tree, else on PATH.
      char self[4096];
      ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
      std::string here = len > 0 ? std::string(self, static_cast<size_t>(len)) : "";
      here = here.substr(0, here.find_last_of('/'));
      std::string exe = "spoolfs";
      for (const std::string& c : {here + "/spoolfs", here + "/../fuse/spoolfs"}) {
        if (::access(c.c_str(), X_OK) == 0) {
          exe = c;
          break;
        }
      }
      std::vector<std::string> args = {exe, dir, mountpoint};
      args.insert(args.end(), mount_args.begin(), mount_args.end());
      std::vector<char*> argv_c;
      for (auto& a : args) argv_c.push_back(a.data());
      argv_c.push_back(nullptr);
      ::execvp(exe.c_str(), argv_c.data());
      std::fprintf(stderr, "spool: cannot run spoolfs (%s); is it installed?\n", std::strerror(errno));
      return kExitError;
    }
    if (*compact) {
      auto q = open_existing(dir, &err);
      if (!q) return fail(err, dir);
      cli::ProgressBar bar("compact");
      auto r = q->compact([&](uint64_t done, uint64_t total) { bar.update(done, total); });
      if (!r.ok()) return fail(r.status(), dir);
      if (json) {
        std::printf("{\"segments_removed\":%" PRIu64 ",\"messages_copied\":%" PRIu64 ",\"bytes_freed\":%" PRIu64 "}\n",
                    r->segments_removed, r->messages_copied, r->bytes_freed);
      } else {
        std::printf("removed %" PRIu64 " segments (%.1f MiB), copied %" PRIu64 " live messages\n", r->segments_removed,
                    static_cast<double>(r->bytes_freed) / (1 << 20), r->messages_copied);
      }
      return 0;
    }
    if (*verify) {
      auto q = open_existing(dir, &err);
      if (!q) return fail(err, dir);
      cli::ProgressBar bar("verify");
      auto r = q->verify(repair, [&](uint64_t done, uint64_t total) { bar.update(done, total); });
      if (!r.ok()) return fail(r.status(), dir);
      if (json) {
        nlohmann::json j{{"ok", r->ok()}, {"segments", r->segments}, {"records", r->records},
                         {"messages", r->messages}, {"problems", r->problems}, {"repairs", r->repairs}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        for (const auto& p : r->problems) std::printf("problem: %s\n", p.c_str());
        for (const auto& p : r->repairs) std::printf("repaired: %s\n", p.c_str());
        std::printf("%s: %" PRIu64 " segments, %" PRIu64 " records, %" PRIu64 " messages%s\n", dir.c_str(), r->segments, r->records,
                    r->messages, r->ok() ? ", ok" : "");
      }
      return r->ok() ? 0 : kExitError;
    }
    if (*forward) {
      auto q = open_existing(dir, &err);
      if (!q) return fail(err, dir);
      return cli::run_forward(*q, forward_args);
    }
    if (*pull) {
      auto q = open_existing(dir, &err);
      if (!q) return fail(err, dir);
      return cli::run_pull(*q, pull_args);
    }
    if (*work) {
      cli::WorkOptions o;
      o.jobs = jobs;
      if (!visibility.empty()) o.visibility = duration_arg("--visibility", visibility);
      if (!max_runtime.empty()) o.max_runtime = duration_arg("--max-runtime", max_runtime);
      if (!grace.empty() && !until_empty) throw UsageError{"--grace goes with --until-empty"};
      if (!grace.empty()) o.grace = duration_arg("--grace", grace);
      o.until_empty = until_empty;
      if (!max_messages.empty()) {
        o.max_messages = count_arg("--max-messages", max_messages);
        if (*o.max_messages == 0) throw UsageError{"--max-messages must be at least 1"};
      }
      o.verbose = verbose;
      o.command = command;
      auto q = open_existing(dir, &err);
      if (!q) return fail(err, dir);
      return cli::run_work(*q, o);
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "spool: %s\n", e.message.c_str());
    return kExitUsage;
  }
  return kExitUsage;
}
