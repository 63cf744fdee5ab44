// Corruption campaign (docs/reliability.md, campaign 5): random byte flips and truncations in
// the segment files and the index of a closed queue. Whatever the damage:
//  - open never crashes (each trial runs in a forked child) and either works or refuses
//    with an error naming the damaged file;
//  - verify() names the damage (the segment file) when records were damaged in the middle
//    of a segment, or a segment is missing;
//  - every live message with an undamaged record is still delivered, byte for byte, and
//    nothing comes back with a payload it was not sent with. Those are counted.
// The damage is planned against a map of every record (storage::Log::recover on the intact
// copy), so each trial knows which messages it hit.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "child_report.h"
#include "spool/queue.h"
#include "storage/log.h"
#include "test_util.h"

namespace spool {
namespace {

using namespace std::chrono_literals;
using test::in_child;
using test::Report;
using test::TempDir;
namespace fs = std::filesystem;

constexpr uint64_t kSegSize = 64 << 10;

std::string payload_for(uint64_t n) {
  std::mt19937_64 r(n * 7919);
  size_t len = 30 + r() % 1800;
  std::string s = "c" + std::to_string(n) + ":";
  while (s.size() < len) s.push_back(static_cast<char>(r()));  // binary, NULs included
  return s;
}

struct Rec {
  uint64_t seq, off, size, hashed;  // hashed: header + payload (what the checksum covers)
  format::RecordType type;
  uint64_t id;
};

struct Reference {
  std::string dir;
  std::map<uint64_t, std::string> payload;  // every id ever sent
  std::set<uint64_t> live;                  // not acked when the queue was closed
  std::vector<Rec> recs;
  std::map<uint64_t, uint64_t> seg_end;     // seq -> end of its records
  std::vector<uint64_t> seqs;
};

// 400 messages (binary payloads of 30..1830 bytes) in 64 KiB segments; about 110 of the
// oldest 150 acked, 30 leased (for a second, so they are receivable again by the time the
// trials run) and 10 of those nacked, then a compaction that copies the old segments' live
// messages: the log holds MSG originals and copies, LEASE, RELEASE, ACK and CHECKPOINT
// records.
Reference build_reference(const std::string& dir) {
  Reference ref;
  ref.dir = dir;
  QueueOptions o;
  o.segment_size = kSegSize;
  {
    auto q = Queue::open(dir, o);
    EXPECT_TRUE(q.ok());
    std::mt19937 rng(31337);
    for (uint64_t n = 1; n <= 400; ++n) {
      auto id = (*q)->send(payload_for(n));
      EXPECT_TRUE(id.ok());
      ref.payload[*id] = payload_for(n);
      ref.live.insert(*id);
    }
    for (int i = 0; i < 120; ++i) {
      uint64_t id = 1 + rng() % 150;
      auto m = (*q)->receive_id(id, 60s);
      if (!m.ok()) continue;
      EXPECT_TRUE((*q)->ack(m->receipt).ok());
      ref.live.erase(id);
    }
    auto got = (*q)->receive(30, 1s);
    EXPECT_TRUE(got.ok());
    for (size_t i = 0; i < got->size(); i += 3) EXPECT_TRUE((*q)->nack((*got)[i].receipt).ok());
    auto c = (*q)->compact();
    EXPECT_TRUE(c.ok() && c->messages_copied > 0) << "the reference needs compaction copies";
  }
  std::this_thread::sleep_for(1200ms);  // the leases run out
  storage::LogOptions lo;
  lo.segment_size = kSegSize;
  lo.read_only = true;
  auto log = storage::Log::open(dir + "/segments", lo);
  EXPECT_TRUE(log.ok());
  auto rec = (*log)->recover([&](storage::Pos p, const storage::RecordView& v) {
    ref.recs.push_back(Rec{p.seq, p.off, v.size, format::kRecordHeaderSize + v.payload.size(), v.type, v.id});
    ref.seg_end[p.seq] = p.off + v.size;
  });
  EXPECT_TRUE(rec.ok());
  EXPECT_TRUE(rec->corrupt.empty());
  auto seqs = (*log)->segments();
  ref.seqs = *seqs;
  return ref;
}

std::string seg_name(uint64_t seq) {
  char name[32];
  std::snprintf(name, sizeof name, "%020" PRIu64 ".seg", seq);
  return name;
}

// One trial's damage, as planned.
struct Damage {
  std::string kind;
  std::map<uint64_t, std::vector<uint64_t>> flips;  // seq -> offsets flipped
  std::map<uint64_t, uint64_t> cut;                  // seq -> truncated to this size
  std::set<uint64_t> removed;                        // seq -> file deleted
  bool index_damaged = false;
  bool index_deleted = false;

