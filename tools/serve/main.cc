// spool-serve: `spool serve ROOT --sqs ADDR` (docs/sqs.md). Its own executable, which
// `spool serve` runs, so that the core `spool` binary does not link an HTTP server and
// OpenSSL: a host that only runs workers and shell pipelines needs neither.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <thread>

#include "cli/std_fds.h"
#include "serve/server.h"
#include "serve/sqs_part.h"

namespace {

constexpr int kExitUsage = 64;

// "HOST:PORT", "[::1]:PORT" or "PORT" (loopback).
bool parse_addr(const std::string& s, std::string* host, int* port) {
  std::string p = s;
  *host = "127.0.0.1";
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') return false;
    *host = s.substr(1, close - 1);
    p = s.substr(close + 2);
  } else if (size_t colon = s.rfind(':'); colon != std::string::npos) {
    *host = s.substr(0, colon);
    p = s.substr(colon + 1);
  }
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos)
    return false;
  *port = std::stoi(p);
  return *port > 0 && *port < 65536 && !host->empty();
}

bool loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  spool::cli::StdFds closed;
  if (!spool::cli::ensure_std_fds(&closed)) return 1;
  CLI::App app{"spool serve: the SQS API (and later a dashboard) over a spool root; docs/sqs.md"};
  std::string root, sqs, credentials, region = "us-east-1";
  bool no_auth = false;
  int verbose = 0;
  size_t threads = 256;
  app.add_option("ROOT", root,
                 "directory whose sub-directories are the queues (queue NAME is ROOT/NAME)")
      ->required();
  app.add_option("--sqs", sqs, "serve the SQS API on HOST:PORT (loopback unless told otherwise)")
      ->required();
  app.add_option("--credentials", credentials,
                 "the keys requests are signed with, in the ~/.aws/credentials format");
  app.add_flag("--no-auth", no_auth, "accept unsigned requests (loopback addresses only)");
  app.add_option("--region", region, "the region in queue ARNs when a request names none");
  app.add_option("--threads", threads, "handler threads (each long poll under way holds one)")
      ->check(CLI::Range(4, 100000));
  app.add_flag("-v,--verbose", verbose, "log each listener (-v) and each refused request (-vv)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "spool serve: %s (run 'spool serve --help' for usage)\n", e.what());
    return kExitUsage;
  }
  spdlog::set_level(verbose >= 2   ? spdlog::level::debug
                    : verbose == 1 ? spdlog::level::info
                                   : spdlog::level::warn);

  std::string host;
  int port = 0;
  if (!parse_addr(sqs, &host, &port)) {
    std::fprintf(stderr,
                 "spool serve: bad address '%s' for --sqs (use HOST:PORT, [IPv6]:PORT or PORT)\n",
                 sqs.c_str());
    return kExitUsage;
  }
  struct stat st {};
  if (::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    std::fprintf(stderr, "spool serve: %s: not a directory (make it first: mkdir -p %s)\n",
                 root.c_str(), root.c_str());
    return 1;
  }
  spool::serve::SqsOptions so;
  so.root = root;
  so.region = region;
  if (no_auth == !credentials.empty()) {
    std::fprintf(stderr,
                 "spool serve: give --credentials FILE (the keys clients sign with), or --no-auth "
                 "on a loopback address\n");
    return kExitUsage;
  }
  if (no_auth) {
    if (!loopback(host)) {
      std::fprintf(stderr,
                   "spool serve: --no-auth is refused on %s: anyone who reaches it could read and "
                   "delete every "
                   "queue; it is allowed on loopback addresses only (127.0.0.1, ::1)\n",
                   host.c_str());
      return kExitUsage;
    }
    std::fprintf(stderr,
                 "spool serve: WARNING: --no-auth: requests to %s:%d are NOT authenticated; every "
                 "local user "
                 "and process can read, send and delete messages in every queue under %s\n",
                 host.c_str(), port, root.c_str());
    so.no_auth = true;
  } else {
    auto keys = spool::serve::read_credentials(credentials);
    if (!keys.ok()) {
      std::fprintf(stderr, "spool serve: %s\n", keys.status().message().c_str());
      return 1;
    }
    so.keys = std::move(*keys);
  }

  // Signals go to a watcher thread that stops the server (handlers then finish).
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  spool::serve::ListenOptions lo;
  lo.threads = threads;
  spool::serve::Server server(lo);
  server.add(std::make_unique<spool::serve::SqsPart>(std::move(so)), host, port);
  if (spool::Status s = server.bind(); !s.ok()) {
    std::fprintf(stderr, "spool serve: %s\n", s.message().c_str());
    return 1;
  }
  std::thread watcher([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    server.stop();
  });
  server.run();
  // run() also returns if a listener fails; wake the watcher so it can be joined.
  pthread_kill(watcher.native_handle(), SIGTERM);
  watcher.join();
  return 0;
}
