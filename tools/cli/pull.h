// `spool pull`: a durable JetStream pull consumer that feeds a local queue, the way down from
// a central stream to an edge device (docs/beyond-one-host.md, "spool pull"). Each fetched
// batch is sent into the queue and synced to disk, and only then acked to JetStream; a
// message redelivered after a crash between the two is recognised by its deduplication id
// (derived from the stream and its stream sequence) and queued once. While the queue is full
// it stops fetching: what it holds stays leased in the stream, the rest stays in the stream.
// A consumer deleted under it is created again as it was; a stream deleted is waited for.
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

struct PullArgs {
  NatsArgs nats;                // --nats, credentials and TLS (cli/nats_conn.h)
  std::string stream;           // --stream: the stream to consume (must exist)
  std::string consumer;         // --consumer: durable pull consumer, created if missing
  std::string filter;           // --filter: subject filter of a consumer pull creates (wildcards allowed)
  std::string ack_wait = "30s"; // --ack-wait: AckWait of a consumer pull creates
  size_t batch = 256;           // -j: messages fetched, queued, synced and acked at once
  bool once = false;            // --once: take what the stream holds now, then exit (never waits for room)
};

// Adds the `pull` subcommand and its flags to `app` (DIR goes to `dir`).
CLI::App* add_pull_command(CLI::App& app, std::string& dir, PullArgs& args);

// Pulls until SIGTERM/SIGINT (or, with --once, until the consumer has nothing pending);
// returns the exit code: 0 after a clean stop, 1 on an error (one line on stderr); with
// --once also 75 when the queue had no room (messages left in the stream) and 1 when
// messages the queue can never take were left there.
int run_pull(Queue& q, const PullArgs& args);

}  // namespace spool::cli
