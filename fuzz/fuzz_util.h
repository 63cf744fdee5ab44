// Shared by the fuzz targets that keep queue files for the whole run (fuzz_index,
// fuzz_receipt, fuzz_segment).
#pragma once

#include <errno.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace spool::fuzz {

// Prints what went wrong, named by the target, and aborts: libFuzzer keeps the input as a crash.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, what.c_str());
  std::abort();
}

// A fresh directory for the run, removed at exit, with the library's logging off: it warns
// about every damaged input, which at thousands of inputs a second hides libFuzzer's own
// output and costs time. In /dev/shm when there is one, as every input rewrites files.
// Exit handlers run last-registered first, so a target can register its own clean-up
// (closing what it keeps open in the directory) after calling this.
inline std::string run_dir(const std::string& name) {
  spdlog::set_level(spdlog::level::off);
  std::string base = ::access("/dev/shm", W_OK) == 0 ? std::string("/dev/shm")
                                                     : std::filesystem::temp_directory_path().string();
  std::string tmpl = base + "/spool-" + name + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) fail("mkdtemp: " + std::string(std::strerror(errno)));
  static std::string* dir = new std::string(tmpl);
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(*dir, ec);
  });
  return tmpl;
}

}  // namespace spool::fuzz
