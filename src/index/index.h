// The shared index: a rebuildable cache of the queue's state in an mmap'd file that every
// attached process maps MAP_SHARED, guarded by one robust process-shared mutex.
//
// File layout: an 8 KiB header (IndexHeader), then the region: the window, `capacity`
// Entry slots; the heap, `heap_cap` HeapItems; the overflow table, `ovf_cap` OvfEntries; the
// dedup table, `dedup_cap` DedupSlots (none until a send first gives a dedup id); the group
// table, `group_cap` GroupSlots (none until a send first gives a group). The
// header page is mapped once; the region is remapped when another process grew it
// (region_gen). docs/format.md, "The shared index", says why it is shaped so.
//
// The window holds every live message with an id in [low_id, low_id + capacity), message id
// in slot (id + win_offset) % capacity, so a lookup is one division and one cache line, and
// a slot needs no id or hash-table slack: 24 B. Ids are handed out in order and mostly acked in order, so
// low_id follows the oldest live message and the window stays about as large as the queue.
// A live message that holds low_id back while the window would have to grow past twice the
// live count (a long delay, a lease extended for hours) moves to the overflow table, an
// open-addressing hash table (linear probing, backward-shift deletion, load <= 3/4).
//
// A message of the default priority that has been ready since it was sent and was never
// received is "queued": it is in no heap. Queued messages are delivered in id order, found by
// a cursor that only moves forward. Every other message has an item in one of two 4-ary
// min-heaps that share one array (the timer heap grows from its start, the due heap from
// its end, so their sum is what the array must hold):
//  - the timer heap, ordered by (the time it can next be received, id): a leased message by
//    its lease deadline, a delayed or released one by its ready-at time;
//  - the due heap, ordered by (priority, the time it became ready, id): messages that can
//    be received now and are not queued (another priority, or redelivered). next() moves
//    timer items whose time has come into it, each once per time it becomes ready.
// Both are as large as the messages in flight, delayed, redelivered or of another priority,
// not the default-priority backlog, so a receive from a backlog of 10M costs what it costs
// at 1k. The next message to deliver is the lower of the queue head, taken as (default
// priority, its send time, id), and the due heap's top.
//
// Invariants, true whenever the mutex is free (checked by check_invariants()):
//  I1 count == live window slots + ovf_count; ovf_count <= ovf_cap * 3/4.
//  I2 heap_size + due_size == count - queued - blocked, and heap_size + due_size + blocked
//     <= heap_cap (a blocked entry gets an item when it becomes its group's first); every
//     entry neither queued nor blocked has a heap_pos naming its item (kDueBit set: in the
//     due heap).
//  I3 the heap property holds on (key, id) in both heaps.
//  I4 leased == number of entries in state kLeased.
//  I5 every id < next_id; window ids are in [low_id, low_id + capacity), overflow ids are
//     below low_id and findable; 1 <= low_id <= cursor <= next_id; queued entries >= cursor.
//  I6 every entry's state is valid, its owner at most kOwnerSlots; overflow holds no
//     queued entry.
//  I7 blocked == entries in state kBlocked; each has a member slot and is not its group's
//     first; group_used == occupied group slots <= group_cap * 3/4.
// A process that dies inside the critical section may break any of them; the next locker
// gets EOWNERDEAD and rebuilds the whole index from the log (the log is written before the
// index in every operation, so the log always holds the truth).
//
// Damage (docs/security.md, "A damaged or hostile index"): the file is shared with every
// process that may write the queue, so no value read from it is used as an offset or a loop
// bound unchecked, in every attached process, not only the first opener:
//  - at every lock, check_file() (before the lock word itself is touched: a truncated file
//    would SIGBUS) and check_header() (O(1): geometry, counters, I5's order, heap size);
//  - at every use, the values those cannot vouch for: a heap_pos, a heap item's id, an
//    overflow probe (bounded by the table's size), a slot, the window's low end. A bad one
//    is never followed: the operation goes on with a harmless value (a write lands in a
//    scratch entry, a lookup finds nothing) and the damage is recorded (damage()); the lock
//    holder then rebuilds the index from the log before it unlocks.
// A process that pokes the file while another holds the lock can still make that holder
// compute nonsense, never read or write outside the mappings.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/io.h"
#include "spool/status.h"
#include "sys/robust_mutex.h"
#include "sys/thread_annotations.h"

