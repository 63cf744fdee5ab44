// Issue 42's two power-loss findings, each as a test that failed before its fix:
// - a power cut during compaction (its checkpoint durable, its prefix not yet removed) left
//   counters the recovered log does not bear out: copies whose originals were lost counted as
//   no send, acks lost with the prefix's unsynced tail still counted by the checkpoint;
// - the `interval` flusher waited a whole interval after a pass that had overrun it, so a
//   send could stay unsynced for an interval plus a pass plus another interval.
// Issue 46's power cuts with subscriptions: each view's state comes back from the log alone
// after a cut in the middle of its calls and during or right after a compaction, and again
// after its index files are deleted.
// The power cut is FaultIo's (tests/fault_io.h): every write not yet synced is undone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "env/env.h"
#include "fault_io.h"
#include "index/index.h"
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

// ---- Subscriptions (issue 46) ----------------------------------------------------------

// The queue's own view ("") and two subscriptions; s1 gets every message from the first send
// on (added before it), s2 every one too (added from start after a few sends, none acked).
const std::vector<std::string> kViews = {"", "s1", "s2"};

// `view`'s handle on the queue in `dir` (with `o`'s env and settings).
Result<std::unique_ptr<Queue>> open_view(const std::string& dir, const std::string& view,
                                         QueueOptions o = {}) {
  o.subscription = view;
  return Queue::open(dir, o);
}

// A reboot after the cut: every index file is whatever reached the disk, from another boot
// (`deleted` false), or gone (`deleted` true). Either way every view is rebuilt from the log.
void reboot_indexes(const std::string& dir, bool deleted) {
  std::vector<std::string> files = {dir + "/index"};
  if (std::filesystem::exists(dir + "/subs")) {
    for (const auto& e : std::filesystem::directory_iterator(dir + "/subs")) {
      if (e.path().extension() == ".index") files.push_back(e.path().string());
    }
  }
  for (const std::string& f : files) {
    if (deleted) {
      std::filesystem::remove(f);
      continue;
    }
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(io.good()) << f;
    const char other_boot[] = "00000000-0000-0000-0000-000000000000";
    io.seekp(static_cast<std::streamoff>(offsetof(index::IndexHeader, ident) +
                                         offsetof(index::IndexIdentity, boot_id)));
    io.write(other_boot, sizeof other_boot);
    ASSERT_TRUE(io.good()) << f;
  }
}

// Everything a view's reader can tell of its state: its counters, each message's receive
// count and state, the subscriptions and their starts. Equal states compare equal.
struct ViewState {
  std::map<std::string, uint64_t> counters;
  std::map<uint64_t, std::string> messages;  // id -> "count N state S"
  bool operator==(const ViewState&) const = default;
};
std::ostream& operator<<(std::ostream& os, const ViewState& v) {
  for (const auto& [k, n] : v.counters) os << k << "=" << n << " ";
  os << "|";
  for (const auto& [id, m] : v.messages) os << " " << id << ":" << m;
  return os;
}

// sent_total == live + acked + dead + expired in view `view` (expect_counters_agree's sum).
void expect_view_counters_agree(const std::string& view, const Stats& st) {
  SCOPED_TRACE("view '" + view + "'");
  expect_counters_agree(st);
}

// Every view's state, read through a handle of each; also checks each view's counters and
// index invariants, and that both subscriptions are listed with their starts.
std::map<std::string, ViewState> view_states(const std::string& dir) {
  std::map<std::string, ViewState> out;
  for (const std::string& view : kViews) {
    auto q = open_view(dir, view);
    EXPECT_TRUE(q.ok()) << "view '" << view << "': " << q.status().to_string();
    if (!q.ok()) return out;
    ViewState& v = out[view];
    auto st = (*q)->stats();
    EXPECT_TRUE(st.ok()) << st.status().to_string();
    if (!st.ok()) return out;
    expect_view_counters_agree(view, *st);
    v.counters = {{"sent", st->sent_total},
                  {"acked", st->acked_total},
                  {"dead", st->dead_lettered_total},
                  {"expired", st->expired_total},
                  {"ready", st->ready},
                  {"in_flight", st->in_flight},
                  {"delayed", st->delayed},
                  {"nacked", st->nacked_total},
                  {"received", st->received_total},
                  {"redelivered", st->redelivered_total},
                  {"next_id", st->next_id},
                  {"bytes", st->bytes}};
    auto all = (*q)->list(SIZE_MAX);
    EXPECT_TRUE(all.ok()) << all.status().to_string();
    if (!all.ok()) return out;
    for (const MessageInfo& m : *all) {
      v.messages[m.id] = "count " + std::to_string(m.receive_count) + " " + state_name(m.state);
    }
    EXPECT_EQ((*q)->check_index(), "") << "view '" << view << "'";
    if (view.empty()) {
      auto subs = (*q)->subscriptions();
      EXPECT_TRUE(subs.ok()) << subs.status().to_string();
      if (!subs.ok()) return out;
      std::string names;
      for (const auto& s : *subs) names += s.name + " from " + std::to_string(s.from) + ";";
      v.counters["subscriptions " + names] = subs->size();
    }
  }
  return out;
}

