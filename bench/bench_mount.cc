// What the filesystem view costs: messages per second through a spoolfs mount, beside the
// library API on the same machine in the same run, with 100 B payloads.
//
//   send          mount: open(O_CREAT|O_WRONLY), write, close per message; the run ends
//                 when the queue has counted every send (spoolfs sends at RELEASE, after
//                 close() returned). library: Queue::send per message.
//   receive+ack   mount: readdir for the names, then open, read to EOF, close and unlink
//                 per message. library: Queue::receive(1) and Queue::ack per message.
//
// One client thread each time, so the figures are per-worker latency-bound throughput.
// Each figure is the median of --rounds runs of --n messages; the library and the mount
// use two queues of the same settings.
//
// Usage: bench_mount [SPOOLFS] [--n=N] [--rounds=R] [--sync=always|interval|never]
// SPOOLFS defaults to ../fuse/spoolfs or ./spoolfs beside this program. spoolfs runs in the
// foreground as a child (fork/exec) and is unmounted with fusermount3 -u at the end. Files
// go to a fresh directory under /var/tmp (SPOOL_BENCH_DIR overrides), removed at the end.
// Without /dev/fuse or fusermount3 the benchmark is skipped (exit 77) with a message.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "spool/queue.h"

namespace {

namespace fs = std::filesystem;
using spool::Millis;
using spool::Queue;
using spool::QueueOptions;
using spool::SyncPolicy;
using Clock = std::chrono::steady_clock;

constexpr size_t kPayload = 100;
constexpr Millis kVisibility{60000};  // no lease runs out during a run
constexpr auto kMountTimeout = std::chrono::seconds(10);
constexpr auto kDrainTimeout = std::chrono::seconds(60);

struct Args {
  std::string spoolfs;
  size_t n = 5000;
  int rounds = 3;
  SyncPolicy sync = SyncPolicy::kInterval;
  std::string sync_name = "interval";
};

class MountedQueue;
MountedQueue* g_mount = nullptr;  // unmounted by die()
std::string g_root;               // removed by die()

[[noreturn]] void die(const std::string& what);

std::string self_dir() {
  char buf[4096];
  ssize_t len = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  std::string self = len > 0 ? std::string(buf, static_cast<size_t>(len)) : "";
  return self.substr(0, self.find_last_of('/'));
}

// Why FUSE cannot be used here, or "" if it can.
std::string fuse_unavailable() {
  int fd = ::open("/dev/fuse", O_RDWR | O_CLOEXEC);
  if (fd < 0) return std::string("/dev/fuse cannot be opened: ") + std::strerror(errno);
  ::close(fd);
  if (std::system("command -v fusermount3 >/dev/null 2>&1") != 0)
    return "fusermount3 is not installed";
  return "";
}

std::unique_ptr<Queue> open_queue(const std::string& dir, SyncPolicy sync) {
  QueueOptions o;
  o.sync = sync;
  o.visibility = kVisibility;
  auto q = Queue::open(dir, o);
  if (!q.ok()) die("open " + dir + ": " + q.status().to_string());
  return std::move(q).value();
}

double per_second(size_t n, Clock::duration d) {
  return static_cast<double>(n) / std::chrono::duration<double>(d).count();
}

// ------------------------------------------------------------------ the mount

// A spoolfs mount of one queue, run in the foreground as a child; unmounted and reaped by
// the destructor.
class MountedQueue {
 public:
  MountedQueue(const std::string& spoolfs, const std::string& queue, const std::string& mnt)
      : mnt_(mnt) {
    g_mount = this;
    fs::create_directory(mnt);
    fs::permissions(mnt, fs::perms::owner_all);
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) die("fork: " + std::string(std::strerror(errno)));
    if (pid_ == 0) {
      ::execl(spoolfs.c_str(), spoolfs.c_str(), queue.c_str(), mnt.c_str(), "-f", "-o",
              ("visibility=" + std::to_string(kVisibility.count()) + "ms").c_str(), nullptr);
      std::fprintf(stderr, "bench_mount: exec %s: %s\n", spoolfs.c_str(), std::strerror(errno));
      ::_exit(127);
    }
    wait_mounted();
  }

  ~MountedQueue() { unmount(); }