namespace spool::index {

inline constexpr uint64_t kIndexMagic = 0x5844494c4f4f5053ull;  // "SPOOLIDX"
// Bumped at every change of the layout or of what a field means: an index of another
// version is rebuilt from the log by the first opener.
inline constexpr uint32_t kIndexVersion = 25;
inline constexpr uint64_t kMinWindow = 1024;
inline constexpr uint64_t kMinHeap = 256;
inline constexpr uint64_t kMinOverflow = 64;
// The dedup table's size in slots: 0, or a power of two in [kMinDedup, kMaxDedup]. At most
// 3/4 of the slots are used, so kMaxDedup bounds the ids remembered at once (1,572,864).
inline constexpr uint64_t kMinDedup = 1024;
inline constexpr uint64_t kMaxDedup = 1ull << 21;
inline constexpr uint32_t kNoPos = UINT32_MAX;
// A heap_pos with this bit names an item of the due heap (the rest is its position there).
inline constexpr uint32_t kDueBit = 1u << 31;
// Priorities (docs/semantics.md, "Priorities"): 0 is the most urgent.
inline constexpr uint8_t kDefaultPriority = 128;
// A due heap item's key: the priority above the time it became ready, in 256 ns units.
inline constexpr uint64_t due_key(uint8_t priority, uint64_t ready) { return (uint64_t{priority} << 56) | (ready >> 8); }
inline constexpr uint64_t due_time(uint64_t key) { return (key & ((uint64_t{1} << 56) - 1)) << 8; }
// shrink() gives the region back only when that frees at least this much.
inline constexpr uint64_t kShrinkMinBytes = 1 << 20;

// kQueued: of the default priority, ready since it was sent, never received: no heap item
// (see above). kReady: ready or delayed, in a heap. kLeased: in the timer heap by its lease
// deadline, or in the due heap once that has passed. kBlocked: a member of an ordered group
// behind its group's first (see GroupSlot): in no heap.
enum class State : uint8_t { kEmpty = 0, kReady = 1, kLeased = 2, kQueued = 3, kBlocked = 4 };

// Processes that bind their leases (Queue::bind_leases) each claim one owner slot; at most
// this many at once.
inline constexpr uint32_t kOwnerSlots = 128;

struct Entry {
  uint64_t loc;       // storage::Pos::pack() of the MSG record
  uint32_t len;       // payload length
  uint32_t count;     // receive count == lease generation
  uint32_t heap_pos;  // where this entry's item sits in its heap; kQueued: key bits (key())
  uint16_t key_hi;    // kQueued: more key bits; otherwise the message's priority
  State state;
  uint8_t owner;      // 1 + owner slot of the process the lease is bound to; 0: unbound
};
static_assert(sizeof(Entry) == 24);

struct HeapItem {
  uint64_t key;  // CLOCK_BOOTTIME ns when the message can next be received
  uint64_t id;   // also the tie-break: FIFO among equal keys
};
static_assert(sizeof(HeapItem) == 16);

struct OvfEntry {
  uint64_t id;  // 0: empty slot
  Entry e;
};
static_assert(sizeof(OvfEntry) == 32);

// A remembered deduplication id: a hint, not the truth. It names the MSG record that carries
// a dedup id whose 64-bit hash is `hash`; the queue confirms every hit against that record
// (the id itself, and the record's enqueue time within the window), so neither a hash
// collision nor a damaged slot can make a send be taken for a duplicate it is not.
struct DedupSlot {
  uint64_t hash;     // 0: empty
  uint64_t loc;      // storage::Pos::pack() of the MSG record
  uint64_t expires;  // CLOCK_BOOTTIME ns: the record's enqueue time + the queue's window
};
static_assert(sizeof(DedupSlot) == 24);

// Ordered groups (docs/semantics.md, "Ordered groups"). One open-addressing table of these
// slots (linear probing, backward-shift deletion, load <= 3/4) holds two kinds, told apart
// by the key's top bit:
//  - a group: key = the 64-bit hash of its key | kGroupTag; a = its first live member, b =
//    its last, c = the member linked last (where a link out of id order starts looking);
//  - a member: key = its message id (< 2^62); a = its group's key; b = the next member in
//    id order (0: none); c = while it is blocked, the time it can be received.
// A group's members form a list in id order, which is send order. Only the first is a
// message like any other; the rest are kBlocked: in no heap, not queued, so that a backlog
// of many groups costs a receive nothing. Erasing the first (ack, dead letter, expiry,
// purge) puts the next one into the timer heap at its own receive time, from where next()
// takes it as it takes any other. Two groups whose hashes collide share one order: stricter
// than asked, never looser.
inline constexpr uint64_t kGroupTag = 1ull << 63;
inline constexpr uint64_t kMinGroupSlots = 1024;
inline constexpr uint64_t kMaxGroupSlots = 1ull << 28;
struct GroupSlot {
  uint64_t key;  // 0: empty
  uint64_t a;
  uint64_t b;
  uint64_t c;
};
static_assert(sizeof(GroupSlot) == 32);

// Where the log clock was set to the wall clock (a CLOCK record, queue/log_clock.h): records
// from `at` on store CLOCK_BOOTTIME + `off` until the next anchor.
struct ClockAnchor {
  uint64_t at;   // storage::Pos::pack() of the CLOCK record
  uint64_t off;  // CLOCK_REALTIME - CLOCK_BOOTTIME then (two's complement: wall before boot wraps)
};
inline constexpr uint32_t kClockAnchors = 64;

// Replay after ack (QueueOptions::keep_acked): the acks of the last keep_acked, by time, in
// a ring of buckets each `width` ns of CLOCK_BOOTTIME wide (width = keep_acked / (n - 2),
// rounded up, so the ring spans the window and then some). A bucket keeps the lowest
// segment holding the MSG record of a message acked in it (compaction keeps that segment
// and every later one until the bucket has left the window), and how many messages were
// acked in it, with their payload bytes (stats).
inline constexpr uint32_t kKeptBuckets = 32;
struct KeptBucket {
  uint64_t n;        // bucket number + 1 (the acks at [n-1, n) * width); 0: empty
  uint64_t min_seq;  // lowest segment holding the MSG record of one of them
  uint64_t acks;
  uint64_t bytes;
};

// The header page holds four kinds of state, each a part of its own with its own writers
// (docs/design.md, "Truth, cache, coordination, registry"):
//  - the cache, which a replay of the log rebuilds (a damaged or foreign index is simply
//    made again): `layout`, the shape of the index's own tables, written by SharedIndex's
//    operations; and `cache`, the queue's state derived from the records, written by
//    queue::apply_record() and nowhere else (the clock anchors too: a CLOCK record's), but
//    for `log_end`, which only the writer of records knows (published by the store's commit
//    after an append, by replay at the end of the log), and a rebuild, which empties it
//    first;
//  - `coord`, coordination between the attached processes: the locks, the futex words
//    and the durable marks; never rebuilt from the log, and never sealed (they change
//    without the index lock);
//  - `registry`, the lease owners' slots: liveness, which no log records (a rebuild keeps
//    it: queue/lease_owners.h);
//  - `disk`, bookkeeping of files and background work (spares, what compaction removed,
//    when dead owners are next looked for), which a rebuild recounts from the directory.
// `ident` says whose index this is. The parts under the index lock (layout, cache, disk,
// registry) are contiguous, so that seal() checksums them in one range.
struct IndexIdentity {
  uint64_t magic;
  uint64_t format;    // format_word(): refuses builds with another ABI
  char boot_id[40];   // boot that built this index; another boot means rebuild
  uint64_t file_bytes;
  // Written by the last process to detach: XXH3 of the parts guarded by the lock and of the
  // region, so the next first opener can tell a cleanly closed index from one damaged
  // since (seal(), unseal()). 0 while any process is attached.
  uint64_t seal;
};

struct IndexCoordination {
  alignas(64) sys::RobustMutex mu;       // the index lock
  alignas(64) sys::RobustMutex sync_mu;  // group commit: one flusher at a time
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

// Guarded by the index lock; written by SharedIndex only.
struct IndexLayout {
  uint64_t capacity;    // window slots
  uint64_t win_offset;  // message id sits in window slot (id + win_offset) % capacity
  uint64_t heap_cap;
  uint64_t ovf_cap;
  uint64_t region_gen;
  uint64_t count;      // live messages
  uint64_t ovf_count;  // of them in the overflow table
  uint64_t queued;     // of them in state kQueued
  uint64_t heap_size;  // timer heap items
  uint64_t due_size;   // due heap items
  uint64_t low_id;     // the window's first id
  uint64_t cursor;     // no queued message has a lower id
  uint64_t leased;
  uint64_t dedup_cap;   // dedup table slots (0: none yet)
  uint64_t dedup_used;  // occupied dedup slots, expired ones included until a sweep
  uint64_t group_cap;   // group table slots (0: none yet)
  uint64_t group_used;  // occupied group table slots (groups and members)
  uint64_t blocked;     // entries in state kBlocked
  // 1 while resize() moves entries: a holder killed then leaves a region laid out for
  // neither geometry, which only a replay (reset()) mends, and nothing may read meanwhile.
  uint32_t resizing;
};

// A queue's subscriptions (issue 46; docs/format.md, "Views"): subscription k (view k,
// 1..kSubscriptions) in slot k - 1 of view 0's table. Its state is in an index of its own
// (DIR/subs/k.index), guarded by view 0's lock. Written by queue::apply_record() (SUB records).
inline constexpr uint32_t kSubscriptions = 16;
inline constexpr uint32_t kSubscriptionName = 48;
struct Subscription {
  uint64_t from;   // the first message id it gets
  uint64_t added;  // storage::Pos::pack() of its SUB add record
  uint32_t active;  // 1: added and not removed since
  uint32_t name_len;
  char name[kSubscriptionName];
  uint32_t max_receives;  // its own (its SUB add's t1); 0: the queue's
  uint32_t reserved;
};
static_assert(sizeof(Subscription) == 80);

// Guarded by the index lock; written by queue::apply_record() (see above for the rest).
struct QueueCache {
  uint64_t next_id;
  uint64_t log_end;  // storage::Pos::pack() of where the next record goes
  uint64_t purged_through;
  uint64_t sent_total;
  uint64_t acked_total;
  uint64_t dead_total;
  uint64_t expired_total;  // dropped by a retention limit
  uint64_t nacked_total;
  uint64_t received_total;     // deliveries: LEASEs that raised a receive count
  uint64_t redelivered_total;  // of them, to a count above 1
  uint64_t bytes_live;
  uint64_t paused;      // 1: receives deliver nothing (a PAUSE record, Queue::pause)
  uint64_t kept_width;  // KeptBucket width in ns (0: none noted yet)
  KeptBucket kept[kKeptBuckets];
  // This boot's clock anchors, oldest first (at most kClockAnchors: readers clamp
  // clock_n), and where the first of them is.
  uint32_t clock_n;
  uint64_t clock_first;
  ClockAnchor clock[kClockAnchors];
  // View 0's only (a subscription's index leaves it empty).
  Subscription subs[kSubscriptions];
};

// Guarded by the index lock; written by queue::LeaseOwners and kept by a rebuild.
struct OwnerRegistry {
  uint32_t owners_claimed;             // number of claimed owner slots
  uint8_t owner_claimed[kOwnerSlots];  // slot k is held by a live process's OFD lock on byte k of dir/owners
  int32_t owner_pid[kOwnerSlots];      // the pid its claimant saw for itself (shown by list(), never trusted)
  // Boot time of the last receive or extend that renewed a lease bound to slot k, in tenths
  // of a second (renew_stamp(); 0: none since it was claimed; 32 bits so that the header
  // stays one page, wrapping after 13 years of uptime); shown by stats() as the holder's time
  // since its last renewal. One store per lease taken or extended, under the lock.
  uint32_t owner_renew_ds[kOwnerSlots];
};

// Guarded by the index lock; recounted by a rebuild.
struct DiskBookkeeping {
  uint64_t compacted_through;  // every segment <= this was removed by compaction
  uint64_t spares;             // spare segment files (Log::make_spare) on disk
  uint64_t spare_bytes;        // their sizes, summed
  uint64_t next_reap_ns;       // boot time of the next check for dead lease owners
  uint64_t rebuilds;           // reset()s so far: a compaction tells whether one came between its holds
};

struct alignas(64) IndexHeader {
  IndexIdentity ident;
  IndexCoordination coord;
  alignas(64) IndexLayout layout;
  QueueCache cache;
  DiskBookkeeping disk;
  OwnerRegistry registry;
};

// Every process that maps the index shares these words, also across builds for other
// targets on one machine (format_word() refuses a different layout, not a different
// atomicity). On a 32-bit target (armhf: ARMv7, LDREXD/STREXD) the 64-bit atomics must still
// be lock-free, so no process-private lock stands in for them, and 8-aligned, as those
// instructions need. The futex words are what the kernel reads: 32 bits, 4-aligned.
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the shared index needs lock-free 64-bit atomics");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "the shared index needs lock-free 32-bit atomics");
static_assert(sizeof(std::atomic<uint64_t>) == 8 && alignof(std::atomic<uint64_t>) == 8);
static_assert(sizeof(std::atomic<uint32_t>) == 4 && alignof(std::atomic<uint32_t>) == 4);
static_assert(alignof(uint64_t) == 8, "the index layout assumes 8-aligned 64-bit fields (not i386's 4)");
static_assert(offsetof(IndexCoordination, durable_end) % 64 == 0 && offsetof(IndexCoordination, wake_seq) % 64 == 0 &&
              offsetof(IndexCoordination, room_seq) % 64 == 0 && offsetof(IndexCoordination, durable_seq) % 4 == 0 &&
              offsetof(IndexHeader, coord) % 64 == 0);
// The region's arrays sit at multiples of their element sizes from a page boundary, so
// their 64-bit fields are 8-aligned too.
static_assert(alignof(Entry) == 8 && alignof(HeapItem) == 8 && alignof(OvfEntry) == 8 && alignof(DedupSlot) == 8 &&
              alignof(GroupSlot) == 8);

static_assert(offsetof(IndexHeader, cache) == offsetof(IndexHeader, layout) + sizeof(IndexLayout) &&
                  offsetof(IndexHeader, registry) + sizeof(OwnerRegistry) <= sizeof(IndexHeader),
              "seal() checksums layout..registry as one range");
// owner_renew_ds's value for boot time `boot_ns` (never 0), and back to ns.
inline uint32_t renew_stamp(uint64_t boot_ns) {
  const auto ds = static_cast<uint32_t>(boot_ns / 100'000'000);
  return ds == 0 ? 1 : ds;
}
inline uint64_t renew_stamp_ns(uint32_t stamp) { return uint64_t{stamp} * 100'000'000; }
// The header pages; the region follows. (8 KiB since the subscription table.)
inline constexpr uint64_t kHeaderBytes = 8192;
static_assert(sizeof(IndexHeader) <= kHeaderBytes);

// version | sizeof(pthread_mutex_t) | cache line | sizeof(IndexHeader), as LMDB does.
uint64_t format_word();

// A capability for the thread-safety analysis (sys/thread_annotations.h): holding it means
// holding hdr().coord.mu, the index lock, or having an index no other thread or process can reach
// (one attach()ed anonymous, or about to be renamed into place). The operations that read
// or change messages need it (REQUIRES); a test or tool that drives a private index says
// so once with assert_held().
class CAPABILITY("index lock") SharedIndex {
 public:
  SharedIndex() = default;
  ~SharedIndex();
  SharedIndex(const SharedIndex&) = delete;
  SharedIndex& operator=(const SharedIndex&) = delete;

