// 4. Disk full, I/O errors (docs/reliability.md): a really full file system (a 2 MiB tmpfs)
// and injected EIO, ENOSPC and short writes.
// Shared helpers (prepare, kPayloads, damage_index, consistency, ...) are in
// tests/faults_common.h.
// Needs the pwrite backend, like all of faults_test (tests/faults_common.h).
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "child_report.h"
#include "fault_io.h"
#include "faults_common.h"
#include "proc_util.h"
#include "spool/queue.h"
#include "test_util.h"

namespace spool::faults {
namespace {

// ---- 4. Disk full, I/O errors ----------------------------------------------------------------

class FullDisk : public ::testing::Test {
 public:
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "\n*** SKIPPED: mounting a 2 MiB tmpfs needs root; a really full file system "
                      "is NOT covered by this run ***";
    }
    mnt_ = dir_ / "mnt";
    ASSERT_EQ(::mkdir(mnt_.c_str(), 0700), 0);
    // SPOOL_TEST_FULL_DISK=ext4: a 2 MiB ext4 image on a loop device instead of a tmpfs (the
    // mapped backend's stores meet ext4's delayed allocation there).
    if (const char* kind = std::getenv("SPOOL_TEST_FULL_DISK"); kind != nullptr && std::string(kind) == "ext4") {
      std::string img = dir_ / "ext4.img";
      std::string cmd = "truncate -s 2M '" + img + "' && mkfs.ext4 -q -F -b 1024 -O ^has_journal -m 0 '" + img +
                        "' && mount -o loop,nosuid,nodev '" + img + "' '" + mnt_ + "'";
      if (std::system((cmd + " 2>" + (dir_ / "mount.err")).c_str()) != 0) {
        std::ifstream err(dir_ / "mount.err");
        std::string why((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
        GTEST_SKIP() << "\n*** SKIPPED: a 2 MiB ext4 image cannot be mounted here (" << why
                     << "); a really full ext4 file system is NOT covered by this run ***";
      }
    } else if (::mount("tmpfs", mnt_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=2m") != 0) {
      GTEST_SKIP() << "\n*** SKIPPED: mount -t tmpfs -o size=2m failed (" << std::strerror(errno)
                   << "); a really full file system is NOT covered by this run ***";
    }
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_ && ::umount(mnt_.c_str()) != 0) ::umount2(mnt_.c_str(), MNT_DETACH);
  }
  void fill(const std::string& path, size_t bytes) {
    std::string chunk(bytes, 'f');
    std::ofstream(path, std::ios::binary) << chunk;
  }
  std::string filler() const { return mnt_ + "/filler"; }
  std::string qdir() const { return mnt_ + "/q"; }
  // Runs `body` in a child on a queue in the mount (128 KiB segments unless `segment_size`
  // says otherwise, 4 KiB payloads), with 640 KiB of the 2 MiB taken by filler(): a file not
  // the queue's, so that removing it frees space.
  void in_child_on_queue(const std::string& what, const std::function<void(Report&, Queue&)>& body,
                         uint64_t segment_size = 128 << 10) {
    fill(filler(), 640 << 10);
    in_child(what, [&](Report& r) {
      QueueOptions o;
      o.segment_size = segment_size;
      o.max_payload = 4096;
      auto q = Queue::open(qdir(), o);
      if (!r.check(q.ok(), "open: " + q.status().to_string())) return;
      body(r, **q);
    });
  }
  TempDir dir_;
  std::string mnt_;
  bool mounted_ = false;
};

// Sends fail with kNoSpace and a message that says so, again and again without harm;
// nothing acknowledged is lost; after space that is not the queue's frees, sends work again.
void sends_fail_cleanly(FullDisk& t, uint64_t segment_size) {
  t.in_child_on_queue("full disk", [&](Report& r, Queue& Q) {
    std::set<uint64_t> sent;
    Status full;
    for (int i = 0; i < 100000; ++i) {
      auto id = Q.send(std::string(1000, static_cast<char>('a' + i % 26)));
      if (!id.ok()) {
        full = id.status();
        break;
      }
      sent.insert(*id);
    }
    if (!r.check(!full.ok(), "the disk never filled")) return;
    r.info("full after " + std::to_string(sent.size()) + " sends: " + full.to_string());
    r.check(full.code() == Code::kNoSpace, "send on a full disk: " + full.to_string());
    r.check(full.message().find("No space") != std::string::npos, "the error does not say the disk is full: " + full.to_string());
    // The background thread may have been making a spare when the disk filled: a send
    // can still fit once it is counted, and a send that finds the next segment's size
    // refused takes a smaller spare of what is left (at least 256 KiB: about 250 sends
    // of 1000 bytes), which the background's failed attempt may just have given back.
    // Then every send fails, and keeps failing.
    int failed_in_a_row = 0;
    for (int i = 0; i < 3000 && failed_in_a_row < 20; ++i) {
      auto again = Q.send(std::string(1000, 'x'));
      if (again.ok()) {
        sent.insert(*again);
        failed_in_a_row = 0;
        continue;
      }
      r.check(again.status().code() == Code::kNoSpace, "send #" + std::to_string(i) + " on a full disk: " +
                                                            again.status().to_string());
      ++failed_in_a_row;
    }
    r.check(failed_in_a_row == 20, "sends on the full disk did not keep failing");
    r.check(ids_of(Q) == sent, "every send that returned is still queued");
    std::string c = consistency(Q);
    r.check(c.empty(), "while full: " + c);
    r.check(::unlink(t.filler().c_str()) == 0, "remove the filler");
    // The background thread may be taking the freed space for the spare it makes ahead;
    // until that spare is counted, a send can still find no room: it gets 2 s to.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (;;) {
      auto id = Q.send(std::string(1000, 'y'));
      if (id.ok()) {
        sent.insert(*id);
        break;
      }
      if (id.status().code() != Code::kNoSpace || std::chrono::steady_clock::now() >= until) {
        r.check(false, "send after freeing space: " + id.status().to_string());
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (int i = 0; i < 50; ++i) {
      auto id = Q.send(std::string(1000, 'y'));
      if (!r.check(id.ok(), "send after freeing space: " + id.status().to_string())) break;
      sent.insert(*id);
    }
    r.check(ids_of(Q) == sent, "nothing acknowledged was lost");
    c = consistency(Q);
    r.check(c.empty(), "at the end: " + c);
  }, segment_size);
  // And from the log alone, after every process closed it.
  ::unlink((t.qdir() + "/index").c_str());
  auto q = Queue::open(t.qdir());
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(consistency(**q), "");
}

TEST_F(FullDisk, SendsFailCleanlyAndWorkAgainAfterSpaceFrees) { sends_fail_cleanly(*this, 128 << 10); }

// The same with the default segment size, which the disk cannot hold one of: the queue's
// segments start small and grow (storage/log.h), and the spares made ahead for the drain
// grow with them, until one does not fit.
TEST_F(FullDisk, GrowingSegmentsSendsFailCleanlyAndWorkAgainAfterSpaceFrees) {
  sends_fail_cleanly(*this, QueueOptions{}.segment_size);
}

// docs/durability.md: on a full disk receive, ack and compaction keep working, so a full queue
// can be drained, and then accepts sends again.
// Fills the disk with sends, then drains every reader: the queue's own and, with `subs`,
// that many subscriptions (names of the longest length, so each segment's opener restates
// the most), each through its own handle. Every receive and ack succeeds: the drain reserve
// counts each reader's records and each segment's opener.
void drain_full(FullDisk& t, uint64_t segment_size, int subs = 0) {
  t.in_child_on_queue("drain a full disk", [&](Report& r, Queue& Q) {
    std::vector<std::string> names;
    for (int k = 0; k < subs; ++k) {
      names.push_back(std::string(47, static_cast<char>('a' + k)) + std::to_string(k));
      Status added = Q.add_subscription(names.back());
      if (!r.check(added.ok(), "add_subscription: " + added.to_string())) return;
    }
    std::set<uint64_t> sent;
    for (int i = 0; i < 100000; ++i) {
      auto id = Q.send(std::string(1000, 'a'));
      if (!id.ok()) break;
      sent.insert(*id);
    }
    r.check(!sent.empty(), "no send succeeded");
    std::vector<std::pair<std::string, std::unique_ptr<Queue>>> readers;
    readers.emplace_back("the queue's own readers", nullptr);
    for (const std::string& name : names) {
      QueueOptions o;
      o.subscription = name;
      auto h = Queue::open(t.qdir(), o);
      if (!r.check(h.ok(), "open subscription: " + h.status().to_string())) return;
      readers.emplace_back("subscription " + name, std::move(h).value());
    }
    for (auto& [who, handle] : readers) {
      Queue& V = handle ? *handle : Q;
      size_t acked = 0;
      Status rs;
      while (acked < sent.size() && rs.ok()) {
        auto got = V.receive(64, 60s);
        if (!got.ok()) {
          rs = got.status();
          break;
        }
        for (auto& m : *got) {
          if (rs = V.ack(m.receipt); !rs.ok()) break;
          ++acked;
        }
      }
      r.check(rs.ok(), who + ": draining a full queue failed after " + std::to_string(acked) + " of " +
                           std::to_string(sent.size()) + " acks: " + rs.to_string());
    }
    readers.clear();
    auto comp = Q.compact();
    r.check(comp.ok(), "compaction on a full disk: " + comp.status().to_string());
    if (comp.ok()) r.info("drained " + std::to_string(sent.size()) + "; compaction freed " + std::to_string(comp->bytes_freed) + " bytes");
    auto after = Q.send("room again");
    r.check(after.ok(), "send after draining and compacting: " + after.status().to_string());
    std::string c = consistency(Q);
    r.check(c.empty(), "at the end: " + c);
  }, segment_size);
}

TEST_F(FullDisk, AFullQueueCanBeDrainedAndCompactedWhileTheDiskIsFull) { drain_full(*this, 128 << 10); }

TEST_F(FullDisk, GrowingSegmentsAFullQueueCanBeDrainedAndCompactedWhileTheDiskIsFull) {
  drain_full(*this, QueueOptions{}.segment_size);
}

TEST_F(FullDisk, ASubscribedFullQueueCanBeDrainedByEveryReaderWhileTheDiskIsFull) {
  drain_full(*this, 128 << 10, 3);
}

// The index is a mapped file: growing it on a full disk must be an error, never SIGBUS.
// Tiny messages into a large preallocated segment, so the log has room and only the index
// needs more space.
TEST_F(FullDisk, IndexGrowthOnAFullDiskIsAnErrorNotSigbus) {
  in_child("index growth on a full disk", [&](Report& r) {
    QueueOptions o;
    o.segment_size = 1 << 20;
    auto q = Queue::open(qdir(), o);
    if (!r.check(q.ok(), "open: " + q.status().to_string())) return;
    Queue& Q = **q;
    r.check(Q.send("first").ok(), "first send");  // the segment is allocated now
    // Fill every byte that is left.
    {
      std::ofstream f(filler(), std::ios::binary);
      std::string chunk(4096, 'f');
      while (f.write(chunk.data(), chunk.size())) {
      }
    }
    std::ofstream(filler() + "2", std::ios::binary) << std::string(1, 'f');
    std::set<uint64_t> sent = ids_of(Q);
    Status err;
    for (int i = 0; i < 15000; ++i) {
      auto id = Q.send("t" + std::to_string(i));
      if (!id.ok()) {
        err = id.status();
        break;
      }
      sent.insert(*id);
    }
    r.info(err.ok() ? "all 15000 tiny sends fitted" : "stopped after " + std::to_string(sent.size()) + ": " + err.to_string());
    if (!err.ok()) r.check(err.code() == Code::kNoSpace, "error on a full disk: " + err.to_string());
    r.check(ids_of(Q) == sent, "every send that returned is queued");
    ::unlink(filler().c_str());
    ::unlink((filler() + "2").c_str());
    for (int i = 0; i < 2000; ++i) {
      auto id = Q.send("u" + std::to_string(i));
      if (!r.check(id.ok(), "send after freeing: " + id.status().to_string())) break;
      sent.insert(*id);
    }
    r.check(ids_of(Q) == sent, "every send that returned is queued after freeing");
    std::string c = consistency(Q);
    r.check(c.empty(), c);
  });
}

// Injected write errors (EIO, ENOSPC) fail exactly the call that met them with a clear
// error, change nothing, and the queue works again at once when the device recovers.
TEST(IoErrors, WriteErrorsFailTheCallChangeNothingAndClear) {
  struct Case {
    int err;
    Code code;
    const char* text;
  };
  int injected = 0;
  for (Case c : {Case{EIO, Code::kIo, "Input/output error"}, Case{ENOSPC, Code::kNoSpace, "No space"}}) {
    SCOPED_TRACE(c.text);
    TempDir d;
    Prepared p = prepare(d / "q");
    ASSERT_NE(p.q, nullptr);
    Queue& q = *p.q;
    auto expect_fails = [&](const char* what, const std::function<Status()>& call) {
      uint64_t before = fault_io().counters().injected;
      fault_io().fail(FaultIo::Op::kWrite, 1, c.err);
      Status s = call();
      fault_io().clear();
      // Every one of these calls writes (one write path: nothing is deferred).
      if (fault_io().counters().injected == before) {
        ADD_FAILURE() << what << " wrote nothing, so it met no error";
        return;
      }
      ++injected;
      EXPECT_EQ(s.code(), c.code) << what << ": " << s.to_string();
      EXPECT_NE(s.message().find(c.text), std::string::npos) << what << ": " << s.to_string();
      EXPECT_NE(s.message().find(".seg"), std::string::npos) << what << " does not name the file: " << s.to_string();
      EXPECT_EQ(consistency(q), "") << what;
    };
    expect_fails("send", [&] { return q.send("lost in the write").status(); });
    EXPECT_EQ(ids_of(q), p.live) << "a failed send left a message";
    expect_fails("receive", [&] { return q.receive(9, 60s).status(); });
    EXPECT_EQ(q.stats()->in_flight, 2u) << "a failed receive left leases";
    expect_fails("ack", [&] { return q.ack(p.leased[0].receipt); });
    expect_fails("nack", [&] { return q.nack(p.leased[0].receipt); });
    expect_fails("extend", [&] { return q.extend(p.leased[0].receipt, 90s); });
    expect_fails("purge", [&] { return q.purge().status(); });
    EXPECT_EQ(ids_of(q), p.live) << "a failed purge removed messages";
    expect_fails("compact", [&] { return q.compact().status(); });
    EXPECT_EQ(ids_of(q), p.live) << "a failed compaction lost messages";
    // Recovered: every call works on the same Queue.
    EXPECT_TRUE(q.ack(p.leased[0].receipt).ok()) << "the receipt survived every failed call";
    EXPECT_TRUE(q.send("after").ok());
    auto c2 = q.compact();
    EXPECT_TRUE(c2.ok()) << c2.status().to_string();
    EXPECT_GT(c2->messages_copied, 0u) << "the compaction case had nothing to copy";
    EXPECT_EQ(ids_of(q).size(), p.live.size());
    EXPECT_EQ(consistency(q), "");
  }
  std::printf("[figures] injected write errors: %d\n", injected);
  EXPECT_EQ(injected, 2 * 7) << "each of the 7 calls, for both errors, met its injected error";
}

// A failed write undoes its own call only: the acks and the lease made before it stand.
TEST(IoErrors, AFailedWriteKeepsTheAcksAndLeasesMadeBeforeIt) {
  for (int err : {EIO, ENOSPC}) {
    TempDir d;
    Prepared p = prepare(d / "q");
    ASSERT_NE(p.q, nullptr);
    Queue& q = *p.q;
    ASSERT_TRUE(q.ack(p.leased[0].receipt).ok());
    ASSERT_TRUE(q.ack(p.leased[1].receipt).ok());
    p.live.erase(p.leased[0].id);
    p.live.erase(p.leased[1].id);
    uint64_t before = fault_io().counters().injected;
    auto leased = q.receive(1, 60s);
    ASSERT_TRUE(leased.ok() && leased->size() == 1u);
    ASSERT_EQ(fault_io().counters().injected, before);
    fault_io().fail(FaultIo::Op::kWrite, 1, err);
    auto sent = q.send("lost in the write");
    fault_io().clear();
    ASSERT_GT(fault_io().counters().injected, before) << "the send wrote nothing";
    EXPECT_FALSE(sent.ok()) << "a send whose write failed returned an id";
    EXPECT_EQ(ids_of(q), p.live) << "the failed write undid an ack or kept the message";
    EXPECT_EQ(q.stats()->in_flight, 1u) << "the failed write undid the lease";
    EXPECT_TRUE(q.ack(leased->front().receipt).ok()) << "the lease's receipt no longer holds";
    p.live.erase(leased->front().id);
    EXPECT_EQ(ids_of(q), p.live);
    EXPECT_EQ(consistency(q), "");
  }
}

// After a reboot the log may have lost the last sends, and their ids are given out again.
// An ack of such an id, lost with it, must not ack the new message with that id, whatever
// the index from before the reboot still shows.
TEST(IoErrors, AnAckTheLogLostNeverAcksTheSuccessorOfItsId) {
  TempDir d;
  const std::string dir = d / "q";
  QueueOptions o = faulty();
  o.sync = SyncPolicy::kNever;
  o.segment_size = 4096;
  {
    auto q = Queue::open(dir, o);
    ASSERT_TRUE(q.ok());
    for (int i = 0; i < 30; ++i) ASSERT_TRUE((*q)->send(std::string(100, 'a')).ok());  // 2 segments
    auto got = (*q)->receive(30, 60s);
    ASSERT_TRUE(got.ok() && got->size() == 30u);
    for (auto& m : *got) ASSERT_TRUE((*q)->ack(m.receipt).ok());
  }
  // A consumer acks the next message and dies (_exit: no close).
  pid_t child = spawn([&] {
    auto q = Queue::open(dir, o);
    if (!q.ok() || !(*q)->send("x").ok()) return 1;
    auto got = (*q)->receive(1, 60s);
    if (!got.ok() || got->size() != 1 || got->front().id != 31 || !(*q)->ack(got->front().receipt).ok()) return 2;
    ::_exit(0);
  });
  ASSERT_EQ(wait_exit(child), 0);
  // The reboot: the segments after the first are lost, the index is from another boot.
  for (auto& e : std::filesystem::directory_iterator(dir + "/segments")) {
    if (e.path().extension() == ".seg" && e.path().filename().string() > "00000000000000000001.seg") {
      std::filesystem::remove(e.path());
    }
  }
  std::mt19937_64 rng(1);
  damage_index(dir, IndexAfterCut::kLeft, rng);
  auto q = Queue::open(dir, o);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  ASSERT_LE((*q)->stats()->next_id, 31u) << "the acked message's send was not lost; the test needs it to be";
  while ((*q)->stats()->next_id <= 31) ASSERT_TRUE((*q)->send("new").ok());
  ASSERT_TRUE((*q)->sync().ok());
  q->reset();
  std::filesystem::remove(dir + "/index");
  auto again = Queue::open(dir, o);
  ASSERT_TRUE(again.ok());
  auto all = (*again)->peek(1000);
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(std::any_of(all->begin(), all->end(), [](const Message& m) { return m.id == 31; }))
      << "the new message 31 was acked by the old ack of 31";
}

// Writes cut short at every size still store every byte (the writer resumes).
TEST(IoErrors, ShortWritesStillStoreEveryByte) {
  TempDir d;
  QueueOptions o = faulty();
  o.segment_size = 64 << 10;
  auto q = Queue::open(d / "q", o);
  ASSERT_TRUE(q.ok());
  std::map<uint64_t, std::string> sent;
  uint64_t shortened = fault_io().counters().shortened;
  for (size_t limit : {1, 7, 48, 511, 4096}) {
    fault_io().set_short_writes(limit);
    for (int i = 0; i < test::scaled(40); ++i) {
      std::string body = kPayloads.make("short" + std::to_string(limit) + "." + std::to_string(i));
      auto id = (*q)->send(body);
      ASSERT_TRUE(id.ok()) << id.status().to_string();
      sent[*id] = body;
    }
    auto got = (*q)->receive(5, 60s);
    ASSERT_TRUE(got.ok());
    for (auto& m : *got) {
      ASSERT_TRUE((*q)->ack(m.receipt).ok());
      EXPECT_EQ(m.payload, sent[m.id]);
      sent.erase(m.id);
    }
  }
  fault_io().clear();
  EXPECT_GT(fault_io().counters().shortened, shortened + 100);
  EXPECT_EQ(consistency(**q), "");
  q->reset();
  ::unlink((d / "q/index").c_str());  // and from the log alone
  auto again = Queue::open(d / "q", faulty());
  ASSERT_TRUE(again.ok());
  auto all = (*again)->peek(SIZE_MAX);
  ASSERT_TRUE(all.ok());
  std::map<uint64_t, std::string> got;
  for (auto& m : *all) got[m.id] = m.payload;
  EXPECT_EQ(got, sent);
}

// An fdatasync error under sync=always fails the call loudly (never a false success), is
// sticky for that segment in that process (fsyncgate: no retry into success), and another
// process, or the same after reopening, works once the device recovers. Nothing whose send
// returned is lost.
TEST(IoErrors, SyncErrorIsLoudStickyAndRecoverableByReopening) {
  TempDir d;
  QueueOptions o = faulty();
  o.sync = SyncPolicy::kAlways;
  o.segment_size = 64 << 10;
  std::string dir = d / "q";
  auto q = Queue::open(dir, o);
  ASSERT_TRUE(q.ok());
  std::set<uint64_t> returned;
  for (int i = 0; i < 20; ++i) returned.insert(*(*q)->send("ok" + std::to_string(i)));
  fault_io().fail(FaultIo::Op::kSync, 1, EIO);
  auto bad = (*q)->send("meets EIO");
  fault_io().clear();
  ASSERT_FALSE(bad.ok()) << "a send whose fdatasync failed returned success";
  EXPECT_EQ(bad.status().code(), Code::kIo) << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("fdatasync"), std::string::npos) << bad.status().to_string();
  auto bad2 = (*q)->send("after EIO, same process");
  EXPECT_FALSE(bad2.ok()) << "the failed segment was synced again into a success";
  int ambiguous = 0;  // sends that failed at the sync: the record may be queued (at least once)
  // Another process is not affected by this process's failed fd.
  pid_t other = spawn([&] {
    auto oq = Queue::open(dir, faulty());
    return oq.ok() && (*oq)->send("other process").ok() ? 0 : 1;
  });
  EXPECT_EQ(wait_exit(other), 0);
  q->reset();
  auto re = Queue::open(dir, o);
  ASSERT_TRUE(re.ok());
  auto id = (*re)->send("after reopening");
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  returned.insert(*id);
  auto all = ids_of(**re);
  for (uint64_t r : returned) EXPECT_TRUE(all.count(r)) << "message " << r << " lost";
  ambiguous = static_cast<int>(all.size() - returned.size()) - 1;  // minus the other process's
  EXPECT_EQ(consistency(**re), "");
  std::printf("[figures] sync EIO: failed sends whose record stayed queued (at-least-once) = %d\n", ambiguous);
}

// The interval policy's failure path (docs/durability.md, "interval"): the flusher thread's
// fdatasync fails, and every later write of that process reports it (sticky, like the
// segment's own fsync error) instead of returning as if the window still held. The send
// whose sync failed is not counted as durable; reopening recovers, losing nothing.
TEST(IoErrors, AFailedBackgroundSyncIsReportedByEveryLaterWrite) {
  TempDir d;
  QueueOptions o = faulty();
  o.sync = SyncPolicy::kInterval;
  o.sync_interval = 50ms;
  std::string dir = d / "q";
  auto q = Queue::open(dir, o);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  auto until = [](const std::function<bool()>& done) {
    auto give_up = std::chrono::steady_clock::now() + 30s;
    while (!done() && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(5ms);
    return done();
  };
  auto first = (*q)->send("first");  // starts the flusher
  ASSERT_TRUE(first.ok());
  auto held = (*q)->receive(1, 600s);
  ASSERT_TRUE(held.ok());
  // Behind the lease record: once the watermark covers it, nothing is left to sync.
  auto marker = (*q)->send("marker");
  ASSERT_TRUE(marker.ok());
  ASSERT_TRUE(until([&] { return (*q)->durable_id() >= *marker; })) << "the flusher never synced the first sends";
  // Only the flusher syncs on an interval queue: the next fdatasync of this process is its.
  uint64_t injected = fault_io().counters().injected;
  fault_io().fail(FaultIo::Op::kSync, 1, EIO);
  auto second = (*q)->send("its sync fails");
  ASSERT_TRUE(second.ok()) << "an interval send does not wait for the disk";
  bool met = until([&] { return fault_io().counters().injected > injected; });
  fault_io().clear();
  ASSERT_TRUE(met) << "the flusher never synced after the second send";
  EXPECT_LT((*q)->durable_id(), *second) << "a send whose background sync failed counts as durable";
  // The fault counter moves inside fdatasync, before the flusher records the failure: a
  // send in between may still succeed. Once one write reports it, every later one must.
  Status first_report;
  ASSERT_TRUE(until([&] {
    auto probe = (*q)->send("probe");
    if (!probe.ok()) first_report = probe.status();
    return !probe.ok();
  })) << "no send reported the failed background sync";
  EXPECT_EQ(first_report.code(), Code::kIo) << first_report.to_string();
  // Every later write of this process says so, not only the first.
  for (const char* what : {"third", "fourth"}) {
    auto later = (*q)->send(what);
    ASSERT_FALSE(later.ok()) << "send '" << what << "' after a failed background sync returned success";
    EXPECT_EQ(later.status().code(), Code::kIo) << later.status().to_string();
    EXPECT_NE(later.status().message().find("background sync failed"), std::string::npos)
        << later.status().to_string();
  }
  EXPECT_EQ((*q)->ack(held->front().receipt).code(), Code::kIo) << "an ack after a failed background sync";
  EXPECT_EQ((*q)->receive(1, 60s).status().code(), Code::kIo) << "a receive (it writes a lease) after a failed background sync";
  q->reset();
  auto re = Queue::open(dir, o);
  ASSERT_TRUE(re.ok()) << re.status().to_string();
  auto after = (*re)->send("after reopening");
  ASSERT_TRUE(after.ok()) << after.status().to_string();
  auto ids = ids_of(**re);
  // (`first` may be gone: like a send that met the error, the ack that reported it was
  // written before it did, so it may have taken effect.)
  EXPECT_TRUE(ids.count(*marker)) << "a send that returned was lost";
  EXPECT_TRUE(ids.count(*second)) << "the send whose background sync failed was lost";
  EXPECT_TRUE(ids.count(*after)) << "the send after reopening was lost";
  EXPECT_EQ(consistency(**re), "");
}

// A segment that cannot be created (fallocate fails: ENOSPC, EIO) fails the send that needed
// it, cleanly, and the next send creates it. Allocations fail for stretches longer than a
// segment's worth of sends: a single failed allocation may fall to the background thread
// that makes spares ahead (which leaves it to a send), so only a stretch is sure to reach
// a send.
TEST(IoErrors, SegmentCreationFailureIsCleanAndRetried) {
  for (int err : {ENOSPC, EIO}) {
    TempDir d;
    QueueOptions o = faulty();
    o.segment_size = 16 << 10;
    auto q = Queue::open(d / "q", o);
    ASSERT_TRUE(q.ok());
    std::set<uint64_t> sent;
    int failures[3] = {};  // in each stretch
    for (int i = 0; i < 350; ++i) {
      if (i % 100 == 50) fault_io().fail(FaultIo::Op::kAllocate, 1, err, true);  // sends 50-109: three segments' worth
      if (i % 100 == 10) fault_io().clear();
      auto id = (*q)->send(std::string(700, 'x'));
      if (id.ok()) {
        sent.insert(*id);
      } else {
        ASSERT_GE(i, 50) << "a send failed while allocations worked";
        ++failures[(i - 50) / 100];
        EXPECT_EQ(id.status().code(), err == ENOSPC ? Code::kNoSpace : Code::kIo) << id.status().to_string();
      }
    }
    fault_io().clear();
    for (int k = 0; k < 3; ++k) EXPECT_GT(failures[k], 0) << "no send met the failed allocations of stretch " << k;
    EXPECT_EQ(ids_of(**q), sent);
    EXPECT_EQ(consistency(**q), "");
  }
}

}  // namespace
}  // namespace spool::faults