  void unmount() {
    g_mount = nullptr;
    if (pid_ < 0) return;
    std::string cmd =
        "fusermount3 -u '" + mnt_ + "' 2>/dev/null || fusermount3 -u -z '" + mnt_ + "'";
    if (std::system(cmd.c_str()) != 0)
      std::fprintf(stderr, "bench_mount: could not unmount %s\n", mnt_.c_str());
    // spoolfs exits when unmounted; SIGTERM (which also unmounts) if it lingers.
    auto deadline = Clock::now() + std::chrono::seconds(5);
    while (::waitpid(pid_, nullptr, WNOHANG) != pid_) {
      if (Clock::now() > deadline) {
        ::kill(pid_, SIGTERM);
        ::waitpid(pid_, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    pid_ = -1;
  }

 private:
  // Mounted when the mount point is on another device than its parent.
  bool mounted() const {
    struct stat m {
    }, p{};
    return ::stat(mnt_.c_str(), &m) == 0 && ::stat((mnt_ + "/..").c_str(), &p) == 0 &&
           m.st_dev != p.st_dev;
  }

  void wait_mounted() {
    auto deadline = Clock::now() + kMountTimeout;
    while (!mounted()) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        die("spoolfs exited before mounting (see above)");
      }
      if (Clock::now() > deadline) die(mnt_ + " not mounted after 10 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  std::string mnt_;
  pid_t pid_ = -1;
};

void die(const std::string& what) {
  std::fprintf(stderr, "bench_mount: %s\n", what.c_str());
  if (g_mount) g_mount->unmount();
  std::error_code ec;
  if (!g_root.empty()) fs::remove_all(g_root, ec);
  std::exit(1);
}

void write_file(const std::string& path, const std::string& data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) die("create " + path + ": " + std::strerror(errno));
  if (::write(fd, data.data(), data.size()) != static_cast<ssize_t>(data.size()))
    die("write " + path + ": " + std::strerror(errno));
  if (::close(fd) != 0) die("close " + path + ": " + std::strerror(errno));
}

// Reads a message file to EOF; false if it cannot be opened (taken or gone).
bool read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[4096];
  while (::read(fd, buf, sizeof buf) > 0) {
  }
  ::close(fd);
  return true;
}

// The message files listed in `dir` (all-digit names).
std::vector<std::string> list_messages(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (!d) die("opendir " + dir + ": " + std::strerror(errno));
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] >= '1' && e->d_name[0] <= '9') names.emplace_back(e->d_name);
  }
  ::closedir(d);
  return names;
}

uint64_t sent_total(Queue& q) {
  auto st = q.stats();
  if (!st.ok()) die("stats: " + st.status().to_string());
  return st->sent_total;
}

// Sends n files through the mount; the time runs until the queue (`q`, the mounted queue
// opened by this process too) has counted them all.
Clock::duration mount_send(const std::string& mnt, Queue& q, size_t n) {
  const std::string payload(kPayload, 'm');
  uint64_t want = sent_total(q) + n;
  auto t0 = Clock::now();
  for (size_t i = 0; i < n; ++i) write_file(mnt + "/m" + std::to_string(i), payload);
  auto deadline = t0 + kDrainTimeout;
  while (sent_total(q) < want) {
    if (Clock::now() > deadline) die("the mount did not send every message in 60 s");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return Clock::now() - t0;
}

// Receives and acks n messages through the mount, listing as needed.
Clock::duration mount_receive(const std::string& mnt, size_t n) {
  size_t done = 0;
  auto t0 = Clock::now();
  while (done < n) {
    if (Clock::now() - t0 > kDrainTimeout)
      die("could not receive every message through the mount in 60 s");
    for (const std::string& name : list_messages(mnt)) {
      std::string path = mnt + "/" + name;
      if (!read_file(path)) continue;
      if (::unlink(path.c_str()) != 0) die("unlink " + path + ": " + std::strerror(errno));
      ++done;
    }
  }
  return Clock::now() - t0;
}

// ------------------------------------------------------------------ the library

Clock::duration library_send(Queue& q, size_t n) {
  const std::string payload(kPayload, 'l');
  auto t0 = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    if (auto id = q.send(payload); !id.ok()) die("send: " + id.status().to_string());
  }
  return Clock::now() - t0;
}

Clock::duration library_receive(Queue& q, size_t n) {
  auto t0 = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    auto msgs = q.receive(1, kVisibility);
    if (!msgs.ok()) die("receive: " + msgs.status().to_string());
    if (auto s = q.ack((*msgs)[0].receipt); !s.ok()) die("ack: " + s.to_string());
  }
  return Clock::now() - t0;
}

