// Issue 42's two power-loss findings, each as a test that failed before its fix:
// - a power cut during compaction (its checkpoint durable, its prefix not yet removed) left
//   counters the recovered log does not bear out: copies whose originals were lost counted as
//   no send, acks lost with the prefix's unsynced tail still counted by the checkpoint;
// - the `interval` flusher waited a whole interval after a pass that had overrun it, so a
//   send could stay unsynced for an interval plus a pass plus another interval.
// The power cut is FaultIo's (tests/fault_io.h): every write not yet synced is undone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "env/env.h"
#include "fault_io.h"
#include "io/io.h"
#include "spool/queue.h"
#include "test_util.h"

namespace spool::test {
namespace {

using namespace std::chrono_literals;

class PowerCutTest : public QueueDirTest {};

// Every message the recovered log says was sent is still queued, or was acked, dead-lettered
// or dropped: the counters agree with the messages.
void expect_counters_agree(const Stats& st) {
  const uint64_t live = st.ready + st.in_flight + st.delayed + st.blocked;
  EXPECT_EQ(st.sent_total, live + st.acked_total + st.dead_lettered_total + st.expired_total)
      << "sent " << st.sent_total << ", live " << live << ", acked " << st.acked_total << ", dead "
      << st.dead_lettered_total << ", expired " << st.expired_total;
}

TEST_F(PowerCutTest, ACutAfterACompactionsCheckpointLeavesCountersTheLogBearsOut) {
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::filesystem::remove_all(qdir());
    // The child runs the workload and the compaction, and cuts the power (undoes every
    // unsynced write) as soon as the compaction removed the first segment of its prefix: its
    // checkpoint is durable then, and the rest of the prefix is still there.
    pid_t child = spawn([&] {
      auto fault = std::make_shared<FaultIo>(io::default_io());
      fault->keep_undo_log(FaultIo::Undo::kPrivate, 64 << 20);
      QueueOptions o;
      o.env = make_default_env(fault);
      o.sync = SyncPolicy::kNever;  // only what compaction syncs survives the cut
      o.segment_size = 16 << 10;
      auto q = open_queue(qdir(), o);
      if (!q) return 2;
      // 600 sends made durable, then every one received and six in ten acked (their ACK
      // records not synced): the segments of sends keep four in ten live, too many for the
      // automatic compaction at a roll (a quarter), not for compact() (a half), and the
      // later segments of LEASE and ACK records none. Their acks are what a cut loses.
      const std::string body(200 + 50 * round, 'x');
      for (int i = 0; i < 600; ++i) {
        if (!q->send(body).ok()) return 3;
      }
      if (!q->sync().ok()) return 3;
      for (int i = 0; i < 6; ++i) {
        auto got = q->receive(100, 3600s);
        if (!got.ok()) return 4;
        for (const auto& m : *got) {
          if (m.id % 10 < 6 && !q->ack(m.receipt).ok()) return 5;
        }
      }
      // The oldest segment now: once it is gone, the compaction's checkpoint is durable.
      std::string oldest;
      for (const auto& e : std::filesystem::directory_iterator(qdir() + "/segments")) {
        const std::string p = e.path().string();
        if (p.ends_with(".seg") && (oldest.empty() || p < oldest)) oldest = p;
      }
      bool cut = false;
      auto r = q->compact([&](uint64_t, uint64_t) {
        if (!cut && !std::filesystem::exists(oldest)) {
          cut = true;
          fault->power_cut(qdir(), 0);
          ::_exit(0);
        }
      });
      if (!r.ok()) return 6;
      return cut ? 0 : 7;  // 7: the compaction removed nothing
    });
    ASSERT_EQ(wait_exit(child), 0);
    // A new boot: the index is gone with the power.
    std::filesystem::remove(qdir() + "/index");
    auto q = open();
    ASSERT_NE(q, nullptr);
    auto st = q->stats();
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    expect_counters_agree(*st);
    auto rep = q->verify(false);
    ASSERT_TRUE(rep.ok()) << rep.status().to_string();
    EXPECT_TRUE(rep->problems.empty()) << rep->problems.front();
  }
}

// An Io whose datasync takes `delay` and notes when each began and ended, by thread.
class SlowSyncIo final : public io::Io {
 public:
  explicit SlowSyncIo(std::chrono::milliseconds delay) : inner_(io::make_pwrite_io()), delay_(delay) {}
  const char* name() const override { return inner_->name(); }
  int datasync(int fd) override {
    const auto begin = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(delay_);
    const int r = inner_->datasync(fd);
    std::lock_guard<std::mutex> g(mu_);
    syncs_[std::this_thread::get_id()].push_back({begin, std::chrono::steady_clock::now()});
    return r;
  }
  int allocate(int fd, uint64_t off, uint64_t len) override { return inner_->allocate(fd, off, len); }
  int open(const std::string& path, int flags, mode_t mode) override { return inner_->open(path, flags, mode); }
  int rename(const std::string& from, const std::string& to) override { return inner_->rename(from, to); }
  int unlink(const std::string& path) override { return inner_->unlink(path); }
  int sync_dir(const std::string& path) override { return inner_->sync_dir(path); }
  using Span = std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point>;
  // The syncs of the thread that made the most (the flusher's).
  std::vector<Span> busiest() {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<Span> best;
    for (auto& [tid, v] : syncs_) {
      if (v.size() > best.size()) best = v;
    }
    return best;
  }

 protected:
  int64_t write_some(int fd, const iovec* iov, int iovcnt, uint64_t off) override {
    int64_t total = 0;
    for (int i = 0; i < iovcnt; ++i) total += static_cast<int64_t>(iov[i].iov_len);
    const int r = inner_->write_all(fd, iov, iovcnt, off);
    return r < 0 ? r : total;
  }

 private:
  std::unique_ptr<io::Io> inner_;
  std::chrono::milliseconds delay_;
  std::mutex mu_;
  std::map<std::thread::id, std::vector<Span>> syncs_;
};

TEST_F(PowerCutTest, TheFlusherStartsItsNextPassAtOnceWhenAPassOverranTheInterval) {
  // A pass (one datasync of 400 ms) overruns the 300 ms interval: the next one must follow
  // at once, not an interval later, while sends keep coming.
  auto slow = std::make_shared<SlowSyncIo>(400ms);
  QueueOptions o;
  o.env = make_default_env(slow);
  o.sync = SyncPolicy::kInterval;
  o.sync_interval = Millis(300);
  {
    auto q = open(o);
    ASSERT_NE(q, nullptr);
    const auto until = std::chrono::steady_clock::now() + 2500ms;
    while (std::chrono::steady_clock::now() < until) {
      ASSERT_TRUE(q->send("payload").ok());
      std::this_thread::sleep_for(1ms);
    }
  }
  auto syncs = slow->busiest();
  ASSERT_GE(syncs.size(), 3u) << "the flusher synced too rarely to judge";
  std::sort(syncs.begin(), syncs.end());
  // (The last sync may be the close's, which comes when it comes.)
  for (size_t i = 1; i + 1 < syncs.size(); ++i) {
    const auto gap = std::chrono::duration_cast<std::chrono::milliseconds>(syncs[i].first - syncs[i - 1].second);
    EXPECT_LT(gap.count(), 150) << "pass " << i << " began " << gap.count() << " ms after the one before ended";
  }
}

}  // namespace
}  // namespace spool::test
