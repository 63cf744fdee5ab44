// The cases, run the same way for every system (see harness.h and docs/performance.md).
//
// produce        1 producer process sends n messages, one call each; msgs/s = n / (start ..
//                last send returned); p50/p99 = duration of one send call.
// produce_batch  the same with the system's native batching, `batch` messages per call;
//                p50/p99 = duration of one batch call.
// produce_mp     `producers` processes send n messages between them (n / producers each);
//                msgs/s = n / (start .. the last producer's last send); p50/p99 per send.
//                With --gap-us=G, each producer pauses a random time (exponential, mean G
//                us, not timed) before each send: callers arriving at random rather than
//                back to back, which is what the group commit's gather costs latency for.
// e2e_1c/e2e_2c  1 producer + 1 or 2 consumer processes, all started together; consumers
//                receive one message with a 60 s lease and ack it; msgs/s = n / (start ..
//                the n-th ack). No p50/p99 (null): the queue builds a backlog by design.
// latency        a consumer blocked in a long poll (5 s); the producer sleeps 1.0-1.5 ms
//                after the consumer said it is about to block, then sends one message whose
//                first 8 bytes are CLOCK_MONOTONIC; the consumer takes the difference when its
//                receive returns, then acks. `samples` round trips after `warmup`.
#include "harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../bench_util.h"

namespace cmp {

using spool::bench::pct_us;
using spool::bench::StartGate;
using spool::bench::wait_all;

uint64_t mono_ns() { return spool::bench::mono_ns(); }

void fail(const std::string& what) {
  std::fprintf(stderr, "compare[%d]: %s\n", ::getpid(), what.c_str());
  std::fflush(stderr);
  ::_exit(2);
}

namespace {

constexpr uint64_t kStallNs = 60'000'000'000ull;  // a consumer with no message for this long fails
constexpr int kSliceMs = 50;                      // e2e consumers' long-poll slice

struct Shared {
  std::atomic<uint64_t> ready;     // children past connect()
  std::atomic<uint64_t> acked;     // e2e: acks so far
  std::atomic<uint64_t> drained;   // drainer: messages taken
  std::atomic<uint64_t> t_end;     // e2e: CLOCK_MONOTONIC of the n-th ack
  std::atomic<uint64_t> prod_end;  // latest end of a producer
  std::atomic<uint64_t> timeouts;  // latency: receives that came back empty
};

Shared* g_sh = nullptr;
uint64_t* g_samples = nullptr;  // after Shared in the mapping: ns per call (produce) or per round trip (latency)
size_t g_sh_size = 0;

pid_t spawn(const std::function<int()>& body) {
  return spool::bench::spawn([&] {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    return body();
  });
}

std::string make_payload(size_t size) { return spool::bench::make_payload(std::max<size_t>(size, 8), 0); }

void usage(const char* system) {
  std::fprintf(stderr,
               "usage: cmp_%s --case=produce|produce_batch|produce_mp|e2e_1c|e2e_2c|latency\n"
               "       [--sync=LEVEL] [--size=BYTES] [--n=MSGS] [--samples=N] [--warmup=N] [--batch=N]\n"
               "       [--producers=N] [--gap-us=US] [--dir=DIR] [--port=PORT] [--poll-us=US] [--tag=NAME]\n"
               "Prints one JSON line. Servers (beanstalkd, redis) must already run on 127.0.0.1:PORT.\n",
               system);
}

bool parse(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto eq = s.find('=');
    if (s.rfind("--", 0) != 0 || eq == std::string::npos) return false;
    std::string k = s.substr(2, eq - 2), v = s.substr(eq + 1);
    if (k == "case") a.kase = v;
    else if (k == "sync") a.sync = v;
    else if (k == "dir") a.dir = v;
    else if (k == "host") a.host = v;
    else if (k == "port") a.port = std::atoi(v.c_str());
    else if (k == "size") a.size = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "n") a.n = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "samples") a.samples = std::atoi(v.c_str());
    else if (k == "warmup") a.warmup = std::atoi(v.c_str());
    else if (k == "batch") a.batch = std::atoi(v.c_str());
    else if (k == "producers") a.producers = std::atoi(v.c_str());
    else if (k == "poll-us") a.poll_us = std::atoi(v.c_str());
    else if (k == "gap-us") a.gap_us = std::atoi(v.c_str());
    else if (k == "tag") a.tag = v;
    else return false;
  }
  return a.size >= 8 && a.n > 0 && a.samples > 0 && a.batch > 0 && a.producers > 0 && a.gap_us >= 0;
}

struct Outcome {
  bool ok = false;
  uint64_t elapsed_ns = 0;  // start .. end as the case defines it
  uint64_t count = 0;       // messages timed
  std::vector<uint64_t> lat;  // ns samples for p50/p99 (empty: null)
};

