#include "cli/output.h"

#include "cli/survey.h"
#include "cli/units.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <set>
#include <sstream>

namespace spool::cli {

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c >> 5) == 0x6) { n = 1; cp = c & 0x1f; }
    else if ((c >> 4) == 0xe) { n = 2; cp = c & 0x0f; }
    else if ((c >> 3) == 0x1e) { n = 3; cp = c & 0x07; }
    else return false;
    if (i + n >= s.size()) return false;  // truncated sequence
    for (size_t k = 1; k <= n; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 0x2) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
        (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

std::string one_line(std::string_view s) {
  const bool utf8 = valid_utf8(s);
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && !utf8)) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  return out;
}

std::string base64(std::string_view s) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((s.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < s.size(); i += 3) {
    uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8) | uint8_t(s[i + 2]);
    for (int k = 3; k >= 0; --k) out += kAlphabet[(v >> (6 * k)) & 63];
  }
  if (i < s.size()) {
    uint32_t v = uint8_t(s[i]) << 16;
    if (i + 1 < s.size()) v |= uint8_t(s[i + 1]) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < s.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> unbase64(std::string_view s) {
  while (!s.empty() && s.back() == '=') s.remove_suffix(1);
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    int v = c >= 'A' && c <= 'Z' ? c - 'A' : c >= 'a' && c <= 'z' ? c - 'a' + 26
            : c >= '0' && c <= '9' ? c - '0' + 52 : c == '+' ? 62 : c == '/' ? 63 : -1;
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  if (bits >= 6) return std::nullopt;  // a lone sixth of a byte: truncated
  return out;
}

// A message's group under "group", or "group_base64" if it is not UTF-8; nothing if none.
static void put_group(nlohmann::json& j, const std::string& group) {
  if (group.empty()) return;
  if (valid_utf8(group)) {
    j["group"] = group;
  } else {
    j["group_base64"] = base64(group);
  }
}

nlohmann::json message_json(const Message& m) {
  nlohmann::json j;
  j["id"] = m.id;
  if (!m.receipt.empty()) j["receipt"] = m.receipt;
  j["receive_count"] = m.receive_count;
  j["priority"] = m.priority;
  put_group(j, m.group);
  j["enqueued_at"] = iso_time(m.enqueued);
  if (valid_utf8(m.payload)) {
    j["payload"] = m.payload;
  } else {
    j["payload_base64"] = base64(m.payload);
  }
  // Always present, so that `jq .attributes.KEY` needs no guard; a value that is not UTF-8
  // (JSON strings must be) is given in base64 under attributes_base64 instead.
  nlohmann::json attrs = nlohmann::json::object(), attrs64 = nlohmann::json::object();
  // A key that is not UTF-8 (spool refuses one at send; a forged record may hold one) is
  // escaped: dump() threw on it, after recv had leased the message (issue 48).
  for (const auto& [key, v] : m.attributes) {
    const std::string k = valid_utf8(key) ? key : one_line(key);
    if (valid_utf8(v)) {
      attrs[k] = v;
    } else {
      attrs64[k] = base64(v);
    }
  }
  j["attributes"] = std::move(attrs);
  if (!attrs64.empty()) j["attributes_base64"] = std::move(attrs64);
  return j;
}

// Seconds since `t` (the wall clock's now less it; 0 for a time ahead of it).
static double age_s(std::chrono::system_clock::time_point t) {
  return std::max(0.0, std::chrono::duration<double>(std::chrono::system_clock::now() - t).count());
}

nlohmann::json info_json(const MessageInfo& m, bool dead) {
  nlohmann::json j;
  j["id"] = m.id;
  j["state"] = dead ? "dead" : state_name(m.state);
  j["receive_count"] = m.receive_count;
  j["size"] = m.size;
  j["priority"] = m.priority;
  put_group(j, m.group);
  j["enqueued_at"] = iso_time(m.enqueued);
  j["age_s"] = std::round(age_s(m.enqueued) * 1000) / 1000;
  if (!dead && m.state != MessageState::kReady && m.state != MessageState::kBlocked) j["due_at"] = iso_time(m.due);
  if (!dead && m.holder_pid != 0) j["holder_pid"] = m.holder_pid;
  if (m.original_id != 0) j["original_id"] = m.original_id;
  return j;
}

std::string list_header() {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%-10s %-9s %8s %10s %3s %-6s %-24s %-8s %-10s %s", "ID", "STATE", "RECEIVES", "BYTES",
                "PRI", "AGE", "DUE", "HOLDER", "ORIGINAL", "GROUP");
  return buf;
}

