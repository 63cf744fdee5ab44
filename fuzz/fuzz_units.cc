// libFuzzer target for the CLI's duration and size parsers (tools/cli/units.h), which take
// whatever a user types after --visibility, --delay, --segment-size, ... . Beyond "never
// crash", what they accept must be consistent:
//  - a duration is 0 .. 1e15 ms and reads back the same when printed as "<n>ms";
//  - a bare number is seconds: parse_duration(x) == parse_duration(x + "s");
//  - a size reads back the same when printed in bytes, and x + "K" is 1024 times x.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cli/units.h"

namespace {

[[noreturn]] void fail(const char* cond, int line, const std::string& input) {
  std::fprintf(stderr, "fuzz_units: invariant violated at line %d: %s (input '%s')\n", line, cond, input.c_str());
  std::abort();
}
#define FUZZ_CHECK(cond) ((cond) ? (void)0 : fail(#cond, __LINE__, text))

bool has_unit(const std::string& s) {
  return !s.empty() && ((s.back() >= 'a' && s.back() <= 'z') || (s.back() >= 'A' && s.back() <= 'Z'));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 256) return 0;  // nobody types more; keeps the fuzzer on the parser
  // Command-line arguments are C strings: they cannot hold a NUL.
  if (std::memchr(data, 0, size) != nullptr) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  using spool::cli::parse_duration;
  using spool::cli::parse_size;

  auto d = parse_duration(text);
  if (d) {
    FUZZ_CHECK(d->count() >= 0);
    FUZZ_CHECK(d->count() <= 1000000000000000ll);
    auto again = parse_duration(std::to_string(d->count()) + "ms");
    FUZZ_CHECK(again && *again == *d);
  }
  if (!has_unit(text)) {
    auto with_s = parse_duration(text + "s");
    FUZZ_CHECK(d.has_value() == with_s.has_value());
    FUZZ_CHECK(!d || *d == *with_s);
  }

  auto s = parse_size(text);
  if (s) {
    FUZZ_CHECK(*s <= 1000000000000000000ull);
    auto again = parse_size(std::to_string(*s));
    FUZZ_CHECK(again && *again == *s);
    if (!has_unit(text) && *s <= 1000000000000000000ull / 1024) {
      auto k = parse_size(text + "K");
      FUZZ_CHECK(k && *k == *s * 1024);
    }
  }
  return 0;
}
