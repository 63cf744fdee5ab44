// Helpers shared by the tests: a temporary directory that removes itself.
#pragma once

#include <algorithm>
#include <string>

namespace spool::test {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace spool::test

namespace spool::test {

// Multiplier for data-heavy tests (SPOOL_TEST_SCALE, default 1): the sanitizer run uses a
// fraction, so the same test proves the same behaviour at a size ASan can afford.
double scale();
inline int scaled(int n) { return std::max(1, static_cast<int>(n * scale())); }

}  // namespace spool::test
