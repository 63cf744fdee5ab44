// spool-batch-worker: receives messages in batches, runs each batch's tasks on a few threads
// while one LeaseManager keeps every lease alive, and acks each message through the manager
// once its task is done. Tasks may take longer than the queue's visibility timeout: the
// manager renews the leases, so no other worker gets them meanwhile.
//
//   spool-batch-worker DIR [--threads N] [--work-ms MS] [--idle-exit SECONDS]
//
// Prints "ID PAYLOAD" per processed message. Build against an installed libspool:
//   c++ -std=c++20 lease_manager.cc $(pkg-config --cflags --libs spool) -o spool-batch-worker
#include <spool/lease_manager.h>
#include <spool/queue.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  using namespace std::chrono;
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(stderr, "usage: %s DIR [--threads N] [--work-ms MS] [--idle-exit SECONDS]\n", argv[0]);
    return 64;
  }
  long threads = 4, work_ms = 0, idle_exit_s = 2;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string_view flag = argv[i];
    long v = std::atol(argv[i + 1]);
    if (flag == "--threads" && v > 0) threads = v;
    else if (flag == "--work-ms" && v >= 0) work_ms = v;
    else if (flag == "--idle-exit" && v > 0) idle_exit_s = v;
    else {
      std::fprintf(stderr, "%s: bad option %s %s\n", argv[0], argv[i], argv[i + 1]);
      return 64;
    }
  }
  spool::QueueOptions qo;
  qo.create = false;
  auto q = spool::Queue::open(argv[1], qo);
  if (!q.ok()) {
    std::fprintf(stderr, "%s\n", q.status().to_string().c_str());
    return 1;
  }
  // Leases of the queue's visibility, renewed to 10 s whenever 3 s are left.
  spool::LeaseManager::Options lo;
  lo.extend_by = seconds(10);
  lo.margin = seconds(3);
  lo.max_lifetime = minutes(30);
  lo.min_remaining = milliseconds(200);
  auto lm = spool::LeaseManager::start(**q, lo);
  if (!lm.ok()) {
    std::fprintf(stderr, "%s\n", lm.status().to_string().c_str());
    return 1;
  }
  std::mutex out_mu;
  auto last_batch = steady_clock::now();
  while (steady_clock::now() - last_batch < seconds(idle_exit_s)) {
    const auto before = spool::LeaseManager::Clock::now();
    auto batch = (*q)->receive(static_cast<size_t>(threads) * 4, spool::Millis{0}, spool::Millis{500});
    if (!batch.ok() || batch->empty()) continue;  // nothing within the long poll
    last_batch = steady_clock::now();
    const auto lease_end = before + (*q)->options().visibility;
    std::vector<spool::Message> mine;
    for (auto& m : *batch) {
      if (spool::Status s = (*lm)->add(m.receipt, lease_end); !s.ok()) {
        std::fprintf(stderr, "not kept, left to run out: %s\n", s.to_string().c_str());
        continue;
      }
      mine.push_back(std::move(m));
    }
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    for (long t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        for (size_t i; (i = next.fetch_add(1)) < mine.size();) {
          const spool::Message& m = mine[i];
          std::this_thread::sleep_for(milliseconds(work_ms));  // the task
          auto info = (*lm)->status(m.receipt);
          if (info.ok() && info->state != spool::LeaseManager::LeaseState::kRenewing) {
            (void)(*lm)->release(m.receipt);  // lost or expired: another worker has it now
            continue;
          }
          if ((*lm)->ack(m.receipt).ok()) {
            std::lock_guard lock(out_mu);
            std::printf("%llu %s\n", static_cast<unsigned long long>(m.id), m.payload.c_str());
          }
        }
      });
    }
    for (auto& t : pool) t.join();
  }
  return 0;
}
