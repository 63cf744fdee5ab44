#include "queue/log_clock.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "storage/format.h"
#include "storage/log.h"
#include "sys/clock.h"

namespace spool::queue {

namespace {

uint32_t anchors(const index::IndexHeader& h) { return std::min(h.cache.clock_n, index::kClockAnchors); }

// The offset of the anchor in force at `at` (lock held; `at` at or after clock_first).
uint64_t offset_at(const index::IndexHeader& h, uint64_t at) {
  const uint32_t n = anchors(h);
  uint32_t i = 0;
  while (i + 1 < n && h.cache.clock[i + 1].at <= at) ++i;
  return h.cache.clock[i].off;
}

}  // namespace

uint64_t boot_hash() {
  static const uint64_t hash = [] {
    std::string id = sys::boot_id();
    uint64_t v = XXH3_64bits(id.data(), id.size());
    return v == 0 ? 1 : v;
  }();
  return hash;
}

Clocks read_clocks(const index::IndexHeader& h, Env& env) {
  const Env::Now t = env.now();
  Clocks c;
  c.env = &env;
  c.boot = t.boot;
  c.real_coarse = t.real_coarse;
  const uint32_t n = anchors(h);
  c.rt = n == 0 ? c.real() : c.boot + h.cache.clock[n - 1].off;
  return c;
}

bool anchor_due(const index::IndexHeader& h, const Clocks& c) {
  if (anchors(h) == 0) return true;
  // A full table keeps the last offset for the rest of the boot: conversions stay exact,
  // only the log clock no longer follows the wall clock's steps.
  if (anchors(h) == index::kClockAnchors) return false;
  // Coarse (a tick, a few ms, behind): against a second of slack, and free of the precise read.
  const auto drift = static_cast<int64_t>(c.real_coarse - c.rt);
  return drift > static_cast<int64_t>(kClockSlackNs) || drift < -static_cast<int64_t>(kClockSlackNs);
}

storage::Record anchor_record(const Clocks& c, const uint64_t& boot) {
  return storage::Record{format::RecordType::kClock, 0, 0, c.rt, c.boot,
                         std::string_view(reinterpret_cast<const char*>(&boot), sizeof boot)};
}

storage::Record restatement(const index::IndexHeader& h, const uint64_t& boot, uint64_t boot_ns) {
  Clocks c;
  c.boot = boot_ns;
  c.rt = c.boot + h.cache.clock[anchors(h) - 1].off;
  return anchor_record(c, boot);
}

namespace {

void add_anchor(index::IndexHeader& h, uint64_t at, uint64_t off) {
  const uint32_t n = anchors(h);
  if (n == index::kClockAnchors) return;  // anchor_due() asks for no more
  if (n == 0) h.cache.clock_first = at;
  h.cache.clock[n] = index::ClockAnchor{at, off};
  h.cache.clock_n = n + 1;
}

}  // namespace

void note_anchor(index::IndexHeader& h, uint64_t at, const storage::RecordView& r) {
  uint64_t boot = 0;
  if (r.payload.size() == sizeof boot) std::memcpy(&boot, r.payload.data(), sizeof boot);
  if (boot != boot_hash()) return;
  const uint32_t n = anchors(h);
  if (n == 0 || h.cache.clock[n - 1].off != r.t1 - r.t2) add_anchor(h, at, r.t1 - r.t2);  // else a restatement
}

void clear_anchors(index::IndexHeader& h) {
  h.cache.clock_n = 0;
  h.cache.clock_first = 0;
  std::memset(h.cache.clock, 0, sizeof h.cache.clock);
}

uint64_t rebase(const index::IndexHeader& h, uint64_t at, uint64_t t, const Clocks& now) {
  if (anchors(h) == 0 || at < h.cache.clock_first) return t + (now.rt - now.real());  // a wall-clock time
  return t - offset_at(h, at) + (now.rt - now.boot);
}

void ReplayClock::clock_record(const storage::RecordView& r) {
  uint64_t boot = 0;
  if (r.payload.size() == sizeof boot) std::memcpy(&boot, r.payload.data(), sizeof boot);
  if (boot != boot_hash()) foreign_ = true;
}

bool ReplayClock::this_boot(uint64_t at) const { return anchors(h_) != 0 && at >= h_.cache.clock_first; }

uint64_t ReplayClock::lease_key(uint64_t at, uint64_t t2) const {
  if (this_boot(at)) return key_at(t2, offset_at(h_, at));
  if (foreign_) return 0;  // an earlier boot's lease: nobody holds it any more
  return key_at(t2, now_.real() - now_.boot);
}

uint64_t ReplayClock::ready_key(uint64_t at, uint64_t t1, uint64_t t2) const {
  if (this_boot(at)) return key_at(t2, offset_at(h_, at));
  uint64_t k = key_at(t2, now_.real() - now_.boot);
  // However far the wall clock went back, no longer than the record asked for.
  if (t1 != 0 && t2 >= t1) k = std::min(k, now_.boot + (t2 - t1));
  return k;
}

uint64_t ReplayClock::written(const storage::RecordView& r) {
  switch (r.type) {
    case format::RecordType::kMsg: return (r.flags & format::kFlagCopy) != 0 ? 0 : r.t1;
    case format::RecordType::kLease:
    case format::RecordType::kRelease:
    case format::RecordType::kClock: return r.t1;
    default: return 0;
  }
}

uint64_t ReplayClock::time_key(uint64_t at, uint64_t t) const {
  if (t == 0) return 0;
  if (this_boot(at)) return std::min(now_.boot, key_at(t, offset_at(h_, at)));
  return std::min(now_.boot, key_at(t, now_.real() - now_.boot));
}

uint64_t ReplayClock::time_wall(uint64_t at, uint64_t t) const {
  if (this_boot(at)) return now_.real() - std::min(now_.real(), now_.boot - time_key(at, t));
  return std::min(now_.real(), t);
}

}  // namespace spool::queue
