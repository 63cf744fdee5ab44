#include "test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include <filesystem>
#include <stdexcept>
#include <thread>

namespace spool::test {

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "spool-test-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

bool can_punch_holes(const std::string& dir) {
  std::string path = dir + "/.punch-probe";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  bool ok = ::posix_fallocate(fd, 0, 1 << 16) == 0 &&
            ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 1 << 16) == 0;
  ::close(fd);
  ::unlink(path.c_str());
  return ok;
}

TempDir::~TempDir() {
  if (std::getenv("SPOOL_TEST_KEEP") != nullptr) return;  // for post-mortems
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::unique_ptr<Queue> open_queue(const std::string& dir, const QueueOptions& o) {
  auto q = Queue::open(dir, o);
  EXPECT_TRUE(q.ok()) << dir << ": " << q.status().to_string();
  return q.ok() ? std::move(q).value() : nullptr;
}

}  // namespace spool::test

namespace spool::test {

double scale() {
  const char* s = std::getenv("SPOOL_TEST_SCALE");
  double v = s != nullptr ? std::atof(s) : 1.0;
  return v > 0 ? v : 1.0;
}

}  // namespace spool::test

namespace spool::test {

pid_t spawn(const std::function<int()>& child) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    int rc = 99;
    try {
      rc = child();
    } catch (...) {
    }
    ::_exit(rc);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

uint64_t mono_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

bool wait_for_file(const std::string& path, std::chrono::milliseconds limit) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (std::filesystem::exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

}  // namespace spool::test

namespace spool::test {

IndexFile::IndexFile(const std::string& qdir) {
  const std::string path = qdir + "/index";
  fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd_ < 0) {
    ADD_FAILURE() << "open " << path << ": " << std::strerror(errno);
    return;
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || st.st_size < static_cast<off_t>(index::kHeaderBytes)) {
    ADD_FAILURE() << path << " cannot be read or is shorter than its header";
    return;
  }
  len_ = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    ADD_FAILURE() << "mmap " << path << ": " << std::strerror(errno);
    return;
  }
  base_ = static_cast<char*>(p);
}

IndexFile::~IndexFile() {
  if (base_ != nullptr) ::munmap(base_, len_);
  if (fd_ >= 0) ::close(fd_);
}

index::Entry* IndexFile::window() { return reinterpret_cast<index::Entry*>(base_ + index::kHeaderBytes); }

index::Entry& IndexFile::entry_of(uint64_t id) { return window()[(id + hdr().layout.win_offset) % hdr().layout.capacity]; }

index::OvfEntry* IndexFile::overflow() {
  return reinterpret_cast<index::OvfEntry*>(base_ + index::kHeaderBytes + hdr().layout.capacity * sizeof(index::Entry) +
                                           hdr().layout.heap_cap * sizeof(index::HeapItem));
}

index::DedupSlot* IndexFile::dedup() {
  return reinterpret_cast<index::DedupSlot*>(reinterpret_cast<char*>(overflow()) +
                                            hdr().layout.ovf_cap * sizeof(index::OvfEntry));
}

}  // namespace spool::test
