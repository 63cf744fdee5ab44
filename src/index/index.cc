#include "index/index.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <vector>

#include "sys/clock.h"

namespace spool::index {
namespace {

constexpr uint64_t kCacheLine = 64;
constexpr uint64_t region_bytes(uint64_t capacity) {
  return capacity * (sizeof(Entry) + sizeof(HeapItem));
}
// Mixes the id so that ids sent in a row do not form one long probe run.
inline uint64_t hash_id(uint64_t id) {
  id ^= id >> 33;
  id *= 0xff51afd7ed558ccdull;
  id ^= id >> 33;
  return id;
}

}  // namespace

uint64_t format_word() {
  return (uint64_t{kIndexVersion} << 48) | (uint64_t{sizeof(pthread_mutex_t)} << 32) |
         (kCacheLine << 16) | sizeof(IndexHeader);
}

SharedIndex::~SharedIndex() {
  if (region_ != nullptr) ::munmap(region_, region_len_);
  if (hdr_ != nullptr) ::munmap(hdr_, kHeaderBytes);
  if (fd_ >= 0) ::close(fd_);
}

Status SharedIndex::attach(const std::string& path, bool fresh, bool anonymous) {
  anonymous_ = anonymous;
  void* p = nullptr;
  if (anonymous) {
    p = ::mmap(nullptr, kHeaderBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    fresh = true;
  } else {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd_ < 0) return errno_status(errno, "open index " + path);
    struct stat st {};
    if (::fstat(fd_, &st) != 0) return errno_status(errno, "stat " + path);
    uint64_t want = kHeaderBytes + region_bytes(kMinCapacity);
    if (fresh) {
      // Only the first opener gets here, so nobody maps the file: shrinking it is safe.
      // Allocated, not sparse: a page of a sparse file that cannot get a block on a full file
      // system is a SIGBUS at the first store through the mapping (grow() does the same).
      if (::ftruncate(fd_, 0) != 0) return errno_status(errno, "size index " + path);
      if (int r = ::posix_fallocate(fd_, 0, static_cast<off_t>(want)); r != 0) {
        return errno_status(r, "allocate index " + path);
      }
    } else if (static_cast<uint64_t>(st.st_size) < kHeaderBytes) {
      return Status(Code::kCorrupt, path + ": index is truncated");
    }
    p = ::mmap(nullptr, kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  }
  if (p == MAP_FAILED) return errno_status(errno, "map index " + path);
  hdr_ = static_cast<IndexHeader*>(p);
  if (fresh) {
    std::memset(static_cast<void*>(hdr_), 0, kHeaderBytes);
    new (hdr_) IndexHeader();
    if (int r = hdr_->mu.init(); r != 0) return errno_status(r, "init index mutex");
    if (int r = hdr_->sync_mu.init(); r != 0) return errno_status(r, "init sync mutex");
    hdr_->capacity = kMinCapacity;
    hdr_->region_gen = 1;
    hdr_->next_id = 1;
    hdr_->file_bytes = kHeaderBytes + region_bytes(kMinCapacity);
    std::string boot = sys::boot_id();
    std::strncpy(hdr_->boot_id, boot.c_str(), sizeof hdr_->boot_id - 1);
    hdr_->format = format_word();
    std::atomic_thread_fence(std::memory_order_release);
    hdr_->magic = kIndexMagic;  // last: a half-initialised file never looks valid
    return map_region();
  }
  if (!reusable()) {
    return Status(Code::kIncompatible,
                  path + ": index was built by an incompatible spool build or another boot; "
                         "close every process using the queue so the next opener rebuilds it");
  }
  return {};
}

uint64_t SharedIndex::checksum() const {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  const char* first = reinterpret_cast<const char*>(&hdr_->capacity);
  const char* last = reinterpret_cast<const char*>(&hdr_->owner_claimed[kOwnerSlots]);
  XXH3_64bits_update(st, first, static_cast<size_t>(last - first));
  XXH3_64bits_update(st, region_, region_bytes(hdr_->capacity));
  uint64_t sum = XXH3_64bits_digest(st) | 1;  // never 0, which means "not sealed"
  XXH3_freeState(st);
  return sum;
}

void SharedIndex::seal() {
  if (region_ == nullptr || mapped_capacity_ != hdr_->capacity) return;
  hdr_->seal = checksum();
}

bool SharedIndex::unseal() {
  uint64_t want = hdr_->seal;
  hdr_->seal = 0;
  if (want == 0) return true;
  return region_ != nullptr && mapped_capacity_ == hdr_->capacity && checksum() == want;
}

bool SharedIndex::reusable() const {
  if (hdr_->magic != kIndexMagic || hdr_->format != format_word()) return false;
  std::string boot = sys::boot_id();
  if (std::strncmp(hdr_->boot_id, boot.c_str(), sizeof hdr_->boot_id) != 0) return false;
  struct stat st {};
  if (anonymous_) {
    st.st_size = static_cast<off_t>(kHeaderBytes + region_bytes(hdr_->capacity));
  } else if (::fstat(fd_, &st) != 0) {
    return false;
  }
  uint64_t cap = hdr_->capacity;
  // Bounds: a damaged or hostile file must not make us map or index out of range.
  return cap >= kMinCapacity && (cap & (cap - 1)) == 0 && cap < (1ull << 36) &&
         kHeaderBytes + region_bytes(cap) <= static_cast<uint64_t>(st.st_size) &&
         hdr_->count <= cap && hdr_->heap_size <= cap;
}

Status SharedIndex::map_region() {
  uint64_t cap = hdr_->capacity;
  uint64_t len = region_bytes(cap);
  void* p;
  if (anonymous_) {
    p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  } else {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) return errno_status(errno, "stat index");
    if (kHeaderBytes + len > static_cast<uint64_t>(st.st_size)) {
      return Status(Code::kCorrupt, "index is smaller than its header says");
    }
    p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, kHeaderBytes);
  }
  if (p == MAP_FAILED) return errno_status(errno, "map index region");
  if (region_ != nullptr) ::munmap(region_, region_len_);
  region_ = p;
  region_len_ = len;
  slots_ = static_cast<Entry*>(p);
  heap_ = reinterpret_cast<HeapItem*>(static_cast<char*>(p) + cap * sizeof(Entry));
  mapped_gen_ = hdr_->region_gen;
  mapped_capacity_ = cap;
  return {};
}