  // Maps `path`. With `fresh`, (re)creates it: mutexes initialised, region empty; only a
  // first opener (no other process attached) may do that. Without it, validates magic,
  // format word and bounds. `anonymous` keeps the index in private memory (read-only users).
  // `mode`: what a fresh file gets whatever the umask (a queue's state-file mode,
  // sys/file_modes.h); an existing one this process owns is set to it too.
  // `io` opens, removes and allocates the file (empty: the default backend's plain calls).
  // `crashpoint` is called at the named steps a crash test may kill the process at (the
  // queue's Env::crashpoint(); empty: none), so this layer needs no Env.
  Status attach(const std::string& path, bool fresh, bool anonymous = false, mode_t mode = 0600,
                std::shared_ptr<io::Io> io = {}, std::function<void(const char*)> crashpoint = {});
  // True when the mapped header matches this build and boot, and its geometry and counters
  // are in bounds (a rebuild reads the old entries' lease owners only then).
  bool reusable() const;

  // Tells the analysis this thread holds the index: hdr().coord.mu's lock() or try_lock() returned
  // kOk or kOwnerDied, or the index is private (see above). Checks nothing.
  void assert_held() const ASSERT_CAPABILITY(this) {}

  IndexHeader& hdr() { return *hdr_; }
  const IndexHeader& hdr() const { return *hdr_; }
  bool attached() const { return hdr_ != nullptr; }
  // Clean close: the last process to detach seals the index (lock held, region mapped).
  void seal();
  // For the first opener: false when the index was sealed and has changed since (damage
  // while nobody had it open). Clears the seal either way.
  bool unseal();

