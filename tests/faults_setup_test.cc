// The faults_test executable itself (tests/faults_common.h): it runs the queue on the pwrite
// backend, whose system calls tests/sys_faults.cc interposes, so injection reaches the queue.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>

#include "faults_common.h"
#include "io/io.h"
#include "spool/queue.h"
#include "sys_faults.h"
#include "test_util.h"

namespace spool::faults {
namespace {

TEST(FaultsSetup, UsesThePwriteBackendSoInjectionReachesTheQueue) {
  ASSERT_STREQ(io::default_io()->name(), "pwrite")
      << "faults_test injects at pwritev/fdatasync; run it with SPOOL_IO=pwrite";
  auto before = sf::counters();
  TempDir d;
  auto q = Queue::open(d / "q");
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE((*q)->send("x").ok());
  ASSERT_TRUE((*q)->sync().ok());
  auto after = sf::counters();
  EXPECT_GT(after.writes, before.writes) << "the queue's writes do not go through the interposed pwritev64";
  EXPECT_GT(after.syncs, before.syncs) << "the queue's syncs do not go through the interposed fdatasync";
}

// Per-call durability really syncs: on an interval queue whose flusher will not run during
// the test, a plain ack makes no fdatasync and an ack with Durability::kSync makes one (the
// same for sends), seen by the interposed fdatasync.
TEST(FaultsSetup, ADurableCallSyncsAndAPlainOneDoesNot) {
  TempDir d;
  QueueOptions o;
  o.sync = SyncPolicy::kInterval;
  o.sync_interval = std::chrono::hours(1);
  auto q = Queue::open(d / "q", o);
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE((*q)->send("first").ok());
  uint64_t before = sf::counters().syncs;
  ASSERT_TRUE((*q)->send("plain").ok());
  EXPECT_EQ(sf::counters().syncs, before) << "a plain send on an interval queue synced";
  ASSERT_TRUE((*q)->send("durable", SendOptions{.durability = Durability::kSync}).ok());
  EXPECT_EQ(sf::counters().syncs, before + 1) << "a send with kSync did not sync exactly once";
  auto got = (*q)->receive(2, std::chrono::seconds(60));
  ASSERT_TRUE(got.ok() && got->size() == 2u);
  before = sf::counters().syncs;
  ASSERT_TRUE((*q)->ack(got->at(0).receipt).ok());
  EXPECT_EQ(sf::counters().syncs, before) << "a plain ack on an interval queue synced";
  ASSERT_TRUE((*q)->ack(got->at(1).receipt, Durability::kSync).ok());
  EXPECT_EQ(sf::counters().syncs, before + 1) << "an ack with kSync did not sync exactly once";
}

}  // namespace
}  // namespace spool::faults