// Deleting every index file (DIR/index, DIR/subs/*.index) and reopening rebuilds each view
// to the state it had.
void expect_rebuild_gives_the_same_views(const std::string& dir,
                                         const std::map<std::string, ViewState>& before) {
  reboot_indexes(dir, true);
  EXPECT_FALSE(std::filesystem::exists(dir + "/subs/1.index"));
  const auto after = view_states(dir);
  for (const std::string& view : kViews) {
    EXPECT_EQ(after.at(view), before.at(view))
        << "view '" << view << "' rebuilt from the log alone differs";
  }
}

// verify finds nothing wrong with the log and the indexes, and the rebuild from the log
// alone gives every view the state `before` it had.
void expect_verified_and_rebuilt(const std::string& dir,
                                 const std::map<std::string, ViewState>& before) {
  auto q = open_view(dir, "");
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  auto rep = (*q)->verify(false);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_TRUE(rep->problems.empty()) << rep->problems.front();
  q->reset();
  expect_rebuild_gives_the_same_views(dir, before);
}

// What the child saw return before the power went, per view: written when it cuts.
struct SubLedger {
  std::map<uint64_t, std::string> sent;             // send returned: id -> payload
  std::map<std::string, std::set<uint64_t>> acked;  // ack returned, per view
  // Per view: the highest receive count a returned receive showed.
  std::map<std::string, std::map<uint64_t, uint32_t>> count;
  // The call in progress when the power went (its outcome may or may not be on disk).
  std::string pending_kind, pending_view;
  uint64_t pending_id = 0;
  uint64_t undone = 0;  // writes the cut undid

  static std::string v(const std::string& view) { return view.empty() ? "-" : view; }
  static std::string unv(const std::string& s) { return s == "-" ? "" : s; }
  std::string encode() const {
    std::ostringstream o;
    for (const auto& [id, p] : sent) o << "S " << id << " " << p << "\n";
    for (const auto& [view, ids] : acked) {
      for (uint64_t id : ids) o << "A " << v(view) << " " << id << "\n";
    }
    for (const auto& [view, m] : count) {
      for (const auto& [id, c] : m) o << "R " << v(view) << " " << id << " " << c << "\n";
    }
    o << "P " << (pending_kind.empty() ? "-" : pending_kind) << " " << v(pending_view) << " "
      << pending_id << "\n";
    return o.str();
  }
  void decode(const std::string& path) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      std::istringstream s(line);
      std::string kind, view, p;
      uint64_t id = 0;
      uint32_t c = 0;
      s >> kind;
      if (kind == "S") {
        s >> id >> p;
        sent[id] = p;
      } else if (kind == "A") {
        s >> view >> id;
        acked[unv(view)].insert(id);
      } else if (kind == "R") {
        s >> view >> id >> c;
        count[unv(view)][id] = c;
      } else if (kind == "U") {
        s >> undone;
      } else if (kind == "P") {
        s >> pending_kind >> view >> pending_id;
        pending_view = unv(view);
      }
    }
  }
};