  // Unmaps the region's pages from this process (they stay in the file and the page cache):
  // the first opener reads all of it to validate it, and a consumer's RSS must not keep the
  // whole backlog's index for that.
  void drop_resident();
  // Must be called with the lock held, before touching the region: remaps if it grew.
  Status refresh();

  // Empties the region but the dedup table (counts to zero, the window starting at
  // next_id); the caller then replays the log or has purged everything (a dedup id outlives
  // its message). Lock held.
  Status reset() REQUIRES(this);

  // The operations below need the lock. A slot names a live message until the next
  // insert, erase or set(); insert, set and reserve may grow (remap) the region, which
  // invalidates every Entry reference.
  int64_t find(uint64_t id) const REQUIRES(this);  // slot or -1
  uint64_t id_of(uint32_t slot) const REQUIRES(this);
  // An out-of-range slot (damage) gives a scratch entry and records the damage.
  Entry& entry(uint32_t slot) REQUIRES(this) {
    if (slot < wcap_) return win_[slot];
    if (slot - wcap_ < ocap_) return ovf_[slot - wcap_].e;
    return bad_slot(slot);
  }
  // When the message can next be received (a queued one's key is rounded down to 1 us).
  uint64_t key(uint32_t slot) const REQUIRES(this);
  // Adds message `id` (not present): queued if `key` <= `now` and `priority` is the
  // default, else ready at `key`.
  Result<uint32_t> insert(uint64_t id, const Entry& e, uint64_t key, uint64_t now,
                          uint8_t priority = kDefaultPriority) REQUIRES(this);
  // Makes room now so that inserting the ids next_id .. next_id + more - 1 (ready at a later
  // time when `delayed`) cannot fail.
  Status reserve(uint64_t more, bool delayed) REQUIRES(this);
  // Gives the message in `slot` state kReady or kLeased and the time it can next be
  // received (its item goes to the timer heap; a queued message gets one). Cannot remap.
  Status set(uint32_t slot, State state, uint64_t key) REQUIRES(this);
  void erase(uint32_t slot) REQUIRES(this);
  // The message to deliver next if one can be received at `now`: the lower of the queue
  // head and the due heap's top, after moving the timer items due at `now` into the due
  // heap; -1 if none. Moves the cursor.
  int64_t next(uint64_t now) REQUIRES(this);
  // The earliest time anything can be received (UINT64_MAX: nothing is queued).
  uint64_t next_key() REQUIRES(this);
  // Grows the heaps' array now so that `more` messages can leave the queue without a remap.
  Status reserve_heap(uint64_t more) REQUIRES(this);
  // Once a big backlog has drained, lays the region out again at a fraction of its size and
  // punches the freed tail out of the file, if that frees at least `min_gain` bytes; else
  // does nothing. Remaps, so no slot may be held. The file keeps its size
  // (docs/durability.md, "The shared index").
  Status shrink(uint64_t min_gain = kShrinkMinBytes) REQUIRES(this);
  // Punches the file's blocks past the region out (best effort). shrink() does it for what
  // it frees; a rebuild does it too, for the tail a process killed inside a shrink left
  // allocated (resized, not yet punched), which no later shrink would free.
  void punch_tail();

