// The shared index against a plain model, through random operations: sends (queued or
// delayed), replayed inserts below the window (the overflow table), leases, nacks and
// extends (set), acks (erase) and receives (next). The queue relies on next() being the
// earliest receivable (key, id) at all times, on find() and key() after any sequence of
// window growth, evictions to the overflow table, backward-shift deletions and heap resizes;
// how the index is laid out is an optimisation that must not change any of it.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <tuple>
#include <thread>
#include <vector>

#include "index/index.h"
#include "test_util.h"

namespace spool {
namespace {

using index::Entry;
using index::SharedIndex;
using index::State;

struct Model {
  State state;
  uint64_t key;  // a queued message's key, rounded down as the index keeps it
  uint8_t priority = index::kDefaultPriority;
};

void random_operations(SharedIndex& x, uint64_t seed, int steps) {
  std::mt19937_64 rng(seed);
  std::map<uint64_t, Model> live;
  std::vector<uint64_t> ids;  // live ids, for picking one at random
  uint64_t next_id = 1, now = 1 << 20;
  uint64_t overflow_inserts = 0, evicted_seen = 0, leased = 0;
  auto forget = [&](uint64_t id) {
    live.erase(id);
    for (size_t at = 0; at < ids.size(); ++at) {
      if (ids[at] == id) {
        ids[at] = ids.back();
        ids.pop_back();
        return;
      }
    }
  };
  // What next() must answer. Queued messages (never received, no delay, the default
  // priority) leave in id order; the head of that queue, as (default priority, its key, id),
  // competes with the least (priority, key, id) of the others that can be received at
  // `now`, keys compared at the due heap's 256 ns.
  auto want_next = [&]() -> uint64_t {
    using T = std::tuple<uint8_t, uint64_t, uint64_t>;
    std::optional<T> best;
    bool queue_seen = false;
    for (auto& [id, m] : live) {
      // A queued message evicted to the overflow table waits in the heap instead (fit()).
      if (m.state == State::kQueued && static_cast<uint64_t>(x.find(id)) >= x.hdr().layout.capacity) {
        m.state = State::kReady;
      }
      if (m.state == State::kQueued) {
        if (queue_seen) continue;  // std::map: ids ascending
        queue_seen = true;
      } else if (m.key > now) {
        continue;
      }
      T t{m.state == State::kQueued ? index::kDefaultPriority : m.priority, m.key >> 8, id};
      if (!best || t < *best) best = t;
    }
    return best ? std::get<2>(*best) : 0;
  };
  auto slot_of = [&](uint64_t id) {
    int64_t s = x.find(id);
    EXPECT_GE(s, 0) << "id " << id << " lost";
    return static_cast<uint32_t>(s);
  };
  uint64_t shrinks = 0;
  // shrink() with no minimum gain, so that it runs whenever a part is 4x too big; the ids
  // and their keys, states and heap order must come through it as through a growth.
  auto shrink = [&] {
    uint64_t before = x.hdr().layout.capacity + x.hdr().layout.heap_cap + x.hdr().layout.ovf_cap;
    ASSERT_TRUE(x.shrink(0).ok());
    shrinks += x.hdr().layout.capacity + x.hdr().layout.heap_cap + x.hdr().layout.ovf_cap < before;
  };
  for (int step = 0; step < steps; ++step) {
    now += rng() % 4096;
    if (step % 1000 == 999) shrink();
    unsigned op = static_cast<unsigned>(rng() % 100);
    // Keys near now: ties are common (they must fall back to the id) and some are delayed.
    uint64_t key = now - 8192 + rng() % 16384;
    if (op < 36 || ids.empty()) {
      uint64_t id = next_id++;
      x.hdr().cache.next_id = next_id;
      Entry e{id * 64, 1, 0, index::kNoPos, 0, State::kReady, 0};
      // Mostly the default priority, as most sends are.
      const uint8_t pri = rng() % 4 != 0 ? index::kDefaultPriority : static_cast<uint8_t>(rng() % 256);
      auto slot = x.insert(id, e, key, now, pri);
      ASSERT_TRUE(slot.ok()) << slot.status().to_string();
      bool queued = key <= now && pri == index::kDefaultPriority;
      ASSERT_EQ(x.entry(*slot).state, queued ? State::kQueued : State::kReady);
      live[id] = Model{queued ? State::kQueued : State::kReady, queued ? key >> 10 << 10 : key, pri};
      ids.push_back(id);
    } else if (op < 38) {
      // Replay meets a compaction copy of an id below the window: it goes to the overflow.
      uint64_t low = x.hdr().layout.low_id;
      if (low <= 1) continue;
      uint64_t id = 1 + rng() % (low - 1);
      if (live.count(id) != 0) continue;
      Entry e{id * 64, 1, 0, index::kNoPos, 0, State::kReady, 0};
      const uint8_t pri = static_cast<uint8_t>(rng() % 256);
      auto slot = x.insert(id, e, key, now, pri);
      ASSERT_TRUE(slot.ok()) << slot.status().to_string();
      live[id] = Model{State::kReady, key, pri};
      ids.push_back(id);
      ++overflow_inserts;
    } else if (op < 64) {
      // A lease, nack or extend.
      uint64_t id = ids[rng() % ids.size()];
      State st = rng() % 2 == 0 ? State::kLeased : State::kReady;
      leased += (st == State::kLeased) - (live[id].state == State::kLeased);
      ASSERT_TRUE(x.set(slot_of(id), st, key).ok());
      live[id] = Model{st, key, live[id].priority};
    } else if (op < 90) {
      // An ack of a random message: holes everywhere, and long-lived stragglers.
      uint64_t id = ids[rng() % ids.size()];
      leased -= live[id].state == State::kLeased;
      x.erase(slot_of(id));
      forget(id);
      EXPECT_EQ(x.find(id), -1) << "erased id " << id << " still found";
    } else {
      // What receive does: take the next message and lease it (or, now and then, ack it).
      uint64_t want = want_next();
      int64_t got = x.next(now);
      if (want == 0) {
        ASSERT_EQ(got, -1) << "step " << step << ": next() found a message that is not receivable";
        continue;
      }
      ASSERT_GE(got, 0) << "step " << step << ": next() missed message " << want;
      ASSERT_EQ(x.id_of(static_cast<uint32_t>(got)), want) << "step " << step << ": not the earliest";
      if (op < 97) {
        ASSERT_TRUE(x.reserve_heap(1).ok());
        ASSERT_TRUE(x.set(slot_of(want), State::kLeased, now + 30000).ok());
        leased += live[want].state != State::kLeased;
        live[want] = Model{State::kLeased, now + 30000, live[want].priority};
      } else {
        leased -= live[want].state == State::kLeased;
        x.erase(slot_of(want));
        forget(want);
      }
    }
    ASSERT_EQ(x.hdr().layout.count, live.size());
    ASSERT_EQ(x.hdr().layout.leased, leased);
    if (x.hdr().layout.ovf_count != 0) ++evicted_seen;
    if (step % 3000 == 0) {
      ASSERT_EQ(x.check_invariants(), "") << "step " << step;
      for (auto& [id, m] : live) {
        uint32_t s = slot_of(id);
        ASSERT_EQ(x.id_of(s), id);
        if (m.state == State::kQueued && s >= x.hdr().layout.capacity) m.state = State::kReady;  // evicted
        // (A ready item's key is kept at 256 ns in the due heap.)
        ASSERT_EQ(x.key(s) >> 8, m.key >> 8) << "id " << id << " at step " << step;
        if (m.state != State::kQueued) {
          ASSERT_EQ(x.entry(s).key_hi, m.priority) << "id " << id;
        }
        ASSERT_EQ(x.entry(s).state, m.state) << "id " << id << " at step " << step;
        ASSERT_EQ(x.entry(s).loc, id * 64) << "id " << id << " at step " << step;
      }
    }
  }
  ASSERT_EQ(x.check_invariants(), "");
  // The run must have used what it claims to test.
  EXPECT_GT(overflow_inserts, 0u);
  EXPECT_GT(evicted_seen, 0u) << "no message ever moved to the overflow table";
  EXPECT_GT(x.hdr().layout.capacity, index::kMinWindow) << "the window never grew";
  // Drain in delivery order: every next() is the model's earliest.
  now = UINT64_MAX / 2;
  for (uint64_t n = 0; !live.empty(); ++n) {
    if (n % 500 == 0) shrink();
    uint64_t want = want_next();
    int64_t got = x.next(now);
    ASSERT_GE(got, 0);
    ASSERT_EQ(x.id_of(static_cast<uint32_t>(got)), want);
    x.erase(static_cast<uint32_t>(got));
    forget(want);
  }
  EXPECT_EQ(x.next(now), -1);
  EXPECT_EQ(x.hdr().layout.count, 0u);
  EXPECT_EQ(x.check_invariants(), "");
  EXPECT_GT(shrinks, 0u) << "the region never shrank";
}

// Fewer steps than this never grow the window or evict (the run checks that it did), so
// the sanitizer builds' smaller SPOOL_TEST_SCALE stops here.
constexpr int kMinSteps = 25000;

TEST(SharedIndex, RandomOperationsMatchTheModel) {
  int steps = std::max(kMinSteps, test::scaled(60000));
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    SharedIndex x;
    ASSERT_TRUE(x.attach("", true, true).ok());
    ASSERT_TRUE(x.refresh().ok());
    random_operations(x, seed, steps);
  }
}

// The same through a file mapping, whose resizes remap the region in place.
TEST(SharedIndex, RandomOperationsOnAFileMapping) {
  test::TempDir d;
  SharedIndex x;
  ASSERT_TRUE(x.attach(d / "index", true).ok());
  ASSERT_TRUE(x.refresh().ok());
  random_operations(x, 4, std::max(kMinSteps, test::scaled(40000)));
}

// The window's own cases, on a private index.
class IndexWindow : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(x.attach("", true, true).ok());
    ASSERT_TRUE(x.refresh().ok());
  }
  // Message `id` at record position id * 64, queued (key 5 <= now 10) unless `key` > 10.
  uint32_t add(uint64_t id, uint64_t key = 5) {
    auto s = x.insert(id, Entry{id * 64, 1, 0, index::kNoPos, 0, State::kReady, 0}, key, 10);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return s.ok() ? *s : 0;
  }
  // One more message sent and acked at once, behind whatever is held back.
  void send_and_ack(uint64_t id) {
    x.hdr().cache.next_id = id + 1;
    x.erase(add(id));
  }
  // A message leased until `deadline`, as the oldest in the queue.
  void lease_first(uint64_t deadline) {
    x.hdr().cache.next_id = 2;
    ASSERT_TRUE(x.set(add(1), State::kLeased, deadline).ok());
  }
  // send_batch reserves room for the whole batch first. A batch bigger than the window must
  // grow it (the batch is about to be live), not push the batch's own ids out to the
  // overflow table: sent while one old message holds the window's low end (`held`), or
  // into a fresh, empty index.
  void send_a_big_batch(bool held) {
    if (held) {
      lease_first(1000);
      for (uint64_t id = 2; id <= 1000; ++id) send_and_ack(id);
    }
    const uint64_t batch = 5000, from = x.hdr().cache.next_id;
    ASSERT_TRUE(x.reserve(batch, false).ok());
    for (uint64_t id = from; id < from + batch; ++id) add(id);
    x.hdr().cache.next_id = from + batch;
    EXPECT_GE(x.hdr().layout.capacity, batch);
    EXPECT_EQ(x.hdr().layout.ovf_count, 0u) << "the batch went to the overflow table";
    EXPECT_EQ(x.hdr().layout.queued, batch);
    EXPECT_EQ(x.check_invariants(), "");
  }
  SharedIndex x;
};

