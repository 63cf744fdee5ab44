// Clocks. The index orders deadlines on CLOCK_BOOTTIME (monotonic, counts suspend, immune
// to wall-clock steps); the log stores times on a clock tied to it by CLOCK records
// (queue/log_clock.h), which stays near CLOCK_REALTIME.
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>
#include <string>

namespace spool::sys {

inline uint64_t now_ns(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}
inline uint64_t boot_ns() { return now_ns(CLOCK_BOOTTIME); }
inline uint64_t real_ns() { return now_ns(CLOCK_REALTIME); }
// Ticks at the scheduler's rate (a few ms) and is read without a system call or a TSC read:
// for "was this done in the last N ms" on hot paths.
inline uint64_t coarse_ns() { return now_ns(CLOCK_MONOTONIC_COARSE); }

// /proc/sys/kernel/random/boot_id, which changes at every boot ("" if unreadable).
std::string boot_id();

// ISO 8601 UTC with milliseconds, e.g. 2026-11-29T20:40:00.123Z: how spool shows times, in
// dead letters' history and in the CLI's and spoolfs's output (tools/meson.build compiles
// this file into them too: the library exports only its public API).
std::string iso_time(std::chrono::system_clock::time_point t);

}  // namespace spool::sys
