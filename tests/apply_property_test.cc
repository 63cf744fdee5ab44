// The one mutator (src/queue/apply.h), as a property: whatever stream of operations a queue
// takes, the index the live calls leave and the index a replay of the log makes are the same,
// field by field. Each test drives random streams (sends with and without groups,
// priorities, dedup ids and delays; receives, acks, nacks, extends, dead letters, removes,
// purges, compactions, pauses and resumes, releases by id), then deletes the index and lets the next open rebuild it from the log,
// and compares the two. One does so after a kill -9 of the process that ran the stream, at a
// random point.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "index/index.h"
#include "queue/apply.h"
#include "spool/queue.h"
#include "sys/clock.h"
#include "test_util.h"

namespace spool::test {
namespace {

using namespace std::chrono_literals;
constexpr Millis kHour{3600 * 1000};

QueueOptions options() {
  QueueOptions o;
  o.sync = SyncPolicy::kNever;
  o.segment_size = 16 << 10;  // many rolls, so compaction has prefixes to copy and remove
  o.max_receives = 3;         // dead letters come from receives too
  o.dedup_window = kHour;
  o.keep_acked = kHour;       // the kept-acked buckets are state as well
  return o;
}

// What an index holds, in a form two indexes can be compared by. Placement is not state (a
// message ready since it was sent is "queued" live but may sit in a heap after a replay, and
// the other way round), so an entry is named by what a receiver sees: leased, blocked, or
// ready at its key (kQueued has no key: it is ready, `now` at the latest).
struct Snapshot {
  std::map<std::string, uint64_t> header;
  std::map<uint64_t, std::string> entries;
  std::map<std::string, std::set<std::pair<uint64_t, uint64_t>>> dedup;  // dedup id -> (loc, expires)
};

std::string describe(index::SharedIndex& x, uint32_t slot, uint64_t now) REQUIRES(x) {
  const index::Entry& e = x.entry(slot);
  std::string state;
  uint64_t key = 0;
  uint32_t prio = e.key_hi;
  switch (e.state) {
    case index::State::kLeased: state = "leased"; key = x.key(slot); break;
    case index::State::kBlocked: state = "blocked"; break;
    case index::State::kQueued: state = "ready"; prio = index::kDefaultPriority; break;
    case index::State::kReady:
      key = x.key(slot);
      state = key <= now ? "ready" : "delayed";
      if (key <= now) key = 0;
      break;
    default: state = "?"; break;
  }
  if (e.state == index::State::kBlocked) prio = 0;  // (key_hi is not the priority there)
  // In 256 ns steps: a message due now moves to the due heap, whose keys keep the time only
  // to that step (index::due_key), when a receive looks at it, not when a replay does.
  key >>= 8;
  return state + " count=" + std::to_string(e.count) + " len=" + std::to_string(e.len) +
         " loc=" + std::to_string(e.loc) + " key=" + std::to_string(key) + " prio=" + std::to_string(prio);
}

// Reads QUEUE/index (no process attached) into a Snapshot; `dedup_ids` are the ids the
// stream used, looked up in the dedup table.
Snapshot snapshot(const std::string& qdir, const std::set<std::string>& dedup_ids) {
  Snapshot s;
  index::SharedIndex x;
  Status st = x.attach(qdir + "/index", false);
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (!st.ok()) return s;
  x.assert_held();  // nobody else is attached
  EXPECT_TRUE(x.refresh().ok());
  auto& h = x.hdr();
  s.header = {{"count", h.layout.count},           {"leased", h.layout.leased},
              {"blocked", h.layout.blocked},       {"next_id", h.cache.next_id},
              {"purged_through", h.cache.purged_through}, {"sent_total", h.cache.sent_total},
              {"acked_total", h.cache.acked_total}, {"dead_total", h.cache.dead_total},
              {"expired_total", h.cache.expired_total}, {"nacked_total", h.cache.nacked_total},
              {"received_total", h.cache.received_total}, {"redelivered_total", h.cache.redelivered_total},
              {"bytes_live", h.cache.bytes_live}, {"log_end", h.cache.log_end},
              {"sent_through", h.coord.sent_through.load()}, {"paused", h.cache.paused}};
  // The kept-acked buckets by their sums: an ACK record stores no time, so replay files it
  // under the time of the record before it, which may fall in the next bucket.
  uint64_t kept_acks = 0, kept_bytes = 0, kept_min_seq = UINT64_MAX;
  for (uint32_t b = 0; b < index::kKeptBuckets; ++b) {
    const auto& k = h.cache.kept[b];
    if (k.n == 0) continue;
    kept_acks += k.acks;
    kept_bytes += k.bytes;
    kept_min_seq = std::min(kept_min_seq, k.min_seq);
  }
  s.header["kept.acks"] = kept_acks;
  s.header["kept.bytes"] = kept_bytes;
  s.header["kept.min_seq"] = kept_min_seq;
  // The log clock's anchors (CLOCK records, apply_record's like every other effect).
  s.header["clock_n"] = h.cache.clock_n;
  s.header["clock_first"] = h.cache.clock_first;
  for (uint32_t a = 0; a < std::min(h.cache.clock_n, index::kClockAnchors); ++a) {
    s.header["clock[" + std::to_string(a) + "].at"] = h.cache.clock[a].at;
    s.header["clock[" + std::to_string(a) + "].off"] = h.cache.clock[a].off;
  }
  // Far enough ahead that a lease or delay of the stream (an hour) still counts as one, and
  // a message whose short delay has passed counts as ready in both snapshots.
  const uint64_t now = sys::boot_ns() + 60'000'000'000ull;
  x.for_each_entry([&](uint32_t slot, uint64_t id, const index::Entry&) REQUIRES(x) { s.entries[id] = describe(x, slot, now); });
  for (const auto& d : dedup_ids) {
    x.dedup_probe(queue::dedup_hash(d), [&](uint64_t loc, uint64_t expires) {
      s.dedup[d].insert({loc, expires});
      return false;
    });
  }
  return s;
}

void expect_same(const Snapshot& live, const Snapshot& replayed) {
  for (const auto& [k, v] : live.header) {
    auto it = replayed.header.find(k);
    EXPECT_TRUE(it != replayed.header.end() && it->second == v)
        << "header " << k << ": live " << v << ", replayed "
        << (it == replayed.header.end() ? std::string("(none)") : std::to_string(it->second));
  }
  for (const auto& [k, v] : replayed.header) {
    EXPECT_TRUE(live.header.count(k)) << "header " << k << " only after the replay: " << v;
  }
  for (const auto& [id, e] : live.entries) {
    auto it = replayed.entries.find(id);
    EXPECT_TRUE(it != replayed.entries.end() && it->second == e)
        << "message " << id << ": live " << e << ", replayed "
        << (it == replayed.entries.end() ? std::string("(none)") : it->second);
  }
  for (const auto& [id, e] : replayed.entries) {
    EXPECT_TRUE(live.entries.count(id)) << "message " << id << " only after the replay: " << e;
  }
  EXPECT_EQ(live.dedup, replayed.dedup) << "the dedup tables differ";
}

// Runs `n` random operations on the queue in `qdir`; every dedup id it uses goes into
// `dedup_ids` (a fixed set, so the parent of a killed child knows them too).
std::set<std::string> all_dedup_ids() {
  std::set<std::string> s;
  for (int i = 0; i < 12; ++i) s.insert("d" + std::to_string(i));
  return s;
}

void run_stream(Queue& q, uint32_t seed, int n) {
  std::mt19937 rng(seed);
  auto pick = [&](int k) { return static_cast<int>(rng() % static_cast<uint32_t>(k)); };
  std::vector<Message> held;  // receipts not yet used
  for (int i = 0; i < n; ++i) {
    const int op = pick(100);
    if (op < 35) {  // send
      SendOptions o;
      if (pick(3) == 0) o.priority = static_cast<uint8_t>(pick(256));
      if (pick(4) == 0) o.group = "g" + std::to_string(pick(3));
      if (pick(4) == 0) o.dedup_id = "d" + std::to_string(pick(12));
      if (pick(6) == 0) o.delay = pick(2) == 0 ? kHour : Millis(1);
      if (pick(5) == 0) o.attributes = {{"k", std::to_string(i)}};
      (void)q.send(std::string(static_cast<size_t>(50 + pick(400)), static_cast<char>('a' + pick(26))), o);
    } else if (op < 42) {  // batch of items
      std::vector<std::string> bodies;
      std::vector<SendItem> items;
      const int k = 1 + pick(6);
      for (int j = 0; j < k; ++j) bodies.push_back(std::string(static_cast<size_t>(20 + pick(200)), 'b'));
      for (int j = 0; j < k; ++j) {
        SendItem it{bodies[static_cast<size_t>(j)]};
        if (pick(3) == 0) it.dedup_id = "d" + std::to_string(pick(12));
        if (pick(3) == 0) it.group = "g" + std::to_string(pick(3));
        if (pick(3) == 0) it.priority = static_cast<uint8_t>(pick(256));
        items.push_back(it);
      }
      (void)q.send_batch(std::span<const SendItem>(items), SendOptions{});
    } else if (op < 62) {  // receive
      auto got = q.receive(static_cast<size_t>(1 + pick(4)), pick(5) == 0 ? Millis(1) : kHour);
      if (got.ok()) {
        for (auto& m : *got) held.push_back(std::move(m));
      }
    } else if (!held.empty() && op < 90) {
      const size_t at = static_cast<size_t>(pick(static_cast<int>(held.size())));
      Message m = std::move(held[at]);
      held.erase(held.begin() + static_cast<long>(at));
      const int what = pick(10);
      if (what < 5) {
        (void)q.ack(m.receipt);
      } else if (what < 7) {
        (void)q.nack(m.receipt, pick(2) == 0 ? Millis(0) : kHour);
      } else if (what < 9) {
        (void)q.extend(m.receipt, kHour);
        held.push_back(std::move(m));
      } else {
        (void)q.dead_letter(m.receipt, {{"why", "test"}});
      }
    } else if (op < 92) {
      (void)q.remove(1 + rng() % 400);
    } else if (op < 93) {  // an operator's pause or resume (issue 44)
      (void)(pick(2) == 0 ? q.pause() : q.resume());
    } else if (op < 94) {  // an operator's release of a lease by id
      (void)q.release(1 + rng() % 400);
    } else if (op < 95) {
      (void)q.purge();
    } else {
      (void)q.compact();
    }
  }
}

class ApplyPropertyTest : public QueueDirTest {
 public:
  // Deletes the index and opens the queue, which rebuilds it from the log; closes it again.
  void rebuild() {
    std::filesystem::remove(qdir() + "/index");
    auto q = open(options());
    ASSERT_NE(q, nullptr);
  }
};

TEST_F(ApplyPropertyTest, LiveStateEqualsReplayedState) {
  const auto ids = all_dedup_ids();
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::filesystem::remove_all(qdir());
    {
      auto q = open(options());
      ASSERT_NE(q, nullptr);
      run_stream(*q, seed, scaled(1500));
    }
    const Snapshot live = snapshot(qdir(), ids);
    ASSERT_GT(live.header.at("sent_total"), 0u);
    rebuild();
    expect_same(live, snapshot(qdir(), ids));
  }
}

TEST_F(ApplyPropertyTest, AfterAKillNineTheIndexLeftEqualsTheReplay) {
  const auto ids = all_dedup_ids();
  std::mt19937 rng(42);
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::filesystem::remove_all(qdir());
    { ASSERT_NE(open(options()), nullptr); }
    const uint32_t seed = 100 + static_cast<uint32_t>(round);
    pid_t child = spawn([&] {
      auto q = open_queue(qdir(), options());
      if (!q) return 1;
      run_stream(*q, seed, 1'000'000);  // until killed
      return 0;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + rng() % 250));
    ::kill(child, SIGKILL);
    EXPECT_EQ(wait_exit(child), 128 + SIGKILL);
    // The next open takes the index the dead process left (repairing it first if it died
    // holding the lock); that is the live state.
    { ASSERT_NE(open(options()), nullptr); }
    const Snapshot live = snapshot(qdir(), ids);
    rebuild();
    expect_same(live, snapshot(qdir(), ids));
  }
}

}  // namespace
}  // namespace spool::test
