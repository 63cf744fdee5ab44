// spool stats: depth and totals, once or every second, as text, JSON or Prometheus.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "cli/output.h"
#include "cli/pinned.h"
#include "cli/units.h"
#include "cmd/command.h"

namespace spool::cmd {
namespace {

struct StatsArgs {
  std::vector<std::string> dirs;
  std::string target, sub;
  double rate = 0;
  bool json = false, watch = false, prom = false;
};

// "removed, open  2 segments (128.0 MiB) held by pids 12, 34 ..." for the human output.
std::string pinned_line(const cli::Pinned& p) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "removed, open  %s (%.1f MiB) held by pid%s", cli::count_of(p.segments, "segment").c_str(),
                static_cast<double>(p.bytes) / (1 << 20), p.pids.size() == 1 ? "" : "s");
  std::string out = buf;
  for (size_t i = 0; i < p.pids.size(); ++i) out += (i == 0 ? " " : ", ") + std::to_string(p.pids[i]);
  return out + ": compaction cannot free that disk until they close them\n";
}

volatile sig_atomic_t g_interrupted = 0;
void on_interrupt(int) { g_interrupted = 1; }

// One queue of the command line, with what its last refresh showed (for --watch's rates).
struct Watched {
  std::string dir;
  std::unique_ptr<Queue> q;
  std::optional<Stats> prev;
  std::chrono::steady_clock::time_point prev_at;
};

// One queue's stats in the chosen format; false (with the error printed) if they failed.
bool show(const StatsArgs& a, Watched& w, double target_s, bool several, std::string* out) {
  auto st = w.q->stats();
  if (!st.ok()) {
    fail(st.status(), w.dir);
    return false;
  }
  auto now = std::chrono::steady_clock::now();
  double seconds = std::chrono::duration<double>(now - w.prev_at).count();
  // Removed segments still open or mapped somewhere: disk compaction could not free.
  const cli::Pinned pinned = cli::pinned_segments(w.dir);
  if (a.prom) {
    *out += cli::prometheus(w.dir, *st);
    *out += cli::prometheus_gauge(w.dir, "spool_pinned_removed_bytes",
                                  "Disk held by removed segments that a process still has open or mapped.",
                                  pinned.bytes);
    if (a.rate > 0) {
      *out += cli::prometheus_gauge(w.dir, "spool_recommended_workers", "Workers needed to meet the latency target.",
                                    st->workers_needed(a.rate, target_s));
    }
  } else if (a.json) {
    auto j = cli::stats_json(*st);
    cli::DiskUse disk = cli::disk_use(w.dir);
    j["dir_bytes"] = disk.total;
    j["index_bytes"] = disk.index;
    j["dlq_bytes"] = disk.dlq;
    j["keep_acked_ms"] = w.q->options().keep_acked.count();
    j["pinned_removed_segments"] = pinned.segments;
    j["pinned_removed_bytes"] = pinned.bytes;
    j["pinned_by"] = pinned.pids;
    j["pinned_unexamined_processes"] = pinned.unexamined;
    if (several) j["queue"] = w.dir;
    if (!a.sub.empty()) j["subscription"] = a.sub;
    if (auto subs = w.q->subscriptions(); subs.ok() && !subs->empty() && a.sub.empty()) {
      j["subscriptions"] = nlohmann::json::array();
      for (const auto& s : *subs) {
        j["subscriptions"].push_back(cli::subscription_json(s));
      }
    }
    if (a.watch) j["time"] = cli::iso_time(std::chrono::system_clock::now());
    if (a.rate > 0) j["recommended_workers"] = st->workers_needed(a.rate, target_s);
    *out += j.dump() + "\n";
  } else {
    cli::DiskUse disk = cli::disk_use(w.dir);
    if (several && !out->empty()) *out += "\n";
    if (!a.sub.empty()) *out += "subscription   " + a.sub + "\n";
    *out += cli::human_stats(w.dir, *st, w.prev ? &*w.prev : nullptr, seconds, &disk);
    // The queue's own stats name its subscriptions, each with what it holds.
    if (auto subs = w.q->subscriptions(); subs.ok() && a.sub.empty()) {
      for (const auto& s : *subs) {
        *out += "subscription   " + s.name + ": " + cli::count_of(s.messages, "message") + ", " +
                std::to_string(s.leased) + " in flight, " + std::to_string(s.expired_total) + " expired, holds back " +
                cli::format_size(s.held_back_bytes) + " (spool stats " + w.dir + " --sub " + s.name + ")\n";
      }
    }
    if (const Millis keep = w.q->options().keep_acked; keep.count() != 0 && st->kept_acked == 0) {
      *out += "kept acked     0 (keep_acked " + std::to_string(keep.count()) + " ms)\n";
    }
    if (a.rate > 0) *out += "workers needed " + std::to_string(st->workers_needed(a.rate, target_s)) + "\n";
    if (!pinned.pids.empty()) *out += pinned_line(pinned);
  }
  w.prev = *st;
  w.prev_at = now;
  return true;
}

