// What `spool forward` and `spool pull` share about talking to NATS (docs/beyond-one-host.md,
// docs/security.md "spool forward and spool pull: credentials and TLS"): the --nats URL and
// its credentials and TLS flags, how a URL is shown (never with its user information), how
// the credentials are found (one way only), and connecting with retries while the server is
// unreachable. Every text either command prints passes through these functions' rules: no
// password or token reaches stderr, stdout or /proc/PID/cmdline (after parsing).
//
// Thread-safety: the free functions are pure or use only their arguments; Warnings is safe
// to call from any thread (libnats calls back on its own threads).
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "spool/queue.h"

#if SPOOL_HAVE_NATS
#include <nats/nats.h>
#endif

namespace CLI {
class App;
}

namespace spool::cli {

// The header that carries an attribute whose value a header cannot (a control byte), base64:
// spool forward sends attribute KEY as Spool-B64-KEY, spool pull makes KEY of it again.
inline const std::string kBase64Header = "Spool-B64-";

struct NatsArgs {
  std::string url;  // --nats: nats://HOST:PORT, or several joined by commas
  // Credentials: --creds-file, or the environment (SPOOL_NATS_USER + SPOOL_NATS_PASSWORD, or
  // SPOOL_NATS_TOKEN), or the URL; only one of them. TLS: --tls-ca, and --tls-cert with --tls-key.
  std::string creds_file;  // --creds-file: one line, user:password or a token
  std::string tls_ca;      // --tls-ca: PEM CA certificates that the server's must chain to
  std::string tls_cert;    // --tls-cert: PEM client certificate (chain)
  std::string tls_key;     // --tls-key: PEM private key of --tls-cert
};

// Adds --nats (required), --creds-file, --tls-ca, --tls-cert and --tls-key to `c`.
void add_nats_options(CLI::App* c, NatsArgs& a);

// A CLI11 validator for a duration flag: "" when `text` is a duration of more than 0, else
// what is wrong with it.
std::string check_positive_duration(const std::string& text);

// "" when `subject` is dot-separated tokens without white space, else what is wrong. With
// `wildcards` a token may be '*', and the last one '>' (a filter); without, none may (a
// subject to publish to).
std::string check_subject_text(const std::string& subject, bool wildcards);

// What `who` (spool forward, spool pull) says and returns (1) in a build without libnats.
int nats_not_built(const char* who);

// SIGTERM and SIGINT call `handler`; SIGPIPE is ignored (a server's socket may close).
void on_stop_signals(void (*handler)(int));

// `urls` (comma-separated servers) with the user information of each, anything before an
// '@' after the scheme, replaced by "***": nats://***@host:4222. What spool shows of a URL
// anywhere.
std::string redact_url(const std::string& urls);

// Overwrites, in place, the user information of the URL in every element of argv that
// holds one (as redact_url), so that `ps` and /proc/PID/cmdline stop showing it once the
// arguments are parsed (docs/security.md says for how long they do).
void hide_url_secrets(int argc, char** argv);

#if SPOOL_HAVE_NATS

using SteadyClock = std::chrono::steady_clock;

// How spool authenticates: a user and password, a token, or neither (then the URL may carry
// them). `secrets` is every string that must never be printed.
struct Credentials {
  std::string user, password, token;
  std::vector<std::string> secrets;
};

// Finds the credentials of `a` (one way only); on a problem prints one line, "WHO: ...", and
// returns the exit code (64 for a usage error, 1 otherwise); 0 when they are fine. Warns when
// the URL carries them (ps shows them while spool starts).
int load_nats_credentials(const NatsArgs& a, const char* who, Credentials* c);

// `text` with every secret in it replaced by "***" (secrets under 4 bytes are skipped).
std::string scrub(std::string text, const std::vector<std::string>& secrets);

// Warnings on stderr, "WHO: text", with every secret scrubbed, and not one of the same kind
// (default: the same text) again within 10 s: an outage fails many things at once.
class Warnings {
 public:
  Warnings(std::string who, std::vector<std::string> secrets) : who_(std::move(who)), secrets_(std::move(secrets)) {}
  void warn(const std::string& text, const std::string& kind = "");
  // The library's text for `s` (its last error on this thread), with no secret in it.
  std::string nats_text(natsStatus s) const;
  const std::vector<std::string>& secrets() const { return secrets_; }
  const std::string& who() const { return who_; }

 private:
  const std::string who_;
  const std::vector<std::string> secrets_;
  std::mutex mu_;
  std::string last_;
  SteadyClock::time_point last_at_;
};

// The connection's event handlers (any may be null), called on libnats's threads.
struct NatsCallbacks {
  natsConnectionHandler disconnected = nullptr;
  natsConnectionHandler reconnected = nullptr;
  natsErrHandler error = nullptr;
  void* closure = nullptr;
};

// Connects to a.url with `creds` (load_nats_credentials) and the TLS of `a`, reconnecting for ever once
// connected. While the server is unreachable it warns once ("cannot reach NATS at URL (...);
// retrying until it is up `waiting_note`") and retries with backoff up to 5 s until `stop`.
// Returns -1 when connected (*nc set), 0 when `stop` came first, 1 on an error (one line
// printed: a bad URL, refused credentials, TLS) or, with `give_up` above 0, once the server
// has been unreachable that long ("...; giving up after DUR").
int connect_nats(const NatsArgs& a, const Credentials& creds, Warnings& w, const std::string& client_name,
                 const NatsCallbacks& cb, const std::string& waiting_note, const std::atomic<bool>& stop, natsConnection** nc,
                 Millis give_up = Millis(0));

// How a failed JetStream set-up call ends: retried (the server or link is away: warned,
// rate-limited), or fatal (one line printed; "JetStream is not enabled" for no responders).
enum class NatsSetup { kOk, kRetry, kFatal };
NatsSetup classify_setup_failure(Warnings& w, natsStatus s, const std::string& what, const std::string& shown_url);

// Sleeps `d`, in steps of 50 ms; false (at once) if `stop` is or becomes set.
bool sleep_unless(const std::atomic<bool>& stop, Millis d);

#endif  // SPOOL_HAVE_NATS

}  // namespace spool::cli
