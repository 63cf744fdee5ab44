#include "soak_samples.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace spool::campaign {

namespace fs = std::filesystem;

int64_t status_kb(pid_t pid, const std::string& field) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::atoll(line.c_str() + field.size() + 1);
  }
  return -1;
}

uint64_t disk_bytes(const std::string& dir, uint64_t* tmp) {
  uint64_t total = 0;
  *tmp = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code fe;
    if (it->is_regular_file(fe)) {
      uint64_t n = it->file_size(fe);
      if (fe) continue;
      total += n;
      if (it->path().filename().string().find(".tmp.") != std::string::npos) *tmp += n;
    }
  }
  return total;
}

double slope_per_hour(const std::vector<double>& t, const std::vector<double>& v) {
  double n = static_cast<double>(t.size()), st = 0, sv = 0, stt = 0, stv = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    st += t[i];
    sv += v[i];
    stt += t[i] * t[i];
    stv += t[i] * v[i];
  }
  double den = n * stt - st * st;
  return den == 0 ? 0 : (n * stv - st * sv) / den * 3600;
}

std::string growth_problem(const std::string& name, const std::vector<double>& v, double slack) {
  size_t n = v.size();
  auto mean = [&](size_t from, size_t to) {
    double sum = 0;
    for (size_t i = from; i < to; ++i) sum += v[i];
    return sum / static_cast<double>(to - from);
  };
  double q2 = mean(n / 4, n / 2), q4 = mean(3 * n / 4, n);
  if (q4 <= 1.2 * q2 + slack) return "";
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s grows: last-quarter mean %.0f > 1.2 x second-quarter mean %.0f + %.0f",
                name.c_str(), q4, q2, slack);
  return buf;
}

}  // namespace spool::campaign
