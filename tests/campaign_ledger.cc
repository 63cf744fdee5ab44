#include "campaign_ledger.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace spool::campaign {

void Ledger::add(Delivery d) {
  auto key = std::make_pair(d.id, d.count);
  if (auto it = deliveries.find(key); it != deliveries.end()) {
    duplicate_deliveries.insert(key);
    const Delivery& o = it->second;
    duplicate_details.push_back("message " + std::to_string(d.id) + " delivery " + std::to_string(d.count) +
                                ": first to " + o.who + " (receive " + std::to_string(o.t0) + ".." +
                                std::to_string(o.t1) + (o.acked ? ", acked" : "") + (o.nack_tried ? ", nacked" : "") +
                                "), again to " + d.who + " (receive " + std::to_string(d.t0) + ".." +
                                std::to_string(d.t1) + ")" +
                                (!o.tag.empty() && !d.tag.empty() && o.tag != d.tag ? "; tags differ: " + o.tag + " / " + d.tag : ""));
    return;
  }
  deliveries[key] = std::move(d);
}

void Ledger::read_library(const Incarnation& in) {
  std::string who = std::string(1, in.role) + std::to_string(in.slot) + "." + std::to_string(in.inc);
  std::ifstream f(in.journal);
  for (std::string line; std::getline(f, line);) {
    std::istringstream s(line);
    char kind = 0;
    s >> kind;
    uint64_t id = 0;
    uint32_t c = 0;
    std::string tag;
    if (kind == 'E') {
      errors.push_back(who + ": " + line);
      continue;
    }
    if (kind == 's') {
      s >> tag;
      attempted.insert(tag);
    } else if (kind == 'S') {
      s >> id >> tag;
      if (auto it = sent.find(id); it != sent.end() && it->second != tag) {
        errors.push_back(who + ": id " + std::to_string(id) + " given to two sends: " + it->second + " and " + tag);
      }
      sent[id] = tag;
      ++sends;
    } else if (kind == 'K') {
      uint64_t segs = 0, cp = 0;
      s >> segs >> cp;
      ++compactions;
      copied += cp;
    } else if (kind == 'R') {
      Delivery d;
      uint64_t vis_ms = 0;
      s >> d.id >> d.count >> d.t0 >> d.t1 >> vis_ms >> tag;
      d.who = who;
      d.tag = tag;
      d.vis_ns = vis_ms * 1'000'000;
      d.deadline = d.t0 + d.vis_ns;
      add(d);
    } else {
      s >> id >> c;
      auto it = deliveries.find({id, c});
      if (it == deliveries.end()) continue;
      Delivery& d = it->second;
      switch (kind) {
        case 'n': d.nack_tried = true; break;
        case 'N': ++nacks; break;
        case 'a': d.ack_tried = true; ack_tried_ids.insert(id); break;
        case 'A': d.acked = true; acked_ids.insert(id); ++acks; break;
        case 'L': d.lease_lost = true; ++lease_lost; break;
        case 'X': {
          uint64_t te = 0, vis_ms = 0;
          s >> te >> vis_ms;
          d.deadline = std::max(d.deadline, te + vis_ms * 1'000'000);
          ++extends;
          break;
        }
      }
    }
  }
}

void Ledger::read_work(const Incarnation& in) {
  std::string who = "W" + std::to_string(in.slot) + "." + std::to_string(in.inc);
  std::set<uint64_t> ack_failed;
  {
    std::ifstream e(in.err);
    for (std::string line; std::getline(e, line);) {
      uint64_t id = 0;
      int end = 0;
      // A log line (src/logging.h): "<time> spool work[<pid>] <level>: <message>"; the
      // library's own are named "spool[<pid>]".
      const size_t work_at = line.find(" spool work[");
      const size_t msg_at = work_at == std::string::npos ? std::string::npos : line.find("]", work_at);
      const size_t colon = msg_at == std::string::npos ? std::string::npos : line.find(": ", msg_at);
      const std::string msg = colon == std::string::npos ? std::string() : line.substr(colon + 2);
      if (std::sscanf(msg.c_str(), "message %" SCNu64 ": ack failed%n", &id, &end) == 1 && end > 0) {
        ack_failed.insert(id);
        ++work_ack_failed;
        if (std::getenv("CAMPAIGN_DEBUG")) std::printf("%s: %s\n", who.c_str(), line.c_str());
      } else if (line.find("retry in") == std::string::npos && line.find("nack failed") == std::string::npos &&
                 line.find("] warning: ") == std::string::npos && line.find("] info: ") == std::string::npos &&
                 !line.empty()) {
        errors.push_back(who + " stderr: " + line);
      }
    }
  }
  std::ifstream f(in.journal);
  std::vector<std::pair<uint64_t, uint32_t>> order;
  for (std::string line; std::getline(f, line);) {
    std::istringstream s(line);
    Delivery d;
    double up = 0;
    if (!(s >> d.id >> d.count >> up)) continue;
    s >> d.tag;
    d.who = who;
    d.t1 = static_cast<uint64_t>(up * 1e9);
    d.w_failed = d.id % 17 == 0 && d.count == 1;
    d.lease_lost = ack_failed.count(d.id) > 0;
    order.emplace_back(d.id, d.count);
    add(d);
    ++work_handled;
  }
  // With -j 1 spool work receives the next message only after acking (or nacking) this
  // one, so every entry but the last had its ack (or nack) return.
  for (size_t i = 0; i + 1 < order.size(); ++i) {
    auto it = deliveries.find(order[i]);
    if (it == deliveries.end() || it->second.who != who) continue;
    Delivery& d = it->second;
    if (!d.w_failed && !d.lease_lost) {
      d.w_ack_known = true;
      d.acked = true;
      acked_ids.insert(d.id);
    }
  }
  for (auto& key : order) {
    auto it = deliveries.find(key);
    if (it != deliveries.end() && !it->second.w_failed) {
      it->second.ack_tried = true;
      ack_tried_ids.insert(key.first);
    }
  }
}

}  // namespace spool::campaign