std::string info_line(const MessageInfo& m, bool dead) {
  const std::string due = dead || m.state == MessageState::kReady || m.state == MessageState::kBlocked ? "-" : iso_time(m.due);
  const std::string holder = !dead && m.holder_pid != 0 ? std::to_string(m.holder_pid) : "-";
  const std::string original = m.original_id != 0 ? std::to_string(m.original_id) : "-";
  const double age = age_s(m.enqueued);
  const std::string shown_age = age > 0 ? human_age(age) : "0s";
  char buf[192];
  std::snprintf(buf, sizeof buf, "%-10" PRIu64 " %-9s %8u %10u %3u %-6s %-24s %-8s %-10s ", m.id,
                dead ? "dead" : state_name(m.state), m.receive_count, m.size, m.priority, shown_age.c_str(), due.c_str(),
                holder.c_str(), original.c_str());
  return buf + (m.group.empty() ? std::string("-") : one_line(m.group));
}

nlohmann::json subscription_json(const SubscriptionInfo& s) {
  return {{"name", s.name},
          {"from", s.from},
          {"messages", s.messages},
          {"in_flight", s.leased},
          {"expired_total", s.expired_total},
          {"held_back_bytes", s.held_back_bytes},
          {"max_receives", s.max_receives}};
}

nlohmann::json stats_json(const Stats& s) {
  nlohmann::json holders = nlohmann::json::array();
  for (const auto& h : s.holders) {
    nlohmann::json x{{"pid", h.pid}, {"in_flight", h.in_flight}};
    if (h.renewed_ago_s >= 0) x["renewed_ago_s"] = h.renewed_ago_s;
    holders.push_back(std::move(x));
  }
  return {{"ready", s.ready},
          {"in_flight", s.in_flight},
          {"delayed", s.delayed},
          {"blocked", s.blocked},
          {"dead", s.dead},
          {"oldest_ready_age_s", s.oldest_ready_age_s},
          {"sent_total", s.sent_total},
          {"acked_total", s.acked_total},
          {"dead_lettered_total", s.dead_lettered_total},
          {"expired_total", s.expired_total},
          {"nacked_total", s.nacked_total},
          {"received_total", s.received_total},
          {"redelivered_total", s.redelivered_total},
          {"bytes", s.bytes},
          {"disk_bytes", s.bytes_on_disk},
          {"segments", s.segments},
          {"held_back_bytes", s.held_back_bytes},
          {"dedup_ids", s.dedup_ids},
          {"kept_acked", s.kept_acked},
          {"kept_acked_bytes", s.kept_acked_bytes},
          {"paused", s.paused},
          {"holders", holders}};
}

std::string prometheus_label(const std::string& value) {
  std::string esc;
  for (char c : value) {
    if (c == '\\' || c == '"') esc += '\\';
    if (c == '\n') {
      esc += "\\n";
      continue;
    }
    esc += c;
  }
  return esc;
}

std::string prometheus_gauge(const std::string& queue, const char* name, const char* help, uint64_t value) {
  return std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + "{queue=\"" +
         prometheus_label(queue) + "\"} " + std::to_string(value) + "\n";
}

