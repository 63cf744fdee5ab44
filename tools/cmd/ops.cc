// The operator's actions: pause, resume, release, move (docs/operations.md).
#include <cinttypes>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/units.h"
#include "cmd/command.h"

namespace spool::cmd {
namespace {

struct OpsArgs {
  std::string dir, dst;
  std::vector<std::string> ids;
  std::string max;
  bool json = false, dlq = false;
};

int run_pause(const OpsArgs& a, bool on) {
  Status err;
  auto q = open_existing(a.dir, &err);
  if (!q) return fail(err, a.dir);
  if (Status s = on ? q->pause() : q->resume(); !s.ok()) return fail(s, a.dir);
  std::fprintf(stderr, "%s %s\n", a.dir.c_str(), on ? "paused: sends are kept, nothing is delivered" : "resumed");
  return 0;
}

std::vector<uint64_t> id_args(const std::vector<std::string>& texts, const char* flag) {
  std::vector<uint64_t> ids;
  for (const auto& text : texts) {
    uint64_t id = count_arg(flag, text);
    if (id == 0) throw UsageError{std::string("bad ") + flag + " '0' (message ids start at 1)"};
    ids.push_back(id);
  }
  return ids;
}

int run_release(const OpsArgs& a) {
  const std::vector<uint64_t> ids = id_args(a.ids, "ID");
  Status err;
  auto q = open_existing(a.dir, &err);
  if (!q) return fail(err, a.dir);
  int rc = 0;
  for (uint64_t id : ids) {
    if (Status s = q->release(id); !s.ok()) rc = fail(s, a.dir);
  }
  return rc;
}

int run_move(const OpsArgs& a) {
  Queue::MoveOptions o;
  o.ids = id_args(a.ids, "--id");
  if (!a.max.empty()) {
    o.max = count_arg("--max", a.max);
    if (o.max == 0) throw UsageError{"--max must be at least 1"};
  }
  Status err;
  auto src = open_existing(a.dir, &err);
  if (!src) return fail(err, a.dir);
  auto dst = open_existing(a.dst, &err);
  if (!dst) return fail(err, a.dst);
  Queue* from = src.get();
  if (a.dlq) {
    auto d = src->dead_letters();
    if (!d.ok()) return fail(d.status(), a.dir);
    from = *d;
  }
  auto r = from->move_to(*dst, o);
  if (!r.ok()) return fail(r.status(), a.dir);
  for (uint64_t id : r->missing) {
    std::fprintf(stderr, "spool: %s: message %" PRIu64 " is not there or not ready (leased or delayed); not moved\n",
                 from->dir().c_str(), id);
  }
  if (a.json) {
    std::printf("{\"moved\":%" PRIu64 ",\"already_there\":%" PRIu64 ",\"missing\":%zu}\n", r->moved, r->already,
                r->missing.size());
  } else {
    std::fprintf(stderr, "moved %s to %s%s\n", cli::count_of(r->moved, "message").c_str(), a.dst.c_str(),
                 r->already == 0 ? "" : r->already == 1 ? " (1 was there already)"
                                  : (" (" + std::to_string(r->already) + " were there already)").c_str());
  }
  return r->missing.empty() ? 0 : kExitError;
}

}  // namespace

std::vector<Command> add_ops_commands(CLI::App& app) {
  std::vector<Command> out;
  for (bool on : {true, false}) {
    auto a = std::make_shared<OpsArgs>();
    auto* sub = app.add_subcommand(on ? "pause" : "resume",
                                   on ? "Pause a queue: sends are kept, receives get nothing until resume"
                                      : "Resume a paused queue (wakes every waiting receiver)");
    add_dir(sub, a->dir);
    sub->footer(on ? "Stored in the queue's log: holds across restarts until spool resume. Example: spool pause q"
                   : "Example: spool resume q");
    out.push_back(Command{sub, [a, on] { return run_pause(*a, on); }});
  }
  {
    auto a = std::make_shared<OpsArgs>();
    auto* sub = app.add_subcommand("release", "End the lease of leased messages by id: ready again at once");
    add_dir(sub, a->dir);
    sub->add_option("ID", a->ids, "Message ids (as spool list shows them)")->required();
    sub->footer("The holder's receipt fails with 'lease lost' once the message is received again.\n"
                "Example: spool list q --state in_flight; spool release q 42");
    out.push_back(Command{sub, [a] { return run_release(*a); }});
  }
  {
    auto a = std::make_shared<OpsArgs>();
    auto* sub = app.add_subcommand("move", "Move messages to another queue, exactly once across a crash");
    add_dir(sub, a->dir);
    sub->add_option("DST", a->dst, "The queue to move them into (it must exist)")->required();
    sub->add_option("--id", a->ids, "Only these messages (ids in the source; repeatable)")->allow_extra_args(false);
    sub->add_option("--max", a->max, "At most this many (default all)");
    sub->add_flag("--dlq", a->dlq, "Move the source's dead letters (ids as spool dlq list prints them)");
    sub->add_flag("--json", a->json, "The counts as JSON on stdout");
    sub->footer("Without --id: the ready messages, lowest id first. Each keeps its payload and attributes and gets\n"
                "spool.moved.from and spool.moved.original_id. A killed move is finished by running it again within\n"
                "DST's dedup window (default 5 min): nothing is lost or sent twice.\n"
                "Examples: spool move q other   |   spool move q other --dlq   |   spool move q other --id 7 --id 9");
    Command c{sub, [a] { return run_move(*a); }};
    c.stdout_data = [a]() -> const char* { return a->json ? "its output" : nullptr; };
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace spool::cmd