  // For stats, list and peek: the timer heap's items (in heap order), the due heap's (all
  // ready now; keys are due_key()s) and the queued messages from the cursor (or from id
  // `from`, if higher) on (in id order; f returns false to stop).
  const HeapItem* heap_begin() const { return heap_; }
  uint64_t heap_size() const { return hdr_->layout.heap_size; }
  const HeapItem* due_begin() const { return heap_ + hcap_ - due_size(); }
  uint64_t due_size() const { return std::min(hdr_->layout.due_size, hcap_); }
  template <class F>
  void for_each_queued(F&& f, uint64_t from = 0) {
    uint64_t end = std::min(hdr_->cache.next_id, hdr_->layout.low_id + wcap_);
    // (From the cursor, which check_header() keeps at or above low_id.)
    const uint64_t first = std::max({hdr_->layout.cursor, hdr_->layout.low_id, from});
    for (uint64_t id = first, left = hdr_->layout.queued; id < end && left != 0; ++id) {
      auto s = wslot(id);
      if (win_[s].state != State::kQueued) continue;
      --left;
      if (!f(s, id)) return;
    }
  }
  // How many queued messages have ids above `after` (list's "N more"): the queued count,
  // less those at or below `after`, or those above it counted, whichever side is shorter.
  uint64_t queued_above(uint64_t after) const;
  // Every live message: the overflow table, then the window in id order.
  template <class F>
  void for_each_entry(F&& f) {
    for (uint64_t s = 0; s < ocap_; ++s)
      if (ovf_[s].id != 0) f(static_cast<uint32_t>(wcap_ + s), ovf_[s].id, ovf_[s].e);
    uint64_t end = std::min(hdr_->cache.next_id, hdr_->layout.low_id + wcap_);
    for (uint64_t id = hdr_->layout.low_id; id < end; ++id) {
      auto s = wslot(id);
      if (win_[s].state != State::kEmpty) f(s, id, win_[s]);
    }
  }
  // What a read of the window from the file needs (window_view(), lock held). The read,
  // scan_window(), goes through pread, not the mapping: a scan of every message (compaction)
  // then leaves none of the window mapped in this process, and it may run without the lock:
  // entries changed meanwhile may be read torn, fit for estimates only, and a resize
  // meanwhile (same_geometry() false) makes the whole read meaningless.
  struct WindowView {
    uint64_t low_id, end, win_offset, wcap, gen;
  };
  WindowView window_view() const {
    return {hdr_->layout.low_id, std::min(hdr_->cache.next_id, hdr_->layout.low_id + wcap_), hdr_->layout.win_offset, wcap_, mapped_gen_};
  }
  bool same_geometry(const WindowView& v) const { return mapped_current() && v.gen == mapped_gen_; }
  // f(id, entry) for each live entry of the window in id order; false if the file could not
  // be read (the anonymous index, private to its process, is read from memory).
  template <class F>
  bool scan_window(const WindowView& v, F&& f) const {
    constexpr uint64_t kChunk = 16384;
    std::vector<Entry> buf(static_cast<size_t>(std::min<uint64_t>(kChunk, v.end - std::min(v.end, v.low_id))));
    for (uint64_t id = v.low_id; id < v.end;) {
      const uint64_t slot = (id + v.win_offset) % v.wcap;
      const uint64_t n = std::min({kChunk, v.end - id, v.wcap - slot});  // up to the wrap
      if (!read_region(slot * sizeof(Entry), n * sizeof(Entry), buf.data())) return false;
      for (uint64_t i = 0; i < n; ++i)
        if (buf[i].state != State::kEmpty) f(id + i, buf[i]);
      id += n;
    }
    return true;
  }
  // f(id, entry) for each entry of the overflow table (lock held).
  template <class F>
  void for_each_overflow(F&& f) const {
    for (uint64_t s = 0; s < ocap_; ++s)
      if (ovf_[s].id != 0) f(ovf_[s].id, ovf_[s].e);
  }
  // for_each_entry() through scan_window() (lock held).
  template <class F>
  bool scan_entries(F&& f) const {
    for_each_overflow(f);
    return scan_window(window_view(), f);
  }
  // Deduplication ids (see DedupSlot; lock held). dedup_probe() calls f(loc, expires) for
  // each slot with `hash` until f returns true. dedup_reserve() makes room for `more`
  // dedup_insert()s, first forgetting the slots expired at `now`, then growing the
  // table (a remap); kQueueFull when kMaxDedup would not do. dedup_insert() cannot fail
  // after it. dedup_oldest_seq(): the lowest segment an unexpired slot names (compaction
  // keeps it), or UINT64_MAX.
  template <class F>
  void dedup_probe(uint64_t hash, F&& f) const {
    if (dcap_ == 0) return;
    if (hash == 0) hash = 1;  // as dedup_insert() stores it: 0 marks an empty slot
    const uint64_t m = dcap_ - 1;
    for (uint64_t i = 0, s = hash & m; i < dcap_ && ded_[s].hash != 0; ++i, s = (s + 1) & m) {
      if (ded_[s].hash == hash && f(ded_[s].loc, ded_[s].expires)) return;
    }
  }
  Status dedup_reserve(uint64_t more, uint64_t now) REQUIRES(this);
  void dedup_clear();  // forgets every id: a replay rebuilds them
  void dedup_insert(uint64_t hash, uint64_t loc, uint64_t expires) REQUIRES(this);
  uint64_t dedup_oldest_seq(uint64_t now) const;
  // Unexpired remembered ids, for stats (O(table)).
  uint64_t dedup_live(uint64_t now) const;
  // Replay after ack (see KeptBucket; lock held). kept_note() counts the ack at `key` of a
  // message of `bytes` payload bytes whose MSG record is in segment `seq`, for a window of
  // `keep` ns (0: does nothing). kept_oldest_seq(): the lowest segment a bucket still inside
  // the window at `now` names (UINT64_MAX: none). kept_live(): the acks and bytes of those
  // buckets. kept_clear(): forgets them all (a replay notes them again).
  void kept_note(uint64_t key, uint64_t seq, uint64_t bytes, uint64_t keep) REQUIRES(this);
  uint64_t kept_oldest_seq(uint64_t now, uint64_t keep) const;
  void kept_live(uint64_t now, uint64_t keep, uint64_t* acks, uint64_t* bytes) const;
  void kept_clear();