Status SharedIndex::refresh() {
  if (mapped_gen_ == hdr_->region_gen && mapped_capacity_ == hdr_->capacity) return {};
  if (!reusable()) return Status(Code::kCorrupt, "index header failed validation");
  return map_region();
}

Status SharedIndex::reset() {
  hdr_->count = 0;
  hdr_->heap_size = 0;
  hdr_->leased = 0;
  std::memset(static_cast<void*>(slots_), 0, hdr_->capacity * sizeof(Entry));
  return {};
}

int64_t SharedIndex::find(uint64_t id) const {
  if (id == 0) return -1;
  for (uint64_t s = hash_id(id) & mask();; s = (s + 1) & mask()) {
    if (slots_[s].id == id) return static_cast<int64_t>(s);
    if (slots_[s].id == 0) return -1;
  }
}

void SharedIndex::place(uint32_t slot, const Entry& e) {
  slots_[slot] = e;
  if (e.heap_pos != kNoPos) heap_[e.heap_pos].slot = slot;
}

Status SharedIndex::grow() {
  // Copy the live state aside: old and new regions overlap in the file.
  std::vector<Entry> entries;
  entries.reserve(hdr_->count);
  std::vector<HeapItem> items(heap_, heap_ + hdr_->heap_size);
  for (uint64_t s = 0; s < hdr_->capacity; ++s)
    if (slots_[s].id != 0) entries.push_back(slots_[s]);
  uint64_t cap = hdr_->capacity * 2;
  uint64_t bytes = kHeaderBytes + region_bytes(cap);
  if (!anonymous_) {
    // Only ever grows: other processes may still map the old, shorter range.
    if (int r = ::posix_fallocate(fd_, 0, static_cast<off_t>(bytes)); r != 0) {
      return errno_status(r, "grow index");
    }
  }
  uint64_t old_cap = hdr_->capacity;
  hdr_->capacity = cap;
  hdr_->file_bytes = bytes;
  if (Status s = map_region(); !s.ok()) {
    hdr_->capacity = old_cap;
    return s;
  }
#ifdef MADV_POPULATE_WRITE
  // The rehash below touches every page of the new region; faulting them in with one call
  // instead of one exception each made send_batch(64) of 200,000 messages into a fresh queue
  // 25-30% faster (cmp_spool produce_batch, five pairs: 566-618k against 383-494k msgs/s;
  // exceptions are dear on this VM). Best effort: kernels before 5.14 answer EINVAL.
  (void)::madvise(region_, region_len_, MADV_POPULATE_WRITE);
#endif
  std::memset(static_cast<void*>(slots_), 0, cap * sizeof(Entry));
  if (!items.empty()) std::memcpy(static_cast<void*>(heap_), items.data(), items.size() * sizeof(HeapItem));
  for (const Entry& e : entries) {
    uint64_t s = hash_id(e.id) & mask();
    while (slots_[s].id != 0) s = (s + 1) & mask();
    place(static_cast<uint32_t>(s), e);
  }
  ++hdr_->region_gen;
  mapped_gen_ = hdr_->region_gen;
  return {};
}

Status SharedIndex::reserve(uint64_t more) {
  while ((hdr_->count + more) * 4 > hdr_->capacity * 3) {
    if (Status s = grow(); !s.ok()) return s;
  }
  return {};
}

