// bench_footprint: memory and threads of a spool worker, for edge devices (docs/footprint.md).
//
//   bench_footprint [--messages N] [--size BYTES] [--idle-seconds S] [--segment-size BYTES] [DIR]
//
// Runs each role as a fresh process (fork + exec of itself: a forked child's RSS would
// not count the pages it shares with the parent until it touches them) and reads its
// /proc/PID/status (VmRSS, VmHWM, RssAnon, RssFile, Threads) and /proc/PID/task/*/comm from
// the parent, so the measuring code costs the measured process nothing:
//   1. baseline: the worker process before it opens a queue (the C++ runtime, libspool
//      loaded);
//   2. idle worker: it opened the queue and blocks in receive(wait = 60 s); sampled after S
//      seconds of that (default 5), with the CPU time it used while idle;
//   3. loaded worker: a receive(16) + ack loop over N messages (default 200000 of 100 bytes)
//      while a producer process sends them in batches of 100; sampled every 20 ms (the
//      highest thread count and its thread names are kept) and once more when done;
//   4. the producer, sampled when it has sent everything.
// The queue is created in DIR (default: a new directory under /tmp, removed at the end) with
// default options except --segment-size (default 64 MiB, the library's; pass a small one to
// see the compactor thread start after a roll).
//
// It links the shared libspool.so (public API only), as an application would.
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <spool/queue.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench_util.h"

