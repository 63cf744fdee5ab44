#include "test_util.h"

#include <stdlib.h>

#include <cstdlib>

#include <filesystem>
#include <stdexcept>

namespace spool::test {

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "spool-test-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  if (std::getenv("SPOOL_TEST_KEEP") != nullptr) return;  // for post-mortems
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace spool::test

namespace spool::test {

double scale() {
  const char* s = std::getenv("SPOOL_TEST_SCALE");
  double v = s != nullptr ? std::atof(s) : 1.0;
  return v > 0 ? v : 1.0;
}

}  // namespace spool::test
