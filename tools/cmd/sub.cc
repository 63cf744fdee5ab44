// spool sub: the subscriptions of a queue (docs/semantics.md, "Subscriptions"): add one, list
// them, remove one. The commands that read a subscription take --sub NAME (command.h).
#include <CLI/CLI.hpp>

#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/output.h"
#include "cli/units.h"
#include "cmd/command.h"

namespace spool::cmd {
namespace {

struct SubArgs {
  std::string action, dir, name, from = "now";
  uint32_t max_receives = 0;
  bool json = false;
};

int run_sub(const SubArgs& a) {
  if (a.action != "list" && a.name.empty()) throw UsageError{"sub " + a.action + " needs the subscription's NAME"};
  if (a.action == "list" && !a.name.empty()) throw UsageError{"sub list takes no NAME"};
  if (a.action != "add" && a.from != "now") throw UsageError{"--from goes with sub add"};
  if (a.action != "add" && a.max_receives != 0) throw UsageError{"--max-receives goes with sub add"};
  Status err;
  auto q = open_existing(a.dir, &err);
  if (!q) return fail(err, a.dir);
  if (a.action == "add") {
    if (Status s = q->add_subscription(a.name, a.from == "start", a.max_receives); !s.ok()) return fail(s, a.dir);
    auto subs = q->subscriptions();
    if (!subs.ok()) return fail(subs.status(), a.dir);
    for (const auto& s : *subs) {
      if (s.name != a.name) continue;
      std::fprintf(stderr, "spool: added subscription '%s': it gets %s, from message %llu on\n", a.name.c_str(),
                   cli::count_of(s.messages, "message").c_str(), static_cast<unsigned long long>(s.from));
    }
    return 0;
  }
  if (a.action == "rm") {
    if (Status s = q->remove_subscription(a.name); !s.ok()) return fail(s, a.dir);
    std::fprintf(stderr, "spool: removed subscription '%s'\n", a.name.c_str());
    return 0;
  }
  auto subs = q->subscriptions();
  if (!subs.ok()) return fail(subs.status(), a.dir);
  if (a.json) {
    for (const auto& s : *subs) {
      std::printf("%s\n", cli::subscription_json(s).dump().c_str());
    }
    return 0;
  }
  if (subs->empty()) {
    std::fprintf(stderr, "spool: %s has no subscriptions (spool sub add %s NAME)\n", a.dir.c_str(), a.dir.c_str());
    return 0;
  }
  std::printf("%-20s %12s %12s %12s %12s %12s\n", "NAME", "FROM", "MESSAGES", "IN_FLIGHT", "EXPIRED", "HELD_BACK");
  for (const auto& s : *subs) {
    std::printf("%-20s %12llu %12llu %12llu %12llu %12s\n", s.name.c_str(), static_cast<unsigned long long>(s.from),
                static_cast<unsigned long long>(s.messages), static_cast<unsigned long long>(s.leased),
                static_cast<unsigned long long>(s.expired_total), cli::format_size(s.held_back_bytes).c_str());
  }
  return 0;
}

}  // namespace

Command add_sub(CLI::App& app) {
  auto a = std::make_shared<SubArgs>();
  auto* sub = app.add_subcommand("sub", "Subscriptions: add, list or remove the named readers of a queue's messages");
  sub->add_option("ACTION", a->action, "add, list or rm")->required()->check(CLI::IsMember({"add", "list", "rm"}));
  add_dir(sub, a->dir);
  sub->add_option("NAME", a->name, "add, rm: the subscription's name (1-48 of A-Z a-z 0-9 . _ -)");
  sub->add_option("--from", a->from, "add: the messages it gets: those sent from now on (default), or also every "
                                     "message in the queue now")
      ->check(CLI::IsMember({"now", "start"}));
  sub->add_option("--max-receives", a->max_receives, "add: its own max_receives (deliveries before a message is "
                                                     "dead-lettered; default 0: the queue's)");
  sub->add_flag("--json", a->json, "list: one JSON object per line");
  sub->footer("Each subscription gets every message sent after it was added, from one stored copy, with leases,\n"
              "receive counts and dead letters of its own: read it with --sub NAME on recv, ack, nack, extend,\n"
              "peek, list, show, stats and work. The queue's own readers (no --sub) are unchanged.\n"
              "Examples: spool sub add q billing   |   spool sub add q audit --from start   |   spool sub list q\n"
              "          spool recv q --sub billing   |   spool sub rm q audit");
  Command c{sub, [a] { return run_sub(*a); }};
  c.stdout_data = [a]() -> const char* { return a->action == "list" ? "its output" : nullptr; };
  return c;
}

}  // namespace spool::cmd
