// libFuzzer target for the shared index file (QUEUE/index). It is a cache of the log that
// any process may find damaged, truncated or left by another build or boot; the first
// opener must rebuild it or refuse with a clean error, never crash, and a queue it opens
// must show exactly what the log holds.
//
// Each input becomes the index of a closed queue (built once: messages sent, acked, leased,
// nacked, in several segments), then the queue is opened and read. Three modes, picked by
// the first byte:
//  - raw: the input is the whole file;
//  - header: a valid header of this build and boot (so the opener must judge it on its
//    fields) whose counters and positions (capacity .. compacted_through, the lock-free
//    words) come from the input, over the intact region of the real index. The robust
//    mutexes are kept initialised: a garbage futex word would make the opener wait forever
//    for an owner that is not there, which is not what this target is about.
//  - region: the whole valid header (seal included) and the input written into the region
//    (window, heap and overflow table) at an offset the input picks: the seal the last close wrote must
//    make the opener rebuild (this mode found INDEX_TRUSTED: entries that pass the
//    invariants but point at the wrong record).
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "fuzz_util.h"
#include "index/index.h"
#include "spool/queue.h"

namespace {

using spool::Queue;
using spool::fuzz::fail;
using spool::index::IndexHeader;

struct Env {
  std::string dir;
  std::string q;
  std::string index_bytes;                  // the intact index of the closed queue
  std::map<uint64_t, std::string> payload;  // what the log holds
  size_t fields_begin = 0, fields_end = 0;  // fuzzed header fields in header mode
  size_t disk_begin = 0, disk_end = 0;
  size_t atomics_begin = 0, atomics_end = 0;
};

Env* g_env = nullptr;

std::string slurp(const std::string& path) {
  std::string s;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return s;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

void write_file(const std::string& path, const char* data, size_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || (size > 0 && ::write(fd, data, size) != static_cast<ssize_t>(size))) fail("write index");
  ::close(fd);
}

Env& env() {
  if (g_env != nullptr) return *g_env;
  auto* e = new Env;
  e->dir = spool::fuzz::run_dir("fuzz-index");
  e->q = e->dir + "/q";
  {
    spool::QueueOptions o;
    o.segment_size = 16 << 10;
    o.sync = spool::SyncPolicy::kNever;
    o.max_receives = 0;
    auto q = Queue::open(e->q, o);
    if (!q.ok()) fail("open: " + q.status().to_string());
    for (int i = 0; i < 60; ++i) {
      std::string body = "message " + std::to_string(i) + std::string(static_cast<size_t>(i * 37 % 700), 'x');
      auto id = (*q)->send(body);
      if (!id.ok()) fail("send");
      e->payload[*id] = body;
    }
    auto got = (*q)->receive(20, std::chrono::hours(1));
    for (size_t i = 0; i < got->size(); ++i) {
      auto& m = (*got)[i];
      if (i % 2 == 0) {
        if (!(*q)->ack(m.receipt).ok()) fail("ack");
        e->payload.erase(m.id);
      } else if (i % 5 == 1) {
        if (!(*q)->nack(m.receipt).ok()) fail("nack");
      }
    }
  }
  e->index_bytes = slurp(e->q + "/index");
  if (e->index_bytes.size() < spool::index::kHeaderBytes) fail("no index");
  alignas(64) char buf[sizeof(IndexHeader)] = {};
  auto* h = reinterpret_cast<IndexHeader*>(buf);
  // The layout and the queue's counters (not the clock anchors and kept buckets after
  // them), compacted_through, and the lock-free words.
  e->fields_begin = static_cast<size_t>(reinterpret_cast<char*>(&h->layout) - buf);
  e->fields_end = static_cast<size_t>(reinterpret_cast<char*>(&h->cache.kept_width) - buf);
  e->disk_begin = static_cast<size_t>(reinterpret_cast<char*>(&h->disk.compacted_through) - buf);
  e->disk_end = e->disk_begin + sizeof h->disk.compacted_through;
  e->atomics_begin = static_cast<size_t>(reinterpret_cast<char*>(&h->coord.wake_seq) - buf);
  e->atomics_end = static_cast<size_t>(reinterpret_cast<char*>(&h->coord) - buf) + sizeof h->coord;
  g_env = e;
  return *e;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Env& e = env();
  if (size == 0) return 0;
  const int mode = data[0] % 3;
  const char* in = reinterpret_cast<const char*>(data + 1);
  size_t n = size - 1;
  std::string file;
  if (mode == 0) {
    file.assign(in, n);
  } else {
    file = e.index_bytes;
    size_t at = 0;
    if (mode == 1) {
      for (size_t off = e.fields_begin; off < e.fields_end && at < n; ++off) file[off] = in[at++];
      for (size_t off = e.disk_begin; off < e.disk_end && at < n; ++off) file[off] = in[at++];
      for (size_t off = e.atomics_begin; off < e.atomics_end && at < n; ++off) file[off] = in[at++];
    } else {
      // The intact header; the input overwrites the region from a position it chooses.
      size_t start = n >= 2 ? (static_cast<uint8_t>(in[0]) | static_cast<uint8_t>(in[1]) << 8) : 0;
      at = 2;
      for (size_t off = spool::index::kHeaderBytes + start; off < file.size() && at < n; ++off) file[off] = in[at++];
    }
  }
  write_file(e.q + "/index", file.data(), file.size());

  auto q = Queue::open(e.q);
  if (!q.ok()) {
    if (q.status().message().find("index") == std::string::npos) {
      fail("open refused without naming the index: " + q.status().to_string());
    }
    return 0;
  }
  // Opened: reads must not crash, and when the index holds its invariants it must show
  // exactly the log's messages.
  auto st = (*q)->stats();
  auto list = (*q)->list(1000);
  std::string inv = (*q)->check_index();
  if (inv.empty() && list.ok()) {
    if (list->size() != e.payload.size()) {
      fail("index accepted with " + std::to_string(list->size()) + " messages; the log holds " +
           std::to_string(e.payload.size()));
    }
    auto peek = (*q)->peek(1000);
    if (!peek.ok()) fail("peek: " + peek.status().to_string());
    for (auto& m : *peek) {
      auto it = e.payload.find(m.id);
      if (it == e.payload.end() || it->second != m.payload) fail("message " + std::to_string(m.id) + " differs");
    }
  }
  (void)st;
  return 0;
}