// Under sync=always, with two subscriptions: a child sends, receives, acks and nacks in every
// view at random, and cuts the power itself just before its n-th sync (so the cut lands in
// the middle of a call: that call's unsynced writes are undone, or in odd rounds the oldest
// few of them kept and the next maybe torn). After the reboot (the index files deleted, or
// left from another boot, in turn), in EVERY view: every send that returned
// is there unless that view's ack returned, nothing whose ack returned is back, no receive
// count is below one a returned receive showed, nothing unsent appears, payloads are the sent
// ones, both subscriptions are listed, counters agree; and the same states come back from
// the log alone once the index files are deleted.
TEST_F(PowerCutTest, EverySubscriptionKeepsEachReturnedCallUnderSyncAlways) {
  std::mt19937_64 rng(4646);
  uint64_t undone = 0, sends = 0, acks = 0;
  constexpr int kRounds = 6;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::filesystem::remove_all(qdir());
    const std::string ledger_path = dir_ / ("ledger-" + std::to_string(round));
    const uint64_t cut_at = 40 + rng() % 160;  // syncs after the setup
    const uint64_t seed = rng();
    pid_t child = spawn([&] {
      auto fault = std::make_shared<FaultIo>(io::default_io());
      fault->keep_undo_log(FaultIo::Undo::kPrivate, 64 << 20);
      QueueOptions o;
      o.env = make_default_env(fault);
      o.sync = SyncPolicy::kAlways;
      // No roll in the run (about 50 KB in a 256 KiB first segment), so no background
      // compaction: the child is one thread, and the cut stops every write.
      o.segment_size = 1 << 20;
      o.max_receives = 0;  // no dead letters: every view keeps what it does not ack
      auto own = open_view(qdir(), "", o);
      if (!own.ok()) return 2;
      std::vector<std::unique_ptr<Queue>> h;
      h.push_back(std::move(own).value());
      if (!h[0]->add_subscription("s1").ok()) return 3;
      SubLedger led;
      std::mutex mu;  // the ledger, should another thread's sync be the one that cuts
      std::mt19937_64 r(seed);
      int n = 0;
      auto send = [&]() -> bool {
        std::string p = "m" + std::to_string(n++) + "-" + std::string(50 + r() % 400, 'x');
        {
          std::lock_guard g(mu);
          led.pending_kind = "send";
        }
        auto id = h[0]->send(p);
        std::lock_guard g(mu);
        led.pending_kind.clear();
        if (id.ok()) led.sent[*id] = p;
        return id.ok();
      };
      for (int i = 0; i < 5; ++i) {
        if (!send()) return 3;
      }
      if (!h[0]->add_subscription("s2", true).ok()) return 3;
      for (size_t k = 1; k < kViews.size(); ++k) {
        auto sub = open_view(qdir(), kViews[k], o);
        if (!sub.ok()) return 4;
        h.push_back(std::move(sub).value());
      }
      uint64_t syncs = 0;
      std::mutex cut_mu;  // held from the cut to the _exit: any other syncing thread waits
      fault->on_sync([&] {
        cut_mu.lock();
        if (++syncs < cut_at) {
          cut_mu.unlock();
          return;
        }
        fault->fail(FaultIo::Op::kWrite, 1, EIO, true);  // nothing more reaches the disk
        std::string text;
        {
          std::lock_guard g(mu);
          text = led.encode();
        }
        // Every unsynced write undone, or (odd rounds) the oldest few kept, the next maybe torn.
        std::mt19937_64 cut_rng(seed ^ 0x5ca1ab1e);
        const FaultIo::CutReport cut =
            round % 2 == 0 ? fault->power_cut(qdir(), 0) : fault->power_cut(qdir(), cut_rng);
        std::ofstream(ledger_path) << text << "U " << cut.undone << "\n";
        ::_exit(0);
      });
      std::vector<std::vector<Message>> held(kViews.size());
      for (int i = 0; i < 5000; ++i) {
        const size_t k = r() % kViews.size();
        const std::string& view = kViews[k];
        const int what = static_cast<int>(r() % 100);
        if (what < 30) {
          (void)send();
        } else if (what < 60) {
          {
            std::lock_guard g(mu);
            led.pending_kind = "receive";
            led.pending_view = view;
          }
          auto got = h[k]->receive(1 + r() % 3, std::chrono::hours(1));
          std::lock_guard g(mu);
          led.pending_kind.clear();
          if (!got.ok()) continue;
          for (auto& m : *got) {
            uint32_t& c = led.count[view][m.id];
            c = std::max(c, m.receive_count);
            held[k].push_back(std::move(m));
          }
        } else if (!held[k].empty()) {
          const size_t at = r() % held[k].size();
          Message m = std::move(held[k][at]);
          held[k].erase(held[k].begin() + static_cast<std::ptrdiff_t>(at));
          const bool ack = what < 85;
          {
            std::lock_guard g(mu);
            led.pending_kind = ack ? "ack" : "nack";
            led.pending_view = view;
            led.pending_id = m.id;
          }
          Status s = ack ? h[k]->ack(m.receipt) : h[k]->nack(m.receipt);
          std::lock_guard g(mu);
          led.pending_kind.clear();
          if (ack && s.ok()) led.acked[view].insert(m.id);
        }
      }
      return 7;  // the run ended before the n-th sync
    });
    ASSERT_EQ(wait_exit(child), 0) << "the child failed before the cut (or never reached it)";
    SubLedger led;
    led.decode(ledger_path);
    ASSERT_FALSE(led.sent.empty());
    undone += led.undone;
    sends += led.sent.size();
    for (const auto& [view, ids] : led.acked) acks += ids.size();
    reboot_indexes(qdir(), round / 2 % 2 == 0);

    const auto states = view_states(qdir());
    ASSERT_EQ(states.size(), kViews.size());
    EXPECT_EQ(states.at("").counters.count("subscriptions s1 from 1;s2 from 1;"), 1u)
        << "the subscriptions after the cut: " << states.at("");
    const uint64_t last_sent = led.sent.rbegin()->first;
    for (const std::string& view : kViews) {
      SCOPED_TRACE("view '" + view + "'");
      const ViewState& v = states.at(view);
      const auto& acked = led.acked[view];
      const bool ack_pending = led.pending_kind == "ack" && led.pending_view == view;
      for (const auto& [id, payload] : led.sent) {
        if (v.messages.count(id) || acked.count(id) || (ack_pending && led.pending_id == id))
          continue;
        ADD_FAILURE() << "message " << id
                      << " lost: its send had returned and this view never acked it";
      }
      for (uint64_t id : acked) {
        EXPECT_EQ(v.messages.count(id), 0u)
            << "message " << id << " is back although its ack had returned";
      }
      for (const auto& [id, m] : v.messages) {
        if (led.sent.count(id)) continue;
        // Only the send in progress may have reached the disk without returning.
        EXPECT_TRUE(led.pending_kind == "send" && id == last_sent + 1)
            << "message " << id << " was never sent";
      }
      for (const auto& [id, c] : led.count[view]) {
        auto it = v.messages.find(id);
        if (it == v.messages.end()) continue;
        const uint32_t now = static_cast<uint32_t>(std::stoul(it->second.substr(6)));
        EXPECT_GE(now, c) << "message " << id
                          << "'s receive count went back below one a returned receive showed";
      }
      auto q = open_view(qdir(), view);
      ASSERT_TRUE(q.ok()) << q.status().to_string();
      auto all = (*q)->peek(SIZE_MAX);
      ASSERT_TRUE(all.ok()) << all.status().to_string();
      for (const Message& m : *all) {
        auto it = led.sent.find(m.id);
        if (it != led.sent.end()) {
          EXPECT_EQ(m.payload, it->second) << "message " << m.id << "'s payload";
        }
      }
    }
    expect_verified_and_rebuilt(qdir(), states);
  }
  EXPECT_GT(undone, 0u) << "no cut undid a write: none landed in the middle of a call";
  std::printf(
      "[figures] %d cuts with 2 subscriptions, sync=always: sends returned %llu, acks returned "
      "%llu (all views), writes undone %llu\n",
      kRounds, static_cast<unsigned long long>(sends), static_cast<unsigned long long>(acks),
      static_cast<unsigned long long>(undone));
}