namespace {

struct Sample {
  long rss_kb = 0, hwm_kb = 0, anon_kb = 0, file_kb = 0, shmem_kb = 0, threads = 0;
  long cpu_ticks = 0;                 // utime + stime
  std::map<std::string, int> names;  // thread comm -> how many
};

Sample sample(pid_t pid) {
  Sample s;
  auto st = spool::bench::proc_status(pid);
  s.rss_kb = st["VmRSS"];
  s.hwm_kb = st["VmHWM"];
  s.anon_kb = st["RssAnon"];
  s.file_kb = st["RssFile"];
  s.shmem_kb = st["RssShmem"];
  s.threads = st["Threads"];
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  if (auto p = all.rfind(')'); p != std::string::npos) {
    // fields after "pid (comm)": state is field 3; utime and stime are fields 14 and 15
    std::vector<std::string> f;
    size_t i = p + 2;
    while (i < all.size()) {
      size_t j = all.find(' ', i);
      if (j == std::string::npos) j = all.size();
      f.push_back(all.substr(i, j - i));
      i = j + 1;
    }
    if (f.size() > 13) s.cpu_ticks = std::atol(f[11].c_str()) + std::atol(f[12].c_str());
  }
  std::string task = "/proc/" + std::to_string(pid) + "/task";
  if (DIR* d = ::opendir(task.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream comm(task + "/" + e->d_name + "/comm");
      std::string name;
      std::getline(comm, name);
      // io_uring's kernel workers are "iou-wrk-<tid>", its SQ threads "iou-sqp-<tid>": one
      // kind each, whatever the tid.
      if (name.rfind("iou-", 0) == 0) name = name.substr(0, 8) + "*";
      ++s.names[name];
    }
    ::closedir(d);
  }
  return s;
}

std::string names(const Sample& s) {
  std::string out;
  for (auto& [name, n] : s.names) {
    if (!out.empty()) out += ", ";
    out += name + (n > 1 ? " x" + std::to_string(n) : "");
  }
  return out;
}

void print(const char* what, const Sample& s) {
  std::printf("%-42s %7.1f %7.1f %7.1f %7.1f %7.1f %7ld   %s\n", what, s.rss_kb / 1024.0,
              s.hwm_kb / 1024.0, s.anon_kb / 1024.0, s.file_kb / 1024.0, s.shmem_kb / 1024.0,
              s.threads, names(s).c_str());
}

// A byte over a pipe: the parent and its children step each other through the phases.
void put(int fd, char c) {
  if (::write(fd, &c, 1) != 1) std::_Exit(3);
}
char get(int fd) {
  char c = 0;
  if (::read(fd, &c, 1) != 1) std::_Exit(3);
  return c;
}

[[noreturn]] void die(const char* what, const spool::Status& s) {
  std::fprintf(stderr, "bench_footprint: %s: %s\n", what, s.to_string().c_str());
  std::_Exit(1);
}

struct Config {
  uint64_t messages = 200000, size = 100, segment_size = 64ull << 20;
  int idle_seconds = 5;
  std::string dir;
  spool::QueueOptions opts() const {
    spool::QueueOptions o;
    o.segment_size = segment_size;
    return o;
  }
};

// The roles, each in a process of its own. `in` and `out` are the pipe ends to the parent.
[[noreturn]] void idle_role(const Config& c, int in, int out) {
  put(out, 'b');  // baseline: sampled now
  get(in);
  auto q = spool::Queue::open(c.dir, c.opts());
  if (!q.ok()) die("open", q.status());
  put(out, 'r');
  auto r = (*q)->receive(1, spool::Millis{30000}, spool::Millis{60000});  // queue empty: blocks
  std::_Exit(r.ok() ? 2 : 0);
}

[[noreturn]] void worker_role(const Config& c, int in, int out) {
  auto q = spool::Queue::open(c.dir, c.opts());
  if (!q.ok()) die("open", q.status());
  put(out, 'r');
  uint64_t done = 0;
  while (done < c.messages) {
    auto msgs = (*q)->receive(16, spool::Millis{30000}, spool::Millis{1000});
    if (!msgs.ok()) {
      if (msgs.status().code() == spool::Code::kEmpty) continue;
      die("receive", msgs.status());
    }
    for (auto& m : *msgs) {
      if (spool::Status s = (*q)->ack(m.receipt); !s.ok()) die("ack", s);
      ++done;
    }
  }
  put(out, 'd');
  get(in);  // stay alive, the queue open, until sampled
  std::_Exit(0);
}

[[noreturn]] void producer_role(const Config& c, int in, int out) {
  auto q = spool::Queue::open(c.dir, c.opts());
  if (!q.ok()) die("open", q.status());
  std::string payload(c.size, 'x');
  std::vector<std::string_view> batch(100, payload);
  for (uint64_t sent = 0; sent < c.messages; sent += batch.size()) {
    size_t n = std::min<uint64_t>(batch.size(), c.messages - sent);
    auto ids = (*q)->send_batch(std::span<const std::string_view>(batch.data(), n));
    if (!ids.ok()) die("send", ids.status());
  }
  put(out, 'd');
  get(in);
  std::_Exit(0);
}

struct Child {
  pid_t pid = -1;
  int in = -1, out = -1;  // the parent's ends: read `in`, write `out`
};

// fork + exec of this program with --role, the pipe descriptors inherited.
Child spawn(const char* role, const Config& c) {
  int up[2], down[2];
  if (::pipe(up) || ::pipe(down)) std::_Exit(1);
  // exec the real path, not /proc/self/exe, so that the threads' comm is bench_footprint
  std::error_code ec;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(up[0]);
    ::close(down[1]);
    std::vector<std::string> args = {"bench_footprint", "--role", role,
                                     "--fds", std::to_string(down[0]) + "," + std::to_string(up[1]),
                                     "--messages", std::to_string(c.messages),
                                     "--size", std::to_string(c.size),
                                     "--segment-size", std::to_string(c.segment_size), c.dir};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(self.c_str(), argv.data());
    std::_Exit(127);
  }
  ::close(up[1]);
  ::close(down[0]);
  return {pid, up[0], down[1]};
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  std::string role;
  int role_in = -1, role_out = -1;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_footprint: %s needs a value\n", argv[i]);
        std::exit(64);
      }
      return argv[++i];
    };
    if (a == "--messages") c.messages = std::strtoull(next(), nullptr, 10);
    else if (a == "--size") c.size = std::strtoull(next(), nullptr, 10);
    else if (a == "--idle-seconds") c.idle_seconds = std::atoi(next());
    else if (a == "--segment-size") c.segment_size = std::strtoull(next(), nullptr, 10);
    else if (a == "--role") role = next();
    else if (a == "--fds") std::sscanf(next(), "%d,%d", &role_in, &role_out);
    else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr,
                   "usage: bench_footprint [--messages N] [--size BYTES] [--idle-seconds S] "
                   "[--segment-size BYTES] [DIR]\n");
      return 64;
    } else c.dir = std::string(a);
  }
  if (role == "idle") idle_role(c, role_in, role_out);
  if (role == "worker") worker_role(c, role_in, role_out);
  if (role == "producer") producer_role(c, role_in, role_out);

  bool own_dir = c.dir.empty();
  if (own_dir) {
    char tmpl[] = "/tmp/spool-footprint.XXXXXX";
    if (!::mkdtemp(tmpl)) return 1;
    c.dir = std::string(tmpl) + "/q";
  }
  {
    auto q = spool::Queue::open(c.dir, c.opts());  // create it here; nothing of it stays open
    if (!q.ok()) die("open", q.status());
  }
  const long tick = ::sysconf(_SC_CLK_TCK);
  std::printf("queue %s, segment size %llu, %llu messages of %llu bytes\n", c.dir.c_str(),
              static_cast<unsigned long long>(c.segment_size),
              static_cast<unsigned long long>(c.messages), static_cast<unsigned long long>(c.size));
  std::printf("%-42s %7s %7s %7s %7s %7s %7s   %s\n", "process (MiB)", "VmRSS", "VmHWM", "RssAnon",
              "RssFile", "RssShm", "threads", "thread names");

  // ---- baseline and idle worker
  Child idle = spawn("idle", c);
  get(idle.in);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  print("worker before Queue::open (baseline)", sample(idle.pid));
  put(idle.out, 'g');
  get(idle.in);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Sample before = sample(idle.pid);
  std::this_thread::sleep_for(std::chrono::seconds(c.idle_seconds));
  Sample idle_s = sample(idle.pid);
  char label[96];
  std::snprintf(label, sizeof label, "idle worker (in receive, %d s)", c.idle_seconds);
  print(label, idle_s);
  std::printf("  idle worker CPU: %.0f ms in %d s\n",
              (idle_s.cpu_ticks - before.cpu_ticks) * 1000.0 / static_cast<double>(tick),
              c.idle_seconds);
  ::kill(idle.pid, SIGKILL);
  ::waitpid(idle.pid, nullptr, 0);

  // ---- loaded worker and producer
  auto t0 = std::chrono::steady_clock::now();
  Child worker = spawn("worker", c);
  get(worker.in);
  Child producer = spawn("producer", c);
  // Sample the worker while it runs: keep the sample with the most threads.
  Sample busiest, producer_s;
  bool producer_done = false;
  for (;;) {
    pollfd fds[2] = {{worker.in, POLLIN, 0}, {producer.in, POLLIN, 0}};
    int n = ::poll(fds, producer_done ? 1 : 2, 20);
    Sample s = sample(worker.pid);
    if (s.threads >= busiest.threads) busiest = s;
    if (n > 0 && !producer_done && (fds[1].revents & POLLIN)) {
      get(producer.in);
      producer_s = sample(producer.pid);
      producer_done = true;
      put(producer.out, 'x');
    }
    if (n > 0 && (fds[0].revents & POLLIN)) {
      get(worker.in);
      break;
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  print("loaded worker (receive+ack, at the end)", sample(worker.pid));
  print("loaded worker (sample with most threads)", busiest);
  if (!producer_done) {
    get(producer.in);
    producer_s = sample(producer.pid);
    put(producer.out, 'x');
  }
  print("producer (send_batch of 100, at the end)", producer_s);
  std::printf("  %llu messages in %.2f s (%.0f msg/s end to end)\n",
              static_cast<unsigned long long>(c.messages), secs, c.messages / secs);
  put(worker.out, 'x');
  ::waitpid(worker.pid, nullptr, 0);
  ::waitpid(producer.pid, nullptr, 0);
  {
    auto q = spool::Queue::open(c.dir, c.opts());
    if (q.ok()) {
      if (auto st = (*q)->stats(); st.ok()) {
        std::printf("  queue after: ready %llu, acked %llu, %llu segment(s), %.1f MiB on disk\n",
                    static_cast<unsigned long long>(st->ready),
                    static_cast<unsigned long long>(st->acked_total),
                    static_cast<unsigned long long>(st->segments), st->bytes_on_disk / 1048576.0);
      }
    }
  }
  if (own_dir) std::filesystem::remove_all(std::filesystem::path(c.dir).parent_path());
  return 0;
}
