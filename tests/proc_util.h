// Process helpers for the reliability tests (crash campaign, faults, corruption, bad input),
// on top of spawn/wait_exit in test_util.h: a bounded wait, running a program with an exact
// argv, CLOCK_BOOTTIME, one-line journals and the journaled sends of self-checking payloads.
#pragma once

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "spool/queue.h"

#include "test_util.h"

extern char** environ;

namespace spool::test {

// Whether the thread `tid` of `pid` is asleep in a futex wait with a timeout, as a long poll
// is (sys::futex_wait on the index's wake word, FUTEX_WAIT with a timespec); a mutex wait
// has no timeout. From /proc/PID/task/TID/syscall: "NR ARG0 ARG1 ARG2 ARG3 ...".
inline bool in_timed_futex_wait(pid_t pid, pid_t tid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/syscall");
  long nr = -1;
  std::string addr, op, val, timeout;
  if (!(in >> nr >> addr >> op >> val >> timeout)) return false;
  return nr == SYS_futex && (std::stoul(op, nullptr, 16) & FUTEX_CMD_MASK) == FUTEX_WAIT && timeout != "0x0";
}

// Like wait_exit, but SIGKILLs the child after `limit` (then returns 128 + SIGKILL).
inline int wait_exit_for(pid_t pid, std::chrono::milliseconds limit) {
  auto until = std::chrono::steady_clock::now() + limit;
  int st = 0;
  for (;;) {
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (std::chrono::steady_clock::now() > until) {
      ::kill(pid, SIGKILL);
      return wait_exit(pid);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Whether `fd` becomes readable within `ms`.
inline bool readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

// CLOCK_BOOTTIME, the clock the queue orders leases on; comparable across processes.
inline uint64_t boot_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_BOOTTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct RunResult {
  int code = -1;  // exit status, or 128 + signal
  std::string out, err;
};

// Runs `argv` (no shell) with stdin from `input`, in `cwd` if given, with `env_add`
// ("K=V") added to this process's environment; kills it after `limit`.
inline RunResult run_program(const std::vector<std::string>& argv, const std::string& input = "",
                             const std::string& cwd = "", const std::vector<std::string>& env_add = {},
                             std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  char tmpl[] = "/tmp/spool-run-XXXXXX";
  RunResult res;
  if (::mkdtemp(tmpl) == nullptr) return res;
  std::string dir = tmpl;
  {
    std::ofstream(dir + "/in", std::ios::binary) << input;
  }
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    int in = ::open((dir + "/in").c_str(), O_RDONLY);
    int out = ::open((dir + "/out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int err = ::open((dir + "/err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(126);
    for (const auto& kv : env_add) ::putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  res.code = wait_exit_for(pid, limit);
  res.out = slurp(dir + "/out");
  res.err = slurp(dir + "/err");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return res;
}

// A whole-file append of one line, in one write(2): a process killed with SIGKILL leaves
// either the whole line or none of it (the page cache survives the process). A journal that
// cannot be written aborts the process: its ledger would be silently incomplete.
class Journal {
 public:
  explicit Journal(const std::string& path) { switch_to(path); }
  ~Journal() {
    if (fd_ >= 0) ::close(fd_);
  }
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;
  // Later lines go to `path`: a long-lived process can hand over its journal in chunks.
  void switch_to(const std::string& path) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) std::abort();
  }
  void line(const std::string& s) {
    std::string l = s + "\n";
    if (::write(fd_, l.data(), l.size()) != static_cast<ssize_t>(l.size())) std::abort();
  }

 private:
  int fd_ = -1;
};

// Payloads that name themselves ("tag:filler", the filler a function of the tag), so whatever
// comes back can be checked byte for byte and traced to the journaled send of its tag. Each
// campaign keeps its own lengths and filler.
struct TaggedPayloads {
  size_t min_len, spread;  // lengths min_len .. min_len + spread - 1
  char first_letter;       // the filler: letters from here, picked by the tag's hash
  unsigned shifts;         // ... shifted right by 0 .. shifts - 1 bits
  std::string make(const std::string& tag) const {
    uint64_t h = std::hash<std::string>{}(tag);
    size_t len = min_len + h % spread;
    std::string s = tag + ":";
    for (size_t i = 0; s.size() < len; ++i) s.push_back(static_cast<char>(first_letter + (h >> (i % shifts)) % 26));
    return s;
  }
  // Whether `p` is exactly what make() gives for its tag; the tag in `tag`.
  bool check(const std::string& p, std::string* tag) const {
    auto colon = p.find(':');
    if (colon == std::string::npos) return false;
    *tag = p.substr(0, colon);
    return make(*tag) == p;
  }
};

// Queue::open in a journaling child: a failure is journaled ("E open: ...") and gives nullptr.
inline std::unique_ptr<Queue> open_journaled(Journal& j, const std::string& dir, const QueueOptions& o) {
  auto q = Queue::open(dir, o);
  if (!q.ok()) {
    j.line("E open: " + q.status().to_string());
    return nullptr;
  }
  return std::move(q).value();
}

// Sends the payloads of `tags` in one batch. Each tag is journaled before the call ("s TAG":
// a process killed inside it may or may not have sent it) and each id after it returned
// ("S ID TAG"), or the error ("E send: ..."); false then.
inline bool send_journaled(Queue& q, Journal& j, const TaggedPayloads& payloads,
                           const std::vector<std::string>& tags) {
  std::vector<std::string> bodies;
  for (const auto& t : tags) {
    bodies.push_back(payloads.make(t));
    j.line("s " + t);
  }
  std::vector<std::string_view> views(bodies.begin(), bodies.end());
  auto ids = q.send_batch(views);
  if (!ids.ok()) {
    j.line("E send: " + ids.status().to_string());
    return false;
  }
  for (size_t i = 0; i < ids->size(); ++i) j.line("S " + std::to_string((*ids)[i]) + " " + tags[i]);
  return true;
}

}  // namespace spool::test