int run_stats(const StatsArgs& a) {
  double target_s = 0;
  if (!a.target.empty()) target_s = static_cast<double>(duration_arg("--target", a.target).count()) / 1000.0;
  if ((a.rate > 0) != (target_s > 0)) throw UsageError{"--rate and --target go together, both above 0"};
  if (a.prom && a.json) throw UsageError{"--prometheus and --json are two output formats: choose one"};
  // Prometheus' text format gives each metric's HELP and TYPE once, so the queues of one
  // scrape would have to be merged metric by metric; one queue per call keeps each .prom
  // file (node_exporter's textfile collector merges them) whole.
  if (a.prom && a.dirs.size() > 1) throw UsageError{"--prometheus takes one queue: run it once per queue"};
  // Every queue that opens is shown; one that does not is reported, and the exit is 1.
  int rc = 0;
  std::vector<Watched> queues;
  for (const auto& dir : a.dirs) {
    Status err;
    auto q = open_existing(dir, &err, a.sub);
    if (!q) {
      rc = fail(err, dir);
      continue;
    }
    queues.push_back({dir, std::move(q), std::nullopt, std::chrono::steady_clock::now()});
  }
  if (queues.empty()) return rc;
  // Only --watch catches SIGINT and SIGTERM, to end after a whole rendering; a single
  // stats keeps their usual effect, so that one blocked (e.g. opening a dead-letter queue
  // another process holds) still ends (issue 48).
  if (a.watch) {
    ::signal(SIGINT, on_interrupt);
    ::signal(SIGTERM, on_interrupt);
  }
  const bool tty = ::isatty(1);
  const bool several = a.dirs.size() > 1;
  do {
    std::string out;
    // --watch: when this refresh was taken, above the queues (JSON: a "time" field).
    if (a.watch && !a.json && !a.prom) out = "time           " + cli::iso_time(std::chrono::system_clock::now()) + "\n";
    for (auto& w : queues) {
      if (!show(a, w, target_s, several, &out)) return 1;
    }
    if (a.watch && tty) std::fputs("\033[H\033[2J", stdout);
    std::fputs(out.c_str(), stdout);
    if (!stdout_ok()) break;  // reported by main()
    for (int i = 0; a.watch && i < 10 && !g_interrupted; ++i) std::this_thread::sleep_for(Millis(100));
  } while (a.watch && !g_interrupted);
  return rc;
}

}  // namespace

Command add_stats(CLI::App& app) {
  auto a = std::make_shared<StatsArgs>();
  auto* stats = app.add_subcommand("stats", "Show queue depth and totals");
  stats->add_option("DIR", a->dirs, "Queue directories (one or more)")->required();
  add_subscription_flag(stats, a->sub);
  stats->add_flag("--json", a->json, "As one JSON object");
  stats->add_flag("--watch", a->watch, "Refresh every second until interrupted");
  stats->add_flag("--prometheus", a->prom, "Prometheus text exposition format");
  stats->add_option("--rate", a->rate, "Messages per second one worker handles (for recommended_workers)");
  stats->add_option("--target", a->target, "Latency target for the backlog (for recommended_workers)");
  stats->footer("--json and --prometheus are two formats: give at most one. Several DIRs: each in turn\n"
                "(--json: one object a line, with \"queue\"); --prometheus takes one.\n"
                "Examples: spool stats q --watch   |   spool stats q --json --rate 20 --target 30s\n"
                "          spool stats q --prometheus > /var/lib/node_exporter/textfile/spool_q.prom");
  Command c{stats, [a] { return run_stats(*a); }};
  c.stdout_data = [] { return "its output"; };
  return c;
}

}  // namespace spool::cmd
