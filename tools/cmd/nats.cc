// spool forward and spool pull: their flags and workers are cli/forward.cc and cli/pull.cc.
#include <CLI/CLI.hpp>

#include "cli/forward.h"
#include "cli/pull.h"
#include "cmd/command.h"

namespace spool::cmd {

std::vector<Command> add_nats_commands(CLI::App& app) {
  struct Args {
    std::string dir;
    cli::ForwardArgs forward;
    cli::PullArgs pull;
  };
  auto a = std::make_shared<Args>();
  auto* forward = cli::add_forward_command(app, a->dir, a->forward);
  auto* pull = cli::add_pull_command(app, a->dir, a->pull);
  auto with_queue = [a](auto run) {
    Status err;
    auto q = open_existing(a->dir, &err);
    if (!q) return fail(err, a->dir);
    return run(*q);
  };
  return {{forward, [a, with_queue] { return with_queue([&](Queue& q) { return cli::run_forward(q, a->forward); }); }},
          {pull, [a, with_queue] { return with_queue([&](Queue& q) { return cli::run_pull(q, a->pull); }); }}};
}

}  // namespace spool::cmd