// A backlog sent in order and drained in order keeps the window dense: 24 B a slot and at
// most 1.25x the backlog, with nothing in the heap or the overflow table.
TEST_F(IndexWindow, AnInOrderBacklogNeedsAboutOneWindowSlotPerMessage) {
  const uint64_t n = 200000;
  for (uint64_t id = 1; id <= n; ++id) {
    x.hdr().cache.next_id = id + 1;
    add(id);
  }
  EXPECT_LE(x.hdr().layout.capacity, n + n / 4 + 8);
  EXPECT_EQ(x.hdr().layout.heap_size, 0u);
  EXPECT_EQ(x.hdr().layout.ovf_count, 0u);
  for (uint64_t id = 1; id <= n; ++id) {
    int64_t s = x.next(10);
    ASSERT_GE(s, 0);
    ASSERT_EQ(x.id_of(static_cast<uint32_t>(s)), id);
    x.erase(static_cast<uint32_t>(s));
  }
  EXPECT_EQ(x.hdr().layout.low_id, n + 1);
  EXPECT_EQ(x.check_invariants(), "");
}

// One message held back (leased for hours) while a million are sent and acked after it:
// it moves to the overflow table instead of stretching the window over everything since.
TEST_F(IndexWindow, AStragglerDoesNotStretchTheWindow) {
  lease_first(UINT64_MAX / 4);
  for (uint64_t id = 2; id <= 1000000; ++id) send_and_ack(id);
  EXPECT_EQ(x.hdr().layout.capacity, index::kMinWindow);
  EXPECT_EQ(x.hdr().layout.ovf_count, 1u);
  int64_t s = x.find(1);
  ASSERT_GE(s, 0);
  EXPECT_EQ(x.entry(static_cast<uint32_t>(s)).state, State::kLeased);
  EXPECT_EQ(x.check_invariants(), "");
}

