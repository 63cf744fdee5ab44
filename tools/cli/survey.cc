#include "cli/survey.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

namespace spool::cli {
namespace {

using Clock = std::chrono::steady_clock;

bool is_queue(const std::string& dir) {
  struct stat st {};
  return ::stat((dir + "/spool.conf").c_str(), &st) == 0;
}

void find_under(const std::string& dir, const std::string& name, int depth,
                std::vector<std::pair<std::string, std::string>>& out) {
  if (is_queue(dir)) {
    out.emplace_back(dir, name);
    return;
  }
  if (depth <= 0) return;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  std::vector<std::string> subs;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == ".." || (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN && e->d_type != DT_LNK)) continue;
    subs.push_back(n);
  }
  ::closedir(d);
  std::sort(subs.begin(), subs.end());
  for (const auto& n : subs) find_under(dir + "/" + n, name.empty() ? n : name + "/" + n, depth - 1, out);
}

double per_second(uint64_t now, uint64_t before, double secs) {
  return now >= before && secs > 0 ? static_cast<double>(now - before) / secs : 0;
}

Headroom headroom(const Queue& q, const Stats& s) {
  Headroom h;
  const QueueOptions& o = q.options();
  h.max_ready = o.max_ready;
  const uint64_t waiting = s.ready + s.delayed;
  h.ready_left = o.max_ready > waiting ? o.max_ready - waiting : 0;
  h.max_bytes = o.max_bytes;
  h.bytes_left = o.max_bytes > s.bytes ? o.max_bytes - s.bytes : 0;
  struct statvfs fs {};
  if (::statvfs(q.dir().c_str(), &fs) == 0) {
    h.fs_size = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
    h.fs_free = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  }
  return h;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> find_queues(const std::vector<std::string>& roots, int depth) {
  std::vector<std::pair<std::string, std::string>> found;
  for (const auto& root : roots) {
    std::vector<std::pair<std::string, std::string>> here;
    find_under(root, "", depth, here);
    for (auto& [dir, name] : here) {
      // One root: names relative to it; several: prefixed with the root.
      std::string shown = name.empty() ? root : (roots.size() > 1 ? root + "/" + name : name);
      found.emplace_back(dir, shown);
    }
  }
  return found;
}

std::pair<double, const char*> Headroom::tightest() const {
  std::pair<double, const char*> t{1.0, ""};
  auto consider = [&](uint64_t left, uint64_t limit, const char* what) {
    if (limit == 0) return;
    const double f = static_cast<double>(left) / static_cast<double>(limit);
    if (*t.second == '\0' || f < t.first) t = {f, what};
  };
  consider(ready_left, max_ready, "ready");
  consider(bytes_left, max_bytes, "bytes");
  consider(fs_free, fs_size, "fs");
  return t;
}

void Survey::discover() {
  std::map<std::string, std::unique_ptr<SurveyedQueue>> old;
  for (auto& r : rows_) old.emplace(r->dir, std::move(r));
  rows_.clear();
  for (auto& [dir, name] : find_queues(roots_, depth_)) {
    auto it = old.find(dir);
    if (it != old.end()) {
      rows_.push_back(std::move(it->second));
      continue;
    }
    auto r = std::make_unique<SurveyedQueue>();
    r->dir = dir;
    r->name = name;
    rows_.push_back(std::move(r));
  }
  discovered_ = Clock::now();
}

void Survey::sample() {
  if (Clock::now() - discovered_ > std::chrono::seconds(5)) discover();
  for (auto& r : rows_) sample(*r);
}

void Survey::sample(SurveyedQueue& r) {
  if (!r.q) {
    QueueOptions o;
    o.create = false;
    auto q = Queue::open(r.dir, o);
    if (!q.ok()) {
      r.error = q.status().message();
      return;
    }
    r.q = std::move(q).value();
  }
  auto st = r.q->stats();
  if (!st.ok()) {
    r.error = st.status().message();
    return;
  }
  r.error.clear();
  const auto now = Clock::now();
  if (r.have) {
    const double secs = std::chrono::duration<double>(now - r.at).count();
    // Two refreshes a moment apart (an action's) would give noise, not a rate.
    if (secs < 0.05) {
      r.st = *st;
      r.room = headroom(*r.q, r.st);
      return;
    }
    const Stats& p = r.st;
    r.rates.send = per_second(st->sent_total, p.sent_total, secs);
    r.rates.receive = per_second(st->received_total, p.received_total, secs);
    r.rates.redeliver = per_second(st->redelivered_total, p.redelivered_total, secs);
    r.rates.ack = per_second(st->acked_total, p.acked_total, secs);
    r.rates.nack = per_second(st->nacked_total, p.nacked_total, secs);
    r.rates.dead_lettered = per_second(st->dead_lettered_total, p.dead_lettered_total, secs);
    r.rates.expired = per_second(st->expired_total, p.expired_total, secs);
    r.have_rates = true;
  }
  r.st = *st;
  r.at = now;
  r.have = true;
  r.room = headroom(*r.q, r.st);
  r.bridges = read_bridges(r.dir);
  r.history.push_back(Sample{std::chrono::system_clock::now(), r.rates, r.st.ready, r.st.in_flight, r.st.dead});
  while (r.history.size() > kHistory) r.history.pop_front();
}

SurveyedQueue* Survey::find(const std::string& name) const {
  for (const auto& r : rows_) {
    if (r->name == name) return r.get();
  }
  return nullptr;
}

Detail read_detail(Queue& q, const Stats& st, size_t max_leases, size_t max_dead, size_t dead_kept) {
  Detail d;
  if (st.in_flight > 0) {
    if (auto ls = q.list(max_leases, StateFilter::only(MessageState::kInFlight)); ls.ok()) {
      d.leases = std::move(*ls);
      for (const MessageInfo& m : d.leases) ++d.leases_by_holder[m.holder_pid];
    }
  }
  if (st.dead == 0) return d;
  auto dlq = q.dead_letters();
  if (!dlq.ok()) return d;
  auto ls = (*dlq)->list(max_dead);
  if (!ls.ok()) return d;
  for (const MessageInfo& m : *ls) {
    auto shown = (*dlq)->show(m.id);
    if (!shown.ok()) continue;  // redriven or moved meanwhile
    ++d.dead_read;
    DeadLetter x;
    x.id = m.id;
    for (auto& [k, v] : shown->first.attributes) {
      if (k == "spool.dead.reason") {
        x.reason = v;
      } else if (k == "spool.dead.original_id") {
        x.original_id = v;
      } else if (k == "spool.dead.receive_count") {
        x.receive_count = v;
      } else if (k == "spool.dead.enqueued_at") {
        x.enqueued_at = v;
      } else if (k.rfind("spool.dead.", 0) != 0) {
        x.other.emplace(k, v);
      }
    }
    if (x.reason.empty()) x.reason = "unknown";
    ++d.dead_by_reason[x.reason];
    if (d.dead.size() < dead_kept) {
      x.payload = std::move(shown->first.payload);
      d.dead.push_back(std::move(x));
    }
  }
  return d;
}

Result<Peeked> peek_payloads(Queue& q, size_t max, std::string_view text, size_t kept) {
  auto msgs = q.peek(max);
  if (!msgs.ok()) return msgs.status();
  Peeked p;
  p.read = msgs->size();
  p.more = max > 0 && p.read >= max;
  for (Message& m : *msgs) {
    if (!text.empty() && m.payload.find(text) == std::string::npos) continue;
    ++p.matched;
    if (p.shown.size() < kept) p.shown.push_back(std::move(m));
  }
  return p;
}

std::string printable_prefix(std::string_view payload, size_t width) {
  std::string out;
  for (unsigned char c : payload) {
    char esc[8];
    if (c == '\\') {
      std::snprintf(esc, sizeof esc, "\\\\");
    } else if (c == '\t' || c == '\n' || c == '\r') {
      std::snprintf(esc, sizeof esc, "\\%c", c == '\t' ? 't' : c == '\n' ? 'n' : 'r');
    } else if (c >= 0x20 && c < 0x7f) {
      std::snprintf(esc, sizeof esc, "%c", c);
    } else {
      std::snprintf(esc, sizeof esc, "\\x%02x", c);
    }
    if (out.size() + std::strlen(esc) > width) break;
    out += esc;
  }
  return out;
}

std::string ascii_sparkline(const std::vector<double>& values, size_t width) {
  static const char kRamp[] = " .:-=+*#%@";
  const size_t from = values.size() > width ? values.size() - width : 0;
  double max = 0;
  for (size_t i = from; i < values.size(); ++i) max = std::max(max, values[i]);
  std::string out;
  for (size_t i = from; i < values.size(); ++i) {
    const double f = max > 0 ? values[i] / max : 0;
    out += kRamp[values[i] > 0 ? 1 + static_cast<size_t>(f * (sizeof kRamp - 3)) : 0];
  }
  return out;
}

std::string human_bytes(uint64_t b) {
  const char* units = "BKMGTP";
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f%c" : "%.1f%c", v, units[u]);
  return buf;
}

std::string human_age(double s) {
  char buf[32];
  if (s <= 0) return "-";
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%.0fm", s / 60);
  } else if (s < 86400) {
    std::snprintf(buf, sizeof buf, "%.1fh", s / 3600);
  } else {
    std::snprintf(buf, sizeof buf, "%.1fd", s / 86400);
  }
  return buf;
}

}  // namespace spool::cli