std::string prometheus(const std::vector<std::pair<std::string, const Stats*>>& queues) {
  std::vector<std::string> labels;  // queue="NAME", escaped as the format wants
  for (const auto& [queue, s] : queues) labels.push_back("queue=\"" + prometheus_label(queue) + "\"");
  std::ostringstream o;
  // One family: its HELP and TYPE once (the format allows no second), then a series per queue.
  auto metric = [&](const char* name, const char* type, const char* help, auto value_of) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
    for (size_t i = 0; i < queues.size(); ++i) o << name << "{" << labels[i] << "} " << value_of(*queues[i].second) << "\n";
  };
  o << "# HELP spool_messages Messages in the queue by state.\n# TYPE spool_messages gauge\n";
  for (size_t i = 0; i < queues.size(); ++i) {
    const Stats& s = *queues[i].second;
    for (auto [state, v] : {std::pair{"ready", s.ready}, {"in_flight", s.in_flight},
                            {"delayed", s.delayed}, {"blocked", s.blocked}, {"dead", s.dead}}) {
      o << "spool_messages{" << labels[i] << ",state=\"" << state << "\"} " << v << "\n";
    }
  }
  metric("spool_oldest_ready_age_seconds", "gauge", "Age of the oldest ready message.",
         [](const Stats& s) { return s.oldest_ready_age_s; });
  metric("spool_sent_total", "counter", "Messages sent.", [](const Stats& s) { return s.sent_total; });
  metric("spool_acked_total", "counter", "Messages acked.", [](const Stats& s) { return s.acked_total; });
  metric("spool_nacked_total", "counter", "Nacks (messages returned to the queue by a consumer).",
         [](const Stats& s) { return s.nacked_total; });
  metric("spool_received_total", "counter", "Deliveries (each receive of a message counts once).",
         [](const Stats& s) { return s.received_total; });
  metric("spool_redelivered_total", "counter", "Deliveries of a message received before (a lease that ran out, a nack).",
         [](const Stats& s) { return s.redelivered_total; });
  metric("spool_expired_total", "counter", "Messages dropped by a retention limit.",
         [](const Stats& s) { return s.expired_total; });
  metric("spool_dead_lettered_total", "counter", "Messages moved to the dead-letter queue.",
         [](const Stats& s) { return s.dead_lettered_total; });
  metric("spool_bytes", "gauge", "Payload bytes of the messages in the queue.", [](const Stats& s) { return s.bytes; });
  metric("spool_disk_bytes", "gauge", "Bytes of disk the queue's segments occupy.",
         [](const Stats& s) { return s.bytes_on_disk; });
  metric("spool_segments", "gauge", "Segment files.", [](const Stats& s) { return s.segments; });
  metric("spool_dedup_ids", "gauge", "Deduplication ids remembered (sent within the dedup window).",
         [](const Stats& s) { return s.dedup_ids; });
  metric("spool_kept_acked", "gauge", "Acked messages kept for replay (acked within keep_acked).",
         [](const Stats& s) { return s.kept_acked; });
  metric("spool_kept_acked_bytes", "gauge", "Payload bytes of the acked messages kept for replay.",
         [](const Stats& s) { return s.kept_acked_bytes; });
  metric("spool_paused", "gauge", "1 while the queue is paused (spool pause): it delivers nothing.",
         [](const Stats& s) { return s.paused ? 1 : 0; });
  bool holders = false;
  for (const auto& q : queues) holders = holders || !q.second->holders.empty();
  if (holders) {
    o << "# HELP spool_holder_in_flight Unexpired leases bound to a live process (bind_leases, spool work), by pid.\n"
         "# TYPE spool_holder_in_flight gauge\n";
    for (size_t i = 0; i < queues.size(); ++i) {
      for (const auto& h : queues[i].second->holders) {
        o << "spool_holder_in_flight{" << labels[i] << ",pid=\"" << h.pid << "\"} " << h.in_flight << "\n";
      }
    }
  }
  return o.str();
}

std::string prometheus(const std::string& queue, const Stats& s) {
  return prometheus({{queue, &s}});
}

