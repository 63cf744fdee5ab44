#include "cli/work.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <list>
#include <optional>
#include <mutex>
#include <thread>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include "cli/progress.h"
#include "logging.h"
#include "cli/stderr_tee.h"
#include "cli/supervisor.h"
#include "spool/lease_keeper.h"

extern char** environ;

namespace spool::cli {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_force{false};  // a second SIGTERM/SIGINT: stop running commands too
std::atomic<int> g_signal{0};      // the first stopping signal, for the log
void on_stop(int sig) {
  if (g_stop) g_force = true;
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
  g_stop = true;
}

// Resolves argv[0] through PATH in the parent: the forked child then only calls
// async-signal-safe functions before execve.
std::string resolve(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    std::string full = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(full.c_str(), X_OK) == 0) return full;
    start = end + 1;
  }
  return "";
}

// The live progress line while run() runs on a terminal (nullptr otherwise).
std::atomic<LiveLine*> g_live{nullptr};

// stderr for the log: the live progress line is cleared first, so that each log line starts
// at the left margin (the next redraw puts the progress line back below it).
class LogSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    if (LiveLine* live = g_live.load()) live->clear();
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
  }
  void flush_() override { std::fflush(stderr); }
};

// spool work's log, on stderr, in the library's format (spool::kLogPattern), named "spool
// work". Warnings (a command failed, a message goes to the dead-letter queue) by default; -v
// adds one info line per message and the reasons it stops. Payloads never reach it.
spdlog::logger& wlog() {
  static spdlog::logger* const logger = [] {
    auto* l = new spdlog::logger("spool work", std::make_shared<LogSink>());
    l->set_pattern(spool::kLogPattern);
    l->set_level(spdlog::level::warn);
    return l;
  }();
  return *logger;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string absolute(const std::string& dir) {
  char real[PATH_MAX];
  return ::realpath(dir.c_str(), real) != nullptr ? std::string(real) : dir;
}

// How much of the last run's stderr a dead letter keeps (spool.work.stderr): a quarter of
// the 4096 bytes all of a message's attributes may take, so it leaves room for the
// message's own and its history.
constexpr size_t kStderrTail = 512;

Millis backoff(uint32_t receive_count) {
  // 1 s, 2 s, 4 s, ... capped at 10 minutes.
  uint32_t shift = receive_count == 0 ? 0 : std::min<uint32_t>(receive_count - 1, 10);
  return std::min(Millis(1000ll << shift), Millis(600'000));
}

class Runner {
 public:
  Runner(Queue& q, const WorkOptions& o, std::string exe)
      : q_(q), opts_(o), exe_(std::move(exe)),
        vis_(o.visibility.count() > 0 ? o.visibility : q.options().visibility), queue_path_(absolute(q.dir())) {
    if (o.autoscale) scaler_.emplace(*o.autoscale);
  }

  int run() {
    // A SIGKILLed `spool work` gives its messages back at once, not after the lease.
    if (Status st = q_.bind_leases(); !st.ok()) {
      wlog().warn("leases not bound to this process ({}); a crash returns them only when they run out",
                  st.to_string());
    }
    // With --until-empty, receive waits no longer than the grace time, so the exit is not
    // late by a whole long poll.
    const Millis wait = opts_.until_empty ? std::clamp(opts_.grace, Millis(10), Millis(500)) : Millis(500);
    uint64_t taken = 0;
    int corrupt_in_a_row = 0;
    std::thread scaler;
    if (scaler_) scaler = std::thread([this] { scale(); });
    LiveLine live;
    std::thread progress;
    if (live.enabled()) {
      g_live = &live;
      progress = std::thread([this, &live] { draw_progress(live); });
    }
    while (!g_stop) {
      size_t cap;
      {
        std::unique_lock lock(mu_);
        // With --autoscale, the first command waits for the first evaluation, which then
        // sees nothing measured yet (target 1) whenever its thread gets to run.
        auto may_start = [&] { return running_ < limit() && (!scaler_ || scaled_once_); };
        cv_.wait_for(lock, Millis(200), [&] { return may_start() || g_stop; });
        cap = limit();
        if (!may_start() || g_stop) continue;
      }
      if (opts_.max_messages && taken >= *opts_.max_messages) {
        wlog().info("took --max-messages {} messages; finishing", *opts_.max_messages);
        break;
      }
      size_t free = cap - running_.load();  // running_ only falls meanwhile
      if (opts_.max_messages) free = static_cast<size_t>(std::min<uint64_t>(free, *opts_.max_messages - taken));
      auto msgs = q_.receive(free, vis_, wait);
      if (!msgs.ok()) {
        if (msgs.status().code() == Code::kEmpty) {
          if (opts_.until_empty && drained()) {
            wlog().info("the queue has been empty for {:.3g}s; exiting", static_cast<double>(opts_.grace.count()) / 1000);
            break;
          }
          continue;
        }
        // Damage found in the index (kCorrupt: "... try again") is mended before the call
        // returns, so a retry succeeds (docs/cli.md); exiting on the first one stopped every
        // worker that met it. Damage that stays is met again: up to 5 in a row are retried.
        if (msgs.status().code() == Code::kCorrupt && ++corrupt_in_a_row <= 5) {
          wlog().warn("{}; retrying", msgs.status().to_string());
          std::this_thread::sleep_for(Millis(50) * corrupt_in_a_row);
          continue;
        }
        wlog().error("{}", msgs.status().to_string());
        failed_ = true;
        break;
      }
      corrupt_in_a_row = 0;
      empty_since_.reset();
      taken += msgs->size();
      reap(false);
      for (auto& m : *msgs) {
        ++running_;
        auto& job = jobs_.emplace_back();
        job.thread = std::thread([this, &job, m = std::move(m)] {
          handle(m);
          std::lock_guard lock(mu_);
          --running_;
          job.done = true;
          cv_.notify_all();
        });
      }
    }
    // -v says why it exits (docs/cli.md); the other reasons are logged where they are met.
    const char* sig = g_signal == SIGINT ? "SIGINT" : "SIGTERM";
    if (running_ > 0 && g_stop) {
      wlog().warn("{}: stopping; waiting for {} running command(s) (signal again to stop them)", sig, running_.load());
    } else if (g_stop) {
      wlog().info("{} with no command running; exiting", sig);
    }
    reap(true);
    {
      std::lock_guard lock(mu_);
      scaler_stop_ = true;
    }
    cv_.notify_all();
    if (scaler.joinable()) scaler.join();
    if (progress.joinable()) progress.join();
    g_live = nullptr;
    live.clear();
    if (taken > 0) std::fprintf(stderr, "spool work: %s\n", summary(true).c_str());
    return failed_ ? 1 : 0;
  }

 private:
  // What was done so far: "12 messages in 3.2s, 3.7/s: 10 acked, 1 failed (to retry), 1
  // dead-lettered" at the end (`final`); the live line adds what runs now.
  std::string summary(bool final) const {
    const uint64_t ok = acked_, retry = retried_, dead = dead_, lost = unsettled_;
    const uint64_t done = ok + retry + dead + lost;
    const double secs = seconds_since(start_);
    const double rate = secs > 0 ? static_cast<double>(done) / secs : 0;
    std::string text = fmt::format("{} {} in {:.1f}s, {:.3g}/s: {} acked, {} failed (to retry), {} dead-lettered",
                                   done, done == 1 ? "message" : "messages", secs, rate, ok, retry, dead);
    if (lost > 0) text += fmt::format(", {} not settled (ack or nack failed)", lost);
    if (!final) text += fmt::format("; {} running", running_.load());
    return text;
  }

  // The live line on a terminal, redrawn four times a second until run() ends.
  void draw_progress(LiveLine& live) {
    std::unique_lock lock(mu_);
    while (!scaler_stop_) {
      lock.unlock();
      live.show("spool work: " + summary(false));
      lock.lock();
      cv_.wait_for(lock, Millis(250), [&] { return scaler_stop_; });
    }
  }

  // Commands started at most at once now: the autoscaler's target, or -j.
  size_t limit() const { return scaler_ ? scaler_->target() : opts_.jobs; }

  // --autoscale: evaluates the target every period (the first at once) and logs each change.
  void scale() {
    const double latency_s = std::chrono::duration<double>(opts_.autoscale->latency).count();
    size_t logged = 0;
    bool warned = false;
    std::unique_lock lock(mu_);
    while (!scaler_stop_) {
      lock.unlock();
      if (auto st = q_.stats(); st.ok()) {
        auto d = scaler_->evaluate(st->ready, std::chrono::steady_clock::now());
        if (d.target != logged) {
          const std::string per =
              (d.rate >= 100 ? fmt::format("{:.0f}", d.rate) : fmt::format("{:.3g}", d.rate)) + " messages/s per command";
          const std::string rate = d.rate <= 0     ? "rate not measured yet"
                                   : d.rate_bound ? "at most " + per + " (none has finished yet)"
                                                  : per;
          wlog().info("autoscale: target {} (ready {}, {}, --latency {:.3g}s)", d.target, st->ready, rate,
                      latency_s);
          logged = d.target;
        }
        warned = false;
      } else if (!warned) {
        wlog().warn("autoscale: stats failed ({}); the target stays {}", st.status().to_string(), scaler_->target());
        warned = true;
      }
      lock.lock();
      scaled_once_ = true;
      cv_.notify_all();  // a higher target frees slots for the receive loop
      cv_.wait_for(lock, Autoscaler::kPeriod, [&] { return scaler_stop_; });
    }
  }

  // --until-empty: true once the queue has held no ready, delayed or leased message (a
  // message leased by another worker may come back; a delayed one will be due), and no
  // command of ours has run, for the whole grace time.
  bool drained() {
    auto st = q_.stats();
    bool empty = running_ == 0 && st.ok() && st->ready == 0 && st->delayed == 0 && st->in_flight == 0;
    auto now = std::chrono::steady_clock::now();
    if (!empty) {
      empty_since_.reset();
      return false;
    }
    if (!empty_since_) empty_since_ = now;
    return now - *empty_since_ >= opts_.grace;
  }

  void handle(const Message& m) {
    LeaseKeeper::Options ko;
    ko.extend_by = vis_;
    ko.interval = std::max(Millis(10), vis_ / 3);
    ko.max_lifetime = opts_.max_runtime ? *opts_.max_runtime + vis_ : Millis(24ll * 3600 * 1000);
    LeaseKeeper keeper(q_, m.receipt, ko);
    std::string why, err_tail;
    auto start = std::chrono::steady_clock::now();
    std::optional<Autoscaler::Clock::time_point> token;
    if (scaler_) token = scaler_->started();
    int status = execute(m, &why, &err_tail);
    if (token) scaler_->finished(*token);
    double took = seconds_since(start);
    keeper.stop();
    if (status == 0) {
      Status s = q_.ack(m.receipt);
      if (!s.ok()) {
        wlog().warn("message {}: command exited with status 0 after {:.3f}s, but the ack failed: {}", m.id, took,
                    s.to_string());
        ++unsettled_;
      } else {
        wlog().info("message {}: command exited with status 0 after {:.3f}s; acked", m.id, took);
        ++acked_;
      }
      return;
    }
    // This was the last delivery max_receives allows: the message goes to the dead-letter
    // queue now, with the command's exit status, failure and the tail of its stderr beside
    // its history.
    const uint32_t max_receives = q_.options().max_receives;
    const bool last = max_receives > 0 && m.receive_count >= max_receives;
    if (last) {
      wlog().warn("message {}: {} after {:.3f}s; that was delivery {} of max_receives {}: it goes to the "
                  "dead-letter queue (spool dlq {} list)",
                  m.id, why, took, m.receive_count, max_receives, q_.dir());
      Attributes extra{{"spool.work.exit_status", std::to_string(status)}, {"spool.work.failure", why.substr(0, 1024)}};
      if (!err_tail.empty()) extra["spool.work.stderr"] = err_tail;
      Status s = q_.dead_letter(m.receipt, extra);
      if (s.ok()) {
        ++dead_;
        return;
      }
      // A nack instead: the next receive moves it to the dead-letter queue without them.
      wlog().warn("message {}: dead-lettering failed: {}", m.id, s.to_string());
    }
    Millis delay = last ? Millis(0) : backoff(m.receive_count);
    if (!last) wlog().warn("message {}: {} after {:.3f}s; retry in {}s", m.id, why, took, delay.count() / 1000);
    Status s = q_.nack(m.receipt, delay);
    if (!s.ok()) {
      wlog().warn("message {}: nack failed: {}", m.id, s.to_string());
      ++unsettled_;
    } else {
      ++retried_;
    }
  }

  // Runs the command for `m`; its exit status (0 = success) and, if not 0, why. The
  // command's stderr passes through to ours; its last kStderrTail bytes go to `err_tail`.
  int execute(const Message& m, std::string* why, std::string* err_tail) {
    std::vector<std::string> env_store;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "SPOOL_MESSAGE_ID=", 17) && std::strncmp(*e, "SPOOL_RECEIVE_COUNT=", 20) &&
          std::strncmp(*e, "SPOOL_RECEIPT=", 14) && std::strncmp(*e, "SPOOL_QUEUE=", 12))
        env_store.emplace_back(*e);
    }
    env_store.push_back("SPOOL_QUEUE=" + queue_path_);
    env_store.push_back("SPOOL_MESSAGE_ID=" + std::to_string(m.id));
    env_store.push_back("SPOOL_RECEIVE_COUNT=" + std::to_string(m.receive_count));
    env_store.push_back("SPOOL_RECEIPT=" + m.receipt);
    std::vector<char*> envp, argv;
    for (auto& e : env_store) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = opts_.command;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);

    int fds[2], err[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      *why = std::string("pipe: ") + std::strerror(errno);
      return -1;
    }
    if (::pipe2(err, O_CLOEXEC) != 0) {
      *why = std::string("pipe: ") + std::strerror(errno);
      ::close(fds[0]);
      ::close(fds[1]);
      return -1;
    }
    Supervised sup = start_supervised(exe_, argv.data(), envp.data(), fds[0], err[1]);
    ::close(fds[0]);
    ::close(err[1]);
    if (sup.pid < 0) {
      ::close(fds[1]);
      ::close(err[0]);
      *why = std::string("fork: ") + std::strerror(errno);
      return -1;
    }
    StderrTee tee(err[0], STDERR_FILENO, kStderrTail);
    pid_t pid = sup.pid;
    // The payload goes in from its own thread, so a command that never reads stdin cannot
    // block the deadline checks below; it ends with EPIPE once the command exits.
    std::thread writer([&] {
      const char* p = m.payload.data();
      size_t left = m.payload.size();
      while (left > 0) {
        ssize_t n = ::write(fds[1], p, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        p += n;
        left -= static_cast<size_t>(n);
      }
      ::close(fds[1]);
    });
    auto start = std::chrono::steady_clock::now();
    std::chrono::steady_clock::time_point term_at;
    bool term_sent = false, kill_sent = false;
    const char* stopped_why = nullptr;
    int st = 0;
    for (;;) {
      pid_t r = ::waitpid(pid, &st, WNOHANG);
      if (r == pid) break;
      if (r < 0 && errno != EINTR) {
        *why = std::string("waitpid: ") + std::strerror(errno);
        ::close(sup.status_fd);
        writer.join();
        *err_tail = tee.finish(false);
        return -1;
      }
      auto now = std::chrono::steady_clock::now();
      if (!term_sent && opts_.max_runtime && now - start > *opts_.max_runtime) {
        stopped_why = "stopped after exceeding --max-runtime";
      } else if (!term_sent && g_force) {
        stopped_why = "stopped by a second SIGTERM/SIGINT";
      }
      // Through the supervisor, to the command's whole process group.
      if (!term_sent && stopped_why != nullptr) {
        ::kill(pid, SIGTERM);
        term_sent = true;
        term_at = now;
      }
      if (term_sent && !kill_sent && now - term_at > std::chrono::seconds(5)) {
        ::kill(pid, SIGUSR1);
        kill_sent = true;
      }
      ::usleep(2000);
    }
    writer.join();
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !supervised_status(sup, &st)) {
      if (sup.status_fd >= 0) ::close(sup.status_fd);
      *why = "the command's supervisor ended without its status";
      // Killed, it did not sweep: what the command started may still hold the pipe.
      *err_tail = tee.finish(false);
      return -1;
    }
    *err_tail = tee.finish(true);
    if (term_sent) {
      *why = stopped_why;
      return -1;
    }
    if (WIFEXITED(st)) {
      int code = WEXITSTATUS(st);
      if (code == 127) *why = "command exited with status 127 (not found or not executable?)";
      else *why = "command exited with status " + std::to_string(code);
      return code;
    }
    *why = std::string("command killed by signal ") + strsignal(WTERMSIG(st));
    return -1;
  }

  struct Job {
    std::thread thread;
    bool done = false;  // guarded by mu_
  };

  // Joins finished jobs (all of them with `all`), so a long-running worker holds no
  // threads beyond those running.
  void reap(bool all) {
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      bool done;
      {
        std::lock_guard lock(mu_);
        done = it->done;
      }
      if (done || all) {
        it->thread.join();
        it = jobs_.erase(it);
      } else {
        ++it;
      }
    }
  }

  Queue& q_;
  const WorkOptions& opts_;
  const std::string exe_;
  const Millis vis_;
  const std::string queue_path_;  // SPOOL_QUEUE: absolute, so a command may change directory
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<size_t> running_{0};
  std::list<Job> jobs_;
  bool failed_ = false;
  std::optional<Autoscaler> scaler_;  // with --autoscale
  bool scaler_stop_ = false;          // guarded by mu_: run() ends; the scaler and progress threads stop
  bool scaled_once_ = false;          // guarded by mu_: the autoscaler has evaluated once
  std::optional<std::chrono::steady_clock::time_point> empty_since_;  // receive loop only
  // The outcomes so far, for the summary at exit and the live line.
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::atomic<uint64_t> acked_{0}, retried_{0}, dead_{0}, unsettled_{0};
};

}  // namespace

int run_work(Queue& q, const WorkOptions& opts) {
  std::string exe = resolve(opts.command.at(0));
  if (exe.empty()) {
    wlog().error("command not found or not executable: {}", opts.command[0]);
    return 1;
  }
  if (opts.verbose) wlog().set_level(spdlog::level::info);
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return Runner(q, opts, exe).run();
}

}  // namespace spool::cli