// An eviction moves a leased message (heap item, late key) and then a queued one, whose new
// heap item (early key) sifts up past the first one's: that sift must still find the first
// one's entry to update its back-pointer.
TEST_F(IndexWindow, AnEvictionKeepsTheHeapBackPointers) {
  lease_first(1'000'000'000);
  x.hdr().cache.next_id = 3;
  add(2, 0);
  for (uint64_t id = 3; x.hdr().layout.ovf_count == 0; ++id) {
    ASSERT_LT(id, 100000u) << "no eviction";
    send_and_ack(id);
  }
  EXPECT_EQ(x.check_invariants(), "");
  int64_t two = x.next(10);
  ASSERT_GE(two, 0);
  EXPECT_EQ(x.id_of(static_cast<uint32_t>(two)), 2u);
  EXPECT_EQ(x.key(static_cast<uint32_t>(x.find(1))), 1'000'000'000u);
}

// A backlog of 200,000, most of it leased once (the heap grows too) and then acked, except
// the last ten: the region shrinks to its minimum sizes, and the ten keep their states,
// keys and order (their deadlines 1 us apart: expired ones are ordered at 256 ns). Then the queue fills and drains again as before.
void drain_and_shrink(SharedIndex& x) {
  const uint64_t n = 200000;
  auto add = [&](uint64_t id) {
    x.hdr().cache.next_id = id + 1;
    ASSERT_TRUE(x.insert(id, Entry{id * 64, 1, 0, index::kNoPos, 0, State::kReady, 0}, 5, 10).ok());
  };
  for (uint64_t id = 1; id <= n; ++id) add(id);
  for (uint64_t id = 1; id <= n / 2; ++id) ASSERT_TRUE(x.set(static_cast<uint32_t>(x.find(id)), State::kLeased, 50).ok());
  for (uint64_t id = n - 9; id < n; ++id) ASSERT_TRUE(x.set(static_cast<uint32_t>(x.find(id)), State::kLeased, 1000 * (n - id)).ok());
  for (uint64_t id = 1; id <= n - 10; ++id) x.erase(static_cast<uint32_t>(x.find(id)));
  const uint64_t big = x.hdr().layout.capacity;
  ASSERT_GE(big, n);
  ASSERT_GE(x.hdr().layout.heap_cap, n / 2);
  ASSERT_TRUE(x.shrink(0).ok());
  EXPECT_EQ(x.hdr().layout.capacity, index::kMinWindow);
  EXPECT_EQ(x.hdr().layout.heap_cap, index::kMinHeap);
  ASSERT_EQ(x.check_invariants(), "");
  ASSERT_EQ(x.hdr().layout.count, 10u);
  for (uint64_t id = n - 9; id < n; ++id) {
    int64_t s = x.find(id);
    ASSERT_GE(s, 0) << id;
    EXPECT_EQ(x.entry(static_cast<uint32_t>(s)).state, State::kLeased);
    EXPECT_EQ(x.entry(static_cast<uint32_t>(s)).loc, id * 64);
    EXPECT_EQ(x.key(static_cast<uint32_t>(s)), 1000 * (n - id));
  }
  // Delivery order: the queued last message (key 5), then the leases by deadline.
  std::vector<uint64_t> order;
  for (int64_t s; (s = x.next(UINT64_MAX / 2)) >= 0;) {
    order.push_back(x.id_of(static_cast<uint32_t>(s)));
    x.erase(static_cast<uint32_t>(s));
  }
  std::vector<uint64_t> want{n};
  for (uint64_t id = n - 1; id >= n - 9; --id) want.push_back(id);
  EXPECT_EQ(order, want);
  // Nothing left to give back: no change.
  ASSERT_TRUE(x.shrink(0).ok());
  EXPECT_EQ(x.hdr().layout.capacity, index::kMinWindow);
  for (uint64_t id = n + 1; id <= n + 5000; ++id) add(id);
  for (uint64_t id = n + 1; id <= n + 5000; ++id) {
    int64_t s = x.next(10);
    ASSERT_GE(s, 0);
    ASSERT_EQ(x.id_of(static_cast<uint32_t>(s)), id);
    x.erase(static_cast<uint32_t>(s));
  }
  EXPECT_EQ(x.check_invariants(), "");
}

TEST_F(IndexWindow, ADrainedBacklogGivesItsRegionBack) { drain_and_shrink(x); }

// On a file: the freed tail's blocks go back to the file system, the file keeps its size
// (another process may map it), and a second mapping of the file, still laid out for the
// big region, remaps at its next refresh and sees the same messages.
TEST(SharedIndex, AShrinkPunchesTheTailOutOfTheFileAndOtherMappingsFollow) {
  test::TempDir d;
  if (!test::can_punch_holes(d.path())) GTEST_SKIP() << "SKIPPED: " << d.path() << " cannot punch holes (fallocate)";
  SharedIndex x, other;
  ASSERT_TRUE(x.attach(d / "index", true).ok());
  ASSERT_TRUE(x.refresh().ok());
  struct stat before {}, after {};
  {
    const uint64_t n = 200000;
    for (uint64_t id = 1; id <= n; ++id) {
      x.hdr().cache.next_id = id + 1;
      ASSERT_TRUE(x.insert(id, Entry{id * 64, 1, 0, index::kNoPos, 0, State::kReady, 0}, 5, 10).ok());
    }
    ASSERT_TRUE(other.attach(d / "index", false).ok());
    ASSERT_TRUE(other.refresh().ok());
    ASSERT_EQ(other.find(n), x.find(n));
    for (uint64_t id = 1; id <= n - 3; ++id) x.erase(static_cast<uint32_t>(x.find(id)));
  }
  ASSERT_EQ(::stat((d / "index").c_str(), &before), 0);
  ASSERT_TRUE(x.shrink().ok());
  ASSERT_EQ(::stat((d / "index").c_str(), &after), 0);
  EXPECT_EQ(x.hdr().layout.capacity, index::kMinWindow);
  EXPECT_EQ(after.st_size, before.st_size) << "the file must keep its size";
  EXPECT_GT(before.st_blocks * 512, 4 << 20);
  EXPECT_LT(after.st_blocks * 512, 1 << 20) << "the freed tail is still allocated";
  ASSERT_TRUE(other.refresh().ok());
  EXPECT_EQ(other.check_invariants(), "");
  for (uint64_t id = 199998; id <= 200000; ++id) {
    int64_t s = other.find(id);
    ASSERT_GE(s, 0) << id;
    EXPECT_EQ(other.entry(static_cast<uint32_t>(s)).loc, id * 64);
  }
  EXPECT_EQ(other.find(199997), -1);
  // The file grows back into the holes when it must.
  for (uint64_t id = 200001; id <= 300000; ++id) {
    other.hdr().cache.next_id = id + 1;
    ASSERT_TRUE(other.insert(id, Entry{id * 64, 1, 0, index::kNoPos, 0, State::kReady, 0}, 5, 10).ok());
  }
  ASSERT_TRUE(x.refresh().ok());
  EXPECT_EQ(x.check_invariants(), "");
  EXPECT_EQ(x.hdr().layout.count, 100003u);
}

TEST_F(IndexWindow, ABatchBiggerThanTheWindowGrowsIt) { send_a_big_batch(true); }
TEST_F(IndexWindow, ABatchBiggerThanAnEmptyWindowGrowsIt) { send_a_big_batch(false); }

// An opener attaches without the lock, while another process may be rebuilding: the
// identity it checks (magic, format, boot id) must never look cleared. The rebuild zeroed
// the boot id, then copied it, and a campaign once saw an open refused as "another boot".
TEST(SharedIndex, ARebuildOfASoundIndexNeverClearsItsIdentity) {
  test::TempDir d;
  SharedIndex x;
  ASSERT_TRUE(x.attach(d / "index", true).ok());
  ASSERT_TRUE(x.refresh().ok());
  const char* boot = x.hdr().ident.boot_id;
  ASSERT_NE(boot[0], 0);
  std::atomic<bool> done{false};
  std::thread rebuilder([&] {
    for (int i = 0; i < 30000; ++i) (void)x.prepare_rebuild();
    done = true;
  });
  uint64_t cleared = 0, looks = 0;
  while (!done.load(std::memory_order_relaxed)) {
    ++looks;
    if (__atomic_load_n(&boot[0], __ATOMIC_RELAXED) == 0) ++cleared;
  }
  rebuilder.join();
  EXPECT_EQ(cleared, 0u) << "of " << looks << " looks at the boot id during rebuilds";
  SharedIndex other;
  EXPECT_TRUE(other.attach(d / "index", false).ok());
}

}  // namespace
}  // namespace spool

