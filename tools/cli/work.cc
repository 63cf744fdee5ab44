#include "cli/work.h"

#include <fcntl.h>
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
#include <list>
#include <mutex>
#include <thread>

#include "cli/supervisor.h"
#include "spool/lease_keeper.h"

extern char** environ;

namespace spool::cli {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_force{false};  // a second SIGTERM/SIGINT: stop running commands too
void on_stop(int) {
  if (g_stop) g_force = true;
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

Millis backoff(uint32_t receive_count) {
  // 1 s, 2 s, 4 s, ... capped at 10 minutes.
  uint32_t shift = receive_count == 0 ? 0 : std::min<uint32_t>(receive_count - 1, 10);
  return std::min(Millis(1000ll << shift), Millis(600'000));
}

class Runner {
 public:
  Runner(Queue& q, const WorkOptions& o, std::string exe)
      : q_(q), opts_(o), exe_(std::move(exe)),
        vis_(o.visibility.count() > 0 ? o.visibility : q.options().visibility) {}

  int run() {
    // A SIGKILLed `spool work` gives its messages back at once, not after the lease.
    if (Status s = q_.bind_leases(); !s.ok()) {
      std::fprintf(stderr, "spool work: leases not bound to this process (%s); a crash returns them only "
                           "when they run out\n", s.to_string().c_str());
    }
    while (!g_stop) {
      {
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, Millis(200), [&] { return running_ < opts_.jobs || g_stop; });
        if (running_ >= opts_.jobs || g_stop) continue;
      }
      size_t free = opts_.jobs - running_.load();
      auto msgs = q_.receive(free, vis_, Millis(500));
      if (!msgs.ok()) {
        if (msgs.status().code() == Code::kEmpty) continue;
        std::fprintf(stderr, "spool work: %s\n", msgs.status().to_string().c_str());
        failed_ = true;
        break;
      }
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
    if (running_ > 0 && g_stop) {
      std::fprintf(stderr, "spool work: stopping; waiting for %zu running command(s) (signal again to stop them)\n",
                   running_.load());
    }
    reap(true);
    return failed_ ? 1 : 0;
  }

 private:
  void handle(const Message& m) {
    LeaseKeeper::Options ko;
    ko.extend_by = vis_;
    ko.interval = std::max(Millis(10), vis_ / 3);
    ko.max_lifetime = opts_.max_runtime ? *opts_.max_runtime + vis_ : Millis(24ll * 3600 * 1000);
    LeaseKeeper keeper(q_, m.receipt, ko);
    std::string why;
    int status = execute(m, &why);
    keeper.stop();
    if (status == 0) {
      Status s = q_.ack(m.receipt);
      if (!s.ok()) std::fprintf(stderr, "spool work: message %lu: ack failed: %s\n", m.id, s.to_string().c_str());
      return;
    }
    Millis delay = backoff(m.receive_count);
    std::fprintf(stderr, "spool work: message %lu: %s; retry in %llds\n", m.id, why.c_str(),
                 static_cast<long long>(delay.count() / 1000));
    Status s = q_.nack(m.receipt, delay);
    if (!s.ok()) std::fprintf(stderr, "spool work: message %lu: nack failed: %s\n", m.id, s.to_string().c_str());
  }

  // Runs the command for `m`; its exit status (0 = success) and, if not 0, why.
  int execute(const Message& m, std::string* why) {
    std::vector<std::string> env_store;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "SPOOL_MESSAGE_ID=", 17) && std::strncmp(*e, "SPOOL_RECEIVE_COUNT=", 20) &&
          std::strncmp(*e, "SPOOL_RECEIPT=", 14))
        env_store.emplace_back(*e);
    }
    env_store.push_back("SPOOL_MESSAGE_ID=" + std::to_string(m.id));
    env_store.push_back("SPOOL_RECEIVE_COUNT=" + std::to_string(m.receive_count));
    env_store.push_back("SPOOL_RECEIPT=" + m.receipt);
    std::vector<char*> envp, argv;
    for (auto& e : env_store) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = opts_.command;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);

    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      *why = std::string("pipe: ") + std::strerror(errno);
      return -1;
    }
    Supervised sup = start_supervised(exe_, argv.data(), envp.data(), fds[0]);
    ::close(fds[0]);
    if (sup.pid < 0) {
      ::close(fds[1]);
      *why = std::string("fork: ") + std::strerror(errno);
      return -1;
    }
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
      return -1;
    }
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
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<size_t> running_{0};
  std::list<Job> jobs_;
  bool failed_ = false;
};

}  // namespace

int run_work(Queue& q, const WorkOptions& opts) {
  std::string exe = resolve(opts.command.at(0));
  if (exe.empty()) {
    std::fprintf(stderr, "spool work: command not found or not executable: %s\n", opts.command[0].c_str());
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return Runner(q, opts, exe).run();
}

}  // namespace spool::cli
