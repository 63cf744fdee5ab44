// `spool forward`: store-and-forward from a local queue to NATS JetStream (PRODUCT.md §8,
// docs/beyond-one-host.md). Each message is published with a de-duplication id and acked
// locally only once JetStream has confirmed it, so nothing is lost when the link, the server
// or the forwarder dies, and a resend after a forwarder crash is dropped by the stream.
//
// Built with NATS support only when libnats was found (meson option `nats`); without it the
// command exists but says so and exits 1.
#pragma once

#include <cstddef>
#include <string>

#include "spool/queue.h"

namespace CLI {
class App;
}

namespace spool::cli {

struct ForwardArgs {
  std::string url;                 // --nats: nats://HOST:PORT, or several joined by commas
  std::string subject;             // --subject: where messages are published
  std::string stream;              // --stream: create this stream if missing; "" = must exist
  std::string ack_timeout = "5s";  // --ack-timeout: wait this long for a PubAck, then retry
  size_t window = 256;             // -j: publishes awaiting their PubAck at once
  bool once = false;               // --once: exit when the queue has nothing left to forward
  // Credentials (docs/security.md, "spool forward: credentials and TLS"): --creds-file, or
  // the environment (SPOOL_NATS_USER + SPOOL_NATS_PASSWORD, or SPOOL_NATS_TOKEN), or the URL;
  // only one of them. TLS: --tls-ca, and --tls-cert with --tls-key.
  std::string creds_file;  // --creds-file: one line, user:password or a token
  std::string tls_ca;      // --tls-ca: PEM CA certificates that the server's must chain to
  std::string tls_cert;    // --tls-cert: PEM client certificate (chain)
  std::string tls_key;     // --tls-key: PEM private key of --tls-cert
};

// `urls` (comma-separated servers) with the user information of each, anything before an
// '@' after the scheme, replaced by "***": nats://***@host:4222. What spool forward shows of
// a URL anywhere.
std::string redact_url(const std::string& urls);

// Overwrites, in place, the user information of the URL in every element of argv that
// holds one (as redact_url), so that `ps` and /proc/PID/cmdline stop showing it once the
// arguments are parsed (docs/security.md says for how long they do).
void hide_url_secrets(int argc, char** argv);

// Adds the `forward` subcommand and its flags to `app` (DIR goes to `dir`). Flag values that
// can be checked without a server (durations, -j, the subject) are checked while parsing,
// so they fail as usage errors.
CLI::App* add_forward_command(CLI::App& app, std::string& dir, ForwardArgs& args);

// Forwards until SIGTERM/SIGINT (or, with --once, until the queue is empty); returns the
// exit code: 0 after a clean stop, 1 on an error (one line on stderr).
int run_forward(Queue& q, const ForwardArgs& args);

}  // namespace spool::cli
