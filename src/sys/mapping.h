// Shared file mappings, optionally laid out for transparent huge pages.
#pragma once
#include <sys/types.h>

#include <cstddef>

namespace spool::sys {

// The size of a PMD mapping on x86-64 and arm64 (4 KiB pages).
inline constexpr size_t kHugeMapAlign = size_t{2} << 20;

// mmap(nullptr, len, prot, MAP_SHARED, fd, off), but with `huge` (and len >= kHugeMapAlign)
// the mapping starts on a kHugeMapAlign boundary and is advised MADV_HUGEPAGE, so that the
// kernel can map the file's 2 MiB page cache folios with one entry each. Returns MAP_FAILED
// with errno set, like mmap; the result is unmapped with munmap(p, len).
//
// Why: on a VM with shadow paging the first touch of every 4 KiB page through a new mapping
// is a trip into the hypervisor, and a record store into a fresh segment paid one every few
// dozen records; a PMD mapping pays one per 2 MiB (bench/bench_store, docs/performance.md).
// The price: a page cache folio is written back whole, so a sync after a small store
// writes 2 MiB (callers use it where nothing syncs).
void* map_shared(int fd, size_t len, int prot, off_t off, bool huge);

}  // namespace spool::sys