// One producer child: sends `count` messages (in batches of `batch` when batched), records
// each call's duration at samples[first ..].
pid_t producer(System& sys, const Args& a, StartGate& gate, uint64_t count, size_t first, bool batched) {
  return spawn([&, count, first, batched] {
    auto c = sys.connect(a);
    std::string payload = make_payload(a.size);
    std::vector<std::string> bufs(static_cast<size_t>(a.batch), payload);
    std::vector<std::string_view> views(bufs.begin(), bufs.end());
    gate.child_wait();
    if (batched) {
      size_t call = 0;
      for (uint64_t sent = 0; sent < count; ++call) {
        size_t k = static_cast<size_t>(std::min<uint64_t>(static_cast<uint64_t>(a.batch), count - sent));
        uint64_t t = mono_ns();
        for (size_t j = 0; j < k; ++j) std::memcpy(bufs[j].data(), &t, sizeof t);
        c->send_batch(std::span<const std::string_view>(views.data(), k));
        g_samples[first + call] = mono_ns() - t;
        sent += k;
      }
    } else {
      uint64_t rnd = 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(::getpid());
      for (uint64_t i = 0; i < count; ++i) {
        if (a.gap_us > 0) {
          rnd ^= rnd << 13;
          rnd ^= rnd >> 7;
          rnd ^= rnd << 17;
          double u = (static_cast<double>(rnd >> 11) + 1.0) / 9007199254740993.0;  // (0, 1]
          ::usleep(static_cast<useconds_t>(-std::log(u) * a.gap_us));
        }
        uint64_t t = mono_ns();
        std::memcpy(payload.data(), &t, sizeof t);
        c->send(payload);
        g_samples[first + i] = mono_ns() - t;
      }
    }
    uint64_t end = mono_ns(), prev = g_sh->prod_end.load();
    while (prev < end && !g_sh->prod_end.compare_exchange_weak(prev, end)) {
    }
    return 0;
  });
}

// A consumer (ack = true) or drainer child: takes messages until `n` have been handled.
pid_t consumer(System& sys, const Args& a, StartGate& gate, uint64_t n, bool ack) {
  return spawn([&, n, ack] {
    auto c = sys.connect(a);
    gate.child_wait();
    std::string payload;
    Handle h;
    std::atomic<uint64_t>& done = ack ? g_sh->acked : g_sh->drained;
    uint64_t last = mono_ns();
    while (done.load(std::memory_order_relaxed) < n) {
      if (!c->receive(payload, h, kSliceMs)) {
        if (mono_ns() - last > kStallNs) fail("no message for 60 s (producer gone?)");
        continue;
      }
      last = mono_ns();
      if (ack) c->ack(h);
      if (done.fetch_add(1) + 1 == n) g_sh->t_end = mono_ns();
    }
    return 0;
  });
}

Outcome run_produce(System& sys, const Args& a, bool batched, int nprod) {
  Outcome o;
  StartGate gate(g_sh->ready);
  std::vector<pid_t> pids;
  uint64_t per = a.n / static_cast<uint64_t>(nprod);
  o.count = per * static_cast<uint64_t>(nprod);
  size_t calls = batched ? static_cast<size_t>((per + static_cast<uint64_t>(a.batch) - 1) / static_cast<uint64_t>(a.batch))
                         : static_cast<size_t>(per);
  for (int i = 0; i < nprod; ++i) pids.push_back(producer(sys, a, gate, per, static_cast<size_t>(i) * calls, batched));
  if (sys.produce_needs_drainer()) pids.push_back(consumer(sys, a, gate, o.count, false));
  uint64_t t0 = gate.release(pids, nullptr);
  o.ok = t0 != 0 && wait_all(pids, nullptr);
  if (!o.ok) return o;
  o.elapsed_ns = g_sh->prod_end.load() - t0;
  o.lat.assign(g_samples, g_samples + calls * static_cast<size_t>(nprod));
  return o;
}

Outcome run_e2e(System& sys, const Args& a, int consumers) {
  Outcome o;
  StartGate gate(g_sh->ready);
  std::vector<pid_t> pids;
  o.count = a.n;
  pids.push_back(producer(sys, a, gate, a.n, 0, false));
  for (int i = 0; i < consumers; ++i) pids.push_back(consumer(sys, a, gate, a.n, true));
  uint64_t t0 = gate.release(pids, nullptr);
  o.ok = t0 != 0 && wait_all(pids, nullptr);
  if (!o.ok) return o;
  o.elapsed_ns = g_sh->t_end.load() - t0;
  return o;
}

