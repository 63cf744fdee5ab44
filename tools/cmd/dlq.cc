// spool dlq: list, redrive or purge the dead letters.
#include <cinttypes>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/progress.h"
#include "cli/units.h"
#include "cmd/command.h"

namespace spool::cmd {
namespace {

struct DlqArgs {
  std::string dir, action, sub;  // sub: only the dead letters of this subscription
  std::vector<std::string> ids;  // redrive --id
  size_t n = 1;
  bool json = false, yes = false;
};

void print_redriven(bool json, uint64_t moved) {
  if (json) {
    std::printf("{\"redriven\":%" PRIu64 "}\n", moved);
  } else {
    std::fprintf(stderr, "redrove %s\n", cli::count_of(moved, "message").c_str());
  }
}

// redrive --id: every id is checked before anything moves (a typo is a usage error that
// changes nothing); an id that is not a dead letter is reported and the others still move.
int redrive_ids(Queue& q, const DlqArgs& a) {
  std::vector<uint64_t> ids;
  for (const auto& text : a.ids) {
    uint64_t id = count_arg("--id", text);
    if (id == 0) throw UsageError{"bad --id '0' (dead letter ids start at 1)"};
    ids.push_back(id);
  }
  int rc = 0;
  std::string new_ids;
  uint64_t moved = 0;
  for (uint64_t id : ids) {
    auto to = q.redrive_id(id);
    if (!to.ok()) {
      rc = fail(to.status(), a.dir);
      continue;
    }
    ++moved;
    if (!a.json) std::printf("%" PRIu64 "\n", *to);
    new_ids += (new_ids.empty() ? "" : ",") + std::to_string(*to);
  }
  if (a.json) {
    std::printf("{\"redriven\":%" PRIu64 ",\"ids\":[%s]}\n", moved, new_ids.c_str());
  } else {
    print_redriven(false, moved);
  }
  return rc;
}

// Whether dead letter `m` died in subscription `sub` (its spool.dead.subscription mark).
bool of_subscription(const Message& m, const std::string& sub) {
  for (const auto& [k, v] : m.attributes) {
    if (k == "spool.dead.subscription") return v == sub;
  }
  return false;
}

// Every dead letter of subscription `sub` (each peeked: a dead-letter queue is read whole).
Result<std::vector<Message>> dead_letters_of(Queue& dlq, const std::string& sub) {
  auto all = dlq.peek(SIZE_MAX);
  if (!all.ok()) return all.status();
  std::erase_if(*all, [&](const Message& m) { return !of_subscription(m, sub); });
  return all;
}

// dlq purge --sub: removes that subscription's dead letters only, one by one.
int purge_subscription(Queue& dlq, const DlqArgs& a) {
  auto msgs = dead_letters_of(dlq, a.sub);
  if (!msgs.ok()) return fail(msgs.status(), a.dir);
  uint64_t purged = 0;
  for (const Message& m : *msgs) {
    Status s = dlq.remove(m.id);
    if (s.code() == Code::kNotFound) continue;  // redriven or purged meanwhile
    if (!s.ok()) return fail(s, a.dir);
    ++purged;
  }
  if (a.json) {
    std::printf("{\"purged\":%" PRIu64 "}\n", purged);
  } else {
    std::fprintf(stderr, "purged %s of subscription %s\n", cli::count_of(purged, "dead letter").c_str(), a.sub.c_str());
  }
  return 0;
}

int run_dlq(const DlqArgs& a, bool n_given) {
  if (a.action == "purge" && !a.yes) {
    throw UsageError{"dlq purge deletes every dead letter of " + a.dir + "; add --yes to confirm"};
  }
  if (a.action == "purge" && n_given) {
    throw UsageError{"-n is for dlq list and dlq redrive; dlq purge deletes every dead letter"};
  }
  if (a.action == "redrive" && n_given && a.n == 0) throw UsageError{"-n must be at least 1 for dlq redrive"};
  if (!a.ids.empty() && a.action != "redrive") throw UsageError{"--id is for dlq redrive"};
  if (!a.ids.empty() && n_given) throw UsageError{"give -n or --id to dlq redrive, not both"};
  if (!a.ids.empty() && !a.sub.empty()) {
    throw UsageError{"give --id or --sub to dlq redrive, not both (a dead letter goes back to its own subscription)"};
  }
  Status err;
  auto q = open_existing(a.dir, &err);
  if (!q) return fail(err, a.dir);
  if (a.action == "purge") {
    auto d = q->dead_letters();
    if (!d.ok()) return fail(d.status(), a.dir);
    if (!a.sub.empty()) return purge_subscription(**d, a);
    auto count = (*d)->purge();
    if (!count.ok()) return fail(count.status(), a.dir);
    if (a.json) {
      std::printf("{\"purged\":%" PRIu64 "}\n", *count);
    } else {
      std::fprintf(stderr, "purged %s\n", cli::count_of(*count, "dead letter").c_str());
    }
    return 0;
  }
  if (a.action == "redrive" && !a.ids.empty()) return redrive_ids(*q, a);
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
      auto chunk = q->redrive(static_cast<size_t>(want), a.sub);
      if (!chunk.ok()) return fail(chunk.status(), a.dir);
      moved += *chunk;
      bar.update(moved, std::max(total, moved));
      if (*chunk < want) break;
    }
    print_redriven(a.json, moved);
    return 0;
  }
  auto d = q->dead_letters();
  if (!d.ok()) return fail(d.status(), a.dir);
  auto msgs = a.sub.empty() ? (*d)->peek(n_given ? a.n : 100) : dead_letters_of(**d, a.sub);
  if (!msgs.ok()) return fail(msgs.status(), a.dir);
  if (msgs->size() > (n_given ? a.n : 100)) msgs->resize(n_given ? a.n : 100);
  print_messages(*msgs, a.json, false, true);  // each named by its original id
  return 0;
}

}  // namespace

