// beanstalkd over its text protocol (doc/protocol.txt of beanstalkd), with a minimal client
// written here: one TCP connection per process (TCP_NODELAY), tube TAG.
//   send          put <pri> 0 <ttr=60> <bytes>, wait for INSERTED (one request in flight,
//                 like any ordinary client's put)
//   send_batch    `batch` puts written in one write(), then the `batch` replies read: the
//                 pipelining a client may do (beanstalkd answers in order)
//   receive       reserve-with-timeout <s> (the TTR of 60 s is the lease); the timeout is in
//                 whole seconds, so a 50 ms slice becomes 1 s
//   ack           delete <id>, wait for DELETED
// The server is started by bench/compare/run.sh on 127.0.0.1:PORT (binlog and -f per sync).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "harness.h"

namespace {

constexpr int kTtr = 60;

class Conn {
 public:
  Conn(const std::string& host, int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) cmp::fail("socket");
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    if (::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) cmp::fail("bad host " + host);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
      cmp::fail("connect to beanstalkd at " + host + ":" + std::to_string(port) + ": " + std::strerror(errno));
    }
  }
  ~Conn() { ::close(fd_); }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  void write_all(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t w = ::write(fd_, s.data() + off, s.size() - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) cmp::fail(std::string("beanstalkd write: ") + std::strerror(errno));
      off += static_cast<size_t>(w);
    }
  }
  // The next reply line without its \r\n (valid until the next read).
  std::string_view line() {
    for (;;) {
      size_t e = buf_.find("\r\n", pos_);
      if (e != std::string::npos) {
        std::string_view l(buf_.data() + pos_, e - pos_);
        pos_ = e + 2;
        return l;
      }
      fill();
    }
  }
  // `n` bytes of data followed by \r\n.
  void data(size_t n, std::string& out) {
    while (buf_.size() - pos_ < n + 2) fill();
    out.assign(buf_.data() + pos_, n);
    pos_ += n + 2;
  }
  // Sends a command and checks its one-line reply starts with `want`; returns the line.
  std::string_view cmd(const std::string& c, std::string_view want) {
    write_all(c);
    std::string_view l = line();
    if (l.substr(0, want.size()) != want) cmp::fail("beanstalkd: " + c.substr(0, c.size() - 2) + " -> " + std::string(l));
    return l;
  }

 private:
  void fill() {
    if (pos_ > 0 && pos_ == buf_.size()) {
      buf_.clear();
      pos_ = 0;
    } else if (pos_ > (1u << 16)) {
      buf_.erase(0, pos_);
      pos_ = 0;
    }
    char tmp[65536];
    ssize_t r;
    do {
      r = ::read(fd_, tmp, sizeof tmp);
    } while (r < 0 && errno == EINTR);
    if (r <= 0) cmp::fail(std::string("beanstalkd read: ") + (r == 0 ? "connection closed" : std::strerror(errno)));
    buf_.append(tmp, static_cast<size_t>(r));
  }
  int fd_ = -1;
  std::string buf_;
  size_t pos_ = 0;
};

void append_put(std::string& out, std::string_view p) {
  out += "put 1024 0 " + std::to_string(kTtr) + " " + std::to_string(p.size()) + "\r\n";
  out.append(p);
  out += "\r\n";
}

class BeanstalkClient : public cmp::Client {
 public:
  explicit BeanstalkClient(const cmp::Args& a) : c_(a.host, a.port) {
    c_.cmd("use " + a.tag + "\r\n", "USING");
    c_.cmd("watch " + a.tag + "\r\n", "WATCHING");
    c_.cmd("ignore default\r\n", "WATCHING");
  }
  void send(std::string_view p) override {
    out_.clear();
    append_put(out_, p);
    c_.write_all(out_);
    expect_inserted();
  }
  void send_batch(std::span<const std::string_view> ps) override {
    out_.clear();
    for (auto p : ps) append_put(out_, p);
    c_.write_all(out_);
    for (size_t i = 0; i < ps.size(); ++i) expect_inserted();
  }
  bool receive(std::string& payload, cmp::Handle& h, int wait_ms) override {
    int secs = wait_ms <= 0 ? 0 : (wait_ms + 999) / 1000;
    c_.write_all("reserve-with-timeout " + std::to_string(secs) + "\r\n");
    std::string_view l = c_.line();
    if (l == "TIMED_OUT" || l == "DEADLINE_SOON") return false;
    if (l.substr(0, 9) != "RESERVED ") cmp::fail("beanstalkd: reserve -> " + std::string(l));
    std::string rest(l.substr(9));
    char* end = nullptr;
    h.id = std::strtoull(rest.c_str(), &end, 10);
    size_t bytes = std::strtoull(end, nullptr, 10);
    c_.data(bytes, payload);
    return true;
  }
  void ack(const cmp::Handle& h) override { c_.cmd("delete " + std::to_string(h.id) + "\r\n", "DELETED"); }

  // stats-tube: current-jobs-ready + current-jobs-reserved (0 if the tube is gone).
  void counts(const std::string& tube, uint64_t& ready, uint64_t& reserved) {
    ready = reserved = 0;
    c_.write_all("stats-tube " + tube + "\r\n");
    std::string_view l = c_.line();
    if (l == "NOT_FOUND") return;
    if (l.substr(0, 3) != "OK ") cmp::fail("beanstalkd: stats-tube -> " + std::string(l));
    std::string yaml;
    c_.data(std::strtoull(std::string(l.substr(3)).c_str(), nullptr, 10), yaml);
    auto field = [&](const char* name) -> uint64_t {
      auto p = yaml.find(name);
      return p == std::string::npos ? 0 : std::strtoull(yaml.c_str() + p + std::strlen(name), nullptr, 10);
    };
    ready = field("current-jobs-ready: ");
    reserved = field("current-jobs-reserved: ");
  }

 private:
  void expect_inserted() {
    std::string_view l = c_.line();
    if (l.substr(0, 9) != "INSERTED ") cmp::fail("beanstalkd: put -> " + std::string(l));
  }
  Conn c_;
  std::string out_;
};

class BeanstalkSystem : public cmp::System {
 public:
  void prepare(const cmp::Args& a) override {
    BeanstalkClient probe(a);  // fails early if the server is not there
  }
  std::unique_ptr<cmp::Client> connect(const cmp::Args& a) override { return std::make_unique<BeanstalkClient>(a); }
  std::string check(const cmp::Args& a, uint64_t want_left) override {
    BeanstalkClient c(a);
    uint64_t ready = 0, reserved = 0;
    c.counts(a.tag, ready, reserved);
    if (ready != want_left || reserved != 0) {
      return "ready=" + std::to_string(ready) + " (want " + std::to_string(want_left) + ") reserved=" + std::to_string(reserved);
    }
    return "ok";
  }
  void cleanup(const cmp::Args&) override {}  // the script restarts the server for every run
};

}  // namespace

int main(int argc, char** argv) {
  BeanstalkSystem sys;
  return cmp::run(argc, argv, "beanstalkd", sys);
}
