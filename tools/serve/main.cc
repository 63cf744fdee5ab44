// spool-serve: `spool serve ROOT... [--sqs ADDR] [--http ADDR]` (docs/sqs.md,
// docs/operations.md). Its own executable, which
// `spool serve` runs, so that the core `spool` binary does not link an HTTP server and
// OpenSSL: a host that only runs workers and shell pipelines needs neither.
#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <thread>

#include "cli/std_fds.h"
#include "logging.h"
#include "serve/dash_part.h"
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
  CLI::App app{"spool serve: the SQS API and a dashboard of the queues under some roots; docs/sqs.md, docs/operations.md"};
  std::vector<std::string> roots;
  std::string sqs, http, token_file, credentials, region = "us-east-1";
  bool no_auth = false;
  int verbose = 0, depth = 3;
  size_t threads = 256;
  app.add_option("ROOT", roots,
                 "directory whose sub-directories are the queues (SQS: queue NAME is ROOT/NAME; the "
                 "dashboard: every queue up to --depth levels under each ROOT)")
      ->required();
  app.add_option("--sqs", sqs, "serve the SQS API on HOST:PORT (loopback unless told otherwise)");
  app.add_option("--http", http,
                 "serve the dashboard, its JSON API and /metrics on HOST:PORT (loopback unless told "
                 "otherwise; may be the --sqs address)");
  app.add_option("--token-file", token_file,
                 "the dashboard's actions (pause, resume, purge, redrive, move, release) need the "
                 "token in this file; without it the dashboard is read-only");
  app.add_option("--depth", depth, "how many directory levels under a ROOT the dashboard searches for queues")
      ->check(CLI::Range(0, 16));
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
  // Its own lines in the library's one format (src/logging.h), named "spool serve".
  auto logger = std::make_shared<spdlog::logger>("spool serve", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_pattern(spool::kLogPattern);
  spdlog::set_default_logger(std::move(logger));
  spdlog::set_level(verbose >= 2   ? spdlog::level::debug
                    : verbose == 1 ? spdlog::level::info
                                   : spdlog::level::warn);

  if (sqs.empty() && http.empty()) {
    std::fprintf(stderr, "spool serve: give --sqs ADDR (the SQS API), --http ADDR (the dashboard), or both\n");
    return kExitUsage;
  }
  for (const auto& root : roots) {
    struct stat st {};
    if (::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      std::fprintf(stderr, "spool serve: %s: not a directory (make it first: mkdir -p %s)\n", root.c_str(),
                   root.c_str());
      return 1;
    }
  }
  std::string host, http_host;
  int port = 0, http_port = 0;
  if (!http.empty() && !parse_addr(http, &http_host, &http_port)) {
    std::fprintf(stderr,
                 "spool serve: bad address '%s' for --http (use HOST:PORT, [IPv6]:PORT or PORT)\n",
                 http.c_str());
    return kExitUsage;
  }
  if (http.empty() && !token_file.empty()) {
    std::fprintf(stderr, "spool serve: --token-file is for the dashboard: give --http ADDR too\n");
    return kExitUsage;
  }
  if (sqs.empty() && (no_auth || !credentials.empty())) {
    std::fprintf(stderr, "spool serve: --credentials and --no-auth are for the SQS API: give --sqs ADDR too\n");
    return kExitUsage;
  }
  // Signals go to a watcher thread that stops the server (handlers then finish); blocked
  // before any thread starts (the dashboard's refresh thread), so that every thread inherits it.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<spool::serve::SqsPart> sqs_part;
  if (!sqs.empty()) {
    if (roots.size() != 1) {
      std::fprintf(stderr, "spool serve: the SQS API serves one ROOT (its queues are ROOT/NAME); %zu given\n",
                   roots.size());
      return kExitUsage;
    }
    if (!parse_addr(sqs, &host, &port)) {
      std::fprintf(stderr,
                   "spool serve: bad address '%s' for --sqs (use HOST:PORT, [IPv6]:PORT or PORT)\n",
                   sqs.c_str());
      return kExitUsage;
    }
    spool::serve::SqsOptions so;
    so.root = roots[0];
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
                   host.c_str(), port, roots[0].c_str());
      so.no_auth = true;
    } else {
      auto keys = spool::serve::read_credentials(credentials);
      if (!keys.ok()) {
        std::fprintf(stderr, "spool serve: %s\n", keys.status().message().c_str());
        return 1;
      }
      so.keys = std::move(*keys);
    }
    sqs_part = std::make_unique<spool::serve::SqsPart>(std::move(so));
  }
  std::unique_ptr<spool::serve::DashPart> dash_part;
  if (!http.empty()) {
    spool::serve::DashOptions dopts;
    dopts.roots = roots;
    dopts.depth = depth;
    dopts.loopback = loopback(http_host);
    if (!dopts.loopback) {
      std::fprintf(stderr,
                   "spool serve: WARNING: the dashboard on %s:%d shows the queues under the roots to anyone "
                   "who can reach that address, and a token sent to it travels unencrypted\n",
                   http_host.c_str(), http_port);
    }
    if (!token_file.empty()) {
      auto token = spool::serve::read_token(token_file);
      if (!token.ok()) {
        std::fprintf(stderr, "spool serve: %s\n", token.status().message().c_str());
        return 1;
      }
      dopts.token = std::move(*token);
    }
    dash_part = std::make_unique<spool::serve::DashPart>(std::move(dopts));
  }

  spool::serve::ListenOptions lo;
  lo.threads = threads;
  spool::serve::Server server(lo);
  // The SQS face first: on a shared address, httplib takes the first route that matches, and
  // SQS answers at "/" (the dashboard's page is at /dashboard/ as well).
  if (sqs_part) server.add(std::move(sqs_part), host, port);
  if (dash_part) server.add(std::move(dash_part), http_host, http_port);
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
