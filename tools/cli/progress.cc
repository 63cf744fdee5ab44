#include "cli/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace spool::cli {

ProgressBar::ProgressBar(std::string label) : ProgressBar(std::move(label), ::isatty(2) == 1) {}
ProgressBar::ProgressBar(std::string label, bool enabled) : label_(std::move(label)), enabled_(enabled) {}

ProgressBar::~ProgressBar() {
  if (drawn_) std::fputs("\r\033[K", stderr);
}

void ProgressBar::update(uint64_t done, uint64_t total) {
  if (!enabled_ || total == 0) return;
  auto now = std::chrono::steady_clock::now();
  if (drawn_ && done < total && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  constexpr int kWidth = 30;
  double f = std::min(1.0, static_cast<double>(done) / static_cast<double>(total));
  int filled = static_cast<int>(f * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r%s [%s] %3d%% %lu/%lu", label_.c_str(), bar.c_str(), static_cast<int>(f * 100),
               static_cast<unsigned long>(done), static_cast<unsigned long>(total));
  std::fflush(stderr);
  drawn_ = true;
}

LiveLine::LiveLine() : LiveLine(::isatty(2) == 1) {}
LiveLine::LiveLine(bool enabled) : enabled_(enabled) {}
LiveLine::~LiveLine() { clear(); }

void LiveLine::show(const std::string& text) {
  if (!enabled_) return;
  std::lock_guard lock(mu_);
  std::fprintf(stderr, "\r\033[K%s", text.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void LiveLine::clear() {
  if (!enabled_) return;
  std::lock_guard lock(mu_);
  if (!drawn_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace spool::cli