DiskUse disk_use(const std::string& dir) {
  DiskUse u;
  std::set<std::pair<dev_t, ino_t>> seen;  // a hard-linked file counts once, as du counts it
  auto add = [&](const std::string& path, uint64_t* part) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !seen.emplace(st.st_dev, st.st_ino).second) return;
    const uint64_t bytes = static_cast<uint64_t>(st.st_blocks) * 512;
    u.total += bytes;
    if (part != nullptr) *part += bytes;
  };
  add(dir, nullptr);
  std::error_code ec;
  namespace fs = std::filesystem;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const fs::path rel = it->path().lexically_relative(dir);
    const std::string top = rel.empty() ? std::string() : rel.begin()->string();
    uint64_t* part = top == "segments" ? &u.segments : top == "index" ? &u.index : top == "dlq" ? &u.dlq : nullptr;
    add(it->path().string(), part);
  }
  return u;
}

std::string human_stats(const std::string& queue, const Stats& s, const Stats* prev, double seconds,
                        const DiskUse* disk) {
  char buf[1536];
  std::snprintf(buf, sizeof buf,
                "queue          %s\n"
                "ready          %" PRIu64 "\n"
                "in flight      %" PRIu64 "\n"
                "delayed        %" PRIu64 "\n"
                "blocked        %" PRIu64 "\n"
                "dead           %" PRIu64 "\n"
                "oldest ready   %.1fs\n"
                "sent total     %" PRIu64 "\n"
                "acked total    %" PRIu64 "\n"
                "nacked total   %" PRIu64 "\n"
                "expired total  %" PRIu64 "\n"
                "dead-lettered  %" PRIu64 "\n"
                "payload        %s\n"
                "segments       %" PRIu64 " (%s)\n"
                "dedup ids      %" PRIu64 "\n",
                queue.c_str(), s.ready, s.in_flight, s.delayed, s.blocked, s.dead, s.oldest_ready_age_s,
                s.sent_total, s.acked_total, s.nacked_total, s.expired_total, s.dead_lettered_total,
                format_size(s.bytes).c_str(), s.segments, format_size(s.bytes_on_disk).c_str(), s.dedup_ids);
  std::string out = buf;
  if (disk != nullptr) {
    out += "on disk        " + format_size(disk->total) + " in all, as du counts: segments " +
           format_size(disk->segments) + ", index " + format_size(disk->index) + ", dead-letter queue " +
           format_size(disk->dlq) + ", other " +
           format_size(disk->total - disk->segments - disk->index - disk->dlq) + "\n";
  }
  if (s.held_back_bytes != 0) {
    out += "held back      " + format_size(s.held_back_bytes) + " of segments only this view's messages keep\n";
  }
  if (s.paused) out += "paused         yes: delivers nothing until spool resume\n";
  if (s.kept_acked != 0) {
    std::snprintf(buf, sizeof buf, "kept acked     %" PRIu64 " (%s of payload, for replay)\n", s.kept_acked,
                  format_size(s.kept_acked_bytes).c_str());
    out += buf;
  }
  if (!s.holders.empty()) {
    out += "held by       ";
    for (size_t i = 0; i < s.holders.size(); ++i) {
      out += (i == 0 ? " pid " : ", pid ") + std::to_string(s.holders[i].pid) + ": " +
             std::to_string(s.holders[i].in_flight);
      if (s.holders[i].renewed_ago_s >= 0) {
        std::snprintf(buf, sizeof buf, " (renewed %.1fs ago)", s.holders[i].renewed_ago_s);
        out += buf;
      }
    }
    out += "\n";
  }
  if (prev != nullptr && seconds > 0) {
    auto rate = [&](uint64_t now, uint64_t before) {
      return now >= before ? static_cast<double>(now - before) / seconds : 0.0;
    };
    std::snprintf(buf, sizeof buf, "rates          sent %.0f/s, acked %.0f/s, nacked %.0f/s, dead-lettered %.0f/s\n",
                  rate(s.sent_total, prev->sent_total), rate(s.acked_total, prev->acked_total),
                  rate(s.nacked_total, prev->nacked_total), rate(s.dead_lettered_total, prev->dead_lettered_total));
    out += buf;
  }
  return out;
}

}  // namespace spool::cli