  // Ordered groups (see GroupSlot; lock held). group_reserve(): room for `more` slots (a
  // grouped message takes one, and one more when its group is new); may remap. group_join():
  // makes message `id`, just inserted in `slot`, a member of the group with hash `hash`,
  // blocked unless it is the group's first; a replay may join a group's members out of id
  // order (compaction copies), and a member that comes before the first makes the first
  // blocked. Cannot fail after group_reserve(2) and reserve_heap(1). erase() of a member
  // unlinks it and, for the first, makes the next one receivable (promotions() counts that,
  // in this process, so that a caller knows to wake a long poll).
  Status group_reserve(uint64_t more) REQUIRES(this);
  void group_join(uint32_t slot, uint64_t id, uint64_t hash) REQUIRES(this);
  uint64_t promotions() const { return promotions_; }
  // The first member of the group of blocked message `id` (0: none, or `id` is not blocked).
  uint64_t group_first(uint64_t id) const;
  // The hash of message `id`'s group as group_join() takes it (its top bit cleared: the same
  // group), or 0 if it is in none.
  uint64_t group_of(uint64_t id) const;
  // Every blocked message (O(group table)); f(slot, id).
  template <class F>
  void for_each_blocked(F&& f) REQUIRES(this) {
    if (hdr_->layout.blocked == 0) return;
    for (uint64_t s = 0; s < gcap_; ++s) {
      const uint64_t id = grp_[s].key;
      if (id == 0 || (id & kGroupTag) != 0) continue;
      const int64_t slot = find(id);
      if (slot >= 0 && entry(static_cast<uint32_t>(slot)).state == State::kBlocked) f(static_cast<uint32_t>(slot), id);
    }
  }