// A queue with two subscriptions and a different state in each view, all of it synced:
// 400 messages, each received by every view and most acked. The queue's own view holds
// the ids ending in 8 and every twentieth ending in 9, leased; s1 those ending in 9, the
// ones the queue's own view holds too nacked (ready, count 1), the others leased; s2
// (added from start after the sends) received the first 300 and holds those ending in 7,
// leased, and the last 100 never received (ready, count 0). The segments of the first 300
// are then about a third live (compaction counts a message once per view holding it), the
// later ones (LEASE, ACK and RELEASE records) dead: compact() copies the live messages of
// the prefix, each with a LEASE or RELEASE per view holding it, and removes the prefix, the
// first segment (the SUB records) with it.
void make_three_views(const std::string& dir) {
  QueueOptions o;
  o.sync = SyncPolicy::kNever;  // synced once at the end: what compaction does alone is on trial
  o.segment_size = 16 << 10;
  o.max_receives = 0;
  auto own = open_view(dir, "", o);
  ASSERT_TRUE(own.ok()) << own.status().to_string();
  Queue& q = **own;
  ASSERT_TRUE(q.add_subscription("s1").ok());
  for (int i = 0; i < 400; ++i)
    ASSERT_TRUE(q.send(std::string(200, static_cast<char>('a' + i % 26))).ok());
  ASSERT_TRUE(q.add_subscription("s2", true).ok());
  for (const std::string& view : kViews) {
    auto h = open_view(dir, view, o);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    const size_t upto = view == "s2" ? 300 : 400;
    for (size_t got_n = 0; got_n < upto;) {
      auto got = (*h)->receive(std::min<size_t>(100, upto - got_n), std::chrono::hours(1));
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      got_n += got->size();
      for (const Message& m : *got) {
        const bool keep = view.empty()   ? m.id % 10 == 8 || m.id % 20 == 9
                          : view == "s1" ? m.id % 10 == 9
                                         : m.id % 10 == 7;
        if (!keep) {
          ASSERT_TRUE((*h)->ack(m.receipt).ok());
        } else if (view == "s1" && m.id % 20 == 9) {
          ASSERT_TRUE((*h)->nack(m.receipt).ok());
        }
      }
    }
  }
  ASSERT_TRUE(q.sync().ok());
}

