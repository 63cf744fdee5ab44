// spool through its public API (include/spool/queue.h): send / send_batch, receive(1, 60 s,
// wait) / ack. --sync=always|interval|never is QueueOptions::sync (interval: the default
// 50 ms). The queue lives in DIR/TAG and is removed afterwards. With SPOOL_IO=io_uring in the
// environment the library uses its io_uring backend, and the runs are labelled spool-uring.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "harness.h"
#include "spool/queue.h"

namespace {

using spool::Millis;

constexpr Millis kLease{60000};

spool::QueueOptions options(const cmp::Args& a) {
  spool::QueueOptions o;
  o.visibility = kLease;
  if (a.sync == "always") o.sync = spool::SyncPolicy::kAlways;
  else if (a.sync == "interval") o.sync = spool::SyncPolicy::kInterval;
  else if (a.sync == "never") o.sync = spool::SyncPolicy::kNever;
  else cmp::fail("spool: --sync must be always, interval or never");
  return o;
}

std::string qdir(const cmp::Args& a) { return a.dir + "/" + a.tag; }

std::unique_ptr<spool::Queue> open(const cmp::Args& a) {
  auto q = spool::Queue::open(qdir(a), options(a));
  if (!q.ok()) cmp::fail("open " + qdir(a) + ": " + q.status().to_string());
  return std::move(q).value();
}

class SpoolClient : public cmp::Client {
 public:
  explicit SpoolClient(const cmp::Args& a) : q_(open(a)) {}
  void send(std::string_view p) override {
    auto r = q_->send(p);
    if (!r.ok()) cmp::fail("send: " + r.status().to_string());
  }
  void send_batch(std::span<const std::string_view> ps) override {
    auto r = q_->send_batch(ps);
    if (!r.ok()) cmp::fail("send_batch: " + r.status().to_string());
  }
  bool receive(std::string& payload, cmp::Handle& h, int wait_ms) override {
    auto r = q_->receive(1, kLease, Millis(wait_ms));
    if (!r.ok()) {
      if (r.status().code() == spool::Code::kEmpty) return false;
      cmp::fail("receive: " + r.status().to_string());
    }
    auto& m = r->front();
    payload.swap(m.payload);
    h.id = m.id;
    h.receipt.swap(m.receipt);
    return true;
  }
  void ack(const cmp::Handle& h) override {
    if (auto s = q_->ack(h.receipt); !s.ok()) cmp::fail("ack: " + s.to_string());
  }

 private:
  std::unique_ptr<spool::Queue> q_;
};

class SpoolSystem : public cmp::System {
 public:
  void prepare(const cmp::Args& a) override {
    std::error_code ec;
    std::filesystem::remove_all(qdir(a), ec);
    // Created in a child: no Queue object may cross the fork of the workers.
    if (!cmp::in_child([&] {
          open(a);
          return 0;
        }))
      cmp::fail("cannot create " + qdir(a));
  }
  std::unique_ptr<cmp::Client> connect(const cmp::Args& a) override { return std::make_unique<SpoolClient>(a); }
  std::string check(const cmp::Args& a, uint64_t want_left) override {
    bool ok = cmp::in_child([&] {
      auto q = open(a);
      auto st = q->stats();
      if (!st.ok()) cmp::fail("stats: " + st.status().to_string());
      if (st->ready != want_left || st->in_flight != 0) {
        std::fprintf(stderr, "spool check: ready=%" PRIu64 " (want %" PRIu64 ") in_flight=%" PRIu64 "\n", st->ready,
                     want_left, st->in_flight);
        return 1;
      }
      return 0;
    });
    return ok ? "ok" : "messages left or missing";
  }
  void cleanup(const cmp::Args& a) override {
    std::error_code ec;
    std::filesystem::remove_all(qdir(a), ec);
  }
};

}  // namespace

int main(int argc, char** argv) {
  SpoolSystem sys;
  // SPOOL_IO=io_uring selects the library's io_uring backend instead of the default mmap:
  // reported as a system of its own.
  const char* io = std::getenv("SPOOL_IO");
  bool uring = io != nullptr && std::string_view(io) == "io_uring";
  return cmp::run(argc, argv, uring ? "spool-uring" : "spool", sys);
}
