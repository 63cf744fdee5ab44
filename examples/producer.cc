// spool-producer: sends N messages to a queue, creating the queue if the directory holds
// none. The smallest complete producer: open, send in batches, check every Status.
//
//   spool-producer DIR N [PREFIX]      payloads are "PREFIX-1" ... "PREFIX-N" (default "job")
//
// Build against an installed libspool:
//   c++ -std=c++20 producer.cc $(pkg-config --cflags --libs spool) -o spool-producer
//
// Exit codes: 0 all sent, 1 a queue error (printed), 64 usage.
#include <spool/queue.h>

#include <charconv>
#include <cstdio>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

int main(int argc, char** argv) {
  uint64_t n = 0;
  if (argc < 3 || argc > 4 ||
      std::from_chars(argv[2], argv[2] + std::string_view(argv[2]).size(), n).ec != std::errc{}) {
    std::fprintf(stderr, "usage: %s DIR N [PREFIX]\n", argv[0]);
    return 64;
  }
  const std::string prefix = argc == 4 ? argv[3] : "job";

  auto q = spool::Queue::open(argv[1]);  // default options; creates the queue if needed
  if (!q.ok()) {
    std::fprintf(stderr, "spool-producer: %s\n", q.status().to_string().c_str());
    return 1;
  }

  // send_batch is all or nothing and shares one index lock and one write per batch: much
  // cheaper per message than send() in a loop.
  constexpr uint64_t kBatch = 100;
  uint64_t first_id = 0, last_id = 0;
  for (uint64_t i = 1; i <= n; i += kBatch) {
    std::vector<std::string> payloads;
    for (uint64_t j = i; j < i + kBatch && j <= n; ++j) payloads.push_back(prefix + "-" + std::to_string(j));
    std::vector<std::string_view> views(payloads.begin(), payloads.end());
    auto ids = (*q)->send_batch(views);
    if (!ids.ok()) {
      // kTooLarge, kQueueFull (back-pressure), kNoSpace (disk full), kReadOnly, kIo...
      std::fprintf(stderr, "spool-producer: after %llu messages: %s\n",
                   static_cast<unsigned long long>(i - 1), ids.status().to_string().c_str());
      return 1;
    }
    if (first_id == 0) first_id = ids->front();
    last_id = ids->back();
  }
  // Under the default sync policy (interval) the messages reach the disk within 50 ms; sync()
  // makes them durable now, before we report success.
  if (spool::Status s = (*q)->sync(); !s.ok()) {
    std::fprintf(stderr, "spool-producer: sync: %s\n", s.to_string().c_str());
    return 1;
  }
  std::printf("sent %llu messages (ids %llu..%llu)\n", static_cast<unsigned long long>(n),
              static_cast<unsigned long long>(first_id), static_cast<unsigned long long>(last_id));
  return 0;
}