// Where a compaction's power goes: at its crash point `step` (src/queue/compact.cc) when
// `nth_sync` is 0, else just before its nth_sync-th sync after that point; "" with 0: after
// the compaction returned.
struct CompactionCut {
  std::string step;
  int nth_sync = 0;
  std::string name() const {
    if (step.empty()) return "after the compaction";
    return nth_sync == 0 ? "at " + step
                         : "before sync " + std::to_string(nth_sync) + " after " + step;
  }
};

// Cuts the power (keeping no unsynced write) and ends the process where `cut` says: an Env
// that sees the compaction's crash points, over a FaultIo that sees its syncs. It also
// counts the syncs after each crash point, up to the next one.
class CuttingEnv final : public EnvWrapper {
 public:
  CuttingEnv(std::shared_ptr<FaultIo> fault, std::string root, CompactionCut cut)
      : EnvWrapper(make_default_env(fault)),
        fault_(std::move(fault)),
        root_(std::move(root)),
        cut_(std::move(cut)) {
    fault_->on_sync([this] {
      ++in_step_;
      if (reached_ && cut_.nth_sync != 0 && ++syncs_ == cut_.nth_sync) power_off();
    });
  }
  ~CuttingEnv() override { fault_->on_sync(nullptr); }
  void crashpoint(const char* name) override {
    if (step_ != name) {
      if (!step_.empty()) syncs_after_.emplace(step_, in_step_);
      step_ = name;
      in_step_ = 0;
    }
    if (reached_ || cut_.step != name) return;
    reached_ = true;
    if (cut_.nth_sync == 0) power_off();
  }
  void power_off() {
    fault_->power_cut(root_, 0);
    ::_exit(0);
  }
  // Crash point -> the syncs made after it (its first time) up to the next one or now.
  std::map<std::string, int> syncs_after() const {
    auto out = syncs_after_;
    if (!step_.empty()) out.emplace(step_, in_step_);
    return out;
  }

 private:
  std::shared_ptr<FaultIo> fault_;
  std::string root_;
  CompactionCut cut_;
  // (The child compacts in one thread.)
  bool reached_ = false;
  int syncs_ = 0;
  std::string step_;
  int in_step_ = 0;
  std::map<std::string, int> syncs_after_;
};

