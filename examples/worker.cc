// spool-worker: a competing consumer. Receives one message at a time, processes it while a
// LeaseKeeper renews its lease, and acks it. Run as many as you like on one queue: each
// message is processed by one of them at a time (at least once overall).
//
//   spool-worker DIR [--count N] [--idle-exit SECONDS] [--work-ms MS] [--out FILE]
//
//   --count N          stop after processing N messages (default: run until a signal)
//   --idle-exit S      stop once no message has arrived for S seconds (default: never)
//   --work-ms MS       pretend each message takes MS milliseconds of work (default 0)
//   --out FILE         append "ID PAYLOAD" per processed message to FILE (one write each,
//                      O_APPEND: several workers may share the file); default stdout
//
// SIGINT / SIGTERM: finish the message in hand, then exit 0. If the worker is killed
// instead, its bound lease returns to ready at once and another worker gets the message.
//
// Build against an installed libspool:
//   c++ -std=c++20 worker.cc $(pkg-config --cflags --libs spool) -o spool-worker
#include <fcntl.h>
#include <signal.h>
#include <spool/lease_keeper.h>
#include <spool/queue.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>

namespace {

volatile std::sig_atomic_t g_stop = 0;

void on_signal(int) { g_stop = 1; }

// The "work": here, recording the message. A real worker resizes the photo, calls the API...
bool process(int out_fd, const spool::Message& m, std::chrono::milliseconds work) {
  if (work.count() > 0) std::this_thread::sleep_for(work);
  std::string line = std::to_string(m.id) + " " + m.payload + "\n";
  return ::write(out_fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(stderr,
                 "usage: %s DIR [--count N] [--idle-exit SECONDS] [--work-ms MS] [--out FILE]\n",
                 argv[0]);
    return 64;
  }
  const std::string dir = argv[1];
  long long count = -1, idle_exit_s = -1, work_ms = 0;
  const char* out_path = nullptr;
  for (int i = 2; i < argc; ++i) {
    std::string_view flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "spool-worker: %s needs a value\n", argv[i]);
      return 64;
    }
    const char* value = argv[++i];
    if (flag == "--count") {
      count = std::atoll(value);
    } else if (flag == "--idle-exit") {
      idle_exit_s = std::atoll(value);
    } else if (flag == "--work-ms") {
      work_ms = std::atoll(value);
    } else if (flag == "--out") {
      out_path = value;
    } else {
      std::fprintf(stderr, "spool-worker: unknown flag %s\n", argv[i - 1]);
      return 64;
    }
  }
  int out_fd = STDOUT_FILENO;
  if (out_path && (out_fd = ::open(out_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) < 0) {
    std::fprintf(stderr, "spool-worker: %s: %s\n", out_path, std::strerror(errno));
    return 1;
  }

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  spool::QueueOptions opts;
  opts.create = false;  // a worker should not invent a queue from a typo'd path
  auto q = spool::Queue::open(dir, opts);
  if (!q.ok()) {
    std::fprintf(stderr, "spool-worker: %s\n", q.status().to_string().c_str());
    return 1;
  }
  spool::Queue& queue = **q;

  // The lease is short (10 s) so that a hung or stopped worker's message comes back soon;
  // the keeper renews it every 3 s while the work runs, for at most 10 minutes.
  const spool::Millis visibility{10000};
  const spool::LeaseKeeper::Options keep{spool::Millis{3000}, visibility, spool::Millis{600000}};

  long long done = 0;
  auto last_message = std::chrono::steady_clock::now();
  while (!g_stop && (count < 0 || done < count)) {
    // Long poll: sleeps until a message is ready (woken at once by any producer) or 1 s
    // passes, so that a signal or --idle-exit is noticed within a second.
    auto msgs = queue.receive(1, visibility, spool::Millis{1000});
    if (!msgs.ok()) {
      if (msgs.status().code() != spool::Code::kEmpty) {
        std::fprintf(stderr, "spool-worker: receive: %s\n", msgs.status().to_string().c_str());
        return 1;
      }
      if (idle_exit_s >= 0 &&
          std::chrono::steady_clock::now() - last_message >= std::chrono::seconds(idle_exit_s)) {
        break;
      }
      continue;
    }
    last_message = std::chrono::steady_clock::now();
    for (const spool::Message& m : *msgs) {
      bool ok;
      spool::Status kept;
      {
        // The keeper renews the lease while we work, and binds it to this process
        // (Queue::bind): if the process dies from here on, the message is ready again at
        // once instead of when the lease runs out.
        spool::LeaseKeeper keeper(queue, m.receipt, keep);
        ok = process(out_fd, m, std::chrono::milliseconds(work_ms));
        keeper.stop();
        kept = keeper.status();
      }
      if (!kept.ok()) {
        // kLeaseLost: another worker has the message now; our result must not be committed.
        std::fprintf(stderr, "spool-worker: message %llu: %s\n",
                     static_cast<unsigned long long>(m.id), kept.to_string().c_str());
        continue;
      }
      spool::Status s = ok ? queue.ack(m.receipt) : queue.nack(m.receipt, spool::Millis{1000});
      if (!s.ok()) {
        std::fprintf(stderr, "spool-worker: message %llu: %s\n",
                     static_cast<unsigned long long>(m.id), s.to_string().c_str());
        continue;
      }
      if (ok) ++done;
    }
  }
  if (out_fd != STDOUT_FILENO) ::close(out_fd);
  std::fprintf(stderr, "spool-worker: processed %lld messages\n", done);
  return 0;
}