Outcome run_latency(System& sys, const Args& a) {
  Outcome o;
  int turn[2];  // consumer -> producer: "about to block in receive"
  if (::pipe2(turn, O_CLOEXEC) != 0) fail("pipe");
  const int total = a.warmup + a.samples;
  StartGate gate(g_sh->ready);
  std::vector<pid_t> pids;
  pids.push_back(spawn([&] {  // consumer
    ::close(turn[0]);
    auto c = sys.connect(a);
    gate.child_wait();
    std::string payload;
    Handle h;
    for (int i = 0; i < total; ++i) {
      char ch = 1;
      if (::write(turn[1], &ch, 1) != 1) return 3;
      bool got = c->receive(payload, h, 5000);
      uint64_t t = mono_ns();
      if (!got) {
        g_sh->timeouts.fetch_add(1);
        continue;
      }
      uint64_t ts = 0;
      std::memcpy(&ts, payload.data(), sizeof ts);
      if (i >= a.warmup) g_samples[i - a.warmup] = t - ts;
      c->ack(h);
    }
    return 0;
  }));
  pids.push_back(spawn([&] {  // producer
    ::close(turn[1]);
    auto c = sys.connect(a);
    std::string payload = make_payload(a.size);
    gate.child_wait();
    uint64_t rnd = 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(::getpid());
    for (int i = 0; i < total; ++i) {
      char ch;
      if (::read(turn[0], &ch, 1) != 1) return 3;
      rnd ^= rnd << 13;
      rnd ^= rnd >> 7;
      rnd ^= rnd << 17;
      ::usleep(1000 + static_cast<useconds_t>(rnd % 500));
      uint64_t ts = mono_ns();
      std::memcpy(payload.data(), &ts, sizeof ts);
      c->send(payload);
    }
    return 0;
  }));
  ::close(turn[0]);
  ::close(turn[1]);
  uint64_t t0 = gate.release(pids, nullptr);
  o.ok = t0 != 0 && wait_all(pids, nullptr);
  if (!o.ok) return o;
  o.elapsed_ns = mono_ns() - t0;
  o.count = static_cast<uint64_t>(a.samples);
  o.lat.assign(g_samples, g_samples + a.samples);
  if (g_sh->timeouts.load() > 0) o.ok = false;
  return o;
}

std::string num(double v, const char* fmt) {
  if (std::isnan(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

}  // namespace

bool in_child(const std::function<int()>& body) { return wait_all({spawn(body)}, nullptr); }

int run(int argc, char** argv, const char* system, System& sys) {
  spool::bench::g_fail = [](const char* what) { fail(what); };
  Args a;
  if (!parse(argc, argv, a)) {
    usage(system);
    return 64;
  }
  if (a.tag.empty()) a.tag = std::string("cmp-") + std::to_string(::getpid());
  size_t slots = std::max<size_t>(static_cast<size_t>(a.n), static_cast<size_t>(a.samples)) + 16;
  g_sh_size = sizeof(Shared) + slots * sizeof(uint64_t);
  g_sh = spool::bench::map_shared<Shared>(slots * sizeof(uint64_t));
  g_samples = reinterpret_cast<uint64_t*>(g_sh + 1);

  const std::string& k = a.kase;
  if ((k == "produce_batch" && !sys.has_batch())) {
    std::fprintf(stderr, "cmp_%s: no native batching; case skipped\n", system);
    return 0;
  }
  sys.prepare(a);
  Outcome o;
  if (k == "produce") o = run_produce(sys, a, false, 1);
  else if (k == "produce_batch") o = run_produce(sys, a, true, 1);
  else if (k == "produce_mp") o = run_produce(sys, a, false, a.producers);
  else if (k == "e2e_1c") o = run_e2e(sys, a, 1);
  else if (k == "e2e_2c") o = run_e2e(sys, a, 2);
  else if (k == "latency") o = run_latency(sys, a);
  else {
    usage(system);
    sys.cleanup(a);
    return 64;
  }
  uint64_t want_left = k.rfind("produce", 0) == 0 && !sys.produce_needs_drainer() ? o.count : 0;
  std::string check = o.ok ? sys.check(a, want_left) : "FAILED";
  if (!o.ok && k == "latency" && g_sh->timeouts.load() > 0) check = "FAILED: receive timed out";
  sys.cleanup(a);

  double rate = NAN, p50 = NAN, p99 = NAN;
  if (o.ok && k != "latency" && o.elapsed_ns > 0) rate = static_cast<double>(o.count) * 1e9 / static_cast<double>(o.elapsed_ns);
  if (o.ok && !o.lat.empty()) {
    p50 = pct_us(o.lat, 0.50);
    p99 = pct_us(o.lat, 0.99);
  }
  std::string kase = k == "produce_mp" ? "produce_" + std::to_string(a.producers) + "p" : k;
  std::printf(
      "{\"system\": \"%s\", \"case\": \"%s\", \"sync\": \"%s\", \"size\": %zu, \"msgs_per_s\": %s, "
      "\"p50_us\": %s, \"p99_us\": %s, \"n\": %" PRIu64 ", \"seconds\": %s, \"check\": \"%s\"}\n",
      system, kase.c_str(), a.sync.c_str(), a.size, num(rate, "%.0f").c_str(), num(p50, "%.1f").c_str(),
      num(p99, "%.1f").c_str(), o.count, num(static_cast<double>(o.elapsed_ns) / 1e9, "%.3f").c_str(),
      check.c_str());
  std::fflush(stdout);
  ::munmap(g_sh, g_sh_size);
  return o.ok && check == "ok" ? 0 : 1;
}

}  // namespace cmp