  // Returns "" or a description of the first broken invariant (O(n); tests and verify).
  std::string check_invariants() const REQUIRES(this);

  // Damage checks for every lock (see the top of this file). check_file(): the file still
  // covers what this process maps, before the lock is taken and before other reads of the
  // header outside it (a sync, the end of a long-poll wait). Another process may have
  // truncated it, and a page past the end of a file is a SIGBUS: when it has, kCorrupt
  // naming the file, now and at every later call, and this process's mappings of the index
  // are replaced by private zeroed memory, so that no thread of it touches the file again
  // (docs/durability.md, "An index truncated by another process"). One fstat.
  // check_header(): "" or what is wrong with the header's counters and geometry against the
  // mapping's; with `sent`, next_id against sent_through too (O(1), lock held, after a
  // successful refresh(), which made the mapping the header's).
  Status check_file();
  // check_file() for the lock path, which every call takes: trusts a check of this process
  // made in the last 100 ms (a monotonic coarse clock, no system call) unless a SIGBUS was
  // caught since. A file cut within that window is still caught: the lock word's page past
  // the end faults at once, the guard zero-fills it and sets the flag, and the caller checks
  // faulted() right after taking the lock; a cut that leaves the header and takes the
  // region is the window no check closes (a cut in the middle of a locked call), guarded
  // the same way.
  Status check_file_recent();
  bool faulted() const { return faulted_.load(std::memory_order_acquire); }
  std::string check_header(bool sent = true) const;
  // The first damage a use found since clear_damage(), or "".
  const std::string& damage() const { return damage_; }
  void clear_damage() { damage_.clear(); }
  // Records damage found by a use, here or by the caller (the first one is kept).
  void damaged(const std::string& what) const {
    if (damage_.empty()) damage_ = what;
  }
  // For a rebuild: maps the region as refresh() does, or, when the header's geometry is not
  // sound (damage), lays the smallest region out again, so that a replay can fill it.
  Status prepare_rebuild();

