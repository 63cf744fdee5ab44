// POSIX message queues (mq_overview(7)): the kernel's in-memory queue, the floor of what a
// local queue costs. No persistence (sync "none"), no lease, no ack: receive removes the
// message. The queue holds at most /proc/sys/fs/mqueue/msg_max messages (the script raises it
// to 10000; at most 65536), and no more than RLIMIT_MSGQUEUE allows (819200 bytes per user
// unless raised: ~4300 messages of 100 B, ~190 of 4 KiB); a full queue blocks mq_send, so the produce case runs with a
// draining process (not timed). No native batching: produce_batch is skipped.
#include <fcntl.h>
#include <mqueue.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "harness.h"

namespace {

std::string name(const cmp::Args& a) { return "/" + a.tag; }

long msg_max() {
  long v = 10;
  if (FILE* f = std::fopen("/proc/sys/fs/mqueue/msg_max", "r")) {
    if (std::fscanf(f, "%ld", &v) != 1) v = 10;
    std::fclose(f);
  }
  return v;
}

class MqClient : public cmp::Client {
 public:
  explicit MqClient(const cmp::Args& a) : buf_(a.size, '\0') {
    q_ = ::mq_open(name(a).c_str(), O_RDWR);
    if (q_ == static_cast<mqd_t>(-1)) cmp::fail("mq_open " + name(a) + ": " + std::strerror(errno));
  }
  ~MqClient() override { ::mq_close(q_); }
  void send(std::string_view p) override {
    while (::mq_send(q_, p.data(), p.size(), 0) != 0) {
      if (errno != EINTR) cmp::fail(std::string("mq_send: ") + std::strerror(errno));
    }
  }
  bool receive(std::string& payload, cmp::Handle&, int wait_ms) override {
    timespec dl{};
    ::clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += wait_ms / 1000;
    dl.tv_nsec += static_cast<long>(wait_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
      dl.tv_sec += 1;
      dl.tv_nsec -= 1000000000L;
    }
    for (;;) {
      ssize_t r = ::mq_timedreceive(q_, buf_.data(), buf_.size(), nullptr, &dl);
      if (r >= 0) {
        payload.assign(buf_.data(), static_cast<size_t>(r));
        return true;
      }
      if (errno == ETIMEDOUT) return false;
      if (errno != EINTR) cmp::fail(std::string("mq_timedreceive: ") + std::strerror(errno));
    }
  }
  void ack(const cmp::Handle&) override {}

 private:
  mqd_t q_;
  std::string buf_;
};

class MqSystem : public cmp::System {
 public:
  bool produce_needs_drainer() const override { return true; }
  bool has_batch() const override { return false; }
  void prepare(const cmp::Args& a) override {
    // Depth: msg_max, but within RLIMIT_MSGQUEUE (bytes per user, 800 KiB by default; raised
    // when the process may) at about size + 128 bytes of kernel memory per message.
    rlimit rl{RLIM_INFINITY, RLIM_INFINITY};
    ::setrlimit(RLIMIT_MSGQUEUE, &rl);
    ::getrlimit(RLIMIT_MSGQUEUE, &rl);
    long depth = msg_max();
    if (rl.rlim_cur != RLIM_INFINITY) {
      depth = std::min<long>(depth, static_cast<long>(rl.rlim_cur / (a.size + 128)));
    }
    depth = std::max<long>(depth, 1);
    ::mq_unlink(name(a).c_str());
    mq_attr attr{};
    attr.mq_maxmsg = depth;
    attr.mq_msgsize = static_cast<long>(a.size);
    mqd_t q = ::mq_open(name(a).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600, &attr);
    if (q == static_cast<mqd_t>(-1)) cmp::fail("mq_open create " + name(a) + ": " + std::strerror(errno));
    ::mq_close(q);
  }
  std::unique_ptr<cmp::Client> connect(const cmp::Args& a) override { return std::make_unique<MqClient>(a); }
  std::string check(const cmp::Args& a, uint64_t want_left) override {
    mqd_t q = ::mq_open(name(a).c_str(), O_RDONLY);
    if (q == static_cast<mqd_t>(-1)) return "mq_open failed";
    mq_attr attr{};
    ::mq_getattr(q, &attr);
    ::mq_close(q);
    if (static_cast<uint64_t>(attr.mq_curmsgs) != want_left) {
      return "curmsgs=" + std::to_string(attr.mq_curmsgs) + " (want " + std::to_string(want_left) + ")";
    }
    return "ok";
  }
  void cleanup(const cmp::Args& a) override { ::mq_unlink(name(a).c_str()); }
};

}  // namespace

int main(int argc, char** argv) {
  MqSystem sys;
  return cmp::run(argc, argv, "posix-mq", sys);
}
