// libFuzzer target for receipts: ack / nack / extend with any string on a live queue. A
// receipt comes back from users and scripts (`spool ack Q "$r"`), so any bytes may arrive.
// Each call must return a clean error or succeed, never crash, never change a message the
// receipt does not name, and leave the index consistent.
//
// To reach past the parser, the input is a template: '@' becomes this queue's tag, '#' the
// id of a message now leased and '%' its delivery number, so the fuzzer can spell valid,
// stale and foreign receipts without guessing an 8-hex-digit tag.
//
// One queue (in /dev/shm when there is one) lives for the whole run and is kept stocked.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "fuzz_util.h"
#include "spool/queue.h"

namespace {

using spool::Code;
using spool::Queue;
using spool::fuzz::fail;

struct Env {
  std::string dir;
  std::unique_ptr<Queue> q;
  spool::Message leased;  // a message currently leased, for '#' and '%'
  std::string tag;
  uint64_t calls = 0;
};

Env* g_env = nullptr;

void restock(Env& e) {
  auto st = e.q->stats();
  if (!st.ok()) fail("stats: " + st.status().to_string());
  if (st->ready + st->in_flight + st->delayed < 4) {
    for (int i = 0; i < 4; ++i)
      if (!e.q->send("payload " + std::to_string(i)).ok()) fail("send");
  }
  // Keep one lease we know the receipt of (it may have been acked or nacked by an input).
  auto got = e.q->receive(1, std::chrono::seconds(600));
  if (got.ok()) e.leased = got->front();
}

Env& env() {
  if (g_env != nullptr) return *g_env;
  auto* e = new Env;
  e->dir = spool::fuzz::run_dir("fuzz-receipt");
  spool::QueueOptions o;
  o.sync = spool::SyncPolicy::kNever;
  o.segment_size = 1 << 20;
  auto q = Queue::open(e->dir + "/q", o);
  if (!q.ok()) fail("open: " + q.status().to_string());
  e->q = std::move(q).value();
  restock(*e);
  e->tag = e->leased.receipt.substr(e->leased.receipt.rfind('.') + 1);
  g_env = e;
  std::atexit([] { g_env->q.reset(); });  // before run_dir's removal
  return *e;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Env& e = env();
  if (size == 0) return 0;
  const int op = data[0] % 3;
  const auto vis = std::chrono::milliseconds(1 + (size > 1 ? data[1] : 0) * 1000);  // 1 ms .. 255 s
  std::string receipt;
  for (size_t i = 2; i < size; ++i) {
    char c = static_cast<char>(data[i]);
    if (c == '@') receipt += e.tag;
    else if (c == '#') receipt += std::to_string(e.leased.id);
    else if (c == '%') receipt += std::to_string(e.leased.receive_count);
    else receipt.push_back(c);
  }
  auto before = e.q->stats();
  spool::Status s = op == 0 ? e.q->ack(receipt) : op == 1 ? e.q->nack(receipt) : e.q->extend(receipt, vis);
  switch (s.code()) {
    case Code::kOk:
    case Code::kInvalidArgument:
    case Code::kNotFound:
    case Code::kLeaseLost:
      break;
    default:
      fail("unexpected error for receipt '" + receipt + "': " + s.to_string());
  }
  if (!s.ok() && s.message().empty()) fail("an error without a message");
  if (!s.ok()) {
    // A refused receipt changes nothing. (Ready and in-flight counts may move on their own
    // as leases run out, so compare what only a call can change.)
    auto after = e.q->stats();
    auto depth = [](const spool::Stats& st) { return st.ready + st.in_flight + st.delayed; };
    if (depth(*after) != depth(*before) || after->acked_total != before->acked_total) {
      fail("a refused receipt '" + receipt + "' changed the queue: " + s.to_string());
    }
  }
  if (s.ok() || ++e.calls % 64 == 0) {
    std::string inv = e.q->check_index();
    if (!inv.empty()) fail("index invariant broken after '" + receipt + "': " + inv);
    restock(e);
  }
  return 0;
}