// ------------------------------------------------------------------ main

double median_rate(size_t n, int rounds, const std::function<Clock::duration()>& run) {
  std::vector<double> rates;
  for (int r = 0; r < rounds; ++r) rates.push_back(per_second(n, run()));
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

void print_row(const char* what, double lib, double mnt) {
  std::printf("%-14s %14.0f %14.0f %12.3f %12.1f\n", what, lib, mnt, mnt / lib, 1e6 / mnt);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s.starts_with("--n=")) {
      a.n = std::strtoul(s.c_str() + 4, nullptr, 10);
    } else if (s.starts_with("--rounds=")) {
      a.rounds = std::atoi(s.c_str() + 9);
    } else if (s.starts_with("--sync=")) {
      a.sync_name = s.substr(7);
      if (a.sync_name == "always")
        a.sync = SyncPolicy::kAlways;
      else if (a.sync_name == "interval")
        a.sync = SyncPolicy::kInterval;
      else if (a.sync_name == "never")
        a.sync = SyncPolicy::kNever;
      else
        die("--sync: always, interval or never");
    } else if (!s.starts_with("-") && a.spoolfs.empty()) {
      a.spoolfs = s;
    } else {
      std::fprintf(stderr,
                   "usage: %s [SPOOLFS] [--n=N] [--rounds=R] [--sync=always|interval|never]\n",
                   argv[0]);
      std::exit(2);
    }
  }
  if (a.n == 0 || a.rounds < 1) die("--n and --rounds must be positive");
  if (a.spoolfs.empty()) {
    std::string here = self_dir();
    for (const std::string& c : {here + "/../fuse/spoolfs", here + "/spoolfs"}) {
      if (::access(c.c_str(), X_OK) == 0) a.spoolfs = c;
    }
    if (a.spoolfs.empty()) die("spoolfs not found beside " + here + "; pass its path");
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  if (std::string why = fuse_unavailable(); !why.empty()) {
    std::printf(
        "\n*** bench_mount SKIPPED: %s. Mount benchmarks need /dev/fuse and fusermount3\n"
        "*** (docker: --device /dev/fuse --cap-add SYS_ADMIN). No figures were taken. ***\n\n",
        why.c_str());
    return 77;
  }
  const char* base = std::getenv("SPOOL_BENCH_DIR");
  std::string tmpl = std::string(base ? base : "/var/tmp") + "/spool-bench-mount-XXXXXX";
  if (!::mkdtemp(tmpl.data())) die("mkdtemp " + tmpl + ": " + std::strerror(errno));
  const std::string root = tmpl;
  g_root = root;

  // Both queues are created before spoolfs is forked: no Queue is used across the fork
  // (the child only execs).
  auto lib = open_queue(root + "/lib", a.sync);
  auto fsq = open_queue(root + "/fs", a.sync);
  double lib_send, lib_recv, mnt_send, mnt_recv;
  {
    MountedQueue mount(a.spoolfs, root + "/fs", root + "/mnt");
    const std::string mnt = root + "/mnt";
    lib_send = median_rate(a.n, a.rounds, [&] {
      auto d = library_send(*lib, a.n);
      library_receive(*lib, a.n);  // drain for the next round (timed apart below)
      return d;
    });
    lib_recv = median_rate(a.n, a.rounds, [&] {
      library_send(*lib, a.n);
      return library_receive(*lib, a.n);
    });
    mnt_send = median_rate(a.n, a.rounds, [&] {
      auto d = mount_send(mnt, *fsq, a.n);
      mount_receive(mnt, a.n);
      return d;
    });
    mnt_recv = median_rate(a.n, a.rounds, [&] {
      library_send(*fsq, a.n);
      return mount_receive(mnt, a.n);
    });
  }
  lib.reset();
  fsq.reset();
  std::error_code ec;
  fs::remove_all(root, ec);

  std::printf(
      "spoolfs mount vs library API: %zu B payloads, %zu messages per run, median of %d runs,\n"
      "one client thread, sync=%s, %u hardware threads\n\n",
      kPayload, a.n, a.rounds, a.sync_name.c_str(), std::thread::hardware_concurrency());
  std::printf("%-14s %14s %14s %12s %12s\n", "operation", "library msg/s", "mount msg/s",
              "mount/lib", "mount us/msg");
  print_row("send", lib_send, mnt_send);
  print_row("receive+ack", lib_recv, mnt_recv);
  return 0;
}
