// libFuzzer target for segment recovery. Any byte string may be found as a segment file
// after a crash, a bad disk or a stray writer, so each input is stored as segment 1 of a log
// and taken through everything a queue does with it on open: parse_header, Segment::open,
// scan, Log::recover, and one append at the recovered end. None of it may crash, and what
// scan reports must agree with the bytes (docs/format.md, "Validity" and "Finding the end").
//
// Per input the cost is one pwrite + ftruncate into a file that lives for the whole run, in
// a directory made once (on tmpfs when there is one), so the fuzzer spends its time in the
// parser rather than in the file system.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_util.h"
#include "io/io.h"
#include "storage/format.h"
#include "storage/log.h"
#include "storage/segment.h"

namespace {

using spool::Code;
using spool::storage::Corruption;
using spool::storage::Log;
using spool::storage::LogOptions;
using spool::storage::Pos;
using spool::storage::Record;
using spool::storage::RecordView;
using spool::storage::ScanResult;
using spool::storage::Segment;
using spool::storage::SegmentInfo;
namespace format = spool::format;

[[noreturn]] void fail(const char* cond, int line) {
  std::fprintf(stderr, "fuzz_segment: invariant violated at line %d: %s\n", line, cond);
  std::abort();
}
#define FUZZ_CHECK(cond) ((cond) ? (void)0 : fail(#cond, __LINE__))

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

struct Env {
  std::string dir;
  std::string seg_path;
  int fd = -1;  // the segment file, rewritten in place for every input
  std::shared_ptr<spool::io::Io> io;
};

Env* g_env = nullptr;

Env& env() {
  if (g_env != nullptr) return *g_env;
  auto* e = new Env;
  e->dir = spool::fuzz::run_dir("fuzz-segment");
  e->seg_path = e->dir + "/00000000000000000001.seg";
  e->fd = ::open(e->seg_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (e->fd < 0) {
    std::perror("fuzz_segment: create segment file");
    std::abort();
  }
  // The backend does not matter for reading; pwrite keeps it free of io_uring setup.
  e->io = spool::io::make_pwrite_io();
  g_env = e;
  std::atexit([] { ::close(g_env->fd); });  // before run_dir's removal
  return *e;
}

void store_input(Env& e, const uint8_t* data, size_t size) {
  if (size > 0 && ::pwrite(e.fd, data, size, 0) != static_cast<ssize_t>(size)) {
    std::perror("fuzz_segment: pwrite");
    std::abort();
  }
  if (::ftruncate(e.fd, static_cast<off_t>(size)) != 0) {
    std::perror("fuzz_segment: ftruncate");
    std::abort();
  }
}

// A range of bytes that scan accounted for: a visited record or a reported corrupt region.
struct Span {
  uint64_t begin;
  uint64_t end;
  bool record;
};

// Runs scan from offset 64 and checks it against the file's bytes. Returns the result.
ScanResult check_scan(const Segment& seg, const uint8_t* data) {
  const SegmentInfo& info = seg.info();
  const uint64_t size = info.size;
  std::vector<Span> spans;
  ScanResult r = spool::storage::scan(seg, format::kSegmentHeaderSize, [&](const RecordView& v) {
    FUZZ_CHECK(v.offset >= format::kSegmentHeaderSize);
    FUZZ_CHECK(v.offset % format::kRecordAlign == 0);
    FUZZ_CHECK(spans.empty() || v.offset >= spans.back().end);
    FUZZ_CHECK(v.size >= format::kRecordHeaderSize + v.payload.size());
    FUZZ_CHECK(v.size <= size - v.offset);
    FUZZ_CHECK(v.payload.data() ==
               reinterpret_cast<const char*>(seg.data()) + v.offset + format::kRecordHeaderSize);
    const uint8_t* h = data + v.offset;
    FUZZ_CHECK(load<uint32_t>(h) == format::kRecordMagic);
    FUZZ_CHECK(load<uint32_t>(h + 4) == v.payload.size());
    FUZZ_CHECK(h[8] == static_cast<uint8_t>(v.type) && h[8] >= 1 && h[8] <= format::kMaxRecordType);
    FUZZ_CHECK(load<uint16_t>(h + 10) == v.view && v.view <= format::kMaxSubscriptions);
    FUZZ_CHECK(v.view == 0 || (info.version >= format::kFirstViewVersion && format::has_view(v.type, v.flags)));
    FUZZ_CHECK(v.type != format::RecordType::kMsg || (v.flags & format::kFlagOneView) == 0 ||
               info.version >= format::kFirstViewVersion);
    FUZZ_CHECK(v.flags == h[9] && v.count == load<uint32_t>(h + 12));
    FUZZ_CHECK(v.id == load<uint64_t>(h + 16) && v.t1 == load<uint64_t>(h + 24) &&
               v.t2 == load<uint64_t>(h + 32));
    FUZZ_CHECK(std::memcmp(v.payload.data(), h + format::kRecordHeaderSize, v.payload.size()) == 0);
    spans.push_back({v.offset, v.offset + v.size, true});
  });
  FUZZ_CHECK(r.end >= format::kSegmentHeaderSize && r.end <= size);
  FUZZ_CHECK(r.records == spans.size());

  std::vector<Span> records = spans;
  for (const Corruption& c : r.corrupt) {
    FUZZ_CHECK(c.seq == info.seq);
    FUZZ_CHECK(c.length > 0 && c.offset >= format::kSegmentHeaderSize);
    FUZZ_CHECK(c.offset <= size && c.length <= size - c.offset);
    // A corrupt region is only reported when a valid record follows it; otherwise its start
    // would be the end. (Or when the search past damage ran out of its budget: then the
    // last region runs to the end of the segment, which is the end.)
    if (r.budget_spent && c.offset + c.length == size) {
      FUZZ_CHECK(r.end == size);
      spans.push_back({c.offset, c.offset + c.length, false});
      continue;
    }
    auto next = seg.record_at(c.offset + c.length);
    FUZZ_CHECK(next.has_value());
    auto it = std::lower_bound(records.begin(), records.end(), c.offset + c.length,
                               [](const Span& s, uint64_t off) { return s.begin < off; });
    FUZZ_CHECK(it != records.end() && it->begin == c.offset + c.length);
    spans.push_back({c.offset, c.offset + c.length, false});
  }
  // Records and corrupt regions must tile [64, end) exactly: nothing is visited twice, no
  // record overlaps a corrupt region, and no bytes before the end go unaccounted for.
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  uint64_t cursor = format::kSegmentHeaderSize;
  for (const Span& s : spans) {
    FUZZ_CHECK(s.begin == cursor);
    FUZZ_CHECK(s.end > s.begin);
    cursor = s.end;
  }
  FUZZ_CHECK(cursor == r.end);
  // Nothing valid may start at or after the end: appends resume there and would bury it.
  FUZZ_CHECK(seg.resync(r.end) == size);

  // Resuming from a visited record (the index's job after a restart) must see the same tail.
  if (!records.empty()) {
    const Span& mid = records[records.size() / 2];
    ScanResult tail = spool::storage::scan(seg, mid.begin, [](const RecordView&) {});
    FUZZ_CHECK(tail.end == r.end);
    uint64_t after = 0;
    for (const Span& s : records) after += s.begin >= mid.begin;
    FUZZ_CHECK(tail.records == after);
  }
  return r;
}

// Offsets a caller could pass by mistake or from a damaged index must be rejected, not read.
void check_wild_offsets(const Segment& seg, const uint8_t* data, size_t len) {
  const uint64_t size = seg.info().size;
  uint64_t wild = len >= 72 ? load<uint64_t>(data + 64) : len;
  for (uint64_t off : {uint64_t{0}, size, size - 1, size - 47, size + 8, wild, ~uint64_t{0} - 7}) {
    auto v = seg.record_at(off);
    FUZZ_CHECK(!v || (off < size && v->size <= size - off));
    uint64_t at = seg.resync(off);
    FUZZ_CHECK(at == size || (at >= off && at < size && seg.record_at(at).has_value()));
    ScanResult r = spool::storage::scan(seg, off, [&](const RecordView& rv) {
      FUZZ_CHECK(rv.offset < size && rv.size <= size - rv.offset);
    });
    FUZZ_CHECK(r.end <= size);
  }
}

// What a queue does on open: recover the log, then append at the end it found.
void check_log(Env& e, const uint8_t* data, size_t len, const spool::Result<SegmentInfo>& header,
               const ScanResult* scanned, uint64_t mapped_size) {
  LogOptions opts;
  opts.segment_size = format::kMinSegmentSize;
  opts.io = e.io;
  auto log = Log::open(e.dir, opts);
  FUZZ_CHECK(log.ok());
  uint64_t visited = 0;
  auto rec = (*log)->recover([&](Pos p, const RecordView& v) {
    FUZZ_CHECK(p.seq == 1 && p.off == v.offset);
    ++visited;
  });
  // A segment whose header is all zeros (the file at least that long) is a roll a power
  // cut cut short: recovery sets it aside and the log is empty.
  if (len >= format::kSegmentHeaderSize &&
      std::all_of(data, data + format::kSegmentHeaderSize, [](uint8_t b) { return b == 0; })) {
    FUZZ_CHECK(rec.ok() && rec->records == 0 && rec->end == Pos{} && visited == 0);
    // Back where store_input() writes the next input (through the same descriptor).
    FUZZ_CHECK(::rename((e.seg_path + ".no-header").c_str(), e.seg_path.c_str()) == 0);
    return;
  }
  if (scanned == nullptr || header->seq != 1) {
    FUZZ_CHECK(!rec.ok());
    FUZZ_CHECK(scanned == nullptr || rec.status().code() == Code::kCorrupt);
    return;
  }
  FUZZ_CHECK(rec.ok());
  FUZZ_CHECK(rec->records == scanned->records && visited == scanned->records);
  FUZZ_CHECK(rec->end == (Pos{1, scanned->end}));
  FUZZ_CHECK(rec->corrupt.size() == scanned->corrupt.size());

  // Append one record where recovery says the next one goes, but only when it fits: a roll
  // would create and fsync a second segment per input, which is the slow path we avoid.
  const uint64_t payload_len = len % 61;
  if (rec->end.off + format::record_size(payload_len) > mapped_size) return;
  std::string payload(reinterpret_cast<const char*>(data), std::min<size_t>(len, payload_len));
  payload.resize(payload_len, 'p');
  Record r{format::RecordType::kMsg, 0, 42, 1, 2, payload};
  auto app = (*log)->append(rec->end, std::span(&r, 1));
  FUZZ_CHECK(app.ok());
  FUZZ_CHECK(app->at.size() == 1 && app->at[0] == rec->end);
  FUZZ_CHECK(app->end == (Pos{1, rec->end.off + format::record_size(payload_len)}));

  // The new record must be the last one found, with nothing before it disturbed and no
  // leftover bytes after it brought back to life.
  RecordView last{};
  uint64_t again_count = 0;
  auto again = (*log)->recover([&](Pos, const RecordView& v) {
    last = v;
    ++again_count;
  });
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->records == scanned->records + 1 && again_count == again->records);
  FUZZ_CHECK(again->end == app->end);
  FUZZ_CHECK(again->corrupt.size() == scanned->corrupt.size());
  FUZZ_CHECK(last.offset == rec->end.off && last.id == 42 && last.payload == payload);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Env& e = env();
  store_input(e, data, size);

  auto header = spool::storage::parse_header(data, size, "input");
  if (header.ok()) {
    FUZZ_CHECK(header->version >= 1 && header->version <= format::kVersion);
    FUZZ_CHECK(header->size >= format::kSegmentHeaderSize);
  }

  auto seg = Segment::open(*e.io, e.seg_path, false);
  // open() reads the same first 64 bytes, so it must reach the same verdict.
  FUZZ_CHECK(seg.ok() == header.ok());
  if (!seg.ok()) {
    FUZZ_CHECK(seg.status().code() == header.status().code());
    check_log(e, data, size, header, nullptr, 0);
    return 0;
  }
  const Segment& s = **seg;
  const SegmentInfo& info = s.info();
  FUZZ_CHECK(info.size == std::min<uint64_t>(header->size, size));
  FUZZ_CHECK(info.salt == header->salt && info.seq == header->seq);
  FUZZ_CHECK(std::memcmp(s.data(), data, info.size) == 0);

  ScanResult scanned = check_scan(s, data);
  check_wild_offsets(s, data, size);
  check_log(e, data, size, header, &scanned, info.size);
  return 0;
}