Command add_dlq(CLI::App& app) {
  auto a = std::make_shared<DlqArgs>();
  auto* dlq = app.add_subcommand("dlq", "Dead letters: list them, redrive them into the queue, or purge them");
  add_dir(dlq, a->dir);
  dlq->add_option("ACTION", a->action, "list, redrive or purge")->required()->check(CLI::IsMember({"list", "redrive", "purge"}));
  dlq->add_option("-n", a->n, "list: up to this many (default 100); redrive: at most this many, oldest first (default all)");
  dlq->add_option("--id", a->ids, "redrive: only these dead letters (ids as dlq list prints them; repeatable); "
                                  "prints the new id of each")
      ->allow_extra_args(false);
  dlq->add_option("--sub", a->sub, "Only the dead letters of subscription NAME (marked spool.dead.subscription=NAME); "
                                   "without it: every dead letter");
  dlq->add_flag("--json", a->json, "list: one JSON object per line; redrive, purge: the count as JSON");
  dlq->add_flag("--yes", a->yes, "purge: confirm");
  dlq->footer("Examples: spool dlq q list -n 10   |   spool dlq q list --json | jq -r .payload   |   spool dlq q redrive\n"
              "          spool dlq q redrive -n 5   |   spool dlq q redrive --id 3 --id 7   |   spool dlq q purge --yes\n"
              "          spool dlq q list --sub billing   |   spool dlq q redrive --sub billing\n"
              "A dead letter goes back to the view it died in: a subscription's to that subscription only, the\n"
              "queue's own (no mark) to the queue's own view only; one whose subscription was removed stays.\n"
              "redrive --id: an id that is not a dead letter is reported and the others are still redriven (exit 1).");
  Command c{dlq, [a, dlq] { return run_dlq(*a, dlq->count("-n") != 0); }};
  c.stdout_data = [a]() -> const char* {
    return a->action == "list" || (a->action == "redrive" && !a->ids.empty()) ? "its output" : nullptr;
  };
  return c;
}

}  // namespace spool::cmd
