#include "cli/forward.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cli/output.h"
#include "cli/units.h"

#if SPOOL_HAVE_NATS
#include <nats/nats.h>
#endif

namespace spool::cli {
namespace {

// CLI11 validators: "" when the value is good, else what is wrong with it.
std::string check_duration(const std::string& text) {
  auto d = parse_duration(text);
  if (!d) return "bad duration '" + text + "' (use 500ms, 30s, 5m, 2h or seconds)";
  if (d->count() <= 0) return "must be more than 0";
  return "";
}

// A subject to publish to: dot-separated tokens, no wildcards, no white space.
std::string check_subject(const std::string& subject) {
  if (subject.empty()) return "empty subject";
  if (subject.find_first_of(" \t\r\n") != std::string::npos) return "a subject has no white space";
  size_t start = 0;
  for (;;) {
    size_t end = subject.find('.', start);
    std::string token = subject.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (token.empty()) return "empty token in subject '" + subject + "' (leading, trailing or double dot)";
    if (token == "*" || token == ">") return "'" + subject + "' has a wildcard; publish needs a plain subject";
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return "";
}

}  // namespace

CLI::App* add_forward_command(CLI::App& app, std::string& dir, ForwardArgs& a) {
  auto* c = app.add_subcommand("forward", "Forward messages to NATS JetStream; each is acked once the stream has it");
  c->add_option("DIR", dir, "Queue directory")->required();
  c->add_option("--nats", a.url, "NATS server URL, nats://HOST:PORT (several: comma-separated)")->required();
  c->add_option("--subject", a.subject, "Subject to publish to")
      ->required()
      ->check(CLI::Validator(check_subject, "SUBJECT"));
  c->add_option("--stream", a.stream,
                "Create this stream (work queue, file storage, 2m duplicate window) if it does not exist; "
                "without it a stream must already capture the subject");
  c->add_option("-j", a.window, "Publishes awaiting their PubAck at once (default 256)")
      ->check(CLI::Range(size_t{1}, size_t{65536}));
  c->add_option("--ack-timeout", a.ack_timeout, "Wait this long for a PubAck before retrying (default 5s)")
      ->check(CLI::Validator(check_duration, "DURATION"));
  c->add_flag("--once", a.once, "Exit when the queue is empty (nothing ready, delayed or leased)");
  c->add_option("--creds-file", a.creds_file,
                "File of one line: USER:PASSWORD, or a token (not readable by others: chmod 600); "
                "or set SPOOL_NATS_USER and SPOOL_NATS_PASSWORD, or SPOOL_NATS_TOKEN")
      ->check(CLI::ExistingFile);
  c->add_option("--tls-ca", a.tls_ca, "TLS: PEM file of the CA certificates the server's certificate must chain to")
      ->check(CLI::ExistingFile);
  auto* key = c->add_option("--tls-key", a.tls_key, "TLS: PEM private key of --tls-cert")->check(CLI::ExistingFile);
  auto* cert = c->add_option("--tls-cert", a.tls_cert, "TLS: PEM client certificate (chain), for servers that verify clients")
                   ->check(CLI::ExistingFile);
  cert->needs(key);
  key->needs(cert);
  c->footer(
      "At-least-once: a message is acked locally only after JetStream confirmed it; a failed or\n"
      "timed-out publish returns it to the queue with backoff. Each message carries Nats-Msg-Id\n"
      "<queue uid>-<id>, so the stream drops a resend after a forwarder crash, and the headers\n"
      "Spool-Id, Spool-Enqueued-At and Spool-Receive-Count.\n"
      "While the server is unreachable (also at start) it warns once and keeps retrying.\n"
      "SIGTERM/SIGINT: stop receiving, wait for outstanding PubAcks (up to --ack-timeout), return\n"
      "the rest to the queue, exit 0. See docs/beyond-one-host.md.\n"
      "Credentials: --creds-file, or the environment; a URL's user:password@ shows in ps\n"
      "(docs/security.md). No secret is ever printed: URLs are shown as nats://***@host.\n"
      "Example: spool forward /var/spool/jobs --nats nats://hub:4222 --subject jobs --stream JOBS");
  return c;
}

namespace {

// The user information of one server URL, [*from, *to): what lies between the scheme (if
// any) and the last '@', as check_url() reads a URL. False if it has none.
bool userinfo_span(std::string_view url, size_t* from, size_t* to) {
  size_t scheme = url.find("://");
  *from = scheme == std::string_view::npos ? 0 : scheme + 3;
  *to = url.rfind('@');
  return *to != std::string_view::npos && *to >= *from;
}

// Calls f(offset, length) for the user information of each comma-separated server.
template <typename F>
void for_each_userinfo(std::string_view urls, F f) {
  size_t start = 0;
  for (;;) {
    size_t end = urls.find(',', start);
    std::string_view u = urls.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    size_t from, to;
    if (userinfo_span(u, &from, &to)) f(start + from, to - from);
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
}

}  // namespace

std::string redact_url(const std::string& urls) {
  std::string out = urls;
  std::vector<std::pair<size_t, size_t>> spans;
  for_each_userinfo(urls, [&](size_t off, size_t len) { spans.emplace_back(off, len); });
  for (auto it = spans.rbegin(); it != spans.rend(); ++it) out.replace(it->first, it->second, "***");
  return out;
}

void hide_url_secrets(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* value = nullptr;
    if (std::strcmp(argv[i], "--nats") == 0 && i + 1 < argc) {
      value = argv[i + 1];
    } else if (std::strncmp(argv[i], "--nats=", 7) == 0) {
      value = argv[i] + 7;
    }
    if (value == nullptr) continue;
    std::string shown = redact_url(value);
    size_t len = std::strlen(value);
    if (shown == value) continue;
    if (shown.size() <= len) {  // "***" and the rest, the tail zeroed
      std::memcpy(value, shown.data(), shown.size());
      std::memset(value + shown.size(), 0, len - shown.size());
    } else {  // user information shorter than "***": starred in place
      for_each_userinfo(value, [&](size_t off, size_t n) { std::memset(value + off, '*', n); });
    }
  }
}

#if !SPOOL_HAVE_NATS

int run_forward(Queue&, const ForwardArgs&) {
  std::fprintf(stderr, "spool forward: this spool was built without NATS support "
                       "(install libnats-dev, then rebuild with -Dnats=enabled)\n");
  return 1;
}

#else

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> g_stop{false};
std::atomic<bool> g_force{false};  // a second signal: stop waiting for PubAcks
void on_stop(int) {
  if (g_stop) g_force = true;
  g_stop = true;
}

// The message of the last NATS error on this thread (more specific than the status text),
// without the library's "(file.c:123): " prefix.
std::string nats_error(natsStatus s) {
  const char* text = nats_GetLastError(nullptr);
  std::string out = text != nullptr && *text != '\0' ? text : natsStatus_GetText(s);
  if (size_t end = out.find("): "); !out.empty() && out[0] == '(' && end != std::string::npos) out.erase(0, end + 3);
  return out;
}

// "" when every comma-separated server is [nats|tls://][user[:pass]@]host[:port]; else what
// is wrong. The library accepts some nonsense (and says "no server available" for it, which
// would have us retry forever), so this is checked first.
std::string check_url(const std::string& urls) {
  if (urls.empty()) return "empty";
  size_t start = 0;
  for (;;) {
    size_t end = urls.find(',', start);
    std::string u = urls.substr(start, end == std::string::npos ? std::string::npos : end - start);
    u.erase(0, u.find_first_not_of(' '));
    u.erase(u.find_last_not_of(' ') + 1);
    if (u.empty()) return "an empty server in the list";
    if (size_t scheme = u.find("://"); scheme != std::string::npos) {
      std::string name = u.substr(0, scheme);
      if (name != "nats" && name != "tls") return "unknown scheme '" + name + "://' (use nats:// or tls://)";
      u.erase(0, scheme + 3);
    }
    if (size_t at = u.rfind('@'); at != std::string::npos) u.erase(0, at + 1);
    if (!u.empty() && u.back() == '/') u.pop_back();
    std::string host = u, port;
    bool has_port = false;
    if (!u.empty() && u[0] == '[') {  // [IPv6]:port
      size_t close = u.find(']');
      if (close == std::string::npos) return "unclosed '[' in '" + u + "'";
      host = u.substr(0, close + 1);
      std::string rest = u.substr(close + 1);
      if (!rest.empty()) {
        if (rest[0] != ':') return "junk after ']' in '" + u + "'";
        port = rest.substr(1);
        has_port = true;
      }
    } else if (size_t colon = u.rfind(':'); colon != std::string::npos) {
      host = u.substr(0, colon);
      port = u.substr(colon + 1);
      has_port = true;
    }
    if (host.empty()) return "no host in '" + u + "'";
    if (host[0] != '[' && host.find_first_of("/?#:[] ") != std::string::npos) return "bad host '" + host + "'";
    if (has_port && (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
                     std::stoi(port) < 1 || std::stoi(port) > 65535)) {
      return "bad port '" + port + "'";
    }
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return "";
}

// How the forwarder authenticates: a user and password, a token, or neither (then the URL
// may carry them). `secrets` is every string that must never be printed.
struct Credentials {
  std::string user, password, token;
  std::vector<std::string> secrets;
};

struct CredentialsError {
  int exit_code = 0;  // 0: none
  std::string message;
};

std::string env_value(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// One line, USER:PASSWORD or a token, from a file other users cannot read.
CredentialsError read_creds_file(const std::string& path, Credentials* c) {
  auto bad = [&](const std::string& why) { return CredentialsError{1, "--creds-file " + path + ": " + why}; };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return bad(std::strerror(errno));
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return bad("not a regular file");
  }
  if ((st.st_mode & (S_IROTH | S_IWOTH)) != 0) {
    ::close(fd);
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return bad(std::string("every user can ") + ((st.st_mode & S_IROTH) != 0 ? "read" : "write") + " it (mode " +
               mode + "); chmod 600 " + path + " (or 640 for a group)");
  }
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 && text.size() < 65536) text.append(buf, static_cast<size_t>(n));
  int read_errno = errno;
  ::close(fd);
  if (n < 0) return bad(std::strerror(read_errno));
  if (text.size() >= 65536) return bad("too large for one line of credentials");
  if (text.rfind("-----BEGIN NATS USER JWT-----", 0) == 0) {
    return bad("a NATS .creds file (JWT and NKey), which spool forward does not read; give USER:PASSWORD or a token");
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
  if (text.empty()) return bad("empty (want one line: USER:PASSWORD, or a token)");
  if (text.find('\n') != std::string::npos) return bad("more than one line (want one: USER:PASSWORD, or a token)");
  c->secrets.push_back(text);
  if (size_t colon = text.find(':'); colon != std::string::npos) {
    c->user = text.substr(0, colon);
    c->password = text.substr(colon + 1);
    if (c->user.empty()) return bad("no user name before the ':' (want USER:PASSWORD)");
    if (c->password.empty()) return bad("no password after the ':' (want USER:PASSWORD)");
    c->secrets.push_back(c->password);
  } else {
    c->token = text;
  }
  return {};
}

// The credentials of --creds-file, the environment or the URL: one of them, else a usage
// error naming both.
CredentialsError load_credentials(const ForwardArgs& a, Credentials* c) {
  std::string user = env_value("SPOOL_NATS_USER"), password = env_value("SPOOL_NATS_PASSWORD"),
              token = env_value("SPOOL_NATS_TOKEN");
  for_each_userinfo(a.url, [&](size_t off, size_t len) {
    std::string info = a.url.substr(off, len);
    if (info.empty()) return;
    c->secrets.push_back(info);
    if (size_t colon = info.find(':'); colon != std::string::npos) c->secrets.push_back(info.substr(colon + 1));
  });
  std::vector<std::string> given;
  if (!a.creds_file.empty()) given.push_back("--creds-file");
  if (!user.empty() || !password.empty()) given.push_back("SPOOL_NATS_USER/SPOOL_NATS_PASSWORD");
  if (!token.empty()) given.push_back("SPOOL_NATS_TOKEN");
  if (redact_url(a.url) != a.url) given.push_back("the --nats URL");
  if (given.size() > 1) {
    return {64, "credentials given two ways (" + given[0] + " and " + given[1] + "); give one"};
  }
  if (!a.creds_file.empty()) return read_creds_file(a.creds_file, c);
  if (!user.empty() || !password.empty()) {
    if (user.empty()) return {64, "SPOOL_NATS_PASSWORD is set but SPOOL_NATS_USER is not"};
    if (password.empty()) return {64, "SPOOL_NATS_USER is set but SPOOL_NATS_PASSWORD is not"};
    c->user = user;
    c->password = password;
    c->secrets.push_back(password);
  } else if (!token.empty()) {
    c->token = token;
    c->secrets.push_back(token);
  }
  return {};
}

// `text` with every secret in it replaced by "***": for texts spool did not write (the
// library's and the server's error messages), which could quote what they were given. A
// second guard (they are not known to quote secrets), so it skips secrets under 4 bytes,
// which would mangle every text ("a" in "Authorization").
std::string scrub(std::string text, const std::vector<std::string>& secrets) {
  for (const auto& secret : secrets) {
    if (secret.size() < 4) continue;
    for (size_t at = 0; (at = text.find(secret, at)) != std::string::npos; at += 3) text.replace(at, secret.size(), "***");
  }
  return text;
}

// The queue's identity for de-duplication ids: the random `uid` fixed in DIR/spool.conf when
// the queue was created (the library API does not expose it). With the message id, which
// never repeats within a queue, "<uid>-<id>" names one message across forwarder restarts,
// and a queue re-created at the same path gets a new uid.
std::string queue_identity(const std::string& dir) {
  std::ifstream conf(dir + "/spool.conf");
  std::string line;
  while (std::getline(conf, line)) {
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    key.erase(key.find_last_not_of(' ') + 1);
    value.erase(0, value.find_first_not_of(' '));
    value.erase(value.find_last_not_of(" \r") + 1);
    if (key == "uid" && !value.empty() && value.find_first_not_of("0123456789") == std::string::npos) return value;
  }
  return "";
}

// Delay before a message whose publish failed is ready again: 250 ms, 500 ms, 1 s, ... 30 s.
// Kept well inside the stream's 2-minute duplicate window, so a resend of a message that did
// reach the stream (its PubAck was lost) is still recognised.
Millis retry_delay(uint32_t receive_count) {
  uint32_t shift = std::min<uint32_t>(receive_count == 0 ? 0 : receive_count - 1, 7);
  return std::min(Millis(250ll << shift), Millis(30000));
}

constexpr int64_t kDuplicateWindowNs = 120ll * 1000 * 1000 * 1000;

class Forwarder {
 public:
  Forwarder(Queue& q, const ForwardArgs& a, Credentials creds, std::string identity, Millis ack_timeout)
      : q_(q), args_(a), creds_(std::move(creds)), url_(redact_url(a.url)), identity_(std::move(identity)),
        ack_timeout_(ack_timeout),
        // Longer than a publish can be outstanding (the PubAck timeout turns it into a retry),
        // so a lease does not run out under a live forwarder; renew_leases() is the backstop.
        lease_(std::max(Millis(1000), 4 * ack_timeout)) {}

  ~Forwarder() {
    // The library's threads call back into this object: they are gone once this returns.
    closing_ = true;  // closing the connection is no outage to warn about
    jsCtx_Destroy(js_);
    natsConnection_Destroy(nc_);
    nats_CloseAndWait(2000);
  }

  int run() {
    // A SIGKILLed forwarder gives its leases back at once, not after the lease.
    if (Status s = q_.bind_leases(); !s.ok()) {
      std::fprintf(stderr, "spool forward: leases not bound to this process (%s); a crash returns them only "
                           "when they run out\n", s.to_string().c_str());
    }
    if (int rc = connect(); rc >= 0) return rc;
    for (Millis pause(250);; pause = std::min(pause * 2, Millis(5000))) {
      Setup st = prepare_stream();
      if (st == Setup::kOk) break;
      if (st == Setup::kFatal) return 1;
      if (!sleep_unless_stopped(pause)) return summary(0);
    }
    std::fprintf(stderr, "spool forward: forwarding %s to stream %s (subject %s) at %s\n", q_.dir().c_str(),
                 stream_.c_str(), args_.subject.c_str(), url_.c_str());
    int rc = forward();
    stop();
    return summary(rc);
  }

  // Called by the library (its reply-subscription thread) for each PubAck or failure.
  static void on_puback(jsCtx*, natsMsg* msg, jsPubAck* pa, jsPubAckErr* pae, void* self) {
    static_cast<Forwarder*>(self)->completed(msg, pa, pae);
    natsMsg_Destroy(msg);
  }
  static void on_disconnected(natsConnection*, void* self) {
    auto* f = static_cast<Forwarder*>(self);
    f->connected_ = false;
    if (f->closing_) return;
    f->warn("lost the connection to NATS; reconnecting (the queue keeps accepting messages)");
    f->abandon_inflight();
  }
  static void on_reconnected(natsConnection*, void* self) {
    auto* f = static_cast<Forwarder*>(self);
    f->connected_ = true;
    if (!f->closing_) f->warn("reconnected to NATS");
    f->cv_.notify_all();
  }
  static void on_async_error(natsConnection*, natsSubscription*, natsStatus err, void* self) {
    static_cast<Forwarder*>(self)->warn(std::string("NATS: ") + natsStatus_GetText(err));
  }

 private:
  enum class Setup { kOk, kRetry, kFatal };

  struct Inflight {
    uint64_t id = 0;
    std::string receipt;
    uint32_t receive_count = 0;
    Clock::time_point lease_end;
  };

  // Connects, retrying while the server is unreachable. -1 when connected, else the exit code.
  int connect() {
    if (std::string why = check_url(args_.url); !why.empty()) {
      if (why.find("(use") == std::string::npos) why += " (use nats://HOST:PORT)";
      std::fprintf(stderr, "spool forward: bad --nats URL '%s': %s\n", url_.c_str(), why.c_str());
      return 1;
    }
    natsOptions* opts = nullptr;
    natsStatus s = natsOptions_Create(&opts);
    if (s == NATS_OK) s = natsOptions_SetURL(opts, args_.url.c_str());  // the real one, not url_
    if (s == NATS_OK) s = natsOptions_SetName(opts, ("spool forward " + q_.dir()).c_str());
    // Once connected, reconnect for ever: the forwarder outlives any outage on its own.
    if (s == NATS_OK) s = natsOptions_SetMaxReconnect(opts, -1);
    if (s == NATS_OK) s = natsOptions_SetReconnectWait(opts, 250);
    if (s == NATS_OK) s = natsOptions_SetTimeout(opts, 2000);
    // A link that dies silently (no RST) is noticed in about 15 s rather than minutes.
    if (s == NATS_OK) s = natsOptions_SetPingInterval(opts, 5000);
    if (s == NATS_OK) s = natsOptions_SetMaxPingsOut(opts, 3);
    if (s == NATS_OK) s = natsOptions_SetDisconnectedCB(opts, on_disconnected, this);
    if (s == NATS_OK) s = natsOptions_SetReconnectedCB(opts, on_reconnected, this);
    if (s == NATS_OK) s = natsOptions_SetErrorHandler(opts, on_async_error, this);
    if (s != NATS_OK) {
      std::fprintf(stderr, "spool forward: bad --nats URL '%s': %s\n", url_.c_str(), nats_text(s).c_str());
      natsOptions_Destroy(opts);
      return 1;
    }
    // Credentials given otherwise than in the URL (one way only: load_credentials()).
    if (!creds_.token.empty()) {
      s = natsOptions_SetToken(opts, creds_.token.c_str());
    } else if (!creds_.user.empty()) {
      s = natsOptions_SetUserInfo(opts, creds_.user.c_str(), creds_.password.c_str());
    }
    if (s != NATS_OK) return options_failed(opts, "cannot set the credentials", s);
    // TLS: asked for by either option (or a tls:// URL, which the library handles).
    if (!args_.tls_ca.empty() || !args_.tls_cert.empty()) {
      s = natsOptions_SetSecure(opts, true);
      if (s != NATS_OK) return options_failed(opts, "cannot use TLS (is libnats built with it?)", s);
    }
    if (!args_.tls_ca.empty()) {
      s = natsOptions_LoadCATrustedCertificates(opts, args_.tls_ca.c_str());
      if (s != NATS_OK) return options_failed(opts, "cannot load --tls-ca " + args_.tls_ca, s);
    }
    if (!args_.tls_cert.empty()) {
      s = natsOptions_LoadCertificatesChain(opts, args_.tls_cert.c_str(), args_.tls_key.c_str());
      if (s != NATS_OK) {
        return options_failed(opts, "cannot load --tls-cert " + args_.tls_cert + " with --tls-key " + args_.tls_key, s);
      }
    }
    bool warned = false;
    for (Millis pause(250);; pause = std::min(pause * 2, Millis(5000))) {
      s = natsConnection_Connect(&nc_, opts);
      if (s == NATS_OK) break;
      bool transient = s == NATS_NO_SERVER || s == NATS_TIMEOUT || s == NATS_IO_ERROR ||
                       s == NATS_CONNECTION_CLOSED || s == NATS_CONNECTION_DISCONNECTED;
      if (!transient) {
        std::string text = nats_text(s);
        std::string hint;
        if (text.find("Authorization") != std::string::npos) {
          hint = " (check the credentials: --creds-file, SPOOL_NATS_USER and SPOOL_NATS_PASSWORD, or SPOOL_NATS_TOKEN)";
        } else if (text.find("SSL") != std::string::npos) {
          if (args_.tls_ca.empty()) hint = " (give the CA that signed the server's certificate with --tls-ca)";
        } else if (!args_.tls_ca.empty() && args_.tls_cert.empty()) {  // the server hung up on us
          hint = " (does the server require a client certificate? --tls-cert and --tls-key)";
        }
        std::fprintf(stderr, "spool forward: cannot connect to NATS at %s: %s%s\n", url_.c_str(), text.c_str(),
                     hint.c_str());
        natsOptions_Destroy(opts);
        return 1;
      }
      if (!warned) {
        std::fprintf(stderr, "spool forward: cannot reach NATS at %s (%s); retrying until it is up "
                             "(the queue keeps accepting messages)\n", url_.c_str(), nats_text(s).c_str());
        warned = true;
      }
      if (!sleep_unless_stopped(pause)) {
        natsOptions_Destroy(opts);
        return summary(0);
      }
    }
    natsOptions_Destroy(opts);
    if (warned) std::fprintf(stderr, "spool forward: connected to NATS at %s\n", url_.c_str());
    connected_ = true;
    return -1;
  }

  // Says why an option could not be set, frees `opts` and returns the exit code.
  int options_failed(natsOptions* opts, const std::string& what, natsStatus s) {
    std::fprintf(stderr, "spool forward: %s: %s\n", what.c_str(), nats_text(s).c_str());
    natsOptions_Destroy(opts);
    return 1;
  }

  Setup classify(natsStatus s, const std::string& what) {
    if (s == NATS_TIMEOUT || s == NATS_CONNECTION_CLOSED || s == NATS_CONNECTION_DISCONNECTED || s == NATS_IO_ERROR) {
      warn(what + ": " + nats_text(s) + "; retrying");
      return Setup::kRetry;
    }
    if (s == NATS_NO_RESPONDERS) {
      std::fprintf(stderr, "spool forward: JetStream is not enabled on NATS at %s (start nats-server with -js)\n",
                   url_.c_str());
    } else {
      std::fprintf(stderr, "spool forward: %s: %s\n", what.c_str(), nats_text(s).c_str());
    }
    return Setup::kFatal;
  }

  // Finds the stream that captures the subject, creating it first with --stream.
  Setup prepare_stream() {
    if (js_ == nullptr) {
      jsOptions jo;
      jsOptions_Init(&jo);
      jo.Wait = ack_timeout_.count();
      jo.PublishAsync.AckHandler = on_puback;
      jo.PublishAsync.AckHandlerClosure = this;
      if (natsStatus s = natsConnection_JetStream(&js_, nc_, &jo); s != NATS_OK) return classify(s, "JetStream");
    }
    jsErrCode jerr = static_cast<jsErrCode>(0);
    const std::string& name = args_.stream;
    if (!name.empty()) {
      jsStreamInfo* si = nullptr;
      natsStatus s = js_GetStreamInfo(&si, js_, name.c_str(), nullptr, &jerr);
      jsStreamInfo_Destroy(si);
      if (s == NATS_NOT_FOUND) {
        jsStreamConfig cfg;
        jsStreamConfig_Init(&cfg);
        const char* subjects[] = {args_.subject.c_str()};
        cfg.Name = name.c_str();
        cfg.Subjects = subjects;
        cfg.SubjectsLen = 1;
        cfg.Retention = js_WorkQueuePolicy;  // a message leaves the stream once a consumer acks it, as in spool
        cfg.Storage = js_FileStorage;
        cfg.Duplicates = kDuplicateWindowNs;
        si = nullptr;
        s = js_AddStream(&si, js_, &cfg, nullptr, &jerr);
        jsStreamInfo_Destroy(si);
        if (s == NATS_OK) {
          std::fprintf(stderr, "spool forward: created stream %s (work queue, file storage, subject %s, "
                               "2m duplicate window)\n", name.c_str(), args_.subject.c_str());
        } else if (jerr != JSStreamNameExistErr) {  // else another forwarder just created it
          return classify(s, "cannot create stream " + name);
        }
      } else if (s != NATS_OK) {
        return classify(s, "cannot look up stream " + name);
      }
    }
    jsOptions lo;
    jsOptions_Init(&lo);
    lo.Stream.Info.SubjectsFilter = args_.subject.c_str();
    jsStreamNamesList* names = nullptr;
    natsStatus s = js_StreamNames(&names, js_, &lo, &jerr);
    if (s == NATS_NOT_FOUND) {
      if (name.empty()) {
        std::fprintf(stderr, "spool forward: no JetStream stream captures subject %s at %s (create one, or pass "
                             "--stream NAME to have it created)\n", args_.subject.c_str(), url_.c_str());
      } else {
        std::fprintf(stderr, "spool forward: stream %s does not capture subject %s\n", name.c_str(),
                     args_.subject.c_str());
      }
      return Setup::kFatal;
    }
    if (s != NATS_OK) return classify(s, "cannot list streams");
    std::string found = names->Count > 0 ? names->List[0] : "";
    bool listed = false;
    for (int i = 0; i < names->Count; ++i) listed = listed || name == names->List[i];
    jsStreamNamesList_Destroy(names);
    if (!name.empty() && !listed) {
      std::fprintf(stderr, "spool forward: subject %s belongs to stream %s, not %s\n", args_.subject.c_str(),
                   found.c_str(), name.c_str());
      return Setup::kFatal;
    }
    stream_ = name.empty() ? found : name;
    return Setup::kOk;
  }

  // The main loop: receive while there is room in the window, publish, repeat. Returns the
  // exit code.
  int forward() {
    auto next_renewal = Clock::now() + lease_ / 4;
    while (!g_stop) {
      auto now = Clock::now();
      if (now >= next_renewal) {
        renew_leases();
        next_renewal = now + lease_ / 4;
      }
      size_t room = 0;
      bool idle = false;
      {
        std::unique_lock lock(mu_);
        // After a failure, probe with one message at a time until a publish succeeds, so an
        // outage or a missing stream costs few deliveries (each counts toward max_receives).
        size_t limit = failures_ > 0 ? 1 : args_.window;
        if (!connected_ || now < pause_until_ || inflight_.size() >= limit) {
          cv_.wait_for(lock, Millis(100));
          continue;
        }
        room = limit - inflight_.size();
        idle = inflight_.empty();
      }
      // Checked before receiving, so --once ends as soon as the last PubAck is in, not after
      // a long poll (stats() is O(backlog), but the window is empty only now and then).
      if (args_.once && idle && drained()) break;
      auto msgs = q_.receive_views(room, lease_, idle ? Millis(250) : Millis(20));
      if (!msgs.ok()) {
        if (msgs.status().code() != Code::kEmpty) {
          std::fprintf(stderr, "spool forward: receive failed: %s\n", msgs.status().to_string().c_str());
          return 1;
        }
        continue;
      }
      for (auto& m : *msgs) publish(m);
    }
    return 0;
  }

  void publish(const MessageView& m) {
    Inflight e{m.id, m.receipt, m.receive_count, Clock::now() + lease_};
    std::string id = std::to_string(m.id), msg_id = identity_ + "-" + id, count = std::to_string(m.receive_count);
    natsMsg* msg = nullptr;
    natsStatus s = natsMsg_Create(&msg, args_.subject.c_str(), nullptr, m.payload.data(),
                                  static_cast<int>(m.payload.size()));
    if (s == NATS_OK) s = natsMsgHeader_Set(msg, "Spool-Id", id.c_str());
    if (s == NATS_OK) s = natsMsgHeader_Set(msg, "Spool-Enqueued-At", iso_time(m.enqueued).c_str());
    if (s == NATS_OK) s = natsMsgHeader_Set(msg, "Spool-Receive-Count", count.c_str());
    if (s == NATS_OK) {
      jsPubOptions po;
      jsPubOptions_Init(&po);
      po.MsgId = msg_id.c_str();  // Nats-Msg-Id: the stream drops a second copy within its window
      po.ExpectStream = stream_.c_str();
      po.MaxWait = ack_timeout_.count();  // no PubAck by then: on_puback gets a timeout
      // Registered before the publish: the PubAck may arrive before js_PublishMsgAsync returns.
      {
        std::lock_guard lock(mu_);
        inflight_[msg] = e;
      }
      s = js_PublishMsgAsync(js_, &msg, &po);  // takes `msg` (sets it to null) on success
      if (s != NATS_OK) {
        std::lock_guard lock(mu_);
        inflight_.erase(msg);
      }
    }
    if (s != NATS_OK) {
      std::string why = nats_text(s);
      natsMsg_Destroy(msg);
      retry_later(e, why);
    }
  }

  void completed(natsMsg* msg, jsPubAck* pa, jsPubAckErr* pae) {
    Inflight e;
    {
      std::lock_guard lock(mu_);
      auto it = inflight_.find(msg);
      // Not found: stop() already returned it to the queue; a late PubAck changes nothing.
      if (closing_ || it == inflight_.end()) return;
      e = std::move(it->second);
      inflight_.erase(it);
    }
    if (pa != nullptr) {
      Status s = q_.ack(e.receipt);
      if (s.ok()) {
        ++forwarded_;
        if (pa->Duplicate) ++duplicates_;
      } else {
        // The stream has the message; the local copy stays (say the lease was lost), and its
        // next publish is dropped as a duplicate and acked then.
        warn("message " + std::to_string(e.id) + " is in the stream but the local ack failed: " + s.to_string());
      }
      std::lock_guard lock(mu_);
      failures_ = 0;
    } else {
      std::string why = pae != nullptr && pae->ErrText != nullptr ? pae->ErrText : "publish failed";
      if (pae != nullptr && pae->Err == NATS_TIMEOUT) why = "no PubAck within --ack-timeout";
      retry_later(e, why);
    }
    cv_.notify_all();
  }

  // Returns the message to the queue after a backoff, and slows the main loop down.
  void retry_later(const Inflight& e, const std::string& why) {
    (void)q_.nack(e.receipt, retry_delay(e.receive_count));  // fails only if the lease is gone: fine
    ++retries_;
    {
      std::lock_guard lock(mu_);
      failures_ = std::min<uint32_t>(failures_ + 1, 5);
      pause_until_ = Clock::now() + std::min(Millis(250ll << failures_), Millis(5000));
    }
    warn("publishing failed (" + why + "); message " + std::to_string(e.id) + " retried with backoff",
         "publish " + why);
  }

  // The PubAcks of publishes outstanding when the connection dropped went with it (a
  // reconnect gets a new one), so waiting for their timeouts would only stall the window
  // after the outage: they go back to the queue now, to be published again (with the same
  // Nats-Msg-Id: the stream drops the copy of any that did arrive). Their late timeouts find
  // no entry and change nothing.
  void abandon_inflight() {
    std::vector<Inflight> lost;
    {
      std::lock_guard lock(mu_);
      for (auto& [msg, e] : inflight_) lost.push_back(std::move(e));
      inflight_.clear();
      failures_ = std::max<uint32_t>(failures_, 1);  // probe with one message after the reconnect
    }
    for (const auto& e : lost) (void)q_.nack(e.receipt);
    retries_ += lost.size();
    cv_.notify_all();
  }

  // Renews the leases of messages in flight for long (say, held back while disconnected).
  void renew_leases() {
    std::vector<std::string> due;
    auto now = Clock::now();
    {
      std::lock_guard lock(mu_);
      for (auto& [msg, e] : inflight_) {
        if (e.lease_end - now < lease_ / 2) {
          due.push_back(e.receipt);
          e.lease_end = now + lease_;
        }
      }
    }
    for (const auto& r : due) (void)q_.extend(r, lease_);  // fails only if acked or nacked since
  }

  // Nothing left to forward: no message ready, delayed or leased (by anyone).
  bool drained() {
    auto st = q_.stats();
    return st.ok() && st->ready == 0 && st->delayed == 0 && st->in_flight == 0;
  }

  // Stops: waits (bounded) for outstanding PubAcks, then returns the unconfirmed messages.
  void stop() {
    std::vector<Inflight> left;
    {
      std::unique_lock lock(mu_);
      if (!inflight_.empty()) {
        std::fprintf(stderr, "spool forward: stopping; waiting up to %llds for %zu PubAck(s)\n",
                     static_cast<long long>((ack_timeout_.count() + 999) / 1000), inflight_.size());
      }
      auto deadline = Clock::now() + ack_timeout_ + Millis(500);
      while (!inflight_.empty() && !g_force && Clock::now() < deadline) cv_.wait_for(lock, Millis(100));
      closing_ = true;
      for (auto& [msg, e] : inflight_) left.push_back(std::move(e));
      inflight_.clear();
    }
    // Ready at once for the next forwarder; if one of these did reach the stream, its resend
    // is dropped there as a duplicate.
    for (const auto& e : left) (void)q_.nack(e.receipt);
    if (!left.empty()) {
      std::fprintf(stderr, "spool forward: returned %zu unconfirmed message(s) to the queue\n", left.size());
    }
  }

  int summary(int rc) {
    std::fprintf(stderr, "spool forward: forwarded %lu messages (%lu already in the stream), %lu publish retries\n",
                 forwarded_.load(), duplicates_.load(), retries_.load());
    return rc;
  }

  // Prints a warning, but not one of the same `kind` (default: the same text) again within
  // 10 s: an outage fails every message in flight at once.
  void warn(const std::string& text, const std::string& kind = "") {
    std::lock_guard lock(warn_mu_);
    auto now = Clock::now();
    const std::string& key = kind.empty() ? text : kind;
    if (key == last_warning_ && now - last_warned_ < std::chrono::seconds(10)) return;
    last_warning_ = key;
    last_warned_ = now;
    std::fprintf(stderr, "spool forward: %s\n", scrub(text, creds_.secrets).c_str());
  }

  // The library's text for `s`, with no secret in it.
  std::string nats_text(natsStatus s) const { return scrub(nats_error(s), creds_.secrets); }

  static bool sleep_unless_stopped(Millis d) {
    for (auto end = Clock::now() + d; Clock::now() < end;) {
      if (g_stop) return false;
      std::this_thread::sleep_for(Millis(50));
    }
    return !g_stop;
  }

  Queue& q_;
  const ForwardArgs& args_;
  const Credentials creds_;
  const std::string url_;  // args_.url as shown: redact_url()
  const std::string identity_;
  const Millis ack_timeout_;
  const Millis lease_;
  natsConnection* nc_ = nullptr;
  jsCtx* js_ = nullptr;
  std::string stream_;
  std::atomic<bool> connected_{false};
  std::atomic<bool> closing_{false};

  std::mutex mu_;  // guards what follows
  std::condition_variable cv_;
  // Keyed by the library's message: the PubAck callback hands it back.
  std::unordered_map<natsMsg*, Inflight> inflight_;
  uint32_t failures_ = 0;  // publishes failed in a row (capped)
  Clock::time_point pause_until_;

  std::atomic<uint64_t> forwarded_{0}, duplicates_{0}, retries_{0};
  std::mutex warn_mu_;
  std::string last_warning_;
  Clock::time_point last_warned_;
};

}  // namespace

int run_forward(Queue& q, const ForwardArgs& args) {
  Credentials creds;
  if (CredentialsError e = load_credentials(args, &creds); e.exit_code != 0) {
    std::fprintf(stderr, "spool forward: %s\n", scrub(e.message, creds.secrets).c_str());
    return e.exit_code;
  }
  if (redact_url(args.url) != args.url) {
    std::fprintf(stderr, "spool forward: warning: the credentials in the --nats URL can be seen by other users "
                         "(ps) while spool starts; use --creds-file or SPOOL_NATS_PASSWORD (docs/security.md)\n");
  }
  std::string identity = queue_identity(q.dir());
  if (identity.empty()) {
    std::fprintf(stderr, "spool forward: cannot read the queue's uid from %s/spool.conf\n", q.dir().c_str());
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  Forwarder f(q, args, std::move(creds), identity, *parse_duration(args.ack_timeout));
  return f.run();
}

#endif  // SPOOL_HAVE_NATS

}  // namespace spool::cli
