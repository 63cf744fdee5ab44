// What a record store into a segment costs, by how the segment is mapped (plain main; prints
// its own table). A fresh preallocated file of 64 MiB is made the way Log::make_spare makes
// a spare (fallocate, populated through a mapping, fdatasync), then 112-byte records are
// stored in sequence through a second mapping, as an append does. On a VM with shadow
// paging the first touch of each 4 KiB page through a new mapping is the cost
// (docs/performance.md, "Where the time goes now"); a huge-page mapping (sys::map_shared)
// takes one per 2 MiB. Also: a second pass over the same mapping, and pwrite per record.
//
// Usage: bench_store [DIR] (default /var/tmp: a disk, as segments are on one)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "sys/mapping.h"

namespace {

constexpr size_t kLen = size_t{64} << 20;
constexpr size_t kRec = 112;

long minor_faults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// FilePmdMapped of the mapping at `p`, in KiB (/proc/self/smaps).
long pmd_kib(const void* p) {
  char start[32];
  std::snprintf(start, sizeof start, "%lx-", reinterpret_cast<unsigned long>(p));
  std::ifstream in("/proc/self/smaps");
  bool ours = false;
  for (std::string line; std::getline(in, line);) {
    if (line.find('-') < 17 && line.find(' ') != std::string::npos && std::isxdigit(static_cast<unsigned char>(line[0]))) {
      ours = line.starts_with(start);
    } else if (ours && line.starts_with("FilePmdMapped:")) {
      return std::stol(line.substr(14));
    }
  }
  return 0;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

enum class Mode { kPlain, kPopulated, kSecondPass, kHuge, kPwrite };

void run(const std::string& dir, Mode mode, const char* name) {
  const std::string path = dir + "/bench_store." + std::to_string(::getpid());
  int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 || ::fallocate(fd, 0, 0, kLen) != 0) {
    std::perror(path.c_str());
    if (fd >= 0) ::close(fd);
    ::unlink(path.c_str());
    return;
  }
  const bool huge = mode == Mode::kHuge;
  // The spare: populated through a mapping of the same kind, then synced (Log::make_spare).
  void* made = spool::sys::map_shared(fd, kLen, PROT_READ | PROT_WRITE, 0, huge);
  if (made != MAP_FAILED) {
    (void)::madvise(made, kLen, MADV_POPULATE_WRITE);
    ::munmap(made, kLen);
  }
  (void)::fdatasync(fd);
  auto* m = static_cast<uint8_t*>(spool::sys::map_shared(fd, kLen, PROT_READ | PROT_WRITE, 0, huge));
  if (m == MAP_FAILED) {
    std::perror("mmap");
    ::close(fd);
    ::unlink(path.c_str());
    return;
  }
  uint8_t rec[kRec];
  std::memset(rec, 0x5a, sizeof rec);
  const size_t n = kLen / kRec;
  auto store_all = [&] {
    for (size_t i = 0; i < n; ++i) {
      std::memcpy(m + i * kRec, rec, kRec);
      asm volatile("" ::: "memory");  // each store happens, in order
    }
  };
  if (mode == Mode::kPopulated) (void)::madvise(m, kLen, MADV_POPULATE_WRITE);
  if (mode == Mode::kSecondPass) store_all();
  const long f0 = minor_faults();
  const auto t0 = std::chrono::steady_clock::now();
  size_t done = n;
  if (mode == Mode::kPwrite) {
    done = n / 8;  // a system call each: fewer, enough to time
    for (size_t i = 0; i < done; ++i) {
      if (::pwrite(fd, rec, kRec, static_cast<off_t>(i * kRec)) != static_cast<ssize_t>(kRec)) break;
    }
  } else {
    store_all();
  }
  const double ms = ms_since(t0);
  std::printf("%-44s %9.1f %10ld %10ld\n", name, ms * 1e6 / static_cast<double>(done), minor_faults() - f0,
              pmd_kib(m));
  ::munmap(m, kLen);
  ::close(fd);
  ::unlink(path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/var/tmp";
  std::printf("112-byte records stored in sequence into a fresh 64 MiB preallocated file in %s\n", dir.c_str());
  std::printf("%-44s %9s %10s %10s\n", "mapping", "ns/rec", "faults", "PMD KiB");
  for (int round = 0; round < 2; ++round) {
    run(dir, Mode::kPlain, "MAP_SHARED (as interval/always queues)");
    run(dir, Mode::kPopulated, "MAP_SHARED after MADV_POPULATE_WRITE");
    run(dir, Mode::kSecondPass, "MAP_SHARED, second pass over it");
    run(dir, Mode::kHuge, "2 MiB-aligned MADV_HUGEPAGE (never queues)");
    run(dir, Mode::kPwrite, "pwrite per record (no mapping)");
  }
  return 0;
}