namespace spool {
namespace {

// Ordered groups in the index: members joined in any order (a replay meets compaction copies
// after later members of their group) are linked in id order, and whatever leaves (a group's
// first, a middle one, its last, as receives, purges and removes take them), exactly the
// lowest live id of each group is not blocked, next() never gives a blocked one, and the
// invariants hold throughout.
TEST(SharedIndex, GroupsLinkInIdOrderWhateverTheJoinOrderAndEraseKeepsThem) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    SharedIndex x;
    ASSERT_TRUE(x.attach("", true, true).ok());
    ASSERT_TRUE(x.refresh().ok());
    std::mt19937_64 rng(seed);
    const uint64_t n = static_cast<uint64_t>(std::max(600, test::scaled(3000)));
    const uint64_t kGroups = 7;
    auto group_of = [](uint64_t id) -> int { return id % 3 == 0 ? -1 : static_cast<int>(id % 7); };
    std::vector<uint64_t> order(n);
    for (uint64_t i = 0; i < n; ++i) order[i] = i + 1;
    std::shuffle(order.begin(), order.end(), rng);
    x.hdr().cache.next_id = n + 1;
    std::map<int, std::set<uint64_t>> groups;
    std::set<uint64_t> live;
    auto check = [&](const char* when) {
      ASSERT_EQ(x.check_invariants(), "") << when;
      uint64_t blocked = 0;
      for (uint64_t id : live) {
        const int g = group_of(id);
        const bool first = g < 0 || *groups[g].begin() == id;
        const int64_t slot = x.find(id);
        ASSERT_GE(slot, 0) << when << ": message " << id << " is gone";
        ASSERT_EQ(x.entry(static_cast<uint32_t>(slot)).state == State::kBlocked, !first)
            << when << ": message " << id << " of group " << g;
        blocked += !first;
      }
      ASSERT_EQ(x.hdr().layout.blocked, blocked) << when;
    };
    for (uint64_t id : order) {
      ASSERT_TRUE(x.group_reserve(2).ok());
      ASSERT_TRUE(x.reserve_heap(1).ok());
      const uint64_t key = rng() % 4 == 0 ? 50 : 5;  // some delayed past now = 10
      auto slot = x.insert(id, Entry{id * 64, 1, 0, index::kNoPos, 0, State::kReady, 0}, key, 10);
      ASSERT_TRUE(slot.ok()) << slot.status().to_string();
      live.insert(id);
      if (const int g = group_of(id); g >= 0) {
        x.group_join(*slot, id, 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(g + 1));
        groups[g].insert(id);
      }
      if (live.size() % 50 == 0) {
        ASSERT_NO_FATAL_FAILURE(check("joining"));
      }
    }
    ASSERT_NO_FATAL_FAILURE(check("joined"));
    ASSERT_EQ(x.hdr().layout.group_used, n - n / 3 + kGroups);
    while (!live.empty()) {
      uint64_t id;
      if (rng() % 2 == 0) {
        // A receive: the next message at a time when all are due, never a blocked one.
        const int64_t s = x.next(100);
        ASSERT_GE(s, 0) << "nothing receivable with " << live.size() << " live";
        id = x.id_of(static_cast<uint32_t>(s));
      } else {
        id = *std::next(live.begin(), static_cast<long>(rng() % live.size()));  // a purge or remove
      }
      if (const int g = group_of(id); g >= 0) {
        groups[g].erase(id);
        if (groups[g].empty()) groups.erase(g);
      }
      x.erase(static_cast<uint32_t>(x.find(id)));
      live.erase(id);
      if (live.size() % 25 == 0) {
        ASSERT_NO_FATAL_FAILURE(check("erasing"));
      }
    }
    EXPECT_EQ(x.hdr().layout.group_used, 0u);
    EXPECT_EQ(x.hdr().layout.blocked, 0u);
  }
}

}  // namespace
}  // namespace spool
