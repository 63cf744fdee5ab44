#include "index/index.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <type_traits>
#include <vector>

#include "sys/clock.h"
#include "sys/file_modes.h"
#include "sys/sigbus_guard.h"

namespace spool::index {
namespace {

constexpr uint64_t kCacheLine = 64;
constexpr uint64_t region_bytes(uint64_t wcap, uint64_t hcap, uint64_t ocap, uint64_t dcap = 0, uint64_t gcap = 0) {
  return wcap * sizeof(Entry) + hcap * sizeof(HeapItem) + ocap * sizeof(OvfEntry) + dcap * sizeof(DedupSlot) +
         gcap * sizeof(GroupSlot);
}
// The open-addressing tables (overflow, dedup, group): a power-of-two number of slots, linear
// probing, backward-shift deletion, key 0 marks an empty slot. No walk goes round more than
// once: a table with no empty slot (damage; the load is kept <= 3/4) must not make a walk
// go round forever under the lock.
uint64_t key_of(const OvfEntry& o) { return o.id; }
uint64_t key_of(const DedupSlot& d) { return d.hash; }
uint64_t key_of(const GroupSlot& g) { return g.key; }
// Where a key's probe starts. Ids and group keys are mixed, so that neighbouring ids do not
// form one long probe run; a dedup key is a hash already.
template <class T>
uint64_t home(uint64_t key, uint64_t cap) {
  if constexpr (!std::is_same_v<T, DedupSlot>) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
  }
  return key & (cap - 1);
}
constexpr int64_t kNoRoom = -2;
// The slot holding `key` (-1: none), or with `vacant` the first empty slot of its probe;
// kNoRoom: a whole lap found no empty slot.
template <class T>
int64_t probe(const T* t, uint64_t cap, uint64_t key, bool vacant = false) {
  uint64_t s = home<T>(key, cap);
  for (uint64_t i = 0; i < cap; ++i, s = (s + 1) & (cap - 1)) {
    if (key_of(t[s]) == 0) return vacant ? static_cast<int64_t>(s) : -1;
    if (!vacant && key_of(t[s]) == key) return static_cast<int64_t>(s);
  }
  return kNoRoom;
}
// Puts `x` in the first empty slot of its probe: that slot, or kNoRoom.
template <class T>
int64_t place(T* t, uint64_t cap, const T& x) {
  const int64_t s = probe(t, cap, key_of(x), true);
  if (s >= 0) t[s] = x;
  return s;
}
// Empties slot `hole` (backward shift: no tombstones).
template <class T>
void vacate(T* t, uint64_t cap, uint64_t hole) {
  const uint64_t m = cap - 1;
  uint64_t probes = 0;
  for (uint64_t s = (hole + 1) & m; key_of(t[s]) != 0 && ++probes < cap; s = (s + 1) & m) {
    const uint64_t h = home<T>(key_of(t[s]), cap);
    // Move s into the hole unless its home lies cyclically in (hole, s].
    const bool stays = hole <= s ? (h > hole && h <= s) : (h > hole || h <= s);
    if (!stays) {
      t[hole] = t[s];
      hole = s;
    }
  }
  t[hole] = T{};
}
// A table's slots, copied aside while resize() lays the region out again: all of them when
// it keeps its size (`whole`: they go back slot for slot, a slot's place depending on the
// table's size only), else the occupied ones, to be placed again (put_back()).
template <class T>
std::vector<T> set_aside(const T* t, uint64_t cap, bool whole) {
  if (whole) return std::vector<T>(t, t + cap);
  std::vector<T> v;
  for (uint64_t s = 0; s < cap; ++s)
    if (key_of(t[s]) != 0) v.push_back(t[s]);
  return v;
}
// Refills a table from set_aside(t, cap, whole): put(x) places each slot of one not whole.
template <class T, class Put>
void put_back(T* t, uint64_t cap, const std::vector<T>& v, bool whole, Put put) {
  if (cap == 0) return;
  if (whole) {
    std::memcpy(static_cast<void*>(t), v.data(), cap * sizeof(T));
    return;
  }
  std::memset(static_cast<void*>(t), 0, cap * sizeof(T));
  for (const T& x : v) put(x);
}
void set_geometry(IndexHeader& h, uint64_t wcap, uint64_t hcap, uint64_t ocap, uint64_t dcap, uint64_t gcap) {
  h.layout.capacity = wcap;
  h.layout.heap_cap = hcap;
  h.layout.ovf_cap = ocap;
  h.layout.dedup_cap = dcap;
  h.layout.group_cap = gcap;
}
// The smallest table (a power of two, at least `min`) of which `n` slots are at most 3/4;
// 0 when that is more than `max`.
uint64_t slots_for(uint64_t n, uint64_t min, uint64_t max) {
  return n > max / 4 * 3 ? 0 : std::max(min, std::bit_ceil((n * 4 + 2) / 3));
}
// pread of all `len` bytes at `off`: false on an error or a short file.
bool pread_all(int fd, void* to, uint64_t len, uint64_t off) {
  for (uint64_t done = 0; done < len;) {
    const ssize_t got = ::pread(fd, static_cast<char*>(to) + done, static_cast<size_t>(len - done),
                                static_cast<off_t>(off + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    done += static_cast<uint64_t>(got);
  }
  return true;
}
// A fresh index's file: the header and the smallest region.
constexpr uint64_t kFreshBytes = kHeaderBytes + region_bytes(kMinWindow, kMinHeap, kMinOverflow);
// A queued entry keeps its key in heap_pos and key_hi, in units of 1024 ns: 48 bits last
// 9 years of uptime.
constexpr int kQueuedKeyShift = 10;

}  // namespace

uint64_t format_word() {
  return (uint64_t{kIndexVersion} << 48) | (uint64_t{sizeof(pthread_mutex_t)} << 32) |
         (kCacheLine << 16) | sizeof(IndexHeader);
}

SharedIndex::~SharedIndex() {
  if (!anonymous_) {
    sys::unguard_mapping(region_);
    sys::unguard_mapping(hdr_);
  }
  if (region_ != nullptr) ::munmap(region_, region_len_);
  if (hdr_ != nullptr) ::munmap(hdr_, kHeaderBytes);
  if (fd_ >= 0) ::close(fd_);
}

Status SharedIndex::attach(const std::string& path, bool fresh, bool anonymous, mode_t mode,
                           std::shared_ptr<io::Io> io, std::function<void(const char*)> crashpoint) {
  anonymous_ = anonymous;
  io_ = io ? std::move(io) : io::default_io();
  crashpoint_ = std::move(crashpoint);
  void* p = nullptr;
  if (anonymous) {
    p = ::mmap(nullptr, kHeaderBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    fresh = true;
  } else {
    // A fresh index is a new file: whatever has the name (a leftover, or a link planted to
    // make us write through it) is removed first, and O_EXCL | O_NOFOLLOW refuse one that
    // reappears. An existing index is never created by opening it, nor followed.
    if (int r = fresh ? io_->unlink(path) : 0; r != 0 && r != -ENOENT) return errno_status(-r, "remove " + path);
    path_ = path;
    fd_ = io_->open(path, O_RDWR | O_NOFOLLOW | (fresh ? O_CREAT | O_EXCL : 0), mode);
    if (fd_ < 0) {
      const int err = -fd_;
      fd_ = -1;
      return errno_status(err, "open index " + path);
    }
    struct stat st {};
    if (::fstat(fd_, &st) != 0) return errno_status(errno, "stat " + path);
    sys::set_own_mode(fd_, mode);  // past the umask
    if (fresh) {
      // Allocated, not sparse: a page of a sparse file that cannot get a block on a full file
      // system is a SIGBUS at the first store through the mapping (resize() does the same).
      if (int r = io_->allocate(fd_, 0, kFreshBytes); r != 0) {
        return errno_status(-r, "allocate index " + path);
      }
    } else if (static_cast<uint64_t>(st.st_size) < kHeaderBytes) {
      return Status(Code::kCorrupt, path + ": index is truncated");
    }
    p = ::mmap(nullptr, kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  }
  if (p == MAP_FAILED) return errno_status(errno, "map index " + path);
  hdr_ = static_cast<IndexHeader*>(p);
  if (!anonymous) {
    sys::guard_mapping(hdr_, kHeaderBytes, PROT_READ | PROT_WRITE, &faulted_);
    covered_.store(kHeaderBytes, std::memory_order_release);
  }
  if (fresh) {
    std::memset(static_cast<void*>(hdr_), 0, kHeaderBytes);
    new (hdr_) IndexHeader();
    if (int r = hdr_->coord.mu.init(); r != 0) return errno_status(r, "init index mutex");
    if (int r = hdr_->coord.sync_mu.init(); r != 0) return errno_status(r, "init sync mutex");
    set_geometry(*hdr_, kMinWindow, kMinHeap, kMinOverflow, 0, 0);
    hdr_->layout.region_gen = 1;
    hdr_->cache.next_id = 1;
    hdr_->layout.low_id = 1;
    hdr_->layout.cursor = 1;
    hdr_->ident.file_bytes = kFreshBytes;
    std::string boot = sys::boot_id();
    std::strncpy(hdr_->ident.boot_id, boot.c_str(), sizeof hdr_->ident.boot_id - 1);
    hdr_->ident.format = format_word();
    std::atomic_thread_fence(std::memory_order_release);
    hdr_->ident.magic = kIndexMagic;  // last: a half-initialised file never looks valid
    return map_region();
  }
  if (!sound(false)) {
    return Status(Code::kIncompatible,
                  path + ": index was built by an incompatible spool build or another boot; "
                         "close every process using the queue so the next opener rebuilds it");
  }
  return {};
}

uint64_t SharedIndex::checksum() const {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  // The parts guarded by the lock, which sit together (index.h): layout, cache, disk, registry.
  const char* first = reinterpret_cast<const char*>(&hdr_->layout);
  const char* last = reinterpret_cast<const char*>(&hdr_->registry) + sizeof(OwnerRegistry);
  XXH3_64bits_update(st, first, static_cast<size_t>(last - first));
  const uint64_t len = region_bytes(hdr_->layout.capacity, hdr_->layout.heap_cap, hdr_->layout.ovf_cap, hdr_->layout.dedup_cap, hdr_->layout.group_cap);
  bool read_ok = true;
  // Read, not through the mapping (read_region()): the first open after a clean close and
  // the last close each read the whole region, and through the mapping every page of it
  // would stay mapped in this process (its RSS) though it then touches a small part. The
  // mapping and the file share the page cache: both read the same bytes.
  std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(len, 1u << 20)));
  for (uint64_t done = 0, n = 0; done < len && read_ok; done += n) {
    n = std::min<uint64_t>(buf.size(), len - done);
    read_ok = read_region(done, n, buf.data());
    if (read_ok) XXH3_64bits_update(st, buf.data(), static_cast<size_t>(n));
  }
  // Never 0, which means "not sealed"; a region that cannot be read gives 2, which no
  // checksum equals, so its seal is never trusted.
  uint64_t sum = read_ok ? XXH3_64bits_digest(st) | 1 : 2;
  XXH3_freeState(st);
  return sum;
}

bool SharedIndex::read_region(uint64_t off, uint64_t len, void* out) const {
  if (anonymous_) {
    std::memcpy(out, static_cast<const char*>(region_) + off, len);
    return true;
  }
  return pread_all(fd_, out, len, kHeaderBytes + off);
}

void SharedIndex::seal() {
  if (region_ == nullptr || !mapped_current()) return;
  hdr_->ident.seal = checksum();
}

bool SharedIndex::unseal() {
  uint64_t want = hdr_->ident.seal;
  hdr_->ident.seal = 0;
  if (want == 0) return true;
  return region_ != nullptr && mapped_current() && checksum() == want;
}

bool SharedIndex::mapped_current() const {
  return mapped_gen_ == hdr_->layout.region_gen && wcap_ == hdr_->layout.capacity && hcap_ == hdr_->layout.heap_cap &&
         ocap_ == hdr_->layout.ovf_cap && dcap_ == hdr_->layout.dedup_cap && gcap_ == hdr_->layout.group_cap;
}

bool SharedIndex::reusable() const { return sound(true); }

bool SharedIndex::sound(bool counters) const {
  if (hdr_->ident.magic != kIndexMagic || hdr_->ident.format != format_word()) return false;
  std::string boot = sys::boot_id();
  if (std::strncmp(hdr_->ident.boot_id, boot.c_str(), sizeof hdr_->ident.boot_id) != 0) return false;
  const IndexHeader& h = *hdr_;
  auto pow2_in = [](uint64_t v, uint64_t min, uint64_t max) { return v >= min && v <= max && std::has_single_bit(v); };
  // Bounds: a damaged or hostile file must not make us map or index out of range, nor
  // probe the overflow table forever. Slots are 32-bit: window + overflow < 2^32.
  if (h.layout.capacity < kMinWindow || h.layout.capacity % 8 != 0 || h.layout.capacity > (1ull << 31) ||
      !pow2_in(h.layout.heap_cap, kMinHeap, 1ull << 31) || !pow2_in(h.layout.ovf_cap, kMinOverflow, 1ull << 30) ||
      (h.layout.dedup_cap != 0 && !pow2_in(h.layout.dedup_cap, kMinDedup, kMaxDedup)) ||
      (h.layout.group_cap != 0 && !pow2_in(h.layout.group_cap, kMinGroupSlots, kMaxGroupSlots))) {
    return false;
  }
  // The counters change under the lock only; an attaching process reads them without it.
  if (counters && (h.layout.resizing != 0 || h.layout.count > h.layout.capacity + h.layout.ovf_cap || h.layout.heap_size > h.layout.heap_cap || h.layout.ovf_count * 4 > h.layout.ovf_cap * 3 ||
      h.layout.win_offset >= h.layout.capacity || h.layout.queued > h.layout.count || h.layout.dedup_used * 4 > h.layout.dedup_cap * 3 ||
      h.layout.group_used * 4 > h.layout.group_cap * 3 || h.layout.blocked > h.layout.count || h.layout.low_id == 0 || h.layout.low_id > (1ull << 62) || h.layout.cursor < h.layout.low_id)) {
    return false;
  }
  struct stat st {};
  uint64_t need = kHeaderBytes + region_bytes(h.layout.capacity, h.layout.heap_cap, h.layout.ovf_cap, h.layout.dedup_cap, h.layout.group_cap);
  if (anonymous_) return true;
  return ::fstat(fd_, &st) == 0 && need <= static_cast<uint64_t>(st.st_size);
}

Status SharedIndex::map_region() {
  const uint64_t w = hdr_->layout.capacity, hc = hdr_->layout.heap_cap, oc = hdr_->layout.ovf_cap, dc = hdr_->layout.dedup_cap,
                 gc = hdr_->layout.group_cap;
  uint64_t len = region_bytes(w, hc, oc, dc, gc);
  // A 32-bit process cannot map more than its address space: mmap's length is a size_t, and
  // a longer region would be truncated into a mapping shorter than what is indexed in it.
  if (len > std::numeric_limits<size_t>::max() - kHeaderBytes) {
    return errno_status(ENOMEM, "map index region of " + std::to_string(len) + " bytes (more than this process can address)");
  }
  void* p;
  if (anonymous_) {
    p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  } else {
    // (Every caller made sure the file covers it: sound() checked, or allocate() grew it.)
    p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, kHeaderBytes);
  }
  if (p == MAP_FAILED) return errno_status(errno, "map index region");
  if (!anonymous_) {
    sys::unguard_mapping(region_);
    sys::guard_mapping(p, len, PROT_READ | PROT_WRITE, &faulted_);
  }
  if (region_ != nullptr) ::munmap(region_, region_len_);
  region_ = p;
  region_len_ = len;
  if (!anonymous_) covered_.store(kHeaderBytes + len, std::memory_order_release);
  win_ = static_cast<Entry*>(p);
  heap_ = reinterpret_cast<HeapItem*>(static_cast<char*>(p) + w * sizeof(Entry));
  ovf_ = reinterpret_cast<OvfEntry*>(static_cast<char*>(p) + w * sizeof(Entry) + hc * sizeof(HeapItem));
  ded_ = reinterpret_cast<DedupSlot*>(static_cast<char*>(p) + region_bytes(w, hc, oc));
  grp_ = reinterpret_cast<GroupSlot*>(static_cast<char*>(p) + region_bytes(w, hc, oc, dc));
  mapped_gen_ = hdr_->layout.region_gen;
  wcap_ = w;
  hcap_ = hc;
  ocap_ = oc;
  dcap_ = dc;
  gcap_ = gc;
  return {};
}

void SharedIndex::drop_resident() {
  // A shared file mapping refaults from the file: nothing is lost. A private one would be.
  if (!anonymous_ && region_ != nullptr) (void)::madvise(region_, region_len_, MADV_DONTNEED);
}

Status SharedIndex::refresh() {
  if (mapped_current()) return {};
  // Geometry only: a holder killed in the middle of an operation leaves counters that the
  // repair (replay) must still be able to map and reset.
  if (!sound(false)) return Status(Code::kCorrupt, "index header failed validation");
  return map_region();
}

Status SharedIndex::check_file_recent() {
  constexpr uint64_t kTrustNs = 100'000'000;
  if (!anonymous_ && fd_ >= 0 && !lost_.load(std::memory_order_acquire) && !faulted()) {
    const uint64_t at = checked_at_.load(std::memory_order_relaxed);
    if (at != 0 && sys::coarse_ns() - at < kTrustNs) return {};
  }
  return check_file();
}

Status SharedIndex::check_file() {
  if (anonymous_ || fd_ < 0) return {};
  if (lost_.load(std::memory_order_acquire)) return Status(Code::kCorrupt, lost_why_);
  // Before the fstat (see covered_): read after it, a grow by another thread of this
  // process in between made a file that was long enough look cut.
  const uint64_t mapped = covered_.load(std::memory_order_acquire);
  const bool faulted = faulted_.load(std::memory_order_acquire);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return errno_status(errno, "stat " + path_);
  if (!faulted && static_cast<uint64_t>(st.st_size) >= mapped) {
    checked_at_.store(sys::coarse_ns(), std::memory_order_relaxed);
    return {};
  }
  static std::mutex mu;  // one thread replaces the mappings
  std::lock_guard lock(mu);
  if (!lost_.load(std::memory_order_acquire)) {
    lost_why_ = path_ + ": the index file was cut to " + std::to_string(st.st_size) + " bytes while this process maps " +
                std::to_string(mapped) + (faulted ? " and used it (a SIGBUS, caught)" : "") +
                " (spool never shortens it: another process truncated it). This process no "
                "longer uses it; nothing is lost, the log holds every message: close every process using the queue, "
                "and the next opener rebuilds the index";
    // Private zeroed pages over the same addresses: a thread that reads the header or the
    // region after this (a waiter waking up, a sync) gets zeros, not a SIGBUS.
    auto cover = [](void* at, uint64_t len) {
      if (at != nullptr) {
        (void)::mmap(at, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      }
    };
    cover(hdr_, kHeaderBytes);
    cover(region_, region_len_);
    lost_.store(true, std::memory_order_release);
  }
  return Status(Code::kCorrupt, lost_why_);
}

std::string SharedIndex::check_header(bool sent) const {
  const IndexHeader& h = *hdr_;
  auto n = [](uint64_t v) { return std::to_string(v); };
  if (h.layout.resizing != 0) return "a resize was interrupted";
  if (h.layout.win_offset >= wcap_) return "window offset " + n(h.layout.win_offset) + " >= window size " + n(wcap_);
  if (h.layout.heap_size > hcap_ || h.layout.due_size > hcap_ - h.layout.heap_size) {
    return "heap sizes " + n(h.layout.heap_size) + " and " + n(h.layout.due_size) + " > heap capacity " + n(hcap_);
  }
  if (h.layout.count > wcap_ + ocap_ || h.layout.ovf_count > h.layout.count || h.layout.ovf_count * 4 > ocap_ * 3 || h.layout.queued > h.layout.count ||
      h.layout.leased > h.layout.heap_size + h.layout.due_size || h.layout.blocked > h.layout.count ||
      h.layout.heap_size + h.layout.due_size + h.layout.queued + h.layout.blocked != h.layout.count || h.layout.blocked > hcap_ - h.layout.heap_size - h.layout.due_size) {
    return "counts: " + n(h.layout.count) + " live, " + n(h.layout.ovf_count) + " in the overflow table, " + n(h.layout.queued) +
           " queued, " + n(h.layout.heap_size) + " + " + n(h.layout.due_size) + " in the heaps, " + n(h.layout.leased) + " leased, " +
           n(h.layout.blocked) + " blocked";
  }
  if (h.layout.low_id == 0 || h.layout.low_id > h.layout.cursor || h.layout.cursor > std::max(h.cache.next_id, h.layout.low_id) || h.cache.next_id > (1ull << 62) ||
      (sent && h.coord.sent_through.load(std::memory_order_relaxed) + 1 != h.cache.next_id)) {
    return "ids: low " + n(h.layout.low_id) + ", cursor " + n(h.layout.cursor) + ", next " + n(h.cache.next_id) + ", sent through " +
           n(h.coord.sent_through.load(std::memory_order_relaxed));
  }
  if (h.registry.owners_claimed > kOwnerSlots) return "owner slots claimed: " + n(h.registry.owners_claimed);
  if (h.layout.dedup_used * 4 > dcap_ * 3) return "dedup slots used: " + n(h.layout.dedup_used) + " of " + n(dcap_);
  if (h.layout.group_used * 4 > gcap_ * 3) return "group slots used: " + n(h.layout.group_used) + " of " + n(gcap_);
  return "";
}

Status SharedIndex::prepare_rebuild() {
  auto& h = *hdr_;
  // Every attached process has the same identity (attach() refuses another): what differs
  // from it is damage, and a rebuild makes the file ours again. Written only where it
  // differs: an opener attaches without the lock, and an identity cleared for a moment
  // (the boot id was zeroed, then copied) made it refuse a sound index as "another boot".
  if (h.ident.format != format_word()) h.ident.format = format_word();
  char boot[sizeof h.ident.boot_id] = {};
  std::strncpy(boot, sys::boot_id().c_str(), sizeof boot - 1);
  if (std::memcmp(h.ident.boot_id, boot, sizeof boot) != 0) std::memcpy(h.ident.boot_id, boot, sizeof boot);
  if (h.ident.magic != kIndexMagic) h.ident.magic = kIndexMagic;
  if (sound(false)) return mapped_current() ? Status() : map_region();
  damaged("the region's geometry is out of bounds");
  set_geometry(h, kMinWindow, kMinHeap, kMinOverflow, 0, 0);
  h.layout.win_offset = 0;
  h.layout.resizing = 0;
  ++h.layout.region_gen;
  if (!sound(false)) return Status(Code::kCorrupt, "index is smaller than its smallest region");
  return map_region();
}

Entry& SharedIndex::bad_slot(uint32_t slot) {
  damaged("slot " + std::to_string(slot) + " is outside the index");
  scratch_ = Entry{};
  return scratch_;
}

Status SharedIndex::reset() {
  auto& h = *hdr_;
  h.layout.count = h.layout.ovf_count = h.layout.queued = h.layout.heap_size = h.layout.due_size = h.layout.leased = h.layout.blocked = 0;
  h.layout.low_id = h.layout.cursor = std::max<uint64_t>(h.cache.next_id, 1);
  h.layout.win_offset = 0;  // an interrupted resize may have left the old window's
  h.layout.resizing = 0;
  std::memset(static_cast<void*>(win_), 0, wcap_ * sizeof(Entry));
  std::memset(static_cast<void*>(ovf_), 0, ocap_ * sizeof(OvfEntry));
  if (gcap_ != 0) std::memset(static_cast<void*>(grp_), 0, gcap_ * sizeof(GroupSlot));
  h.layout.group_used = 0;
  ++h.disk.rebuilds;
  return {};
}

void SharedIndex::dedup_clear() {
  if (dcap_ != 0) std::memset(static_cast<void*>(ded_), 0, dcap_ * sizeof(DedupSlot));
  hdr_->layout.dedup_used = 0;
}

uint64_t SharedIndex::id_of(uint32_t slot) const {
  if (slot >= wcap_) {
    if (slot - wcap_ < ocap_) return ovf_[slot - wcap_].id;
    damaged("slot " + std::to_string(slot) + " is outside the index");
    return 0;
  }
  uint64_t base = wslot(hdr_->layout.low_id);
  return hdr_->layout.low_id + (slot >= base ? slot - base : slot + wcap_ - base);
}

int64_t SharedIndex::find(uint64_t id) const {
  const uint64_t low = hdr_->layout.low_id;
  if (id == 0) return -1;
  if (id >= low) {
    if (id - low >= wcap_) return -1;
    uint64_t s = wslot(id);
    return win_[s].state == State::kEmpty ? -1 : static_cast<int64_t>(s);
  }
  const int64_t s = probe(ovf_, ocap_, id);
  if (s == kNoRoom) damaged("the overflow table has no empty slot");
  return s < 0 ? -1 : static_cast<int64_t>(wcap_) + s;
}

Entry& SharedIndex::entry_of(uint64_t id) {
  int64_t slot = find(id);
  if (slot < 0) {
    damaged("a heap item names message " + std::to_string(id) + ", which is not in the index");
    scratch_ = Entry{};
    return scratch_;
  }
  return entry(static_cast<uint32_t>(slot));
}

auto SharedIndex::heap_entry(uint32_t pos, uint64_t id) const -> HeapAt {
  const Heap w = heap_of(pos);
  const uint64_t i = pos & ~kDueBit;
  const uint64_t size = w == Heap::kTimer ? hdr_->layout.heap_size : hdr_->layout.due_size;
  if (i >= size || i >= hcap_ || item(w, i).id != id) {
    damaged("message " + std::to_string(id) + " has heap position " + std::to_string(pos) +
            ", which is not its heap item (heap sizes " + std::to_string(hdr_->layout.heap_size) + " and " +
            std::to_string(hdr_->layout.due_size) + ")");
    return {w, -1};
  }
  return {w, static_cast<int64_t>(i)};
}

uint64_t SharedIndex::key(uint32_t slot) const {
  if (slot >= wcap_ + ocap_) {
    damaged("slot " + std::to_string(slot) + " is outside the index");
    return UINT64_MAX;
  }
  const Entry& e = slot < wcap_ ? win_[slot] : ovf_[slot - wcap_].e;
  if (e.state == State::kQueued) return ((uint64_t{e.key_hi} << 32) | e.heap_pos) << kQueuedKeyShift;
  if (e.state == State::kBlocked) {
    const int64_t m = gfind(id_of(slot));
    if (m < 0) {
      damaged("blocked message " + std::to_string(id_of(slot)) + " is in no group");
      return UINT64_MAX;
    }
    return grp_[m].c;
  }
  const HeapAt at = heap_entry(e.heap_pos, id_of(slot));
  if (at.i < 0) return UINT64_MAX;  // damaged: never receivable until rebuilt
  const uint64_t k = item(at.heap, static_cast<uint64_t>(at.i)).key;
  return at.heap == Heap::kTimer ? k : due_time(k);
}

// The file never gets shorter (other processes may still map the old range; shrink()
// punches holes instead). Growing the window keeps its entries where they are in the file,
// so that the lock holder makes no pass over a big backlog: the ring's two runs (the ids
// from low_id up to the end of the array, and the ones that wrapped to its start) stay in
// order if one of them moves, by one memmove, to the other side of the new slots;
// win_offset then names the new position. The heap and the tables are small and are
// copied aside (set_aside()): whatever moves before them overwrites them. A table that
// keeps its size goes back slot for slot, not placed again at each growth of the window.
Status SharedIndex::resize(uint64_t wcap, uint64_t hcap, uint64_t ocap, uint64_t dcap, uint64_t gcap) {
  auto& h = *hdr_;
  if (dcap == kSame) dcap = dcap_;
  if (gcap == kSame) gcap = gcap_;
  const bool same_ovf = ocap == ocap_, same_ded = dcap == dcap_, same_grp = gcap == gcap_;
  const std::vector<OvfEntry> ovs = set_aside(ovf_, ocap_, same_ovf);
  const std::vector<DedupSlot> deds = set_aside(ded_, dcap_, same_ded);
  const std::vector<GroupSlot> grps = set_aside(grp_, gcap_, same_grp);
  const uint64_t old_w = wcap_;
  const bool same_win = wcap == old_w, smaller_win = wcap < old_w;
  const uint64_t r = wslot(h.layout.low_id);  // where the window's first id sits now
  std::vector<HeapItem> items;
  std::vector<Entry> raw;  // a private mapping keeps nothing across a remap
  if (!same_win || anonymous_) items.assign(heap_, heap_ + h.layout.heap_size);
  // The due heap sits at the array's end, which moves whenever the array's size does.
  const std::vector<HeapItem> dues(due_begin(), due_begin() + due_size());
  if (smaller_win) {
    // shrink(): the window's ids, in order from low_id, to be laid out again from slot 0.
    for (uint64_t id = h.layout.low_id, end = std::min(std::max(h.cache.next_id, h.layout.low_id), h.layout.low_id + old_w); id < end; ++id) {
      raw.push_back(win_[wslot(id)]);
    }
  } else if (anonymous_) {
    raw.assign(win_, win_ + old_w);
  }
  uint64_t bytes = kHeaderBytes + region_bytes(wcap, hcap, ocap, dcap, gcap);
  if (!anonymous_) {
    if (int rc = io_->allocate(fd_, 0, bytes); rc != 0) {
      return errno_status(-rc, "grow index");
    }
  }
  h.layout.resizing = 1;
  set_geometry(h, wcap, hcap, ocap, dcap, gcap);
  h.ident.file_bytes = std::max(h.ident.file_bytes, bytes);
  ++h.layout.region_gen;
  if (Status s = map_region(); !s.ok()) {
    set_geometry(h, wcap_, hcap_, ocap_, dcap_, gcap_);  // still the mapping's: the old ones
    h.layout.resizing = 0;
    return s;
  }
  if (crashpoint_) crashpoint_("index.resized");  // new geometry, entries not yet moved: only a rebuild mends it
  auto populate = [&](void* from, uint64_t len) {
#ifdef MADV_POPULATE_WRITE
    // Faulting the pages about to be written in with one call instead of one exception
    // each makes a big send_batch into a fresh queue markedly faster where exceptions are
    // dear (a VM). Best effort: kernels before 5.14 answer EINVAL.
    auto at = reinterpret_cast<uintptr_t>(from) & ~uintptr_t{4095};
    (void)::madvise(reinterpret_cast<void*>(at), len + (reinterpret_cast<uintptr_t>(from) - at), MADV_POPULATE_WRITE);
#else
    (void)from, (void)len;
#endif
  };
  char* const region_end = static_cast<char*>(region_) + region_len_;
  if (anonymous_ && !smaller_win) std::memcpy(static_cast<void*>(win_), raw.data(), old_w * sizeof(Entry));
  if (smaller_win) {
    std::memset(static_cast<void*>(win_), 0, wcap * sizeof(Entry));
    if (!raw.empty()) std::memcpy(static_cast<void*>(win_), raw.data(), raw.size() * sizeof(Entry));
    h.layout.win_offset = (wcap - h.layout.low_id % wcap) % wcap;  // low_id in slot 0
  } else if (!same_win) {
    const uint64_t grow = wcap - old_w;
    if (r <= grow) {
      populate(win_, r * sizeof(Entry));
      populate(win_ + old_w, static_cast<uint64_t>(region_end - reinterpret_cast<char*>(win_ + old_w)));
      // Slots beyond the old array held the old heap and overflow table, or nothing.
      std::memset(static_cast<void*>(win_ + old_w), 0, grow * sizeof(Entry));
      std::memcpy(static_cast<void*>(win_ + old_w), win_, r * sizeof(Entry));  // the wrapped run
      std::memset(static_cast<void*>(win_), 0, r * sizeof(Entry));
      h.layout.win_offset = (r + wcap - h.layout.low_id % wcap) % wcap;
    } else {
      populate(win_ + r, static_cast<uint64_t>(region_end - reinterpret_cast<char*>(win_ + r)));
      std::memset(static_cast<void*>(win_ + old_w), 0, grow * sizeof(Entry));
      std::memmove(static_cast<void*>(win_ + r + grow), win_ + r, (old_w - r) * sizeof(Entry));  // the first run
      std::memset(static_cast<void*>(win_ + r), 0, grow * sizeof(Entry));
      h.layout.win_offset = (r + grow + wcap - h.layout.low_id % wcap) % wcap;
    }
  }
  if (!items.empty()) std::memcpy(static_cast<void*>(heap_), items.data(), items.size() * sizeof(HeapItem));
  if (!dues.empty()) std::memcpy(static_cast<void*>(heap_ + hcap_ - dues.size()), dues.data(), dues.size() * sizeof(HeapItem));
  if (!same_ded) h.layout.dedup_used = 0;  // (counted again as they are placed)
  if (!same_grp) h.layout.group_used = 0;
  put_back(ovf_, ocap_, ovs, same_ovf, [&](const OvfEntry& o) { ovf_place(o.id, o.e); });
  put_back(ded_, dcap_, deds, same_ded, [&](const DedupSlot& d) { dedup_place(d); });
  put_back(grp_, gcap_, grps, same_grp, [&](const GroupSlot& g) { gplace(g); });
  h.layout.resizing = 0;
  return {};
}

void SharedIndex::dedup_place(const DedupSlot& d) {
  if (place(ded_, dcap_, d) < 0) {
    damaged("the dedup table has no free slot");  // dedup_reserve() keeps a quarter free
    return;
  }
  ++hdr_->layout.dedup_used;
}

Status SharedIndex::dedup_reserve(uint64_t more, uint64_t now) {
  auto& h = *hdr_;
  if ((h.layout.dedup_used + more) * 4 <= dcap_ * 3) return {};
  // Forget what has expired first: with a steady rate of dedup sends the table then stays
  // at the size the window needs.
  std::vector<DedupSlot> live = set_aside(ded_, dcap_, false);
  std::erase_if(live, [&](const DedupSlot& d) { return d.expires <= now; });
  h.layout.dedup_used = 0;
  put_back(ded_, dcap_, live, false, [&](const DedupSlot& d) { dedup_place(d); });
  if ((h.layout.dedup_used + more) * 4 <= dcap_ * 3) return {};
  const uint64_t dc = slots_for(h.layout.dedup_used + more, kMinDedup, kMaxDedup);
  if (dc == 0) {
    return Status(Code::kQueueFull, "the queue remembers " + std::to_string(h.layout.dedup_used) +
                                        " deduplication ids within its window, and " + std::to_string(more) +
                                        " more would pass the limit of " + std::to_string(kMaxDedup / 4 * 3) +
                                        "; send fewer messages with a dedup id, or shorten the dedup window");
  }
  return resize(wcap_, hcap_, ocap_, dc);
}

void SharedIndex::dedup_insert(uint64_t hash, uint64_t loc, uint64_t expires) {
  if (dcap_ == 0 || (hdr_->layout.dedup_used + 1) * 4 > dcap_ * 3) {
    damaged("a dedup id was inserted without room");
    return;
  }
  dedup_place(DedupSlot{hash == 0 ? 1 : hash, loc, expires});
}

uint64_t SharedIndex::dedup_oldest_seq(uint64_t now) const {
  uint64_t lowest = UINT64_MAX;
  for (uint64_t s = 0; s < dcap_; ++s) {
    if (ded_[s].hash != 0 && ded_[s].expires > now) lowest = std::min(lowest, ded_[s].loc >> 40);
  }
  return lowest;
}

int64_t SharedIndex::gfind(uint64_t key) const {
  if (gcap_ == 0 || key == 0) return -1;
  const int64_t s = probe(grp_, gcap_, key);
  if (s == kNoRoom) damaged("the group table has no empty slot");
  return s < 0 ? -1 : s;
}

void SharedIndex::gplace(const GroupSlot& g) {
  // group_reserve() keeps a quarter free.
  if ((hdr_->layout.group_used + 1) * 4 > gcap_ * 3 || place(grp_, gcap_, g) < 0) {
    damaged("a group slot was placed without room");
    return;
  }
  ++hdr_->layout.group_used;
}

void SharedIndex::gerase(uint64_t hole) {
  vacate(grp_, gcap_, hole);
  --hdr_->layout.group_used;
}

Status SharedIndex::group_reserve(uint64_t more) {
  auto& h = *hdr_;
  if ((h.layout.group_used + more) * 4 <= gcap_ * 3) return {};
  const uint64_t gc = slots_for(h.layout.group_used + more, kMinGroupSlots, kMaxGroupSlots);
  if (gc == 0) {
    return Status(Code::kQueueFull, "the queue holds " + std::to_string(h.layout.group_used) +
                                        " grouped messages and groups, and " + std::to_string(more) +
                                        " more would pass the limit of " + std::to_string(kMaxGroupSlots / 4 * 3));
  }
  return resize(wcap_, hcap_, ocap_, kSame, gc);
}

void SharedIndex::block(uint32_t slot, uint64_t id) {
  auto& h = *hdr_;
  Entry& e = entry(slot);
  if (e.state == State::kBlocked) return;
  if (const int64_t m = gfind(id); m >= 0) grp_[m].c = key(slot);
  if (e.state == State::kQueued) {
    --h.layout.queued;
    e.key_hi = kDefaultPriority;  // (it held key bits)
  } else if (const HeapAt at = heap_entry(e.heap_pos, id); at.i >= 0) {
    remove(at);
  }
  e.state = State::kBlocked;
  e.heap_pos = kNoPos;
  ++h.layout.blocked;
}

void SharedIndex::promote(uint64_t id) {
  const int64_t slot = find(id);
  const int64_t m = gfind(id);
  if (slot < 0 || m < 0) {
    damaged("group member " + std::to_string(id) + " is not in the index");
    return;
  }
  Entry& e = entry(static_cast<uint32_t>(slot));
  if (e.state != State::kBlocked) return;
  --hdr_->layout.blocked;
  e.state = State::kReady;
  ++promotions_;
  push(Heap::kTimer, static_cast<uint32_t>(slot), id, grp_[m].c);
}

void SharedIndex::group_join(uint32_t slot, uint64_t id, uint64_t hash) {
  if ((hdr_->layout.group_used + 2) * 4 > gcap_ * 3) {
    damaged("a message joined a group without room");
    return;
  }
  const uint64_t gk = hash | kGroupTag;
  int64_t g = gfind(gk);
  if (g < 0) {
    gplace(GroupSlot{gk, id, id, id});
    gplace(GroupSlot{id, gk, 0, key(slot)});
    return;
  }
  GroupSlot& grp = grp_[g];  // placing a slot moves no other
  uint64_t next = 0;
  bool blocked = true;
  if (id > grp.b) {
    if (const int64_t t = gfind(grp.b); t >= 0) grp_[t].b = id;
    grp.b = id;
  } else if (id < grp.a) {
    // A replay meets a compaction copy after the later members it was sent before.
    next = grp.a;
    blocked = false;
    if (const int64_t f = find(grp.a); f >= 0 && entry(static_cast<uint32_t>(f)).state != State::kLeased) {
      block(static_cast<uint32_t>(f), grp.a);
    }
    grp.a = id;
  } else {
    // Between two members (replay only, as above): from the member linked last when it
    // comes before `id`, as copies do, which are made in id order.
    uint64_t p = grp.a;
    if (const int64_t h = gfind(grp.c); grp.c < id && h >= 0) p = grp.c;
    int64_t pm = gfind(p);
    for (uint64_t steps = 0; pm >= 0 && grp_[pm].b != 0 && grp_[pm].b < id && steps < gcap_; ++steps) pm = gfind(grp_[pm].b);
    if (pm < 0 || grp_[pm].b == id) {
      damaged("group of message " + std::to_string(id) + " is not linked in id order");
      return;
    }
    next = grp_[pm].b;
    grp_[pm].b = id;
  }
  grp.c = id;
  gplace(GroupSlot{id, gk, next, 0});
  if (blocked) block(slot, id);
}

uint64_t SharedIndex::group_first(uint64_t id) const {
  const int64_t m = gfind(id);
  if (m < 0) return 0;
  const int64_t g = gfind(grp_[m].a);
  return g < 0 || grp_[g].a == id ? 0 : grp_[g].a;
}

uint64_t SharedIndex::group_of(uint64_t id) const {
  const int64_t m = gfind(id);
  return m < 0 ? 0 : grp_[m].a & ~kGroupTag;
}

void SharedIndex::group_leave(uint64_t id) {
  const int64_t m = gfind(id);
  if (m < 0) return;
  const uint64_t gk = grp_[m].a, next = grp_[m].b;
  gerase(static_cast<uint64_t>(m));
  const int64_t g = gfind(gk);
  if (g < 0) {
    damaged("group member " + std::to_string(id) + " has no group");
    return;
  }
  GroupSlot& grp = grp_[g];
  if (grp.c == id) grp.c = grp.a == id ? next : grp.a;
  if (grp.a == id) {
    grp.a = next;
    if (next == 0) {
      gerase(static_cast<uint64_t>(g));
      return;
    }
    promote(next);
    return;
  }
  // Not the first (a purge, or a retention limit that dropped a later one): unlink.
  int64_t pm = gfind(grp.a);
  for (uint64_t steps = 0; pm >= 0 && grp_[pm].b != id && grp_[pm].b != 0 && steps < gcap_; ++steps) pm = gfind(grp_[pm].b);
  if (pm < 0 || grp_[pm].b != id) {
    damaged("group member " + std::to_string(id) + " is not linked from its group's first");
    return;
  }
  grp_[pm].b = next;
  if (grp.b == id) grp.b = grp_[pm].key;
}

namespace {
uint64_t kept_width_for(uint64_t keep) { return (keep + kKeptBuckets - 3) / (kKeptBuckets - 2); }
// f(b) for each bucket that may hold an ack still inside the window of `keep` ns at `now`:
// one that ends less than `keep` ago.
template <class F>
void for_each_kept(const IndexHeader& h, uint64_t now, uint64_t keep, F f) {
  if (keep == 0 || h.cache.kept_width != kept_width_for(keep)) return;
  for (const KeptBucket& b : h.cache.kept)
    if (b.n != 0 && b.n * h.cache.kept_width + keep > now) f(b);
}
}  // namespace

void SharedIndex::kept_clear() {
  hdr_->cache.kept_width = 0;
  std::memset(hdr_->cache.kept, 0, sizeof hdr_->cache.kept);
}

void SharedIndex::kept_note(uint64_t key, uint64_t seq, uint64_t bytes, uint64_t keep) {
  if (keep == 0) return;
  auto& h = *hdr_;
  const uint64_t width = kept_width_for(keep);
  if (h.cache.kept_width != width) {
    // None yet, or spool.conf was edited: the buckets of another width mean nothing now.
    std::memset(h.cache.kept, 0, sizeof h.cache.kept);
    h.cache.kept_width = width;
  }
  const uint64_t n = key / width + 1;
  KeptBucket& b = h.cache.kept[n % kKeptBuckets];
  if (b.n > n) return;  // older than the whole ring: long out of the window
  if (b.n != n) b = KeptBucket{n, seq, 0, 0};
  b.min_seq = std::min(b.min_seq, seq);
  ++b.acks;
  b.bytes += bytes;
}

uint64_t SharedIndex::kept_oldest_seq(uint64_t now, uint64_t keep) const {
  uint64_t lowest = UINT64_MAX;
  for_each_kept(*hdr_, now, keep, [&](const KeptBucket& b) { lowest = std::min(lowest, b.min_seq); });
  return lowest;
}

void SharedIndex::kept_live(uint64_t now, uint64_t keep, uint64_t* acks, uint64_t* bytes) const {
  *acks = *bytes = 0;
  for_each_kept(*hdr_, now, keep, [&](const KeptBucket& b) {
    *acks += b.acks;
    *bytes += b.bytes;
  });
}

uint64_t SharedIndex::dedup_live(uint64_t now) const {
  uint64_t n = 0;
  for (uint64_t s = 0; s < dcap_; ++s) n += ded_[s].hash != 0 && ded_[s].expires > now;
  return n;
}

// A queue that once held millions keeps a window, heap and overflow table sized for them
// after it drains: hundreds of MB of file and page cache, checksummed at every last close
// and read at every first open. Each part shrinks to twice what it holds once that is a
// quarter of its size or less, so that a queue hovering near one size does not shrink and
// grow in turn.
Status SharedIndex::shrink(uint64_t min_gain) {
  if (region_len_ < min_gain) return {};
  const auto& h = *hdr_;
  // (Bounded: a damaged next_id must not make the new window smaller than the old one's ids.)
  const uint64_t span = std::min(std::max(h.cache.next_id, h.layout.low_id) - h.layout.low_id, wcap_);
  uint64_t w = std::max(kMinWindow, (span * 2 + 7) / 8 * 8);
  uint64_t hc = std::max(kMinHeap, std::bit_ceil((h.layout.heap_size + h.layout.due_size + h.layout.blocked) * 2));
  uint64_t oc = std::max(kMinOverflow, std::bit_ceil(h.layout.ovf_count * 2));
  if (w * 4 > wcap_) w = wcap_;
  if (hc * 4 > hcap_) hc = hcap_;
  if (oc * 4 > ocap_) oc = ocap_;
  uint64_t gc = h.layout.group_used == 0 ? 0 : std::max(kMinGroupSlots, std::bit_ceil(h.layout.group_used * 2));
  if (gc * 4 > gcap_) gc = gcap_;
  // (The dedup table keeps its size: it forgets expired ids as it fills, dedup_reserve.)
  const uint64_t keep = region_bytes(w, hc, oc, dcap_, gc);
  if (keep == region_len_ || region_len_ - keep < min_gain) return {};
  if (Status s = resize(w, hc, oc, kSame, gc); !s.ok()) return s;
  punch_tail();
  return {};
}

void SharedIndex::punch_tail() {
  // Hand the tail's blocks and cache pages back. Not ftruncate: other processes map the
  // old length until their next lock, and a page past the end of a file is a SIGBUS; a
  // hole reads as zeros, and nobody reads there before remapping. Whole pages from the
  // first one past the region: the page the region ends in keeps its block.
  const uint64_t from = (kHeaderBytes + region_len_ + 4095) / 4096 * 4096;
  if (!anonymous_ && hdr_->ident.file_bytes > from) {
    (void)::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(from),
                      static_cast<off_t>(hdr_->ident.file_bytes - from));  // best effort: some file systems cannot
  }
}

Status SharedIndex::reserve_heap(uint64_t more) {
  const uint64_t need = hdr_->layout.heap_size + hdr_->layout.due_size + hdr_->layout.blocked + more;
  if (need <= hcap_) return {};
  if (need > (1ull << 31)) return Status(Code::kQueueFull, "index heap would exceed 2^31 messages");
  return resize(wcap_, std::bit_ceil(need), ocap_);
}

Status SharedIndex::ovf_reserve(uint64_t more) {
  const uint64_t n = hdr_->layout.ovf_count + more;
  if (n * 4 <= ocap_ * 3) return {};
  const uint64_t oc = slots_for(n, ocap_, 1ull << 30);
  if (oc == 0) return Status(Code::kQueueFull, "index overflow table would exceed 2^30 messages");
  return resize(wcap_, hcap_, oc);
}

uint32_t SharedIndex::ovf_place(uint64_t id, const Entry& e) {
  const int64_t s = place(ovf_, ocap_, OvfEntry{id, e});
  if (s < 0) {
    damaged("the overflow table has no empty slot");
    return static_cast<uint32_t>(wcap_ + ocap_);  // entry() gives the scratch entry for it
  }
  return static_cast<uint32_t>(wcap_ + static_cast<uint64_t>(s));
}

void SharedIndex::advance_low(uint64_t limit) {
  auto& h = *hdr_;
  if (h.layout.count == h.layout.ovf_count) {
    h.layout.low_id = std::max(h.layout.low_id, limit);
  } else {
    // At most one lap: the window has a live entry (count > ovf_count), unless damaged.
    for (uint64_t n = 0; h.layout.low_id < limit && win_[wslot(h.layout.low_id)].state == State::kEmpty; ++n, ++h.layout.low_id) {
      if (n == wcap_) {
        damaged("the counts say the window holds a message, and it holds none");
        break;
      }
    }
  }
  h.layout.cursor = std::max(h.layout.cursor, h.layout.low_id);
}

// The window grows while it would stay at least half full, counting the ids about to come;
// otherwise the live messages at its low end move to the overflow table (a message held
// back for hours must not make the window span everything sent since). Growth is by a
// quarter, not doubling, so that a backlog's window is at most 1.25x its size: 24-30 B per
// message.
Status SharedIndex::fit(uint64_t first, uint64_t last) {
  auto& h = *hdr_;
  while (last - h.layout.low_id >= wcap_) {
    if (h.layout.count == h.layout.ovf_count) {  // nothing in the window: start it at `first`
      h.layout.low_id = first;
      h.layout.cursor = std::max(h.layout.cursor, first);
      if (last - first < wcap_) break;  // else the batch alone outgrows it: grow below
    }
    const uint64_t live = h.layout.count - h.layout.ovf_count + (last - first + 1);
    const uint64_t span = last - h.layout.low_id + 1;
    if (live * 2 >= span) {
      uint64_t w = std::max(span, wcap_ + wcap_ / 4);
      w = (w + 7) / 8 * 8;
      if (w > (1ull << 31)) return Status(Code::kQueueFull, "index window would exceed 2^31 messages");
      if (Status s = resize(w, hcap_, ocap_); !s.ok()) return s;
      continue;
    }
    // Evict [low_id, new_low): afterwards `last` fits with a quarter of the window above
    // it. The window is at most half full here, so the batch itself is less than half of
    // the span and first > low_id: this moves.
    const uint64_t new_low = std::min(first, last + 1 + wcap_ / 4 - wcap_);
    const uint64_t stop = std::min(new_low, h.layout.low_id + wcap_);
    uint64_t moving = 0, queued = 0;
    for (uint64_t x = h.layout.low_id; x < stop; ++x) {
      const Entry& e = win_[wslot(x)];
      if (e.state == State::kEmpty) continue;
      ++moving;
      if (e.state == State::kQueued) ++queued;
    }
    if (Status s = ovf_reserve(moving); !s.ok()) return s;
    if (Status s = reserve_heap(queued); !s.ok()) return s;
    // Two passes: heap items first, while every entry is where find() looks for it (a
    // sift moves other items and writes their entries' back-pointers), then the moves.
    for (uint64_t x = h.layout.low_id; x < stop; ++x) {
      const auto s = wslot(x);
      if (win_[s].state != State::kQueued) continue;
      // The overflow table has no queue order: the message waits in the heap instead.
      uint64_t k = key(s);
      --h.layout.queued;
      win_[s].state = State::kReady;
      win_[s].key_hi = kDefaultPriority;
      push(Heap::kTimer, s, x, k);
    }
    for (uint64_t x = h.layout.low_id; x < stop; ++x) {
      const auto s = wslot(x);
      if (win_[s].state == State::kEmpty) continue;
      ovf_place(x, win_[s]);
      win_[s] = Entry{};
      ++h.layout.ovf_count;
    }
    h.layout.low_id = new_low;
    advance_low(first);
  }
  return {};
}

Status SharedIndex::reserve(uint64_t more, bool delayed) {
  if (more == 0) return {};
  if (delayed) {
    if (Status s = reserve_heap(more); !s.ok()) return s;
  }
  const uint64_t first = std::max(hdr_->cache.next_id, hdr_->layout.low_id), last = hdr_->cache.next_id + more - 1;
  return last < first ? Status() : fit(first, last);
}

Result<uint32_t> SharedIndex::insert(uint64_t id, const Entry& in, uint64_t key, uint64_t now, uint8_t priority) {
  auto& h = *hdr_;
  Entry e = in;
  e.owner = 0;
  e.key_hi = priority;
  uint32_t slot;
  if (id < h.layout.low_id) {
    // Replay only: a compaction copy whose original went with its segment.
    if (Status s = ovf_reserve(1); !s.ok()) return s;
    if (Status s = reserve_heap(1); !s.ok()) return s;
    e.state = State::kReady;
    slot = ovf_place(id, e);
    ++h.layout.ovf_count;
    push(Heap::kTimer, slot, id, key);
  } else {
    if (Status s = fit(id, id); !s.ok()) return s;
    slot = wslot(id);
    if (win_[slot].state != State::kEmpty) {
      damaged("message " + std::to_string(id) + " is already in the index (next id " + std::to_string(h.cache.next_id) + ")");
      return Status(Code::kCorrupt, "index is damaged: message " + std::to_string(id) + " is already in it");
    }
    if (key <= now && priority == kDefaultPriority) {
      uint64_t k = key >> kQueuedKeyShift;
      e.state = State::kQueued;
      e.heap_pos = static_cast<uint32_t>(k);
      e.key_hi = static_cast<uint16_t>(k >> 32);
      win_[slot] = e;
      ++h.layout.queued;
      h.layout.cursor = std::min(h.layout.cursor, id);
    } else {
      if (Status s = reserve_heap(1); !s.ok()) return s;  // keeps the window: slot stays
      e.state = State::kReady;
      win_[slot] = e;
      if (key <= now) {
        push(Heap::kDue, slot, id, due_key(priority, key));
      } else {
        push(Heap::kTimer, slot, id, key);
      }
    }
  }
  ++h.layout.count;
  return slot;
}

Status SharedIndex::set(uint32_t slot, State state, uint64_t key) {
  const State was = entry(slot).state;
  if (was == State::kBlocked) {
    // Only a log no spool wrote leases a blocked message (one receivable at a time is the
    // group's promise); a release, as a compaction copy writes for every message, is its
    // receive time.
    if (state == State::kReady) {
      if (const int64_t m = gfind(id_of(slot)); m >= 0) grp_[m].c = key;
    }
    return {};
  }
  if (was == State::kQueued) {
    const uint64_t id = id_of(slot);
    if (Status s = reserve_heap(1); !s.ok()) return s;  // slot survives: ids keep theirs
    --hdr_->layout.queued;
    entry(slot).state = state;
    entry(slot).key_hi = kDefaultPriority;
    hdr_->layout.leased += state == State::kLeased;
    push(Heap::kTimer, slot, id, key);
    return {};
  }
  Entry& e = entry(slot);
  const uint64_t id = id_of(slot);
  const HeapAt at = heap_entry(e.heap_pos, id);
  if (at.i < 0) return Status(Code::kCorrupt, "index is damaged: " + damage_);
  e.state = state;
  hdr_->layout.leased += (state == State::kLeased) - (was == State::kLeased);
  if (at.heap == Heap::kDue) {  // back to the timer heap: the total the array holds stays
    remove(at);
    push(Heap::kTimer, slot, id, key);
    return {};
  }
  uint64_t pos = static_cast<uint64_t>(at.i);
  heap_[pos].key = key;
  sift_down(Heap::kTimer, pos);
  sift_up(Heap::kTimer, pos);
  return {};
}

void SharedIndex::erase(uint32_t slot) {
  if (slot >= wcap_ + ocap_) {
    (void)bad_slot(slot);
    return;
  }
  auto& h = *hdr_;
  Entry& e = entry(slot);
  const uint64_t id = id_of(slot);
  if (e.state == State::kLeased) --h.layout.leased;
  if (e.state == State::kQueued) {
    --h.layout.queued;
  } else if (e.state == State::kBlocked) {
    --h.layout.blocked;
  } else if (const HeapAt at = heap_entry(e.heap_pos, id); at.i >= 0) {
    remove(at);
  }
  --h.layout.count;
  if (slot >= wcap_) {
    vacate(ovf_, ocap_, slot - wcap_);
    --h.layout.ovf_count;
  } else {
    win_[slot] = Entry{};
    if (id == h.layout.low_id) advance_low(h.cache.next_id);
  }
  if (h.layout.group_used != 0) group_leave(id);
}

uint64_t SharedIndex::queued_above(uint64_t after) const {
  const auto& h = *hdr_;
  const uint64_t total = h.layout.queued;
  const uint64_t first = std::max(h.layout.cursor, h.layout.low_id);  // no queued id is lower
  const uint64_t end = std::min(h.cache.next_id, h.layout.low_id + wcap_);
  if (total == 0 || after < first) return total;
  if (after >= end - 1) return 0;  // (end >= low_id >= 1)
  auto queued_in = [&](uint64_t from, uint64_t to) {
    uint64_t n = 0;
    for (uint64_t id = from; id < to; ++id) n += win_[wslot(id)].state == State::kQueued ? 1 : 0;
    return n;
  };
  // (Bounded by total, so a damaged header cannot make the count exceed the queued.)
  if (after + 1 - first <= end - (after + 1)) return total - std::min(total, queued_in(first, after + 1));
  return std::min(total, queued_in(after + 1, end));
}

int64_t SharedIndex::queue_head() {
  auto& h = *hdr_;
  if (h.layout.queued == 0) return -1;
  const uint64_t end = h.layout.low_id + wcap_;
  while (h.layout.cursor < end && win_[wslot(h.layout.cursor)].state != State::kQueued) ++h.layout.cursor;
  if (h.layout.cursor < end) return static_cast<int64_t>(wslot(h.layout.cursor));
  damaged("the counts say " + std::to_string(h.layout.queued) + " messages are queued, and none is");
  return -1;
}

int64_t SharedIndex::next(uint64_t now) {
  auto& h = *hdr_;
  // Each item moves once per time it becomes ready, so this costs what the heap operations
  // of its delivery cost anyway; a receive that finds many at once pays for all of them.
  while (h.layout.heap_size != 0 && heap_[0].key <= now) {
    const HeapItem top = heap_[0];
    const int64_t slot = find(top.id);
    if (slot < 0) {
      damaged("the heap's first item names message " + std::to_string(top.id) + ", which is not in the index");
      return -1;
    }
    remove(HeapAt{Heap::kTimer, 0});
    const uint16_t pri = entry(static_cast<uint32_t>(slot)).key_hi;
    push(Heap::kDue, static_cast<uint32_t>(slot), top.id, due_key(static_cast<uint8_t>(std::min<uint16_t>(pri, 255)), top.key));
  }
  const int64_t q = queue_head();
  if (h.layout.due_size == 0 || h.layout.due_size > hcap_) return q;
  const HeapItem& d = item(Heap::kDue, 0);
  if (q >= 0 && less(HeapItem{due_key(kDefaultPriority, key(static_cast<uint32_t>(q))), h.layout.cursor}, d)) return q;
  const int64_t top = find(d.id);
  if (top < 0) damaged("the due heap's first item names message " + std::to_string(d.id) + ", which is not in the index");
  return top;
}

uint64_t SharedIndex::next_key() {
  if (hdr_->layout.due_size != 0) return 0;  // receivable now
  uint64_t k = hdr_->layout.heap_size != 0 ? heap_[0].key : UINT64_MAX;
  if (int64_t q = queue_head(); q >= 0) k = std::min(k, key(static_cast<uint32_t>(q)));
  return k;
}

void SharedIndex::push(Heap w, uint32_t slot, uint64_t id, uint64_t key) {
  if (hdr_->layout.heap_size + hdr_->layout.due_size >= hcap_) {  // callers reserve first: only damage gets here
    damaged("the heap is full");
    return;
  }
  uint64_t pos = size_of(w)++;
  item(w, pos) = HeapItem{key, id};
  entry(slot).heap_pos = pos_word(w, pos);
  sift_up(w, pos);
}

void SharedIndex::remove(HeapAt at) {
  // Move the last item into the hole, then restore order both ways.
  const uint64_t pos = static_cast<uint64_t>(at.i);
  const uint64_t last = --size_of(at.heap);
  if (pos != last) {
    move_item(at.heap, pos, item(at.heap, last));
    sift_down(at.heap, pos);
    sift_up(at.heap, pos);
  }
}

// The heap is 4-ary and sifts move a hole instead of swapping: every level writes the moved
// item's back-pointer into its entry, a cache miss, and a binary heap with swaps paid two
// such misses a level. Four children are 64 B, one cache line.
void SharedIndex::move_item(Heap w, uint64_t to, const HeapItem& it) {
  item(w, to) = it;
  entry_of(it.id).heap_pos = pos_word(w, to);
}

void SharedIndex::sift_up(Heap w, uint64_t i) {
  const HeapItem it = item(w, i);
  const uint64_t start = i;
  while (i > 0) {
    uint64_t parent = (i - 1) / kHeapArity;
    if (!less(it, item(w, parent))) break;
    move_item(w, i, item(w, parent));
    i = parent;
  }
  if (i != start) move_item(w, i, it);
}

void SharedIndex::sift_down(Heap w, uint64_t i) {
  const uint64_t n = std::min(size_of(w), hcap_);
  const HeapItem it = item(w, i);
  const uint64_t start = i;
  for (;;) {
    uint64_t first = kHeapArity * i + 1;
    if (first >= n) break;
    uint64_t end = std::min(first + kHeapArity, n), m = first;
    for (uint64_t c = first + 1; c < end; ++c)
      if (less(item(w, c), item(w, m))) m = c;
    if (!less(item(w, m), it)) break;
    move_item(w, i, item(w, m));
    i = m;
  }
  if (i != start) move_item(w, i, it);
}

std::string SharedIndex::check_invariants() const {
  const IndexHeader& h = *hdr_;
  if (!mapped_current()) return "mapping is stale";
  // The header's counters, order and bounds first (these include the loads: every probe
  // below relies on an empty slot); then what they count, which must match them.
  if (std::string bad = check_header(false); !bad.empty()) return bad;
  uint64_t on = 0;
  for (uint64_t s = 0; s < ocap_; ++s) on += ovf_[s].id != 0;
  if (on != h.layout.ovf_count) return "I1: overflow count";
  uint64_t n = on, queued = 0, leased = 0, blocked = 0;
  auto check = [&](const Entry& e, uint64_t id) -> std::string {
    if (e.state != State::kReady && e.state != State::kLeased && e.state != State::kQueued &&
        e.state != State::kBlocked) {
      return "I6: entry " + std::to_string(id) + " has an invalid state";
    }
    if (e.owner > kOwnerSlots) return "I6: entry " + std::to_string(id) + " has an invalid owner";
    if (id >= h.cache.next_id) return "I5: entry id " + std::to_string(id) + " >= next_id";
    if (e.state == State::kLeased) ++leased;
    if (e.state == State::kQueued) {
      ++queued;
      if (id < h.layout.cursor) return "I5: queued id " + std::to_string(id) + " is behind the cursor";
    } else if (e.state == State::kBlocked) {
      ++blocked;
      const int64_t m = gfind(id);
      const int64_t g = m < 0 ? -1 : gfind(grp_[m].a);
      if (g < 0 || grp_[g].a == id) return "I7: blocked message " + std::to_string(id) + " is no later member of a group";
    } else {
      const Heap w = heap_of(e.heap_pos);
      const uint64_t i = e.heap_pos & ~kDueBit;
      if (i >= (w == Heap::kTimer ? h.layout.heap_size : h.layout.due_size) || item(w, i).id != id) {
        return "I2: heap back-pointer of " + std::to_string(id);
      }
      if (e.key_hi > 255) return "I6: entry " + std::to_string(id) + " has priority " + std::to_string(e.key_hi);
    }
    return "";
  };
  for (uint64_t s = 0; s < wcap_; ++s) {
    if (win_[s].state == State::kEmpty) continue;
    ++n;
    if (std::string p = check(win_[s], id_of(static_cast<uint32_t>(s))); !p.empty()) return p;
  }
  for (uint64_t s = 0; s < ocap_; ++s) {
    const OvfEntry& o = ovf_[s];
    if (o.id == 0) continue;
    if (o.id >= h.layout.low_id) return "I5: overflow id " + std::to_string(o.id) + " is in the window's range";
    if (o.e.state == State::kQueued) return "I6: overflow entry " + std::to_string(o.id) + " is queued";
    if (find(o.id) != static_cast<int64_t>(wcap_ + s)) return "I5: id " + std::to_string(o.id) + " not findable";
    if (std::string p = check(o.e, o.id); !p.empty()) return p;
  }
  if (n != h.layout.count) return "I1: count";
  uint64_t deds = 0;
  for (uint64_t s = 0; s < dcap_; ++s) deds += ded_[s].hash != 0;
  if (deds != h.layout.dedup_used) return "dedup slots used: " + std::to_string(h.layout.dedup_used) + ", occupied " + std::to_string(deds);
  if (queued != h.layout.queued || blocked != h.layout.blocked) return "I2: heap size";
  uint64_t grps = 0;
  for (uint64_t s = 0; s < gcap_; ++s) grps += grp_[s].key != 0;
  if (grps != h.layout.group_used) return "I7: group slots used: " + std::to_string(h.layout.group_used) + ", occupied " + std::to_string(grps);
  if (leased != h.layout.leased) return "I4: leased count";
  for (Heap w : {Heap::kTimer, Heap::kDue}) {
    for (uint64_t i = 1, size = w == Heap::kTimer ? h.layout.heap_size : h.layout.due_size; i < size; ++i) {
      if (less(item(w, i), item(w, (i - 1) / kHeapArity))) return "I3: heap order at " + std::to_string(i);
    }
  }
  return "";
}

}  // namespace spool::index
