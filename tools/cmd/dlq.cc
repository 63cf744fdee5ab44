// spool dlq: list, redrive or purge the dead letters.
#include <cinttypes>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/progress.h"
#include "cmd/command.h"

namespace spool::cmd {
namespace {

struct DlqArgs {
  std::string dir, action;
  size_t n = 1;
  bool json = false, yes = false;
};

int run_dlq(const DlqArgs& a, bool n_given) {
  if (a.action == "purge" && !a.yes) {
    throw UsageError{"dlq purge deletes every dead letter of " + a.dir + "; add --yes to confirm"};
  }
  if (a.action == "purge" && n_given) {
    throw UsageError{"-n is for dlq list and dlq redrive; dlq purge deletes every dead letter"};
  }
  if (a.action == "redrive" && n_given && a.n == 0) throw UsageError{"-n must be at least 1 for dlq redrive"};
  Status err;
  auto q = open_existing(a.dir, &err);
  if (!q) return fail(err, a.dir);
  if (a.action == "purge") {
    auto d = q->dead_letters();
    if (!d.ok()) return fail(d.status(), a.dir);
    auto count = (*d)->purge();
    if (!count.ok()) return fail(count.status(), a.dir);
    if (a.json) {
      std::printf("{\"purged\":%" PRIu64 "}\n", *count);
    } else {
      std::fprintf(stderr, "purged %" PRIu64 " dead letters\n", *count);
    }
    return 0;
  }
  if (a.action == "redrive") {
    // In chunks, for the progress bar: the total is the dead-letter depth at the start
    // (or the -n limit, if lower).
    const uint64_t limit = n_given ? a.n : UINT64_MAX;
    uint64_t total = 0, moved = 0;
    if (auto d = q->dead_letters(); d.ok()) {
      if (auto ds = (*d)->stats(); ds.ok()) total = std::min(limit, ds->ready + ds->delayed + ds->in_flight);
    }
    cli::ProgressBar bar("redrive");
    while (moved < limit) {
      const uint64_t want = std::min<uint64_t>(1000, limit - moved);
      auto chunk = q->redrive(static_cast<size_t>(want));
      if (!chunk.ok()) return fail(chunk.status(), a.dir);
      moved += *chunk;
      bar.update(moved, std::max(total, moved));
      if (*chunk < want) break;
    }
    if (a.json) {
      std::printf("{\"redriven\":%" PRIu64 "}\n", moved);
    } else {
      std::fprintf(stderr, "redrove %" PRIu64 " messages\n", moved);
    }
    return 0;
  }
  auto d = q->dead_letters();
  if (!d.ok()) return fail(d.status(), a.dir);
  auto msgs = (*d)->peek(n_given ? a.n : 100);
  if (!msgs.ok()) return fail(msgs.status(), a.dir);
  print_messages(*msgs, a.json, false);
  return 0;
}

}  // namespace

Command add_dlq(CLI::App& app) {
  auto a = std::make_shared<DlqArgs>();
  auto* dlq = app.add_subcommand("dlq", "Dead letters: list them, redrive them into the queue, or purge them");
  add_dir(dlq, a->dir);
  dlq->add_option("ACTION", a->action, "list, redrive or purge")->required()->check(CLI::IsMember({"list", "redrive", "purge"}));
  dlq->add_option("-n", a->n, "list: up to this many (default 100); redrive: at most this many, oldest first (default all)");
  dlq->add_flag("--json", a->json, "list: one JSON object per line; redrive, purge: the count as JSON");
  dlq->add_flag("--yes", a->yes, "purge: confirm");
  dlq->footer("Examples: spool dlq q list -n 10   |   spool dlq q list --json | jq -r .payload   |   spool dlq q redrive\n"
              "          spool dlq q redrive -n 5   |   spool dlq q purge --yes");
  Command c{dlq, [a, dlq] { return run_dlq(*a, dlq->count("-n") != 0); }};
  c.stdout_data = [a]() -> const char* { return a->action == "list" ? "its output" : nullptr; };
  return c;
}

}  // namespace spool::cmd
