// Compaction: disk reclaim, state kept across it, and crash safety under kill -9.
#include <cinttypes>
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "proc_util.h"
#include "spool/queue.h"
#include "storage/log.h"
#include "test_util.h"

namespace spool {
namespace {

using namespace std::chrono_literals;

class CompactTest : public test::QueueDirTest {
 public:
  std::unique_ptr<Queue> open(uint64_t segment_size = 1 << 20, uint64_t max_payload = 4096) {
    QueueOptions o;
    o.segment_size = segment_size;
    o.max_payload = max_payload;
    o.max_receives = 0;  // nothing may move to the dead-letter queue in these tests
    return QueueDirTest::open(o);
  }
  std::vector<std::string> segment_files() const {
    std::vector<std::string> out;
    for (auto& e : std::filesystem::directory_iterator(qdir() + "/segments")) out.push_back(e.path().filename());
    return out;
  }
};

TEST_F(CompactTest, AckingAGibibyteLeavesAtMostOneSegment) {
  constexpr uint64_t kSegment = 16 << 20;
  auto q = open(kSegment, 64 << 10);
  std::string body(64 << 10, 'x');
  std::vector<std::string_view> batch(16, body);
  const int batches = test::scaled(1024);  // 1 GiB at scale 1
  for (int i = 0; i < batches; ++i) ASSERT_TRUE(q->send_batch(batch).ok());
  EXPECT_GE(q->stats()->segments, static_cast<uint64_t>(batches) / 17);
  for (;;) {
    auto got = q->receive(256, 60s);
    if (!got.ok()) {
      ASSERT_EQ(got.status().code(), Code::kEmpty);
      break;
    }
    for (auto& m : *got) ASSERT_TRUE(q->ack(m.receipt).ok());
  }
  ASSERT_TRUE(q->compact().ok());
  auto st = q->stats();
  EXPECT_EQ(st->segments, 1u);
  EXPECT_LE(st->bytes_on_disk, kSegment);
  EXPECT_EQ(st->acked_total, 16u * batches);
  EXPECT_EQ(st->sent_total, 16u * batches);
  EXPECT_EQ(q->check_index(), "");
}

TEST_F(CompactTest, LiveMessagesKeepPayloadCountAndLeaseAcrossCompactionAndRebuild) {
  std::map<uint64_t, std::string> live;
  std::string held_receipt;
  {
    auto q = open(64 << 10);
    for (int i = 0; i < 2000; ++i) {
      std::string body = "message " + std::to_string(i) + std::string(1000, 'p');
      auto id = q->send(body);
      ASSERT_TRUE(id.ok());
      live[*id] = body;
    }
    // Keep every 100th message: one stays leased, the others are nacked twice (count 2).
    auto got = q->receive(5000, 60s);
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(got->size(), 2000u);
    for (auto& m : *got) {
      if (m.id % 100 != 0) {
        ASSERT_TRUE(q->ack(m.receipt).ok());
        live.erase(m.id);
      } else if (m.id == 100) {
        held_receipt = m.receipt;
      } else {
        ASSERT_TRUE(q->nack(m.receipt).ok());
      }
    }
    auto again = q->receive(100, 60s);
    ASSERT_EQ(again->size(), 19u);
    for (auto& m : *again) ASSERT_TRUE(q->nack(m.receipt).ok());
    auto before = q->stats();
    auto r = q->compact();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_LE(r->messages_copied, live.size()) << "only live messages are copied";
    // This call and the background compaction the acks triggered leave a short log.
    EXPECT_LE(q->stats()->segments, 3u);
    auto after = q->stats();
    EXPECT_EQ(after->sent_total, before->sent_total);
    EXPECT_EQ(after->acked_total, before->acked_total);
    EXPECT_EQ(q->check_index(), "");
  }
  std::filesystem::remove(qdir() + "/index");  // rebuild from the compacted log alone
  auto q = open(64 << 10);
  auto st = q->stats();
  EXPECT_EQ(st->sent_total, 2000u);
  EXPECT_EQ(st->acked_total, 2000u - live.size());
  EXPECT_EQ(st->in_flight, 1u) << "the lease survived";
  auto all = q->peek(10000);
  ASSERT_EQ(all->size(), live.size());
  for (auto& m : *all) {
    EXPECT_EQ(m.payload, live[m.id]);
    EXPECT_EQ(m.receive_count, m.id == 100 ? 1u : 2u) << m.id;
  }
  EXPECT_TRUE(q->ack(held_receipt).ok()) << "a receipt from before compaction still works";
}

// A compaction killed in the middle of its append can leave the COPY of a message without
// the LEASE or RELEASE record that follows it (a batch is torn between two records, or
// between two segments at a roll). The rebuild after that death must not point the message
// at such a lone copy: a later compaction then removes the original and every record of the
// message's receives, and the next rebuild gives it receive count 0 again (the crash
// campaign's RECEIVE_COUNT_REPEAT: a message delivered twice with receive count 1).
TEST_F(CompactTest, ALoneCopyLeftByAKilledCompactionKeepsTheReceiveCount) {
  constexpr uint64_t kSegment = 64 << 10;
  uint64_t target = 0;
  std::string target_body = "target" + std::string(1000, 't');
  {
    auto q = open(kSegment);
    auto id = q->send(target_body);
    ASSERT_TRUE(id.ok());
    target = *id;
    // Fillers: segment 1 fills up and the log rolls into segment 2.
    for (int i = 0; i < 70; ++i) ASSERT_TRUE(q->send("filler " + std::to_string(i) + std::string(1000, 'f')).ok());
    ASSERT_GE(q->stats()->segments, 2u);
  }
  {
    // Another open: the compaction the roll asked of the first one's thread must not see
    // the acks below (it would copy the target whole and remove segment 1 itself).
    auto q = open(kSegment);
    auto got = q->receive(1000, 60s);
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(got->size(), 71u);
    for (auto& m : *got) {
      ASSERT_EQ(m.receive_count, 1u);
      if (m.id == target) {
        ASSERT_TRUE(q->nack(m.receipt).ok());  // RELEASE, count 1: ready again
      } else {
        ASSERT_TRUE(q->ack(m.receipt).ok());
      }
    }
  }
  // What the killed compaction left: the MSG copy, and no state record after it.
  {
    storage::LogOptions lo;
    lo.segment_size = kSegment;
    lo.max_payload = 4096 + format::kMaxExtSize;
    auto log = storage::Log::open(qdir() + "/segments", lo);
    ASSERT_TRUE(log.ok());
    uint64_t t1 = 0, t2 = 0, next_id = 0;
    auto rec = (*log)->recover([&](storage::Pos, const storage::RecordView& v) {
      if (v.type == format::RecordType::kMsg && v.id == target) t1 = v.t1, t2 = v.t2;
      next_id = std::max(next_id, v.id + 1);
    });
    ASSERT_TRUE(rec.ok());
    ASSERT_EQ(rec->end.seq, 2u);
    storage::Record copy{format::RecordType::kMsg, 0, target, t1, t2, target_body, format::kFlagCopy};
    ASSERT_TRUE((*log)->append(rec->end, std::span(&copy, 1), next_id, {}).ok());
  }
  std::filesystem::remove(qdir() + "/index");
  {
    auto q = open(kSegment);  // the rebuild (as after the compactor's death)
    auto r = q->compact();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_GE(r->segments_removed, 1u) << "segment 1 (the original and its LEASE, RELEASE) is gone";
    EXPECT_EQ(q->check_index(), "");
  }
  std::filesystem::remove(qdir() + "/index");
  auto q = open(kSegment);
  auto v = q->verify(false);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->ok()) << v->problems.front();
  auto got = q->receive(10, 60s, 0ms);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ(got->front().id, target);
  EXPECT_EQ(got->front().payload, target_body);
  EXPECT_EQ(got->front().receive_count, 2u) << "the receive count went back: delivery 1 again";
}

TEST_F(CompactTest, PurgedMessagesStayPurgedAfterTheirPurgeRecordIsCompacted) {
  {
    auto q = open(64 << 10);
    for (int i = 0; i < 1000; ++i) ASSERT_TRUE(q->send(std::string(200, 'a')).ok());
    ASSERT_TRUE(q->purge().ok());
    for (int i = 0; i < 1000; ++i) ASSERT_TRUE(q->send(std::string(200, 'b')).ok());
    ASSERT_TRUE(q->compact().ok());
  }
  std::filesystem::remove(qdir() + "/index");
  auto q = open(64 << 10);
  auto all = q->peek(5000);
  ASSERT_EQ(all->size(), 1000u);
  for (auto& m : *all) EXPECT_EQ(m.payload[0], 'b');
}

// A reader holding a zero-copy view into a segment that compaction then removes keeps
// reading the right bytes: segments are unlinked, never truncated, and mappings survive.
TEST_F(CompactTest, ViewIntoARemovedSegmentStillReadsCorrectBytes) {
  auto q = open(64 << 10);
  std::string body(3000, 'v');
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(q->send(body + std::to_string(i)).ok());
  storage::LogOptions lo;
  lo.segment_size = 64 << 10;
  auto log = storage::Log::open(qdir() + "/segments", lo);
  ASSERT_TRUE(log.ok());
  std::shared_ptr<storage::Segment> keep;
  auto view = (*log)->read(storage::Pos{1, test::kFirstRecordOffset}, &keep);
  ASSERT_TRUE(view.ok());
  std::string_view payload = view->payload;
  auto all = q->receive(1000, 60s);
  for (auto& m : *all) ASSERT_TRUE(q->ack(m.receipt).ok());
  // This call or the background compaction the acks triggered removes segment 1.
  ASSERT_TRUE(q->compact().ok());
  ASSERT_FALSE(std::filesystem::exists(qdir() + "/segments/00000000000000000001.seg"));
  EXPECT_EQ(payload, body + "0") << "the mapping of the removed file still holds the bytes";
}

// ---- kill -9 during compaction with producers and consumers running ------------------

using test::spawn;
using test::wait_exit;

// A child that sends, receives, acks and compacts, journaling each call that returned
// (test::Journal: a line in one write(2), whole or absent after a kill): "S id" after a
// send, "a id" before and "A id" after an ack. Killed at a random moment or at a crash point.
int churn(const std::string& qdir, const std::string& journal, uint32_t seed) {
  QueueOptions o;
  o.segment_size = 64 << 10;
  o.max_payload = 4096;
  o.max_receives = 0;
  auto q = Queue::open(qdir, o);
  if (!q.ok()) return 1;
  test::Journal j(journal);
  std::mt19937 rng(seed);
  for (int i = 0; i < 400; ++i) {
    int op = static_cast<int>(rng() % 10);
    if (op < 5) {
      auto id = (*q)->send(std::string(100 + rng() % 1500, 'm'));
      if (!id.ok()) {
        std::fprintf(stderr, "churn: send failed: %s\n", id.status().to_string().c_str());
        return 2;
      }
      j.line("S " + std::to_string(*id));
    } else if (op < 9) {
      auto got = (*q)->receive(8, 50ms);
      if (!got.ok()) continue;
      for (auto& m : *got) {
        if (rng() % 4 == 0) continue;  // leave some leased: they must come back
        // "a": about to ack (it may take effect even if we die before saying so).
        j.line("a " + std::to_string(m.id));
        if (!(*q)->ack(m.receipt).ok()) continue;
        j.line("A " + std::to_string(m.id));
      }
    } else {
      (void)(*q)->compact();
    }
  }
  return 0;
}

TEST_F(CompactTest, KillNineAtRandomMomentsOfCompactionLosesNothing) {
  const char* points[] = {"compact.after_copy", "compact.after_sync", "compact.after_checkpoint",
                          "compact.after_unlink", ""};
  std::string journal = dir_ / "journal";
  std::mt19937 rng(12345);
  std::set<uint64_t> sent, acked, maybe_acked;
  std::map<uint64_t, uint64_t> sent_round, ack_round;
  const int kRounds = test::scaled(200);
  // Rounds whose victim died at its named crash point (it kills itself there; nothing else
  // kills it in those rounds), by point: a point never reached tests nothing.
  std::map<std::string, int> died_at, rounds_at;
  int bad_exits = 0;
  for (int round = 0; round < kRounds; ++round) {
    const char* point = points[round % 5];
    int nth = 1 + static_cast<int>(rng() % 3);
    uint32_t seed = static_cast<uint32_t>(rng());
    for (const std::string& f : {journal, journal + ".other"}) test::Journal(f).line("R " + std::to_string(round));
    pid_t other = spawn([&] { return churn(qdir(), journal + ".other", seed ^ 0x5555); });
    pid_t victim = spawn([&] {
      if (*point) ::setenv("SPOOL_CRASHPOINT", (std::string(point) + ":" + std::to_string(nth)).c_str(), 1);
      return churn(qdir(), journal, seed);
    });
    // Crash points kill the victim themselves; the rest die at a random moment.
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 30000));
    if (!*point) ::kill(victim, SIGKILL);
    const int st = wait_exit(victim);
    const bool killed = st == 128 + SIGKILL;
    if (*point) {
      ++rounds_at[point];
      if (killed) ++died_at[point];
    }
    // Otherwise it ran all its operations (exit 0) or was killed: any other end is a
    // failed open or send.
    if (!killed && st != 0 && ++bad_exits < 5) {
      ADD_FAILURE() << "round " << round << ": the victim ended with status " << st;
    }
    ::kill(other, SIGKILL);
    wait_exit(other);
    // Also test the rebuild: the index is only a cache, so deleting it after a kill -9 loses
    // and brings back nothing.
    if (round % 25 == 24) std::filesystem::remove(qdir() + "/index");
  }
  EXPECT_EQ(bad_exits, 0);
  for (const char* point : points) {
    if (!*point) continue;
    std::printf("[figures] %s: the victim died there in %d of %d rounds\n", point, died_at[point], rounds_at[point]);
    EXPECT_GE(died_at[point], 1) << "no round died at " << point << ": its rounds tested nothing there";
  }
  for (const std::string& f : {journal, journal + ".other"}) {
    std::ifstream in(f);
    char kind;
    uint64_t id;
    uint64_t round = 0;
    while (in >> kind >> id) {
      if (kind == 'R') round = id;
      if (kind == 'S') sent.insert(id);
      if (kind == 'A') acked.insert(id), ack_round[id] = round;
      if (kind == 'a') maybe_acked.insert(id);
      if (kind == 'S') sent_round[id] = round;
    }
  }
  auto q = open(64 << 10);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->check_index(), "");
  std::set<uint64_t> present;
  auto all = q->peek(1000000);
  ASSERT_TRUE(all.ok());
  for (auto& m : *all) present.insert(m.id);
  size_t lost = 0, resurrected = 0;
  for (uint64_t id : sent)
    if (!maybe_acked.count(id) && !present.count(id)) {
      if (++lost < 10) ADD_FAILURE() << "lost message " << id << " sent in round " << sent_round[id];
    }
  for (uint64_t id : acked) {
    if (present.count(id) && ++resurrected < 10) {
      ADD_FAILURE() << "acked message " << id << " (round " << ack_round[id] << ") came back";
    }
  }
  EXPECT_GT(sent.size(), 1000u) << "the children must have done real work";
  EXPECT_EQ(lost, 0u) << "every send that returned and was not acked is still queued";
  EXPECT_EQ(resurrected, 0u) << "no ack that returned is undone";
  // No orphans: no temp files, and the segments left form one contiguous run.
  std::vector<uint64_t> seqs;
  for (auto& name : segment_files()) {
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
    if (name.starts_with("spare-")) continue;  // preallocated for later segments (docs/format.md)
    seqs.push_back(std::stoull(name.substr(0, 20)));
  }
  std::sort(seqs.begin(), seqs.end());
  ASSERT_FALSE(seqs.empty());
  EXPECT_EQ(seqs.back() - seqs.front() + 1, seqs.size()) << "a gap in the segment files";
  ASSERT_TRUE(q->compact().ok());
  EXPECT_LE(q->stats()->segments, 1u + (present.size() * 1700) / (64 << 10) + 1);
}

}  // namespace
}  // namespace spool
