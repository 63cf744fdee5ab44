// Scaffolding shared by the benchmark programs (bench_queue, bench_compact, bench_append and
// the compare harness), so that they time, start their processes, use scratch space and
// print numbers the same way. Header only: each program is a single file plus this.
#pragma once

#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <new>
#include <string>
#include <vector>

namespace spool::bench {

// A failed system call ends the program: perror and exit 1, unless the program set g_fail
// (the compare drivers, whose exit code and message run.sh reads). g_fail must not return.
inline void (*g_fail)(const char* what) = nullptr;

[[noreturn]] inline void die(const char* what) {
  if (g_fail != nullptr) g_fail(what);
  std::perror(what);
  std::exit(1);
}

inline uint64_t clock_ns(clockid_t c) {
  timespec ts{};
  ::clock_gettime(c, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}
inline uint64_t mono_ns() { return clock_ns(CLOCK_MONOTONIC); }

inline double secs(uint64_t ns) { return static_cast<double>(ns) / 1e9; }

inline std::string human(double v) {
  char b[32];
  if (v >= 1e6) std::snprintf(b, sizeof b, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(b, sizeof b, "%.1fk", v / 1e3);
  else std::snprintf(b, sizeof b, "%.0f", v);
  return b;
}

// The three load averages, printed with the results: other load skews every number.
inline std::string loadavg() {
  char b[64] = "?";
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fgets(b, sizeof b, f) == nullptr) std::strcpy(b, "?");
    std::fclose(f);
  }
  std::string s = b;
  for (size_t i = 0, spaces = 0; i < s.size(); ++i) {
    if (s[i] == ' ' && ++spaces == 3) return s.substr(0, i);
  }
  return s;
}

inline std::string make_payload(size_t n, uint64_t seed) {
  std::string p(n, 'x');
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<char>('a' + (seed + i) % 26);
  return p;
}

// The q-quantile of `v` (not empty; sorted in place), ns in, microseconds out.
inline double pct_us(std::vector<uint64_t>& v, double q) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  i = std::clamp<size_t>(i, 1, v.size()) - 1;
  return static_cast<double>(v[i]) / 1e3;
}

// Whether `name` is in `only`, a comma-separated --only= list.
inline bool selected(const std::string& only, const char* name) {
  return ("," + only + ",").find(std::string(",") + name + ",") != std::string::npos;
}

// ---- scratch directories ----------------------------------------------------------------------

// A new directory $SPOOL_BENCH_DIR/NAME-XXXXXX (default /var/tmp: it must be a disk), or ""
// after perror(who + "mkdtemp ...").
inline std::string make_root(const std::string& name, const std::string& who) {
  const char* base = std::getenv("SPOOL_BENCH_DIR");
  std::string tmpl = std::string(base != nullptr ? base : "/var/tmp") + "/" + name + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::perror((who + "mkdtemp " + tmpl).c_str());
    return {};
  }
  return tmpl;
}

// On tmpfs fdatasync is free, and the sync figures mean nothing.
inline bool is_tmpfs(const std::string& path) {
  struct statfs sf {};
  return ::statfs(path.c_str(), &sf) == 0 && sf.f_type == TMPFS_MAGIC;
}

// Keeps writeback left over from one run out of the next one's timing.
inline void sync_fs(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::syncfs(fd);
    ::close(fd);
  }
}

inline void remove_dir(const std::string& d) {
  std::error_code ec;
  std::filesystem::remove_all(d, ec);
}

inline std::string fresh_dir(const std::string& root, const std::string& name) {
  std::string d = root + "/" + name;
  remove_dir(d);
  return d;
}

// ---- processes ------------------------------------------------------------------------------

// A T, followed by `extra` bytes, in memory that the children forked later share.
template <class T>
T* map_shared(size_t extra = 0) {
  void* m = ::mmap(nullptr, sizeof(T) + extra, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) die("mmap");
  return new (m) T();
}

inline pid_t spawn(const std::function<int()>& body) {
  // Else the child would print what the parent had buffered a second time.
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t p = ::fork();
  if (p < 0) die("fork");
  if (p == 0) {
    int rc = body();
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(rc);  // no atexit handlers: they belong to the parent
  }
  return p;
}

// True when every child exited 0. `who` (null: quiet) names the program in a note about a
// child killed by a signal.
inline bool wait_all(const std::vector<pid_t>& pids, const char* who) {
  bool ok = true;
  for (pid_t p : pids) {
    int st = 0;
    while (::waitpid(p, &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      ok = false;
      if (who != nullptr && WIFSIGNALED(st)) std::fprintf(stderr, "%s: child %d killed by signal %d\n", who, p, WTERMSIG(st));
    }
  }
  return ok;
}

// Holds children back until all of them are set up (queue opened, connected), so that they
// start together and the set-up stays out of the timing. `ready` is in the shared mapping.
class StartGate {
 public:
  explicit StartGate(std::atomic<uint64_t>& ready) : ready_(ready) {
    if (::pipe2(fds_, O_CLOEXEC) != 0) die("pipe");
  }
  StartGate(const StartGate&) = delete;
  StartGate& operator=(const StartGate&) = delete;

  // In a child: blocks until the parent opens the gate. Its own copy of the write end would
  // keep every child from seeing that.
  void child_wait() {
    ::close(fds_[1]);
    ready_.fetch_add(1);
    char c;
    while (::read(fds_[0], &c, 1) < 0 && errno == EINTR) {
    }
    ::close(fds_[0]);
  }

  // Opens the gate once every child in `pids` is ready; returns the start time. If one exits
  // first (it could not set up), kills the others and returns 0; `who` (null: quiet) names
  // the program in a note about it.
  uint64_t release(const std::vector<pid_t>& pids, const char* who) {
    while (ready_.load() < pids.size()) {
      for (pid_t p : pids) {
        int st = 0;
        if (::waitpid(p, &st, WNOHANG) == p) {
          if (who != nullptr) std::fprintf(stderr, "%s: child %d exited before the start; run abandoned\n", who, p);
          for (pid_t q : pids)
            if (q != p) ::kill(q, SIGKILL);
          for (pid_t q : pids)
            if (q != p) ::waitpid(q, &st, 0);
          ::close(fds_[0]);
          ::close(fds_[1]);
          return 0;
        }
      }
      ::usleep(200);
    }
    return open();
  }

  // Opens the gate now; returns the start time.
  uint64_t open() {
    ::close(fds_[0]);
    uint64_t t = mono_ns();
    ::close(fds_[1]);
    return t;
  }

 private:
  std::atomic<uint64_t>& ready_;
  int fds_[2] = {-1, -1};
};

// The "Key:   value kB" lines of /proc/PID/status (pid 0: this process), value in kB (or
// the count, for Threads).
inline std::map<std::string, long> proc_status(pid_t pid = 0) {
  std::map<std::string, long> out;
  std::ifstream f(pid == 0 ? std::string("/proc/self/status") : "/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);) {
    if (auto colon = line.find(':'); colon != std::string::npos) {
      out[line.substr(0, colon)] = std::atol(line.c_str() + colon + 1);
    }
  }
  return out;
}

}  // namespace spool::bench
