// A campaign of random damage to the files of a queue while processes have it open
// (issue 23, "Done when"): each round fills a queue, starts two worker processes that
// receive, ack, nack and send, and meanwhile damages one file at random, the way a stray
// tool, a bad disk or a hostile user with write access could: bytes of the index or a
// segment overwritten, a file truncated or deleted, spool.conf or a lock file filled with
// garbage. Then it checks what docs/security.md promises:
//   - no process crashes (a signal) or hangs past a bound: the workers run in forked
//     children and report through child_report.h;
//   - no call returns a payload other than the one sent (records are checksummed);
//   - nothing is lost that the damage did not destroy: after a rebuild from the log, every
//     message sent and not acked is there, and no acked one is back, unless the damage hit a
//     segment (whose records it may destroy: then the losses are a printed figure);
//   - a queue whose index was damaged opens again, in a new process, without a crash.
// The round count is scaled down under the sanitizers (SPOOL_TEST_SCALE).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "child_report.h"
#include "spool/queue.h"
#include "test_util.h"

namespace spool {
namespace {

using namespace std::chrono_literals;
using test::finish_child;
using test::in_child;
using test::Report;
using test::start_child;
using test::TempDir;
namespace fs = std::filesystem;

// The payload of message tag k: "k:" then a run of one letter whose length and letter
// follow from k, so that any payload can be checked against its tag.
std::string payload_of(uint64_t k) { return std::to_string(k) + ":" + std::string(20 + k % 300, char('a' + k % 26)); }
bool tag_of(const std::string& p, uint64_t* k) {
  auto colon = p.find(':');
  if (colon == std::string::npos || colon == 0 || colon > 19) return false;
  for (size_t i = 0; i < colon; ++i)
    if (p[i] < '0' || p[i] > '9') return false;
  *k = std::stoull(p.substr(0, colon));
  return p == payload_of(*k);
}

enum class Damage {
  kIndexBytes, kIndexTruncated, kIndexDeleted, kConfGarbage, kLockFiles, kSegmentBytes, kSegmentTruncated, kSpareGarbage,
  kPlantedLink, kPlantedFifo, kCount
};
const char* name_of(Damage d) {
  switch (d) {
    case Damage::kIndexBytes: return "index bytes";
    case Damage::kIndexTruncated: return "index truncated";
    case Damage::kIndexDeleted: return "index deleted";
    case Damage::kConfGarbage: return "spool.conf garbage";
    case Damage::kLockFiles: return "lock files garbage";
    case Damage::kSegmentBytes: return "segment bytes";
    case Damage::kSegmentTruncated: return "segment truncated";
    case Damage::kSpareGarbage: return "spare garbage";
    case Damage::kPlantedLink: return "planted link";
    case Damage::kPlantedFifo: return "planted FIFO";
    case Damage::kCount: break;
  }
  return "?";
}
bool hits_segments(Damage d) { return d == Damage::kSegmentBytes || d == Damage::kSegmentTruncated; }

std::vector<std::string> files_in(const std::string& dir, const std::string& suffix_or_prefix, bool prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename();
    if (prefix ? n.starts_with(suffix_or_prefix) : n.ends_with(suffix_or_prefix)) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void overwrite(const std::string& path, uint64_t off, const std::string& bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_NOFOLLOW);
  if (fd < 0) return;
  (void)!::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(off));
  ::close(fd);
}

uint64_t size_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

std::string garbage(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

// Links and FIFOs planted in a queue (issue 48), by a user who may write it: what the round
// undoes afterwards, as the queue's owner would after reading the error that names each
// one, and the files outside the queue that the links point at, which must come through
// unchanged (spool never follows a link in a queue).
struct Planted {
  std::vector<std::string> names;                          // removed at the end of the round
  std::vector<std::pair<std::string, std::string>> moved;  // {where it went, its place}: put back
  std::map<std::string, std::string> targets;              // outside file -> content it must keep
  std::string target_dir;                                  // outside directory that must stay empty
};

// The queue's file `path` (a segment, or a lock file) moved out of the queue, so that
// something can be planted in its place; put back at the end of the round.
void move_out(const std::string& path, const std::string& outside, Planted& p) {
  const std::string to = outside + "/moved-" + std::to_string(p.moved.size());
  if (::rename(path.c_str(), to.c_str()) == 0) p.moved.emplace_back(to, path);
}

// Plants a link (`fifo` false) or a FIFO at one of the places spool opens: a segment, a
// spare, a lock file, the dead-letter queue.
void plant(const std::string& q, bool fifo, std::mt19937_64& rng, Planted& p) {
  const std::string outside = q + ".outside";
  fs::create_directories(outside);
  const std::string victim = outside + "/victim-file";
  std::ofstream(victim, std::ios::trunc) << "not spool's";
  p.targets[victim] = "not spool's";
  auto put = [&](const std::string& at) {
    const int r = fifo ? ::mkfifo(at.c_str(), 0600) : ::symlink(victim.c_str(), at.c_str());
    if (r == 0) p.names.push_back(at);
  };
  const std::string lock = std::vector<std::string>{"/gate", "/lock", "/owners", "/compact.lock"}[rng() % 4];
  // Each place in turn, so that even a scaled-down run meets most of them.
  static int turn[2] = {0, 0};
  switch (turn[fifo]++ % 4) {
    case 0: {  // a segment
      auto segs = files_in(q + "/segments", ".seg", false);
      if (segs.empty()) return;
      const std::string s = segs[rng() % segs.size()];
      move_out(s, outside, p);
      put(s);
      return;
    }
    case 1:  // a spare
      put(q + "/segments/spare-planted");
      return;
    case 2:  // a lock file
      move_out(q + lock, outside, p);
      put(q + lock);
      return;
    default:  // the dead-letter queue: a link to a directory, or a FIFO in its segments
      if (fifo) {
        fs::create_directories(q + "/dlq/segments");
        put(q + "/dlq/segments/00000000000000000001.seg");
      } else {
        p.target_dir = outside + "/victim-dir";
        fs::create_directories(p.target_dir);
        if (::symlink(p.target_dir.c_str(), (q + "/dlq").c_str()) == 0) p.names.push_back(q + "/dlq");
      }
      return;
  }
}

// Undoes plant(): what is still planted goes, and what was moved out comes back (unless
// spool removed the planted name meanwhile, e.g. compaction unlinking a segment name).
// Then checks that nothing outside the queue was written through a link.
void unplant(const Planted& p, Report& r) {
  for (const auto& n : p.names) {
    struct stat st {};
    if (::lstat(n.c_str(), &st) != 0) continue;
    ::unlink(n.c_str());
    for (const auto& [from, to] : p.moved) {
      if (to == n) (void)::rename(from.c_str(), to.c_str());
    }
  }
  for (const auto& [file, want] : p.targets) {
    r.check(test::slurp(file) == want, file + ", a link's target outside the queue, was changed");
  }
  if (!p.target_dir.empty()) {
    r.check(fs::is_empty(p.target_dir), p.target_dir + ", a link's target outside the queue, has files in it");
  }
}

// Damages one file of the queue at `q` (as another process would, while the workers run).
void damage(const std::string& q, Damage d, std::mt19937_64& rng, Planted& planted) {
  const std::string index = q + "/index";
  switch (d) {
    case Damage::kIndexBytes: {
      const uint64_t size = size_of(index);
      if (size == 0) return;
      for (int i = 0, n = 1 + static_cast<int>(rng() % 8); i < n; ++i) {
        // Half of the hits in the header page, where the counters and geometry are.
        uint64_t off = rng() % 2 == 0 ? rng() % std::min<uint64_t>(size, 4096) : rng() % size;
        overwrite(index, off, garbage(rng, 1 + rng() % 16));
      }
      return;
    }
    case Damage::kIndexTruncated: (void)::truncate(index.c_str(), static_cast<off_t>(rng() % (size_of(index) + 1))); return;
    case Damage::kIndexDeleted: ::unlink(index.c_str()); return;
    case Damage::kConfGarbage: {
      std::ofstream(q + "/spool.conf", std::ios::trunc) << "visibility_ms = " << garbage(rng, 8) << "\nsync = sometimes\n";
      return;
    }
    case Damage::kLockFiles:
      for (const char* f : {"/gate", "/lock", "/owners"}) {
        std::ofstream(q + f, std::ios::trunc | std::ios::binary) << garbage(rng, rng() % 4096);
      }
      return;
    case Damage::kSegmentBytes: {
      auto segs = files_in(q + "/segments", ".seg", false);
      if (segs.empty()) return;
      const std::string& s = segs[rng() % segs.size()];
      const uint64_t size = size_of(s);
      for (int i = 0, n = 1 + static_cast<int>(rng() % 4); i < n; ++i) overwrite(s, rng() % size, garbage(rng, 1 + rng() % 64));
      return;
    }
    case Damage::kSegmentTruncated: {
      auto segs = files_in(q + "/segments", ".seg", false);
      if (segs.empty()) return;
      const std::string& s = segs[rng() % segs.size()];
      (void)::truncate(s.c_str(), static_cast<off_t>(rng() % (size_of(s) + 1)));
      return;
    }
    case Damage::kSpareGarbage: {
      auto spares = files_in(q + "/segments", "spare-", true);
      if (spares.empty()) {
        std::ofstream(q + "/segments/spare-planted", std::ios::binary) << garbage(rng, 4096);
        return;
      }
      const std::string& s = spares[rng() % spares.size()];
      overwrite(s, 0, garbage(rng, 256));
      return;
    }
    case Damage::kPlantedLink: plant(q, false, rng, planted); return;
    case Damage::kPlantedFifo: plant(q, true, rng, planted); return;
    case Damage::kCount: return;
  }
}

QueueOptions existing() {
  QueueOptions o;
  o.create = false;
  return o;
}

// What one worker does for about `ms`: receive, check each payload, ack half, nack the
// rest, send a few. Counts what happened; "acked:ID" for every ack that returned, "ackerr:ID"
// for one that failed (its effect is unknown), "sent:ID:TAG" for every send that returned.
void worker(const std::string& q, int who, uint32_t seed, int ms, Report& r) {
  auto opened = Queue::open(q, existing());
  if (!opened.ok()) {
    r.count("open failed");
    return;
  }
  auto& queue = **opened;
  std::mt19937 rng(seed);
  uint64_t next_tag = 1'000'000ull * static_cast<uint64_t>(who + 1);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < until) {
    auto got = queue.receive(1 + rng() % 4, 2000ms, 20ms);
    if (!got.ok()) {
      r.count(got.status().code() == Code::kEmpty ? "receive empty" : "receive error");
      if (got.status().code() != Code::kEmpty) std::this_thread::sleep_for(5ms);
      continue;
    }
    for (auto& m : *got) {
      uint64_t k;
      if (!r.check(tag_of(m.payload, &k), "message " + std::to_string(m.id) + " came back with a payload that was never sent"))
        continue;
      if (rng() % 2 == 0) {
        Status s = queue.ack(m.receipt);
        r.count((s.ok() ? "acked:" : "ackerr:") + std::to_string(m.id));
      } else {
        (void)queue.nack(m.receipt);
      }
    }
    if (rng() % 4 == 0) {
      uint64_t k = next_tag++;
      auto id = queue.send(payload_of(k));
      if (id.ok()) r.count("sent:" + std::to_string(*id) + ":" + std::to_string(k));
    }
  }
}

struct Figures {
  int rounds = 0;
  std::map<std::string, int> by_damage;
  std::map<std::string, long> reopen;
  long lost_to_segment_damage = 0, resurrected_by_segment_damage = 0, worker_errors = 0;
};

void round_of_damage(const std::string& q, Damage d, uint64_t seed, Figures& fig) {
  SCOPED_TRACE(std::string("damage: ") + name_of(d));
  std::mt19937_64 rng(seed);
  QueueOptions o;
  o.segment_size = 64 << 10;
  o.max_receives = 0;  // nothing leaves for the dead-letter queue: every message is accounted here
  std::map<uint64_t, uint64_t> tag_of_id;
  {
    auto made = Queue::open(q, o);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    for (uint64_t k = 1; k <= 400; ++k) {
      auto id = (*made)->send(payload_of(k));
      ASSERT_TRUE(id.ok());
      tag_of_id[*id] = k;
    }
  }
  const std::string conf = test::slurp(q + "/spool.conf");
  std::vector<test::ChildRun> workers;
  for (int w = 0; w < 2; ++w) {
    uint32_t s = static_cast<uint32_t>(rng());
    workers.push_back(start_child("worker " + std::to_string(w), [&, w, s](Report& r) { worker(q, w, s, 500, r); }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(60 + rng() % 200));
  Planted planted;
  damage(q, d, rng, planted);
  std::map<std::string, long> counts;
  for (auto& w : workers) finish_child(w, 30s, &counts, false);  // a crash or a hang fails here
  if (::testing::Test::HasFailure()) return;

  std::set<uint64_t> acked, uncertain;
  for (auto& [name, n] : counts) {
    if (name.starts_with("acked:")) acked.insert(std::stoull(name.substr(6)));
    if (name.starts_with("ackerr:")) uncertain.insert(std::stoull(name.substr(7)));
    if (name.starts_with("sent:")) {
      auto colon = name.find(':', 5);
      tag_of_id[std::stoull(name.substr(5, colon - 5))] = std::stoull(name.substr(colon + 1));
    }
    if (name == "receive error" || name == "open failed") fig.worker_errors += n;
  }
  // spool.conf holds settings, not messages: put it back, as its owner would after reading
  // the error that names it.
  if (d == Damage::kConfGarbage) {
    std::ofstream(q + "/spool.conf", std::ios::trunc) << conf;
  }
  // The damaged index as the next process finds it: it opens, or fails with an error; it
  // does not crash.
  std::map<std::string, long> reopen;
  in_child("reopen", [&](Report& r) {
    auto again = Queue::open(q, existing());
    if (again.ok()) {
      auto st = (*again)->stats();
      r.count(st.ok() ? "reopened" : "reopened, stats failed");
    } else {
      r.count("reopen refused");
    }
  }, 30s, &reopen, false);
  for (auto& [k, n] : reopen) fig.reopen[k] += n;
  // Planted links and FIFOs: removed (what they replaced put back), their targets checked.
  in_child("unplant", [&](Report& r) { unplant(planted, r); }, 30s, nullptr, true);
  if (::testing::Test::HasFailure()) return;
  // Then from the log alone.
  ::unlink((q + "/index").c_str());
  const bool strict = !hits_segments(d);
  long lost = 0, back = 0;
  in_child("rebuilt", [&](Report& r) {
    auto again = Queue::open(q, existing());
    if (!r.check(again.ok(), "the queue does not open after a rebuild from its log: " + again.status().to_string())) return;
    auto all = (*again)->peek(SIZE_MAX);
    if (!r.check(all.ok(), "peek: " + all.status().to_string())) return;
    std::set<uint64_t> present;
    for (auto& m : *all) {
      uint64_t k;
      present.insert(m.id);
      if (!r.check(tag_of(m.payload, &k), "message " + std::to_string(m.id) + " has a payload that was never sent")) continue;
      auto it = tag_of_id.find(m.id);
      r.check(it != tag_of_id.end() && it->second == k,
              "message " + std::to_string(m.id) + " carries tag " + std::to_string(k) + ", which was not sent as it");
    }
    for (auto& [id, k] : tag_of_id) {
      if (acked.count(id) || uncertain.count(id) || present.count(id)) continue;
      if (strict) r.fail("message " + std::to_string(id) + " (tag " + std::to_string(k) + ") was lost, its segments undamaged");
      r.count("lost");
    }
    for (uint64_t id : acked) {
      if (!present.count(id)) continue;
      if (strict) r.fail("message " + std::to_string(id) + " is back although its ack returned and its segments are undamaged");
      r.count("back");
    }
  }, 60s, &counts, false);
  lost = counts["lost"];
  back = counts["back"];
  fig.lost_to_segment_damage += lost;
  fig.resurrected_by_segment_damage += back;
  ++fig.rounds;
  ++fig.by_damage[name_of(d)];
}

TEST(DamageCampaign, RandomDamageWhileProcessesRunCrashesNothingAndLosesOnlyWhatItDestroyed) {
  const int rounds = test::scaled(40);
  std::mt19937_64 rng(20261202);
  Figures fig;
  for (int i = 0; i < rounds; ++i) {
    TempDir d;
    // Every kind in turn, so that even a scaled-down run meets each one.
    auto kind = static_cast<Damage>(i % static_cast<int>(Damage::kCount));
    round_of_damage(d / "q", kind, rng(), fig);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "round " << i << " (" << name_of(kind) << ") failed; stopping";
      break;
    }
  }
  std::string kinds;
  for (auto& [k, n] : fig.by_damage) kinds += " '" + k + "'=" + std::to_string(n);
  for (auto& [k, n] : fig.reopen) kinds += " '" + k + "'=" + std::to_string(n);
  std::printf("[figures] damage rounds=%d%s worker_call_errors=%ld lost_to_segment_damage=%ld "
              "acked_back_by_segment_damage=%ld\n",
              fig.rounds, kinds.c_str(), fig.worker_errors, fig.lost_to_segment_damage,
              fig.resurrected_by_segment_damage);
  EXPECT_EQ(fig.rounds, rounds);
}

}  // namespace
}  // namespace spool
