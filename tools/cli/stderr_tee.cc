#include "cli/stderr_tee.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace spool::cli {

StderrTee::StderrTee(int fd, int out, size_t keep) : fd_(fd), out_(out), keep_(keep) {
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  thread_ = std::thread([this] { loop(); });
}

StderrTee::~StderrTee() {
  if (thread_.joinable()) finish(false);
}

std::string StderrTee::finish(bool to_eof) {
  if (!to_eof) draining_ = true;
  thread_.join();
  ::close(fd_);
  size_t skip = 0;
  // A cut through a multi-byte character leaves continuation bytes (10xxxxxx) in front.
  while (cut_ && skip < 3 && skip < tail_.size() && (static_cast<unsigned char>(tail_[skip]) & 0xC0) == 0x80) ++skip;
  return tail_.substr(skip);
}

void StderrTee::loop() {
  char buf[16384];
  for (;;) {
    // The timeout only bounds how late a finish(false) is seen.
    pollfd p{fd_, POLLIN, 0};
    int r = ::poll(&p, 1, draining_ ? 0 : 50);
    if (r < 0 && errno != EINTR) return;
    if (r <= 0) {
      if (r == 0 && draining_) return;
      continue;
    }
    ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;  // end of file: every writer has gone
    pass_on(buf, static_cast<size_t>(n));
    tail_.append(buf, static_cast<size_t>(n));
    if (tail_.size() > keep_) {
      tail_.erase(0, tail_.size() - keep_);
      cut_ = true;
    }
  }
}

void StderrTee::pass_on(const char* p, size_t n) {
  while (n > 0 && out_ >= 0) {
    ssize_t w = ::write(out_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) {  // an `out` someone made non-blocking
      pollfd o{out_, POLLOUT, 0};
      ::poll(&o, 1, 100);
      continue;
    }
    if (w <= 0) {
      out_ = -1;
      return;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace spool::cli
