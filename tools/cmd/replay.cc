// spool replay: sends messages acked within a time window again, as new messages.
#include <CLI/CLI.hpp>
#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cmd/command.h"

namespace spool::cmd {
namespace {

struct ReplayArgs {
  std::string dir, since, until, to, max, sub;
  bool json = false;
};

int run_replay(const ReplayArgs& a) {
  ReplayOptions o;
  o.since = duration_arg("--since", a.since);
  if (!a.until.empty()) o.until = duration_arg("--until", a.until);
  if (o.since.count() <= 0) throw UsageError{"--since must be more than 0"};
  if (o.until >= o.since) throw UsageError{"--until must be less than --since (both are how long ago the ack was)"};
  if (!a.max.empty()) o.max = count_arg("--max", a.max);
  o.to = a.to;
  Status err;
  auto q = open_existing(a.dir, &err, a.sub);
  if (!q) return fail(err, a.dir);
  auto r = q->replay(o);
  if (!r.ok()) return fail(r.status(), a.to.empty() ? a.dir : "");
  const std::string& dest = a.to.empty() ? a.dir : a.to;
  if (a.json) {
    nlohmann::json j{{"replayed", r->replayed}, {"missing", r->missing}, {"to", dest}, {"ids", r->ids}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("replayed %" PRIu64 " acked messages into %s", r->replayed, dest.c_str());
    if (!r->ids.empty()) std::printf(" (ids %" PRIu64 " to %" PRIu64 ")", r->ids.front(), r->ids.back());
    std::printf("\n");
    if (r->missing != 0) {
      std::printf("%" PRIu64 " acked in the window were no longer in the log (compacted: keep_acked off or shorter)\n",
                  r->missing);
    }
  }
  return 0;
}

}  // namespace

Command add_replay(CLI::App& app) {
  auto a = std::make_shared<ReplayArgs>();
  auto* replay = app.add_subcommand("replay", "Send messages acked within a time window again, as new messages");
  add_dir(replay, a->dir);
  replay->add_option("--since", a->since, "Replay messages acked at most this long ago (required), e.g. 6h")
      ->required();
  replay->add_option("--until", a->until, "... and at least this long ago (default 0: up to now)");
  replay->add_option("--to", a->to, "Send them to this queue (an existing one) instead of DIR");
  replay->add_option("--max", a->max, "At most this many (the earliest acks first)");
  replay->add_option("--sub", a->sub, "Replay subscription NAME's acks, back to that subscription only "
                                      "(default: the queue's own acks, back to its own view only)");
  replay->add_flag("--json", a->json, "Print the result as JSON");
  replay->footer("Each replayed message carries its payload and attributes plus spool.replay.original_id and\n"
                 "spool.replay.acked_at. Acked messages stay replayable for the queue's keep_acked\n"
                 "(spool init --keep-acked 24h); see docs/semantics.md, \"Replay after ack\".\n"
                 "Examples: spool replay /var/spool/jobs --since 6h\n"
                 "          spool replay /var/spool/jobs --since 2h --until 1h --to /var/spool/retry --json");
  return {replay, [a] { return run_replay(*a); }};
}

}  // namespace spool::cmd