 private:
  Status map_region();
  bool mapped_current() const;
  // Identity (magic, format word, boot) and geometry within the file; with `counters`, the
  // counts and positions too, which need the lock to be read consistently.
  bool sound(bool counters) const;
  uint64_t checksum() const;
  int64_t queue_head();  // slot of the lowest queued id, or -1; moves the cursor
  // Re-lays the region out with the given capacities, keeping every entry (kSame: the
  // dedup or group table keeps its size).
  static constexpr uint64_t kSame = UINT64_MAX;
  Status resize(uint64_t wcap, uint64_t hcap, uint64_t ocap, uint64_t dcap = kSame, uint64_t gcap = kSame);
  // The group table (see GroupSlot): the slot holding `key` or -1; placing (the table has
  // room); removing slot `hole`.
  int64_t gfind(uint64_t key) const;
  void gplace(const GroupSlot& g);
  void gerase(uint64_t hole);
  // Takes the entry in `slot` (message `id`) out of its heap or the queue: kBlocked, its
  // receive time kept in its member slot.
  void block(uint32_t slot, uint64_t id) REQUIRES(this);
  // The blocked message `id` becomes its group's first: into the timer heap at its receive time.
  void promote(uint64_t id) REQUIRES(this);
  // Unlinks message `id` (erased) from its group, if it is in one.
  void group_leave(uint64_t id) REQUIRES(this);
  // Places a dedup slot by probing (the table has room).
  void dedup_place(const DedupSlot& d);
  // Makes the ids first..last (first >= low_id, none present yet) fit in the window: grows
  // it, or moves the oldest messages to the overflow table when it is mostly holes.
  Status fit(uint64_t first, uint64_t last) REQUIRES(this);
  Status ovf_reserve(uint64_t more);
  uint32_t ovf_place(uint64_t id, const Entry& e);
  Entry& entry_of(uint64_t id) REQUIRES(this);
  void advance_low(uint64_t limit);  // past empty slots, never past `limit`
  // The two heaps (see the top of this file): the timer heap's item i is heap_[i], the due
  // heap's heap_[hcap_ - 1 - i].
  enum class Heap : uint8_t { kTimer, kDue };
  struct HeapAt {
    Heap heap;
    int64_t i;  // -1: damage (recorded)
  };
  static constexpr uint64_t kHeapArity = 4;
  // An entry's heap_pos for item i of heap w, and back.
  static uint32_t pos_word(Heap w, uint64_t i) { return static_cast<uint32_t>(w == Heap::kTimer ? i : (i | kDueBit)); }
  static Heap heap_of(uint32_t pos) { return (pos & kDueBit) != 0 ? Heap::kDue : Heap::kTimer; }
  HeapItem& item(Heap w, uint64_t i) { return w == Heap::kTimer ? heap_[i] : heap_[hcap_ - 1 - i]; }
  const HeapItem& item(Heap w, uint64_t i) const { return w == Heap::kTimer ? heap_[i] : heap_[hcap_ - 1 - i]; }
  uint64_t& size_of(Heap w) { return w == Heap::kTimer ? hdr_->layout.heap_size : hdr_->layout.due_size; }
  void push(Heap w, uint32_t slot, uint64_t id, uint64_t key) REQUIRES(this);
  void remove(HeapAt at) REQUIRES(this);  // the last item fills the hole
  void move_item(Heap w, uint64_t to, const HeapItem& it) REQUIRES(this);
  void sift_up(Heap w, uint64_t i) REQUIRES(this);
  void sift_down(Heap w, uint64_t i) REQUIRES(this);
  static bool less(const HeapItem& a, const HeapItem& b) {
    return a.key < b.key || (a.key == b.key && a.id < b.id);
  }

  uint32_t wslot(uint64_t id) const { return static_cast<uint32_t>((id + hdr_->layout.win_offset) % wcap_); }
  // `len` bytes of the region from `off`: pread, or a copy of the anonymous index's memory.
  bool read_region(uint64_t off, uint64_t len, void* out) const;
  Entry& bad_slot(uint32_t slot);
  // Where the heap item of the entry with heap_pos `pos` is, checked against its id; i = -1
  // (and damage recorded) if it is not there.
  HeapAt heap_entry(uint32_t pos, uint64_t id) const;

  std::shared_ptr<io::Io> io_;
  std::function<void(const char*)> crashpoint_;  // attach()'s; may be empty
  int fd_ = -1;
  bool anonymous_ = false;
  std::string path_;
  std::atomic<bool> lost_{false};  // check_file() found the file cut short
  std::atomic<bool> faulted_{false};  // a SIGBUS on a mapping of it was caught (sys/sigbus_guard.h)
  std::string lost_why_;           // written once, before lost_ is set
  IndexHeader* hdr_ = nullptr;
  void* region_ = nullptr;
  uint64_t region_len_ = 0;
  // Bytes of the file this process maps (header + region), for check_file() in threads
  // that do not hold the lock. Stored after the file has grown and the new range is
  // mapped; check_file() loads it before its fstat, so a grow by this process's lock
  // holder between the two can only make the file look longer, never cut.
  std::atomic<uint64_t> covered_{0};
  std::atomic<uint64_t> checked_at_{0};  // CLOCK_MONOTONIC_COARSE of the last passed check_file()
  uint64_t mapped_gen_ = UINT64_MAX;
  // The capacities the mapping was laid out with (the header's may be newer).
  uint64_t wcap_ = 0, hcap_ = 0, ocap_ = 0, dcap_ = 0, gcap_ = 0;
  Entry* win_ = nullptr;
  HeapItem* heap_ = nullptr;
  OvfEntry* ovf_ = nullptr;
  DedupSlot* ded_ = nullptr;
  GroupSlot* grp_ = nullptr;
  uint64_t promotions_ = 0;
  mutable std::string damage_;
  Entry scratch_{};  // what an out-of-range slot gives (entry())
};

}  // namespace spool::index
