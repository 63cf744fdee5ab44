// The shared index's hash table and heap against a plain model, through random operations:
// inserts (which grow the table), key changes, erasures and pops of the top. The queue relies
// on heap_top() being the earliest (key, id) at all times, and on find() after any sequence
// of backward-shift deletions; the heap layout (its arity, hole-moving sifts) is an
// optimisation that must not change either.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "index/index.h"
#include "test_util.h"

namespace spool {
namespace {

using index::Entry;
using index::SharedIndex;
using index::State;

void random_operations(SharedIndex& x, uint64_t seed, int steps) {
  std::mt19937_64 rng(seed);
  // (key, tie = low 32 bits of the id, id): the heap's order.
  std::set<std::tuple<uint64_t, uint32_t, uint64_t>> order;
  std::unordered_map<uint64_t, uint64_t> key_of;
  std::vector<uint64_t> ids;  // live ids, for picking one at random
  uint64_t next_id = 1;
  auto forget = [&](size_t at) {
    uint64_t id = ids[at];
    order.erase({key_of[id], static_cast<uint32_t>(id), id});
    key_of.erase(id);
    ids[at] = ids.back();
    ids.pop_back();
  };
  for (int step = 0; step < steps; ++step) {
    unsigned op = static_cast<unsigned>(rng() % 10);
    // Few distinct keys: ties are common and must fall back to the id.
    uint64_t key = rng() % 512;
    if (op < 4 || ids.empty()) {
      uint64_t id = next_id++;
      x.hdr().next_id = next_id;
      Entry e{id, id * 64, 1, index::kNoPos, 0, State::kReady, 0, 0};
      auto slot = x.insert(e, key);
      ASSERT_TRUE(slot.ok()) << slot.status().to_string();
      ids.push_back(id);
      key_of[id] = key;
      order.insert({key, static_cast<uint32_t>(id), id});
    } else if (op < 9) {
      // A lease, nack or extend moves the message (set_key); an ack erases it.
      size_t at = static_cast<size_t>(rng() % ids.size());
      uint64_t id = ids[at];
      int64_t slot = x.find(id);
      ASSERT_GE(slot, 0) << "id " << id << " lost";
      if (op < 7) {
        x.set_key(static_cast<uint32_t>(slot), key);
        order.erase({key_of[id], static_cast<uint32_t>(id), id});
        key_of[id] = key;
        order.insert({key, static_cast<uint32_t>(id), id});
      } else {
        x.erase(static_cast<uint32_t>(slot));
        forget(at);
        EXPECT_EQ(x.find(id), -1) << "erased id " << id << " still found";
      }
    } else {
      // What receive does: take the top.
      ASSERT_FALSE(x.heap_empty());
      auto [want_key, want_tie, want_id] = *order.begin();
      const auto& top = x.heap_top();
      ASSERT_EQ(x.entry(top.slot).id, want_id) << "step " << step << ": the top is not the earliest";
      ASSERT_EQ(top.key, want_key);
      x.erase(top.slot);
      for (size_t at = 0; at < ids.size(); ++at) {
        if (ids[at] == want_id) {
          forget(at);
          break;
        }
      }
    }
    ASSERT_EQ(x.heap_size(), ids.size());
    if (step % 2000 == 0) {
      ASSERT_EQ(x.check_invariants(), "") << "step " << step;
      for (uint64_t id : ids) ASSERT_GE(x.find(id), 0) << "id " << id << " not findable at step " << step;
    }
  }
  ASSERT_EQ(x.check_invariants(), "");
  // Drain in heap order: every pop is the model's minimum.
  while (!order.empty()) {
    auto [want_key, want_tie, want_id] = *order.begin();
    ASSERT_EQ(x.entry(x.heap_top().slot).id, want_id);
    x.erase(x.heap_top().slot);
    order.erase(order.begin());
  }
  EXPECT_TRUE(x.heap_empty());
  EXPECT_EQ(x.check_invariants(), "");
}

TEST(SharedIndex, RandomOperationsKeepTheHeapAndTableExact) {
  int steps = test::scaled(120000);
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    SharedIndex x;
    ASSERT_TRUE(x.attach("", true, true).ok());
    ASSERT_TRUE(x.refresh().ok());
    random_operations(x, seed, steps);
  }
}

// The same through a file mapping, whose growth remaps the region.
TEST(SharedIndex, RandomOperationsOnAFileMapping) {
  test::TempDir d;
  SharedIndex x;
  ASSERT_TRUE(x.attach(d / "index", true).ok());
  ASSERT_TRUE(x.refresh().ok());
  random_operations(x, 4, test::scaled(60000));
}

}  // namespace
}  // namespace spool
