// What the crash campaign's soak samples (tests/crash_campaign_test.cc): the survivors'
// memory, the queue's bytes on disk, and the criterion that calls a series unbounded.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace spool::campaign {

// One sample of the soak's resources.
struct Sample {
  double t = 0;                  // seconds since the start
  std::vector<uint64_t> rss_kb;   // VmRSS of each survivor
  std::vector<uint64_t> anon_kb;  // RssAnon of each survivor: its heap, without mapped segments
  uint64_t disk = 0;             // bytes of all files under the queue directory
  uint64_t tmp = 0;              // of which leftover temporary files ("*.tmp.PID")
  uint64_t index = 0;            // bytes of QUEUE/index
  uint64_t depth = 0, segments = 0;
};

// A field of /proc/PID/status in kB ("VmRSS", "RssAnon"), or -1 if it has none (gone, or a
// zombie).
int64_t status_kb(pid_t pid, const std::string& field);

// Bytes of all regular files under `dir`, and of those named "*.tmp.*" among them (files
// vanish under compaction: errors are skipped).
uint64_t disk_bytes(const std::string& dir, uint64_t* tmp);

// Least-squares slope of `v` over `t`, per hour.
double slope_per_hour(const std::vector<double>& t, const std::vector<double>& v);

// The growth criterion: "" when the mean of the last quarter of the samples is at most 1.2
// times the mean of the second quarter plus `slack` (the first quarter is the warm-up:
// heaps, caches and the backlog settle). Means, not maxima: single samples jump with the
// segments a process has mapped at that moment and with the compaction backlog. A leak
// grows without bound and fails it over a long soak (in an hour, with ~10 MB of queue, a
// disk leak of more than ~8 MB an hour); the slack keeps the noise of a flat run from
// failing it.
std::string growth_problem(const std::string& name, const std::vector<double>& v, double slack);

}  // namespace spool::campaign
