// Writes the seed corpus for fuzz_segment: small segments produced by the real Log writer,
// then damaged the ways docs/format.md says segments get damaged (torn tail, corrupt record,
// zeroed gap, truncated file). Seeds from the writer itself give the fuzzer valid salts and
// checksums to start from, which it could not find by mutation alone.
//
// Usage: make_corpus OUT_DIR   (fuzz/corpus/segment/ in the source tree holds its output)
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "io/io.h"
#include "storage/format.h"
#include "storage/log.h"

namespace {

namespace fs = std::filesystem;
using spool::format::RecordType;
using spool::storage::Log;
using spool::storage::LogOptions;
using spool::storage::Pos;
using spool::storage::Record;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "make_corpus: %s\n", what.c_str());
  std::exit(1);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) die("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) die("cannot write " + path);
}

// One scratch log per seed, so every seed has its own salt.
class Scratch {
 public:
  Scratch(const std::string& root, const std::string& name, uint64_t segment_size)
      : dir_(root + "/" + name) {
    LogOptions opts;
    opts.segment_size = segment_size;
    opts.io = spool::io::make_pwrite_io();
    auto log = Log::open(dir_, opts);
    if (!log.ok()) die(log.status().to_string());
    log_ = std::move(log).value();
  }

  // Appends `recs` as one batch (one write), like a queue's batched send.
  std::vector<Pos> append(std::vector<Record> recs) {
    auto res = log_->append(end_, recs, next_id_);
    if (!res.ok()) die(res.status().to_string());
    end_ = res->end;
    return {res->at.begin(), res->at.end()};
  }
  std::string segment(uint64_t seq) const { return read_file(log_->segment_path(seq)); }
  Pos end() const { return end_; }

 private:
  std::string dir_;
  std::unique_ptr<Log> log_;
  Pos end_;
  uint64_t next_id_ = 1;
};

Record msg(uint64_t id, std::string_view body) {
  return {RecordType::kMsg, 0, id, 1700000000000000000ull, 1700000000000000000ull, body};
}
Record control(RecordType type, uint64_t id, uint32_t count = 0, uint64_t t2 = 0) {
  return {type, count, id, 0, t2, {}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) die("usage: make_corpus OUT_DIR");
  const std::string out = argv[1];
  fs::create_directories(out);
  std::string tmpl = (fs::temp_directory_path() / "spool-corpus-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) die("mkdtemp failed");
  const std::string root = tmpl;
  auto emit = [&](const std::string& name, const std::string& bytes) {
    if (bytes.size() > 16 * 1024) die(name + " is over 16 KiB");
    write_file(out + "/" + name, bytes);
  };

  {  // A freshly rolled segment: header, then zeros.
    Scratch s(root, "empty", 4096);
    s.append({});
    emit("empty-4k", s.segment(1));
    emit("header-only", s.segment(1).substr(0, 64));
  }
  {
    Scratch s(root, "one", 4096);
    s.append({msg(1, "hi")});
    emit("one-msg-4k", s.segment(1));
  }
  const std::string body100(100, 'b');
  {  // Every record type, single appends and a batch, payloads around the padding edges.
    Scratch s(root, "types", 8192);
    s.append({msg(1, ""), msg(2, "1234567"), msg(3, "12345678"), msg(4, body100)});
    s.append({control(RecordType::kLease, 1, 1, 1700000030000000000ull)});
    s.append({control(RecordType::kAck, 1)});
    s.append({control(RecordType::kLease, 2, 1, 1700000030000000000ull),
              control(RecordType::kRelease, 2, 0, 1700000060000000000ull)});
    s.append({control(RecordType::kDead, 3)});
    s.append({control(RecordType::kPurge, 4)});
    s.append({msg(5, std::string(700, 'x'))});
    {  // A receive of many and an ack_batch: LIST records of runs of ids.
      s.append({msg(6, "a"), msg(7, "b"), msg(8, "c")});
      const std::vector<uint64_t> ids{5, 6, 7, 8};
      const std::string list = spool::storage::encode_list(ids);
      Record lease = control(RecordType::kLease, 8, 1, 1700000030000000000ull);
      lease.flags = spool::format::kFlagList;
      lease.payload = list;
      Record ack = control(RecordType::kAck, 8, 1);
      ack.flags = spool::format::kFlagList;
      ack.payload = list;
      s.append({lease});
      s.append({ack});
    }
    const std::string seg = s.segment(1);
    emit("all-types-8k", seg);
    // The header promises 8 KiB but the file stops short, as after an outside truncation.
    emit("truncated", seg.substr(0, 1000));
  }
  {  // A crash mid-write: the last record's header is there, half its payload is not.
    Scratch s(root, "torn", 4096);
    s.append({msg(1, body100), msg(2, body100)});
    auto at = s.append({msg(3, std::string(300, 't'))});
    std::string seg = s.segment(1);
    const uint64_t torn_from = at[0].off + spool::format::kRecordHeaderSize + 150;
    for (uint64_t i = torn_from; i < s.end().off; ++i) seg[i] = '\0';
    emit("torn-tail-4k", seg);
    // Only the first 20 bytes of the last record's header reached the disk.
    for (uint64_t i = at[0].off + 20; i < s.end().off; ++i) seg[i] = '\0';
    emit("torn-header-4k", seg);
  }
  {  // A flipped bit in a record between valid ones: a corrupt region, then more records.
    Scratch s(root, "flip", 8192);
    std::vector<Pos> at;
    for (uint64_t id = 1; id <= 6; ++id) at.push_back(s.append({msg(id, body100)})[0]);
    std::string seg = s.segment(1);
    seg[at[2].off + spool::format::kRecordHeaderSize + 10] ^= 0x04;
    emit("corrupt-middle-8k", seg);
    // An unfinished write between two finished ones reads as zeros.
    for (uint64_t i = at[4].off; i < at[5].off; ++i) seg[i] = '\0';
    emit("corrupt-and-zero-gap-8k", seg);
  }
  {  // Fill segment 1 until it rolls: a segment full to its last byte, and one whose header
     // names segment 2 (which the fuzzer stores as segment 1: a misnamed file).
    Scratch s(root, "full", 4096);
    // 4096 - 64 = 4032 bytes = 21 records of 192 bytes (48 header + 144 payload).
    for (uint64_t id = 1; id <= 22; ++id) s.append({msg(id, std::string(144, 'f'))});
    if (s.end().seq != 2) die("expected the 22nd record to roll to segment 2");
    emit("full-4k", s.segment(1));
    emit("seq2-4k", s.segment(2));
  }
  std::error_code ec;
  fs::remove_all(root, ec);
  return 0;
}
