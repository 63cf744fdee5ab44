// The faults_test executable itself (tests/faults_common.h): its queues are opened with the
// fault-injecting Io (tests/fault_io.h) in their options, so injection reaches them, and
// only them.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>

#include "fault_io.h"
#include "faults_common.h"
#include "io/io.h"
#include "spool/queue.h"
#include "test_util.h"

namespace spool::faults {
namespace {

TEST(FaultsSetup, EveryFileOperationOfAQueueGoesThroughItsIo) {
  TempDir d;
  auto before = fault_io().counters();
  {
    auto q = Queue::open(d / "q", faulty());
    ASSERT_TRUE(q.ok());
    ASSERT_TRUE((*q)->send("x").ok());
    ASSERT_TRUE((*q)->sync().ok());
  }
  auto after = fault_io().counters();
  EXPECT_GT(after.writes, before.writes) << "the queue's writes do not go through its Io";
  EXPECT_GT(after.syncs, before.syncs) << "the queue's syncs do not go through its Io";
  EXPECT_GT(after.allocates, before.allocates) << "the index and segment allocations do not go through its Io";
  // spool.conf is written through it too: a failed write of it fails the creation.
  fault_io().fail(FaultIo::Op::kWrite, 1, ENOSPC);
  auto refused = Queue::open(d / "q2", faulty());
  fault_io().clear();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("spool.conf"), std::string::npos) << refused.status().to_string();
  // A queue opened without it is left alone: nothing is replaced process-wide.
  before = fault_io().counters();
  auto plain = Queue::open(d / "plain");
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE((*plain)->send("y", SendOptions{.durability = Durability::kSync}).ok());
  after = fault_io().counters();
  EXPECT_EQ(after.writes, before.writes);
  EXPECT_EQ(after.syncs, before.syncs);
  EXPECT_EQ(after.allocates, before.allocates);
}

// Per-call durability really syncs: on an interval queue whose flusher will not run during
// the test, a plain ack makes no fdatasync and an ack with Durability::kSync makes one (the
// same for sends), seen by the fault-injecting Io.
TEST(FaultsSetup, ADurableCallSyncsAndAPlainOneDoesNot) {
  TempDir d;
  QueueOptions o = faulty();
  o.sync = SyncPolicy::kInterval;
  o.sync_interval = std::chrono::hours(1);
  auto q = Queue::open(d / "q", o);
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE((*q)->send("first").ok());
  uint64_t before = fault_io().counters().syncs;
  ASSERT_TRUE((*q)->send("plain").ok());
  EXPECT_EQ(fault_io().counters().syncs, before) << "a plain send on an interval queue synced";
  ASSERT_TRUE((*q)->send("durable", SendOptions{.durability = Durability::kSync}).ok());
  EXPECT_EQ(fault_io().counters().syncs, before + 1) << "a send with kSync did not sync exactly once";
  auto got = (*q)->receive(2, std::chrono::seconds(60));
  ASSERT_TRUE(got.ok() && got->size() == 2u);
  before = fault_io().counters().syncs;
  ASSERT_TRUE((*q)->ack(got->at(0).receipt).ok());
  EXPECT_EQ(fault_io().counters().syncs, before) << "a plain ack on an interval queue synced";
  ASSERT_TRUE((*q)->ack(got->at(1).receipt, Durability::kSync).ok());
  EXPECT_EQ(fault_io().counters().syncs, before + 1) << "an ack with kSync did not sync exactly once";
}

}  // namespace
}  // namespace spool::faults
