#include "test_util.h"

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>

namespace spool::test {

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "spool-test-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace spool::test
