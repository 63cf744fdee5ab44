#include "cli/nats_conn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>
#include <utility>

#include "cli/units.h"

namespace spool::cli {

void add_nats_options(CLI::App* c, NatsArgs& a) {
  c->add_option("--nats", a.url, "NATS server URL, nats://HOST:PORT (several: comma-separated)")->required();
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
}

std::string check_positive_duration(const std::string& text) {
  auto d = parse_duration(text);
  if (!d) return "bad duration '" + text + "' (use 500ms, 30s, 5m, 2h or seconds)";
  if (d->count() <= 0) return "must be more than 0";
  return "";
}

std::string check_subject_text(const std::string& subject, bool wildcards) {
  if (subject.empty()) return "empty subject";
  if (subject.find_first_of(" \t\r\n") != std::string::npos) return "a subject has no white space";
  size_t start = 0;
  for (;;) {
    size_t end = subject.find('.', start);
    std::string token = subject.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (token.empty()) return "empty token in subject '" + subject + "' (leading, trailing or double dot)";
    bool wild = token.find_first_of("*>") != std::string::npos;
    if (wild && !wildcards) return "'" + subject + "' has a wildcard; publish needs a plain subject";
    if (wild && token.size() > 1) return "'" + subject + "': a wildcard is a whole token (a.*.c, a.>)";
    if (token == ">" && end != std::string::npos) return "'" + subject + "': '>' must be the last token";
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return "";
}

int nats_not_built(const char* who) {
  std::fprintf(stderr, "%s: this spool was built without NATS support "
                       "(install libnats-dev, then rebuild with -Dnats=enabled)\n", who);
  return 1;
}

void on_stop_signals(void (*handler)(int)) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
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

#if SPOOL_HAVE_NATS

namespace {

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
CredentialsError load_credentials(const NatsArgs& a, Credentials* c) {
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

}  // namespace

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

int load_nats_credentials(const NatsArgs& a, const char* who, Credentials* c) {
  if (CredentialsError e = load_credentials(a, c); e.exit_code != 0) {
    std::fprintf(stderr, "%s: %s\n", who, scrub(e.message, c->secrets).c_str());
    return e.exit_code;
  }
  if (redact_url(a.url) != a.url) {
    std::fprintf(stderr, "%s: warning: the credentials in the --nats URL can be seen by other users "
                         "(ps) while spool starts; use --creds-file or SPOOL_NATS_PASSWORD (docs/security.md)\n", who);
  }
  return 0;
}

void Warnings::warn(const std::string& text, const std::string& kind) {
  std::lock_guard lock(mu_);
  auto now = SteadyClock::now();
  const std::string& key = kind.empty() ? text : kind;
  if (key == last_ && now - last_at_ < std::chrono::seconds(10)) return;
  last_ = key;
  last_at_ = now;
  std::fprintf(stderr, "%s: %s\n", who_.c_str(), scrub(text, secrets_).c_str());
}

std::string Warnings::nats_text(natsStatus s) const { return scrub(nats_error(s), secrets_); }

NatsSetup classify_setup_failure(Warnings& w, natsStatus s, const std::string& what, const std::string& shown_url) {
  if (s == NATS_TIMEOUT || s == NATS_CONNECTION_CLOSED || s == NATS_CONNECTION_DISCONNECTED || s == NATS_IO_ERROR) {
    w.warn(what + ": " + w.nats_text(s) + "; retrying");
    return NatsSetup::kRetry;
  }
  if (s == NATS_NO_RESPONDERS) {
    std::fprintf(stderr, "%s: JetStream is not enabled on NATS at %s (start nats-server with -js)\n", w.who().c_str(),
                 shown_url.c_str());
  } else {
    std::fprintf(stderr, "%s: %s: %s\n", w.who().c_str(), what.c_str(), w.nats_text(s).c_str());
  }
  return NatsSetup::kFatal;
}

bool sleep_unless(const std::atomic<bool>& stop, Millis d) {
  for (auto end = SteadyClock::now() + d; SteadyClock::now() < end;) {
    if (stop) return false;
    std::this_thread::sleep_for(Millis(50));
  }
  return !stop;
}

namespace {

// Says why an option could not be set, frees `opts` and returns the exit code.
int options_failed(natsOptions* opts, Warnings& w, const std::string& what, natsStatus s) {
  std::fprintf(stderr, "%s: %s: %s\n", w.who().c_str(), what.c_str(), w.nats_text(s).c_str());
  natsOptions_Destroy(opts);
  return 1;
}

}  // namespace

int connect_nats(const NatsArgs& a, const Credentials& creds, Warnings& w, const std::string& client_name, const NatsCallbacks& cb,
                 const std::string& waiting_note, const std::atomic<bool>& stop, natsConnection** nc,
                 Millis give_up) {
  const char* who = w.who().c_str();
  const std::string url = redact_url(a.url);
  if (std::string why = check_url(a.url); !why.empty()) {
    if (why.find("(use") == std::string::npos) why += " (use nats://HOST:PORT)";
    std::fprintf(stderr, "%s: bad --nats URL '%s': %s\n", who, url.c_str(), why.c_str());
    return 1;
  }
  natsOptions* opts = nullptr;
  natsStatus s = natsOptions_Create(&opts);
  if (s == NATS_OK) s = natsOptions_SetURL(opts, a.url.c_str());  // the real one, not `url`
  if (s == NATS_OK) s = natsOptions_SetName(opts, client_name.c_str());
  // Once connected, reconnect for ever: the command outlives any outage on its own.
  if (s == NATS_OK) s = natsOptions_SetMaxReconnect(opts, -1);
  if (s == NATS_OK) s = natsOptions_SetReconnectWait(opts, 250);
  if (s == NATS_OK) s = natsOptions_SetTimeout(opts, 2000);
  // A link that dies silently (no RST) is noticed in about 15 s rather than minutes.
  if (s == NATS_OK) s = natsOptions_SetPingInterval(opts, 5000);
  if (s == NATS_OK) s = natsOptions_SetMaxPingsOut(opts, 3);
  if (s == NATS_OK && cb.disconnected != nullptr) s = natsOptions_SetDisconnectedCB(opts, cb.disconnected, cb.closure);
  if (s == NATS_OK && cb.reconnected != nullptr) s = natsOptions_SetReconnectedCB(opts, cb.reconnected, cb.closure);
  if (s == NATS_OK && cb.error != nullptr) s = natsOptions_SetErrorHandler(opts, cb.error, cb.closure);
  if (s != NATS_OK) {
    std::fprintf(stderr, "%s: bad --nats URL '%s': %s\n", who, url.c_str(), w.nats_text(s).c_str());
    natsOptions_Destroy(opts);
    return 1;
  }
  // Credentials given otherwise than in the URL (one way only: load_credentials()).
  if (!creds.token.empty()) {
    s = natsOptions_SetToken(opts, creds.token.c_str());
  } else if (!creds.user.empty()) {
    s = natsOptions_SetUserInfo(opts, creds.user.c_str(), creds.password.c_str());
  }
  if (s != NATS_OK) return options_failed(opts, w, "cannot set the credentials", s);
  // TLS: asked for by either option (or a tls:// URL, which the library handles).
  if (!a.tls_ca.empty() || !a.tls_cert.empty()) {
    s = natsOptions_SetSecure(opts, true);
    if (s != NATS_OK) return options_failed(opts, w, "cannot use TLS (is libnats built with it?)", s);
  }
  if (!a.tls_ca.empty()) {
    s = natsOptions_LoadCATrustedCertificates(opts, a.tls_ca.c_str());
    if (s != NATS_OK) return options_failed(opts, w, "cannot load --tls-ca " + a.tls_ca, s);
  }
  if (!a.tls_cert.empty()) {
    s = natsOptions_LoadCertificatesChain(opts, a.tls_cert.c_str(), a.tls_key.c_str());
    if (s != NATS_OK) {
      return options_failed(opts, w, "cannot load --tls-cert " + a.tls_cert + " with --tls-key " + a.tls_key, s);
    }
  }
  bool warned = false;
  const auto started = std::chrono::steady_clock::now();
  for (Millis pause(250);; pause = std::min(pause * 2, Millis(5000))) {
    s = natsConnection_Connect(nc, opts);
    if (s == NATS_OK) break;
    bool transient = s == NATS_NO_SERVER || s == NATS_TIMEOUT || s == NATS_IO_ERROR || s == NATS_CONNECTION_CLOSED ||
                     s == NATS_CONNECTION_DISCONNECTED;
    if (!transient) {
      std::string text = w.nats_text(s);
      std::string hint;
      if (text.find("Authorization") != std::string::npos) {
        hint = " (check the credentials: --creds-file, SPOOL_NATS_USER and SPOOL_NATS_PASSWORD, or SPOOL_NATS_TOKEN)";
      } else if (text.find("SSL") != std::string::npos) {
        if (a.tls_ca.empty()) hint = " (give the CA that signed the server's certificate with --tls-ca)";
      } else if (!a.tls_ca.empty() && a.tls_cert.empty()) {  // the server hung up on us
        hint = " (does the server require a client certificate? --tls-cert and --tls-key)";
      }
      std::fprintf(stderr, "%s: cannot connect to NATS at %s: %s%s\n", who, url.c_str(), text.c_str(), hint.c_str());
      natsOptions_Destroy(opts);
      return 1;
    }
    const auto waited = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - started);
    if (give_up.count() > 0 && waited >= give_up) {
      std::fprintf(stderr, "%s: cannot reach NATS at %s (%s); giving up after %.3gs (--give-up)\n", who, url.c_str(),
                   w.nats_text(s).c_str(), static_cast<double>(give_up.count()) / 1000);
      natsOptions_Destroy(opts);
      return 1;
    }
    if (!warned) {
      std::fprintf(stderr, "%s: cannot reach NATS at %s (%s); retrying %s %s\n", who, url.c_str(),
                   w.nats_text(s).c_str(),
                   give_up.count() > 0 ? ("for up to " + std::to_string(give_up.count()) + " ms").c_str()
                                       : "until it is up",
                   waiting_note.c_str());
      warned = true;
    }
    if (!sleep_unless(stop, give_up.count() > 0 ? std::min(pause, give_up - waited) : pause)) {
      natsOptions_Destroy(opts);
      return 0;
    }
  }
  natsOptions_Destroy(opts);
  if (warned) std::fprintf(stderr, "%s: connected to NATS at %s\n", who, url.c_str());
  return -1;
}

#endif  // SPOOL_HAVE_NATS

}  // namespace spool::cli