// A cut during a compaction of a queue with subscriptions, or right after it: every view
// comes back with exactly the state it had before the compaction (the subscriptions listed
// with their starts, each message's count and state, the counters, which agree), verify
// finds nothing, and deleting the index files rebuilds the same. The first round lets the
// compaction finish, cuts after it and counts the syncs of each step; then the cuts, in
// the order of the steps: the copies (a MSG plus a LEASE or RELEASE per view holding the
// message) written and not synced, then before the first, the middle and the last three
// syncs of step 3 (the prefix's segments, then the copies' segments and the directory: 17
// here); synced, before the checkpoint, and before each sync of the checkpoint's (3); synced,
// before any unlink; after the first unlink (the first segment, with the SUB records: the
// survivors open with them restated); every unlink made, before the directory's sync.
TEST_F(PowerCutTest, ACutDuringACompactionLeavesEverySubscriptionsState) {
  const std::string first_segment = qdir() + "/segments/00000000000000000001.seg";
  const std::string counts_path = dir_ / "syncs";
  std::vector<CompactionCut> cuts = {{"", 0}};
  for (size_t round = 0; round < cuts.size(); ++round) {
    const CompactionCut cut = cuts[round];
    SCOPED_TRACE("cut " + cut.name());
    std::filesystem::remove_all(qdir());
    make_three_views(qdir());
    if (HasFatalFailure()) return;
    const auto before = view_states(qdir());
    ASSERT_EQ(before.size(), kViews.size());
    ASSERT_EQ(before.at("").counters.count("subscriptions s1 from 1;s2 from 1;"), 1u)
        << before.at("");
    ASSERT_TRUE(std::filesystem::exists(first_segment));
    pid_t child = spawn([&] {
      auto fault = std::make_shared<FaultIo>(io::default_io());
      fault->keep_undo_log(FaultIo::Undo::kPrivate, 64 << 20);
      auto env = std::make_shared<CuttingEnv>(fault, qdir(), cut);
      QueueOptions o;
      o.env = env;
      auto q = open_view(qdir(), "", o);
      if (!q.ok()) return 2;
      auto r = (*q)->compact();
      if (!r.ok()) return 3;
      if (r->segments_removed == 0 || r->messages_copied == 0) return 4;
      std::ofstream counts(counts_path);
      for (const auto& [step, n] : env->syncs_after()) counts << step << " " << n << "\n";
      counts.close();
      // Right after the compaction: what it synced stays.
      fault->power_cut(qdir(), 0);
      return cut.step.empty() ? 0 : 5;
    });
    ASSERT_EQ(wait_exit(child), 0)
        << "4: the compaction copied or removed nothing; 5: it ended before the cut";
    if (cut.step.empty()) {
      EXPECT_FALSE(std::filesystem::exists(first_segment)) << "the SUB records' segment was kept";
      std::map<std::string, int> n;
      std::ifstream in(counts_path);
      for (std::string step; in >> step;) in >> n[step];
      const int copy_syncs = n["compact.after_copy"], checkpoint_syncs = n["compact.after_sync"];
      ASSERT_GE(copy_syncs, 4) << "step 3 synced too little to cut in";
      ASSERT_GE(checkpoint_syncs, 1);
      ASSERT_GE(n["compact.after_unlink"], 1) << "no sync of the directory after the unlinks";
      for (int k : {0, 1, copy_syncs / 2, copy_syncs - 2, copy_syncs - 1, copy_syncs})
        cuts.push_back({"compact.after_copy", k});
      for (int k = 0; k <= checkpoint_syncs; ++k) cuts.push_back({"compact.after_sync", k});
      cuts.push_back({"compact.after_checkpoint", 0});
      cuts.push_back({"compact.after_unlink", 0});
      cuts.push_back({"compact.after_unlink", 1});
    }
    if (cut.step == "compact.after_unlink") {
      EXPECT_FALSE(std::filesystem::exists(first_segment))
          << "the first unlink was not the SUB records' segment";
    }
    reboot_indexes(qdir(), round % 2 == 0);
    const auto after = view_states(qdir());
    ASSERT_EQ(after.size(), kViews.size());
    for (const std::string& view : kViews) {
      EXPECT_EQ(after.at(view), before.at(view))
          << "view '" << view << "' after the cut differs from before the compaction";
    }
    expect_verified_and_rebuilt(qdir(), before);
  }
}
}  // namespace
}  // namespace spool::test
