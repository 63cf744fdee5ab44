// spool stats: depth and totals, once or every second, as text, JSON or Prometheus.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>

#include "cli/output.h"
#include "cli/pinned.h"
#include "cmd/command.h"

namespace spool::cmd {
namespace {

struct StatsArgs {
  std::string dir, target;
  double rate = 0;
  bool json = false, watch = false, prom = false;
};

// "removed, open  2 segments (128.0 MiB) held by pids 12, 34 ..." for the human output.
std::string pinned_line(const cli::Pinned& p) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "removed, open  %llu segment(s) (%.1f MiB) held by pid",
                static_cast<unsigned long long>(p.segments), static_cast<double>(p.bytes) / (1 << 20));
  std::string out = buf;
  for (size_t i = 0; i < p.pids.size(); ++i) out += (i == 0 ? " " : ", ") + std::to_string(p.pids[i]);
  return out + ": compaction cannot free that disk until they close them\n";
}

volatile sig_atomic_t g_interrupted = 0;
void on_interrupt(int) { g_interrupted = 1; }

int run_stats(const StatsArgs& a) {
  double target_s = 0;
  if (!a.target.empty()) target_s = static_cast<double>(duration_arg("--target", a.target).count()) / 1000.0;
  if ((a.rate > 0) != (target_s > 0)) throw UsageError{"--rate and --target go together, both above 0"};
  if (a.prom && a.json) throw UsageError{"--prometheus and --json are two output formats: choose one"};
  Status err;
  auto q = open_existing(a.dir, &err);
  if (!q) return fail(err, a.dir);
  // Only --watch catches SIGINT and SIGTERM, to end after a whole rendering; a single
  // stats keeps their usual effect, so that one blocked (e.g. opening a dead-letter queue
  // another process holds) still ends (issue 48).
  if (a.watch) {
    ::signal(SIGINT, on_interrupt);
    ::signal(SIGTERM, on_interrupt);
  }
  bool tty = ::isatty(1);
  std::optional<Stats> prev;
  auto prev_at = std::chrono::steady_clock::now();
  do {
    auto st = q->stats();
    if (!st.ok()) return fail(st.status(), a.dir);
    auto now = std::chrono::steady_clock::now();
    double seconds = std::chrono::duration<double>(now - prev_at).count();
    // Removed segments still open or mapped somewhere: disk compaction could not free.
    const cli::Pinned pinned = cli::pinned_segments(a.dir);
    std::string out;
    if (a.prom) {
      out = cli::prometheus(a.dir, *st);
      out += cli::prometheus_gauge(a.dir, "spool_pinned_removed_bytes",
                                   "Disk held by removed segments that a process still has open or mapped.",
                                   pinned.bytes);
      if (a.rate > 0) {
        out += cli::prometheus_gauge(a.dir, "spool_recommended_workers",
                                     "Workers needed to meet the latency target.",
                                     st->workers_needed(a.rate, target_s));
      }
    } else if (a.json) {
      auto j = cli::stats_json(*st);
      j["keep_acked_ms"] = q->options().keep_acked.count();
      j["pinned_removed_segments"] = pinned.segments;
      j["pinned_removed_bytes"] = pinned.bytes;
      j["pinned_by"] = pinned.pids;
      j["pinned_unexamined_processes"] = pinned.unexamined;
      if (a.rate > 0) j["recommended_workers"] = st->workers_needed(a.rate, target_s);
      out = j.dump() + "\n";
    } else {
      out = cli::human_stats(a.dir, *st, prev ? &*prev : nullptr, seconds);
      if (const Millis keep = q->options().keep_acked; keep.count() != 0 && st->kept_acked == 0) {
        out += "kept acked     0 (keep_acked " + std::to_string(keep.count()) + " ms)\n";
      }
      if (a.rate > 0) out += "workers needed " + std::to_string(st->workers_needed(a.rate, target_s)) + "\n";
      if (!pinned.pids.empty()) out += pinned_line(pinned);
    }
    prev = *st;
    prev_at = now;
    if (a.watch && tty) std::fputs("\033[H\033[2J", stdout);
    std::fputs(out.c_str(), stdout);
    if (!stdout_ok()) break;  // reported by main()
    for (int i = 0; a.watch && i < 10 && !g_interrupted; ++i) std::this_thread::sleep_for(Millis(100));
  } while (a.watch && !g_interrupted);
  return 0;
}

}  // namespace

Command add_stats(CLI::App& app) {
  auto a = std::make_shared<StatsArgs>();
  auto* stats = app.add_subcommand("stats", "Show queue depth and totals");
  add_dir(stats, a->dir);
  stats->add_flag("--json", a->json, "As one JSON object");
  stats->add_flag("--watch", a->watch, "Refresh every second until interrupted");
  stats->add_flag("--prometheus", a->prom, "Prometheus text exposition format");
  stats->add_option("--rate", a->rate, "Messages per second one worker handles (for recommended_workers)");
  stats->add_option("--target", a->target, "Latency target for the backlog (for recommended_workers)");
  stats->footer("--json and --prometheus are two formats: give at most one.\n"
                "Examples: spool stats q --watch   |   spool stats q --json --rate 20 --target 30s\n"
                "          spool stats q --prometheus > /var/lib/node_exporter/textfile/spool_q.prom");
  Command c{stats, [a] { return run_stats(*a); }};
  c.stdout_data = [] { return "its output"; };
  return c;
}

}  // namespace spool::cmd
