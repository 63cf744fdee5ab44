// libFuzzer target for spoolfs's name handling (fuse/common.h): every name a shell tool can
// hand the mount goes through parse_id, message_name and queue_name_ok before anything else
// happens to it. Each is checked against its definition, written here independently:
//  - parse_id accepts exactly the canonical decimals 1..UINT64_MAX, and gives their value;
//  - message_name claims exactly the all-digit names, with the id parse_id gives when it is
//    in the inode range, else 0 (so "007" and a 30-digit name are reserved but name no
//    message);
//  - queue_name_ok refuses "", ".", "..", and names with '/' or NUL.
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <string_view>

#include "common.h"
#include "inode.h"

namespace {

[[noreturn]] void fail(const char* what, std::string_view name) {
  std::fprintf(stderr, "fuzz_fuse_names: %s for \"%.*s\" (%zu bytes)\n", what, static_cast<int>(name.size()),
               name.data(), name.size());
  std::abort();
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// Canonical and at most UINT64_MAX, compared as text.
bool canonical_u64(std::string_view s) {
  static const std::string kMax = std::to_string(UINT64_MAX);
  if (!all_digits(s) || s[0] == '0') return false;
  return s.size() < kMax.size() || (s.size() == kMax.size() && s <= std::string_view(kMax));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view name(reinterpret_cast<const char*>(data), size);

  uint64_t v = 12345;
  bool parsed = spoolfs::parse_id(name, &v);
  if (parsed != canonical_u64(name)) fail(parsed ? "parse_id accepted a non-canonical number" : "parse_id refused a number", name);
  if (parsed && std::to_string(v) != name) fail("parse_id gave the wrong value", name);

  uint64_t id = 12345;
  bool reserved = spoolfs::message_name(name, &id);
  if (reserved != all_digits(name)) fail("message_name misclassified", name);
  if (reserved) {
    uint64_t want = parsed && v <= spoolfs::ino::kMaxMsgId ? v : 0;
    if (id != want) fail("message_name gave the wrong id", name);
  }

  bool ok = spoolfs::queue_name_ok(name);
  bool want_ok = !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
                 name.find('\0') == std::string_view::npos;
  if (ok != want_ok) fail("queue_name_ok misclassified", name);
  return 0;
}
