// The shared index: a rebuildable cache of the queue's state in an mmap'd file that every
// attached process maps MAP_SHARED, guarded by one robust process-shared mutex.
//
// File layout: a 4 KiB header page (IndexHeader), then the region: an open-addressing hash
// table of `capacity` Entry slots keyed by message id (linear probing, backward-shift
// deletion, load <= 3/4), then a 4-ary min-heap of `capacity` HeapItems. The header page is
// mapped once; the region is remapped when another process grew it (region_gen).
//
// One heap orders every live message by the time it can next be received: a ready message
// by the time it became ready, a delayed one by its ready-at time, a leased one by its lease
// deadline. So "next message to deliver" and "next lease to expire" are both the heap top,
// O(log n) (4-ary: index.cc says why), and an expired lease needs no sweeper: it is simply
// at the top.
//
// Invariants, true whenever the mutex is free (checked by check_invariants()):
//  I1 count == number of non-empty slots; count <= capacity * 3/4.
//  I2 heap_size == count; for every slot s, heap[entry(s).heap_pos].slot == s.
//  I3 the heap property holds on (key, tie).
//  I4 leased == number of entries in state kLeased.
//  I5 every entry's id < next_id; every entry can be found by its id.
//  I6 every entry's state is kReady or kLeased, and its owner at most kOwnerSlots.
// A process that dies inside the critical section may break any of them; the next locker
// gets EOWNERDEAD and rebuilds the whole index from the log (the log is written before the
// index in every operation, so the log always holds the truth).
//
// Memory: 32 B per slot + 16 B per heap item, at load 3/8..3/4: 64-128 B per queued message.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "spool/status.h"
#include "sys/robust_mutex.h"

namespace spool::index {

inline constexpr uint64_t kIndexMagic = 0x5844494c4f4f5053ull;  // "SPOOLIDX"
inline constexpr uint32_t kIndexVersion = 5;  // 2: lease owners; 3: spare segments, seal; 4: durable_seq; 5: 4-ary heap
inline constexpr uint64_t kHeaderBytes = 4096;
inline constexpr uint64_t kMinCapacity = 1024;
inline constexpr uint32_t kNoPos = UINT32_MAX;

enum class State : uint8_t { kReady = 1, kLeased = 2 };

// Processes that bind their leases (Queue::bind_leases) each claim one owner slot; at most
// this many at once.
inline constexpr uint32_t kOwnerSlots = 128;

struct Entry {
  uint64_t id;        // 0: empty slot
  uint64_t loc;       // storage::Pos::pack() of the MSG record
  uint32_t len;       // payload length
  uint32_t heap_pos;  // where this entry's item sits in the heap
  uint32_t count;     // receive count == lease generation
  State state;
  uint8_t reserved;
  uint16_t owner;     // 1 + owner slot of the process the lease is bound to; 0: unbound
};
static_assert(sizeof(Entry) == 32);

struct HeapItem {
  uint64_t key;  // CLOCK_BOOTTIME ns when the message can next be received
  uint32_t slot;
  uint32_t tie;  // low bits of the id: FIFO among equal keys
};
static_assert(sizeof(HeapItem) == 16);

struct alignas(64) IndexHeader {
  uint64_t magic;
  uint64_t format;    // format_word(): refuses builds with another ABI
  char boot_id[40];   // boot that built this index; another boot means rebuild
  uint64_t file_bytes;
  // Written by the last process to detach: XXH3 of the fields guarded by mu and of the
  // region, so the next first opener can tell a cleanly closed index from one damaged
  // since (seal(), unseal()). 0 while any process is attached.
  uint64_t seal;
  alignas(64) sys::RobustMutex mu;       // the index lock
  alignas(64) sys::RobustMutex sync_mu;  // group commit: one flusher at a time
  // Guarded by mu:
  alignas(64) uint64_t capacity;
  uint64_t region_gen;
  uint64_t count;
  uint64_t heap_size;
  uint64_t leased;
  uint64_t next_id;
  uint64_t log_end;  // storage::Pos::pack() of where the next record goes
  uint64_t purged_through;
  uint64_t sent_total;
  uint64_t acked_total;
  uint64_t dead_total;
  uint64_t expired_total;  // dropped by a retention limit
  uint64_t nacked_total;
  uint64_t bytes_live;
  uint64_t compacted_through;  // every segment <= this was removed by compaction
  uint64_t spares;             // spare segment files (Log::make_spare) on disk
  uint64_t next_reap_ns;  // boot time of the next check for dead lease owners
  uint32_t owners_claimed;         // number of claimed owner slots
  uint8_t owner_claimed[kOwnerSlots];  // slot k is held by a live process's OFD lock on byte k of dir/owners
  // Lock-free:
  alignas(64) std::atomic<uint32_t> wake_seq;  // futex word: bumped when something became receivable
  std::atomic<uint32_t> waiters;
  alignas(64) std::atomic<uint32_t> room_seq;  // futex word: bumped when a full queue may have room
  std::atomic<uint32_t> room_waiters;
  alignas(64) std::atomic<uint64_t> durable_end;  // packed Pos synced to disk
  std::atomic<uint64_t> last_sync_ns;
  std::atomic<uint64_t> sent_through;  // highest id sent; stored after log_end (release)
  std::atomic<uint64_t> durable_id;    // every message with an id <= this is on disk
  std::atomic<uint32_t> durable_seq;   // futex word: bumped after every sync attempt
  std::atomic<uint32_t> durable_waiters;
};
static_assert(sizeof(IndexHeader) <= kHeaderBytes);

// version | sizeof(pthread_mutex_t) | cache line | sizeof(IndexHeader), as LMDB does.
uint64_t format_word();

class SharedIndex {
 public:
  SharedIndex() = default;
  ~SharedIndex();
  SharedIndex(const SharedIndex&) = delete;
  SharedIndex& operator=(const SharedIndex&) = delete;