  bool hits(const Rec& r, bool whole) const {
    if (removed.count(r.seq)) return true;
    if (auto c = cut.find(r.seq); c != cut.end() && c->second < r.off + r.size) return true;
    auto f = flips.find(r.seq);
    if (f == flips.end()) return false;
    for (uint64_t o : f->second) {
      if (o < format::kSegmentHeaderSize) return true;  // the header: the whole segment is unreadable
      if (o >= r.off && o < r.off + (whole ? r.size : r.hashed)) return true;
    }
    return false;
  }
  // Segments whose damage verify must name: every segment with a damaged record, except
  // damage at the very end of the last segment, which is what a torn write leaves and
  // recovery silently drops by design (docs/durability.md). A sealed segment was complete and
  // synced before the log moved on, so damage anywhere in it is corruption.
  std::set<uint64_t> must_name(const Reference& ref) const {
    std::set<uint64_t> out;
    // Known bug SEALED_TAIL: recovery takes the end of a sealed segment's valid records for
    // the end of that segment, so damage there is dropped as silently as a torn tail.
    bool sealed_tail_known = std::getenv("SPOOL_KNOWN_BUG_SEALED_TAIL") != nullptr;
    uint64_t last = ref.seqs.back();
    for (const Rec& r : ref.recs) {
      if (removed.count(r.seq) || !hits(r, false)) continue;
      bool followed = false;
      for (const Rec& after : ref.recs) followed = followed || (after.seq == r.seq && after.off > r.off && !hits(after, true));
      if ((r.seq != last && !sealed_tail_known) || followed) out.insert(r.seq);
    }
    return out;
  }
};

void flip_byte(const std::string& path, uint64_t off, uint8_t mask) {
  int fd = ::open(path.c_str(), O_RDWR);
  uint8_t b = 0;
  if (::pread(fd, &b, 1, static_cast<off_t>(off)) == 1) {
    b ^= mask;
    EXPECT_GE(::pwrite(fd, &b, 1, static_cast<off_t>(off)), 0);
  }
  ::close(fd);
}

Damage plan_and_apply(const Reference& ref, const std::string& dir, int kind, std::mt19937_64& rng) {
  Damage d;
  auto seg_path = [&](uint64_t seq) { return dir + "/segments/" + seg_name(seq); };
  auto any_seq = [&] { return ref.seqs[rng() % ref.seqs.size()]; };
  auto mask = [&] { return static_cast<uint8_t>(1 + rng() % 255); };
  switch (kind) {
    case 0: {  // flips inside records
      d.kind = "flips in records";
      for (int n = 1 + static_cast<int>(rng() % 4); n > 0; --n) {
        uint64_t seq = any_seq();
        uint64_t end = ref.seg_end.at(seq);
        uint64_t off = format::kSegmentHeaderSize + rng() % (end - format::kSegmentHeaderSize);
        d.flips[seq].push_back(off);
        flip_byte(seg_path(seq), off, mask());
      }
      break;
    }
    case 1: {  // flips anywhere in a segment file, the unused tail included
      d.kind = "flips anywhere";
      for (int n = 1 + static_cast<int>(rng() % 6); n > 0; --n) {
        uint64_t seq = any_seq();
        uint64_t off = format::kSegmentHeaderSize + rng() % (kSegSize - format::kSegmentHeaderSize);
        d.flips[seq].push_back(off);
        flip_byte(seg_path(seq), off, mask());
      }
      break;
    }
    case 2: {  // truncation
      d.kind = "truncation";
      uint64_t seq = any_seq();
      if (std::getenv("SPOOL_KNOWN_BUG_SEALED_TAIL") != nullptr) seq = ref.seqs.back();  // a torn tail only
      uint64_t at = format::kSegmentHeaderSize + rng() % (ref.seg_end.at(seq) - format::kSegmentHeaderSize);
      d.cut[seq] = at;
      EXPECT_EQ(::truncate(seg_path(seq).c_str(), static_cast<off_t>(at)), 0);
      break;
    }
    case 3: {  // a segment header
      d.kind = "segment header";
      uint64_t seq = any_seq();
      uint64_t off = rng() % format::kSegmentHeaderSize;
      d.flips[seq].push_back(off);
      flip_byte(seg_path(seq), off, mask());
      break;
    }
    case 4: {  // a segment file lost
      d.kind = "missing segment";
      uint64_t seq = ref.seqs[1 + rng() % (ref.seqs.size() - 2)];  // not the first nor the last
      d.removed.insert(seq);
      ::unlink(seg_path(seq).c_str());
      break;
    }
    case 5: {  // the index
      d.kind = "index flips";
      d.index_damaged = true;
      std::string path = dir + "/index";
      struct stat st {};
      ::stat(path.c_str(), &st);
      for (int n = 1 + static_cast<int>(rng() % 16); n > 0; --n) flip_byte(path, rng() % static_cast<uint64_t>(st.st_size), mask());
      break;
    }
    case 6: {
      d.kind = "index truncated";
      d.index_damaged = true;
      std::string path = dir + "/index";
      struct stat st {};
      ::stat(path.c_str(), &st);
      EXPECT_EQ(::truncate(path.c_str(), static_cast<off_t>(rng() % static_cast<uint64_t>(st.st_size))), 0);
      break;
    }
  }
  // As after a reboot, the index is gone half the time; otherwise it is the one of the intact
  // queue (same boot), which the opener must not trust over the damaged log... or must check.
  if (!d.index_damaged && rng() % 2 == 0) {
    ::unlink((dir + "/index").c_str());
    d.index_deleted = true;
  }
  return d;
}

// The child's side of a trial.
void check_trial(Report& r, const Reference& ref, const std::string& dir, const Damage& d) {
  spdlog::set_level(spdlog::level::off);
  // Which live messages must survive: those with an undamaged MSG record.
  std::set<uint64_t> must, damaged;
  for (uint64_t id : ref.live) {
    bool intact = false, hit = false;
    for (const Rec& rec : ref.recs) {
      if (rec.type != format::RecordType::kMsg || rec.id != id) continue;
      if (!d.hits(rec, true)) intact = true;
      if (d.hits(rec, false)) hit = true;
    }
    if (intact) must.insert(id);
    if (hit && !intact) damaged.insert(id);
  }
  auto q = Queue::open(dir);
  if (!q.ok()) {
    r.count("refused");
    std::string msg = q.status().message();
    r.check(msg.find("segments/") != std::string::npos || msg.find("index") != std::string::npos,
            d.kind + ": open refused without naming the damaged file: " + q.status().to_string());
    r.info(d.kind + ": open refused: " + q.status().to_string());
    return;
  }
  r.count("opened");
  Queue& Q = **q;
  auto v = Q.verify(false);
  if (!v.ok()) {
    // verify could not replay the log (a segment it cannot open); its error must name it.
    r.count("verify refused to run");
    r.check(v.status().message().find("segments/") != std::string::npos,
            d.kind + ": verify failed without naming a segment: " + v.status().to_string());
    r.fail(d.kind + ": verify failed to run instead of reporting the damage: " + v.status().to_string());
  }
  std::set<uint64_t> to_name = d.must_name(ref);
  if (v.ok() && (!to_name.empty() || !d.removed.empty())) {
    r.count("damage verify must name");
    bool named = true;
    for (uint64_t seq : to_name) {
      bool this_one = false;
      for (const auto& p : v->problems) this_one = this_one || p.find(seg_name(seq)) != std::string::npos;
      named = named && this_one;
    }
    if (!d.removed.empty()) {
      bool missing = false;
      for (const auto& p : v->problems) missing = missing || p.find("missing") != std::string::npos;
      named = named && missing;
    }
    if (r.check(named, d.kind + ": verify does not name every damaged segment (" +
                           (v->problems.empty() ? std::string("no problems at all") : v->problems.front()) + ")")) {
      r.count("damage named by verify");
    }
  }
  if (v.ok() && !v->ok()) r.count("verify reported problems");
  if (v.ok() && std::getenv("CORRUPTION_DEBUG")) {
    std::string fl;
    for (auto& [seq, offs] : d.flips)
      for (auto o : offs) fl += " " + std::to_string(seq) + "@" + std::to_string(o);
    r.info(d.kind + ": flips" + fl + "; must " + std::to_string(must.size()) + " damaged " + std::to_string(damaged.size()) +
           "; verify: " + std::to_string(v->problems.size()) + " " + (v->problems.empty() ? "" : v->problems.front()));
  }
  if (!Q.peek(SIZE_MAX).ok()) r.count("peek failed as a whole (an unreadable message)");
  // Deliver everything: every message with an intact record must come out intact.
  std::map<uint64_t, std::string> got;
  for (int guard = 0; guard < 100; ++guard) {
    auto batch = Q.receive(64, 3600s);
    if (!batch.ok()) {
      r.check(batch.status().code() == Code::kEmpty, d.kind + ": receive: " + batch.status().to_string());
      break;
    }
    for (auto& m : *batch) {
      got[m.id] = m.payload;
      (void)Q.ack(m.receipt);
    }
  }
  // What is left could not be delivered (it went to the dead-letter queue, described).
  auto left = Q.list(SIZE_MAX);
  r.check(left.ok() && left->empty(), d.kind + ": messages left after draining: " +
                                          std::to_string(left.ok() ? left->size() : 0));
  size_t readable = 0;
  for (uint64_t id : must) {
    auto it = got.find(id);
    if (it == got.end()) {
      // A leased message peek could not read is reported above; otherwise it is missing.
      r.fail(d.kind + ": undamaged message " + std::to_string(id) + " is not delivered");
      continue;
    }
    if (r.check(it->second == ref.payload.at(id), d.kind + ": message " + std::to_string(id) + " came back altered")) ++readable;
  }
  for (auto& [id, body] : got) {
    auto it = ref.payload.find(id);
    r.check(it != ref.payload.end() && it->second == body,
            d.kind + ": message " + std::to_string(id) + " was delivered with a payload it was never sent with");
  }
  size_t resurrected = 0;
  for (auto& [id, body] : got) resurrected += !ref.live.count(id);
  r.count("undamaged messages checked", static_cast<long>(must.size()));
  r.count("undamaged messages readable", static_cast<long>(readable));
  r.count("damaged messages", static_cast<long>(damaged.size()));
  r.count("acked messages back (their ACK record was damaged)", static_cast<long>(resurrected));
  // Messages lost to damage go to the dead-letter queue with a description, or are gone
  // from the rebuilt index; either way verify said so above (interior damage).
}

TEST(Corruption, ByteFlipsAndTruncationsNeverCrashAndSpareUndamagedMessages) {
  if (std::getenv("SPOOL_LOG") == nullptr) spdlog::set_level(spdlog::level::off);
  TempDir d;
  Reference ref = build_reference(d / "ref");
  ASSERT_GE(ref.seqs.size(), 5u) << "the reference needs several segments";
  std::mt19937_64 rng(20250101);
  int trials = test::scaled(70);
  if (const char* s = std::getenv("SPOOL_SOAK_SECONDS")) trials = std::max(trials, std::atoi(s) * 10);
  std::map<std::string, long> counts;
  std::map<std::string, int> kinds;
  for (int t = 0; t < trials; ++t) {
    int kind = t % 7;
    if (kind == 5 && std::getenv("SPOOL_KNOWN_BUG_INDEX_TRUSTED") != nullptr) {
      if (t < 7)
        std::printf("\n*** KNOWN BUG SPOOL_KNOWN_BUG_INDEX_TRUSTED: a closed queue's index with random byte "
                    "flips but a valid header is reused by the first opener; entries damaged in a way the "
                    "invariant check does not see (a record position, say) make intact messages "
                    "undeliverable (dead-lettered as unreadable). Index-flip trials are SKIPPED; unset the "
                    "variable to run them. ***\n\n");
      continue;
    }
    if (kind == 2 && t < 7 && std::getenv("SPOOL_KNOWN_BUG_SEALED_TAIL") != nullptr) {
      std::printf("\n*** KNOWN BUG SPOOL_KNOWN_BUG_SEALED_TAIL: a sealed segment that was truncated, or whose "
                  "last records are damaged, loses those records without any report: recovery and verify take "
                  "the last valid record for the end of the segment, as for a torn tail. Truncation trials cut "
                  "only the last segment, and sealed-tail damage need not be named; unset the variable to test "
                  "it. ***\n\n");
    }
    if (kind == 3 && std::getenv("SPOOL_KNOWN_BUG_SEGMENT_HEADER") != nullptr) {
      if (t < 7)
        std::printf("\n*** KNOWN BUG SPOOL_KNOWN_BUG_SEGMENT_HEADER: one damaged segment header makes "
                    "Queue::open fail for the whole queue when it must rebuild the index, and verify() fail "
                    "instead of reporting (storage::Log::recover returns the segment's error), so no "
                    "undamaged message is readable. Trials of that kind are SKIPPED; unset the variable to "
                    "run them. ***\n\n");
      continue;
    }
    std::string dir = d / ("t" + std::to_string(t));
    fs::copy(ref.dir, dir, fs::copy_options::recursive);
    Damage dmg = plan_and_apply(ref, dir, kind, rng);
    ++kinds[dmg.kind];
    SCOPED_TRACE("trial " + std::to_string(t) + ": " + dmg.kind + (dmg.index_deleted ? ", index deleted" : ""));
    in_child("trial " + std::to_string(t) + " (" + dmg.kind + ")", [&](Report& r) { check_trial(r, ref, dir, dmg); },
             60s, &counts, std::getenv("CORRUPTION_DEBUG") != nullptr);
    fs::remove_all(dir);
  }
  std::printf("[figures] corruption: trials=%d", trials);
  for (auto& [k, n] : kinds) std::printf(" | %s: %d", k.c_str(), n);
  std::printf("\n");
  for (auto& [k, n] : counts) std::printf("[figures]   %s: %ld\n", k.c_str(), n);
  EXPECT_EQ(counts["undamaged messages checked"], counts["undamaged messages readable"]);
  EXPECT_EQ(counts["damage verify must name"], counts["damage named by verify"]);
}

}  // namespace
}  // namespace spool
