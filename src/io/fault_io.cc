#include "io/fault_io.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "logging.h"

namespace spool::io {

void FaultIo::fail(Op op, int nth, int err, bool sticky) {
  std::lock_guard lock(mu_);
  faults_[op] = Fault{nth, err, sticky};
}

void FaultIo::clear_faults() {
  std::lock_guard lock(mu_);
  faults_.clear();
}

int FaultIo::injected(Op op) {
  std::lock_guard lock(mu_);
  auto it = faults_.find(op);
  if (it == faults_.end()) return 0;
  Fault& f = it->second;
  if (f.countdown > 1) {
    --f.countdown;
    return 0;
  }
  int err = f.err;
  if (!f.sticky) faults_.erase(it);
  return -err;
}

size_t FaultIo::unsynced_writes() const {
  std::lock_guard lock(mu_);
  return unsynced_.size();
}

void FaultIo::drop_unsynced(size_t keep) {
  std::lock_guard lock(mu_);
  while (unsynced_.size() > keep) {
    Undo& u = unsynced_.back();
    // Straight to the file: restoring is the simulated disk, not an operation under test.
    if (::pwrite(u.fd, u.old.data(), u.old.size(), static_cast<off_t>(u.off)) < 0) {
      spool::log().warn("simulated power loss could not restore {} bytes: {}", u.old.size(), std::strerror(errno));
    }
    unsynced_.pop_back();
  }
  unsynced_.clear();
}

int FaultIo::datasync(int fd) {
  if (int e = injected(Op::kSync)) return e;
  int r = inner_->datasync(fd);
  if (r == 0) {
    std::lock_guard lock(mu_);
    std::erase_if(unsynced_, [fd](const Undo& u) { return u.fd == fd; });
  }
  return r;
}

int FaultIo::allocate(int fd, uint64_t off, uint64_t len) {
  if (int e = injected(Op::kAllocate)) return e;
  return inner_->allocate(fd, off, len);
}

int FaultIo::open(const std::string& path, int flags, mode_t mode) {
  if (int e = injected(Op::kOpen)) return e;
  return inner_->open(path, flags, mode);
}

int64_t FaultIo::write_some(int fd, const iovec* iov, int iovcnt, uint64_t off) {
  if (int e = injected(Op::kWrite)) return e;
  std::vector<iovec> cut(iov, iov + iovcnt);
  uint64_t total = 0;
  for (auto& v : cut) total += v.iov_len;
  if (short_writes_ != 0 && total > short_writes_) {
    uint64_t left = short_writes_;
    size_t n = 0;
    while (n < cut.size() && left > 0) {
      cut[n].iov_len = std::min<uint64_t>(cut[n].iov_len, left);
      left -= cut[n].iov_len;
      ++n;
    }
    cut.resize(n);
    total = short_writes_;
  }
  Undo u{fd, off, std::vector<char>(total)};
  ssize_t got = ::pread(fd, u.old.data(), total, static_cast<off_t>(off));
  u.old.resize(got > 0 ? static_cast<size_t>(got) : 0);
  int64_t n = inner_->write_some(fd, cut.data(), static_cast<int>(cut.size()), off);
  if (n > 0) {
    u.old.resize(std::min<size_t>(u.old.size(), static_cast<size_t>(n)));
    std::lock_guard lock(mu_);
    unsynced_.push_back(std::move(u));
  }
  return n;
}

}  // namespace spool::io
