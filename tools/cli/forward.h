// `spool forward`: store-and-forward from a local queue to NATS JetStream (docs/beyond-one-host.md). Each message is published with a de-duplication id and acked
// locally only once JetStream has confirmed it, so nothing is lost when the link, the server
// or the forwarder dies, and a resend after a forwarder crash is dropped by the stream.
//
// Built with NATS support only when libnats was found (meson option `nats`); without it the
// command exists but says so and exits 1.
#pragma once

#include <cstddef>
#include <string>

#include "cli/nats_conn.h"
#include "spool/queue.h"

namespace CLI {
class App;
}

namespace spool::cli {

struct ForwardArgs {
  NatsArgs nats;                   // --nats, credentials and TLS (cli/nats_conn.h)
  std::string subject;             // --subject: where messages are published
  std::string stream;              // --stream: create this stream if missing; "" = must exist
  std::string ack_timeout = "5s";  // --ack-timeout: wait this long for a PubAck, then retry
  size_t window = 256;             // -j: publishes awaiting their PubAck at once
  bool once = false;               // --once: exit when the queue has nothing left to forward
  // --give-up DUR (with --once only): exit 1 once NATS has been out of reach this long
  // (at start, or disconnected later); without --once forward waits for it for ever.
  std::string give_up = "30s";
};

// Adds the `forward` subcommand and its flags to `app` (DIR goes to `dir`). Flag values that
// can be checked without a server (durations, -j, the subject) are checked while parsing,
// so they fail as usage errors.
CLI::App* add_forward_command(CLI::App& app, std::string& dir, ForwardArgs& args);

// Forwards until SIGTERM/SIGINT (or, with --once, until the queue is empty); returns the
// exit code: 0 after a clean stop, 1 on an error (one line on stderr).
int run_forward(Queue& q, const ForwardArgs& args);

}  // namespace spool::cli
