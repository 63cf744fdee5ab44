// spool-dump: prints a segment's header and records, and any corrupt regions.
// Usage: spool-dump [--payload] SEGMENT_FILE...
#include <cinttypes>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/std_fds.h"
#include "io/io.h"
#include "storage/segment.h"

namespace {

const char* type_name(spool::format::RecordType t) {
  switch (t) {
    case spool::format::RecordType::kMsg: return "MSG";
    case spool::format::RecordType::kLease: return "LEASE";
    case spool::format::RecordType::kAck: return "ACK";
    case spool::format::RecordType::kRelease: return "RELEASE";
    case spool::format::RecordType::kDead: return "DEAD";
    case spool::format::RecordType::kPurge: return "PURGE";
    case spool::format::RecordType::kCheckpoint: return "CHECKPOINT";
    case spool::format::RecordType::kClock: return "CLOCK";
    case spool::format::RecordType::kPause: return "PAUSE";
    case spool::format::RecordType::kSub: return "SUB";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  // Before any segment is opened: it must not become stdout (cli/std_fds.h). The dump is
  // the output, so a closed stdout is an error rather than /dev/null.
  spool::cli::StdFds closed;
  if (!spool::cli::ensure_std_fds(&closed)) {
    std::fprintf(stderr, "spool-dump: cannot open /dev/null onto a closed standard descriptor: %s\n",
                 std::strerror(errno));
    return 1;
  }
  if (closed.out_closed) {
    std::fprintf(stderr, "spool-dump: standard output is closed, and the dump goes there (redirect it instead)\n");
    return 2;
  }
  constexpr const char* kUsage =
      "usage: spool-dump [--payload] SEGMENT_FILE...\n"
      "Prints each segment file's header and records (docs/format.md); --payload adds payloads.\n"
      "Example: spool-dump /var/spool/jobs/segments/*.seg\n";
  bool show_payload = false;
  int files = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (std::strcmp(argv[i], "--payload") == 0) continue;
    if (argv[i][0] == '-') {
      std::fprintf(stderr, "spool-dump: unknown option '%s'\n%s", argv[i], kUsage);
      return 64;
    }
    ++files;
  }
  if (files == 0) {
    std::fprintf(stderr, "spool-dump: no SEGMENT_FILE given\n%s", kUsage);
    return 64;
  }
  int rc = 0;
  auto io = spool::io::make_pwrite_io();
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--payload") == 0) {
      show_payload = true;
      continue;
    }
    auto seg = spool::storage::Segment::open(*io, argv[i], false);
    if (!seg.ok()) {
      std::fprintf(stderr, "spool-dump: %s\n", seg.status().to_string().c_str());
      rc = 1;
      continue;
    }
    const auto& h = (*seg)->info();
    std::printf("%s: version %u seq %" PRIu64 " base_id %" PRIu64 " size %" PRIu64 " salt %016" PRIx64 " created_ns %" PRIu64 "\n", argv[i],
                h.version, h.seq, h.base_id, h.size, h.salt, h.created_ns);
    auto res = spool::storage::scan(**seg, spool::format::kSegmentHeaderSize, [&](const auto& v) {
      std::printf("  @%-10" PRIu64 " %-7s id %-10" PRIu64 " count %-4u t1 %" PRIu64 " t2 %" PRIu64 " len %zu", v.offset,
                  type_name(v.type), v.id, v.count, v.t1, v.t2, v.payload.size());
      if (v.view != 0) std::printf(" view %u", static_cast<unsigned>(v.view));
      if ((v.flags & spool::format::kFlagList) != 0) {
        // A LIST record's payload is its ids (first-last runs), not text.
        const char* sep = " ids ";
        for (const auto& run : spool::storage::list_runs(v.payload)) {
          std::printf("%s%" PRIu64, sep, run.first);
          if (run.last != run.first) std::printf("-%" PRIu64, run.last);
          sep = ",";
        }
      } else if (show_payload) {
        std::printf(" payload %.*s", static_cast<int>(v.payload.size()), v.payload.data());
      }
      std::printf("\n");
    });
    for (const auto& c : res.corrupt) {
      std::printf("  CORRUPT @%" PRIu64 " length %" PRIu64 "\n", c.offset, c.length);
      rc = 1;
    }
    std::printf("  %" PRIu64 " records, logical end %" PRIu64 "\n", res.records, res.end);
  }
  return rc;
}