  // Maps `path`. With `fresh`, (re)creates it: mutexes initialised, region empty; only a
  // first opener (no other process attached) may do that. Without it, validates magic,
  // format word and bounds. `anonymous` keeps the index in private memory (read-only users).
  Status attach(const std::string& path, bool fresh, bool anonymous = false);
  // True when the mapped header matches this build and boot (used by the first opener to
  // decide whether the existing file can be reused).
  bool reusable() const;

  IndexHeader& hdr() { return *hdr_; }
  bool attached() const { return hdr_ != nullptr; }
  // Clean close: the last process to detach seals the index (lock held, region mapped).
  void seal();
  // For the first opener: false when the index was sealed and has changed since (damage
  // while nobody had it open). Clears the seal either way.
  bool unseal();

  // Must be called with the lock held, before touching the region: remaps if it grew.
  Status refresh();

  // Empties the region (counts to zero); the caller then replays the log. Lock held.
  Status reset();

  // Table and heap operations, lock held.
  int64_t find(uint64_t id) const;  // slot or -1
  Result<uint32_t> insert(const Entry& e, uint64_t key);  // may grow the region
  // Grows the region now so that `more` inserts cannot fail.
  Status reserve(uint64_t more);
  void erase(uint32_t slot);
  void set_key(uint32_t slot, uint64_t key);
  Entry& entry(uint32_t slot) { return slots_[slot]; }
  bool heap_empty() const { return hdr_->heap_size == 0; }
  const HeapItem& heap_top() const { return heap_[0]; }
  const HeapItem* heap_begin() const { return heap_; }
  // The id of a heap item's message. While every id fits 32 bits it is the item's tie, so a
  // scan of the heap array (stats, list, peek) reads no entry: at 10M queued, reading them
  // (random slots of a 768 MiB index) held the lock for 211 ms in stats(), seconds in peek().
  uint64_t item_id(const HeapItem& it) const {
    return hdr_->next_id <= (uint64_t{1} << 32) ? it.tie : slots_[it.slot].id;
  }
  uint64_t heap_size() const { return hdr_->heap_size; }
  template <class F>
  void for_each_entry(F&& f) {
    for (uint64_t s = 0; s < hdr_->capacity; ++s)
      if (slots_[s].id != 0) f(static_cast<uint32_t>(s), slots_[s]);
  }
  // Returns "" or a description of the first broken invariant (O(n); tests and verify).
  std::string check_invariants() const;

 private:
  Status map_region();
  uint64_t checksum() const;
  Status grow();
  void place(uint32_t slot, const Entry& e);
  static constexpr uint64_t kHeapArity = 4;
  void move_item(uint64_t to, const HeapItem& it);
  void sift_up(uint64_t i);
  void sift_down(uint64_t i);
  bool less(const HeapItem& a, const HeapItem& b) const {
    return a.key < b.key || (a.key == b.key && a.tie < b.tie);
  }
  uint64_t mask() const { return hdr_->capacity - 1; }

  int fd_ = -1;
  bool anonymous_ = false;
  IndexHeader* hdr_ = nullptr;
  void* region_ = nullptr;
  uint64_t region_len_ = 0;
  uint64_t mapped_gen_ = UINT64_MAX;
  uint64_t mapped_capacity_ = 0;
  Entry* slots_ = nullptr;
  HeapItem* heap_ = nullptr;
};

}  // namespace spool::index
