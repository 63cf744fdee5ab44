#include "sys/mapping.h"

#include <sys/mman.h>

#include <cstdint>

namespace spool::sys {

void* map_shared(int fd, size_t len, int prot, off_t off, bool huge) {
  if (!huge || len < kHugeMapAlign || len > SIZE_MAX - kHugeMapAlign) {
    return ::mmap(nullptr, len, prot, MAP_SHARED, fd, off);
  }
  // Reserve an aligned window of address space, put the file over it, give back the rest.
  void* r = ::mmap(nullptr, len + kHugeMapAlign, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) return ::mmap(nullptr, len, prot, MAP_SHARED, fd, off);
  const auto start = reinterpret_cast<uintptr_t>(r);
  const uintptr_t at = (start + kHugeMapAlign - 1) & ~uintptr_t{kHugeMapAlign - 1};
  void* p = ::mmap(reinterpret_cast<void*>(at), len, prot, MAP_SHARED | MAP_FIXED, fd, off);
  if (p == MAP_FAILED) {
    ::munmap(r, len + kHugeMapAlign);
    return MAP_FAILED;
  }
  if (at > start) ::munmap(r, at - start);
  if (const uintptr_t end = at + len, rend = start + len + kHugeMapAlign; rend > end) {
    ::munmap(reinterpret_cast<void*>(end), rend - end);
  }
  (void)::madvise(p, len, MADV_HUGEPAGE);  // EINVAL without THP: a plain mapping then
  return p;
}

}  // namespace spool::sys