Result<uint32_t> SharedIndex::insert(const Entry& in, uint64_t key) {
  if ((hdr_->count + 1) * 4 > hdr_->capacity * 3) {
    if (Status s = grow(); !s.ok()) return s;
  }
  uint64_t s = hash_id(in.id) & mask();
  while (slots_[s].id != 0) s = (s + 1) & mask();
  Entry e = in;
  e.heap_pos = static_cast<uint32_t>(hdr_->heap_size);
  heap_[hdr_->heap_size] = HeapItem{key, static_cast<uint32_t>(s), static_cast<uint32_t>(in.id)};
  ++hdr_->heap_size;
  place(static_cast<uint32_t>(s), e);
  ++hdr_->count;
  sift_up(e.heap_pos);
  return static_cast<uint32_t>(s);
}

void SharedIndex::erase(uint32_t slot) {
  // Heap removal: move the last item into the hole, then restore order both ways.
  uint64_t pos = slots_[slot].heap_pos;
  uint64_t last = --hdr_->heap_size;
  if (pos != last) {
    move_item(pos, heap_[last]);
    sift_down(pos);
    sift_up(pos);
  }
  // Backward-shift deletion keeps linear probing free of tombstones.
  uint64_t hole = slot;
  for (uint64_t s = (hole + 1) & mask(); slots_[s].id != 0; s = (s + 1) & mask()) {
    uint64_t home = hash_id(slots_[s].id) & mask();
    // Move s into the hole unless its home lies cyclically in (hole, s].
    bool stays = hole <= s ? (home > hole && home <= s) : (home > hole || home <= s);
    if (!stays) {
      place(static_cast<uint32_t>(hole), slots_[s]);
      hole = s;
    }
  }
  slots_[hole] = Entry{};
  --hdr_->count;
}

void SharedIndex::set_key(uint32_t slot, uint64_t key) {
  uint64_t pos = slots_[slot].heap_pos;
  heap_[pos].key = key;
  sift_down(pos);
  sift_up(pos);
}

// The heap is 4-ary and sifts move a hole instead of swapping. Every receive moves the top
// message to its lease deadline, which is nearly always the largest key: a sift through the
// whole depth, and every level writes the moved item's back-pointer into the hash table, a
// cache (and TLB) miss at a random slot. A binary heap with swaps paid two such misses a
// level, 20 levels at 1M queued. bench_queue --only=index, receive+ack at 1M queued as a
// share of the rate at 1k: binary with swaps 0.28x (heap_swap the top symbol of the
// profile); 4-ary 0.38-0.45x, 8-ary 0.41-0.45x, 16-ary 0.39-0.40x (two or three runs each).
// Four children are 64 B, one cache line when aligned.
void SharedIndex::move_item(uint64_t to, const HeapItem& it) {
  heap_[to] = it;
  slots_[it.slot].heap_pos = static_cast<uint32_t>(to);
}

void SharedIndex::sift_up(uint64_t i) {
  const HeapItem it = heap_[i];
  const uint64_t start = i;
  while (i > 0) {
    uint64_t parent = (i - 1) / kHeapArity;
    if (!less(it, heap_[parent])) break;
    move_item(i, heap_[parent]);
    i = parent;
  }
  if (i != start) move_item(i, it);
}

void SharedIndex::sift_down(uint64_t i) {
  const uint64_t n = hdr_->heap_size;
  const HeapItem it = heap_[i];
  const uint64_t start = i;
  for (;;) {
    uint64_t first = kHeapArity * i + 1;
    if (first >= n) break;
    uint64_t end = std::min(first + kHeapArity, n), m = first;
    for (uint64_t c = first + 1; c < end; ++c)
      if (less(heap_[c], heap_[m])) m = c;
    if (!less(heap_[m], it)) break;
    move_item(i, heap_[m]);
    i = m;
  }
  if (i != start) move_item(i, it);
}

std::string SharedIndex::check_invariants() const {
  uint64_t n = 0, leased = 0;
  for (uint64_t s = 0; s < hdr_->capacity; ++s) {
    const Entry& e = slots_[s];
    if (e.id == 0) continue;
    ++n;
    if (e.state == State::kLeased) ++leased;
    if ((e.state != State::kReady && e.state != State::kLeased) || e.owner > kOwnerSlots) {
      return "I6: entry " + std::to_string(e.id) + " has an invalid state or owner";
    }
    if (e.id >= hdr_->next_id) return "I5: entry id " + std::to_string(e.id) + " >= next_id";
    if (find(e.id) != static_cast<int64_t>(s)) return "I5: id " + std::to_string(e.id) + " not findable";
    if (e.heap_pos >= hdr_->heap_size || heap_[e.heap_pos].slot != s) return "I2: heap back-pointer";
  }
  if (n != hdr_->count || n * 4 > hdr_->capacity * 3) return "I1: count";
  if (hdr_->heap_size != n) return "I2: heap size";
  if (leased != hdr_->leased) return "I4: leased count";
  for (uint64_t i = 1; i < hdr_->heap_size; ++i)
    if (less(heap_[i], heap_[(i - 1) / kHeapArity])) return "I3: heap order at " + std::to_string(i);
  return "";
}

}  // namespace spool::index
