#include "serve/dash_part.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>

#include "cli/output.h"
#include "serve/dash_assets.h"

namespace spool::serve {
namespace {

using nlohmann::json;

constexpr size_t kListHistory = 60;   // samples of each queue in the list (its sparklines)
constexpr size_t kLeasesShown = 100;  // leases listed in a queue's detail
constexpr size_t kDeadScanned = 200;  // dead letters read to group them by reason
constexpr size_t kDeadShown = 20;     // of them, shown one by one
constexpr size_t kPeeked = 10;        // ready messages shown (with the token only)
constexpr size_t kPreview = 160;      // payload bytes shown of each

void reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void reply_error(httplib::Response& res, int status, const std::string& message) {
  reply(res, status, json{{"error", message}});
}

int http_status(Code c) {
  switch (c) {
    case Code::kNotFound: return 404;
    case Code::kInvalidArgument: return 400;
    case Code::kReadOnly: return 403;
    case Code::kEmpty:
    case Code::kLeaseLost:
    case Code::kQueueFull: return 409;
    default: return 500;
  }
}

json rates_json(const cli::Rates& r) {
  return {{"send", r.send},         {"receive", r.receive},
          {"redeliver", r.redeliver}, {"ack", r.ack},
          {"nack", r.nack},         {"dead_lettered", r.dead_lettered},
          {"expired", r.expired}};
}

// What the list shows of a queue (the columns of spool top) and its last `history` samples
// for the charts: with `all_series`, every rate and count (the detail); else the send and
// ack rates only (the list's sparklines, so that a list of 1,000 queues stays small).
json row_json(const cli::SurveyedQueue& r, size_t history, bool all_series) {
  json j{{"name", r.name}, {"dir", r.dir}};
  if (!r.error.empty()) j["error"] = r.error;
  if (!r.have) return j;
  const Stats& s = r.st;
  j["paused"] = s.paused;
  j["ready"] = s.ready;
  j["in_flight"] = s.in_flight;
  j["delayed"] = s.delayed;
  j["blocked"] = s.blocked;
  j["dead"] = s.dead;
  j["oldest_ready_age_s"] = s.oldest_ready_age_s;
  j["sent_total"] = s.sent_total;
  j["acked_total"] = s.acked_total;
  j["nacked_total"] = s.nacked_total;
  j["received_total"] = s.received_total;
  j["redelivered_total"] = s.redelivered_total;
  j["dead_lettered_total"] = s.dead_lettered_total;
  j["expired_total"] = s.expired_total;
  j["bytes"] = s.bytes;
  j["disk_bytes"] = s.bytes_on_disk;
  j["rates"] = r.have_rates ? rates_json(r.rates) : json(nullptr);
  const auto [left, what] = r.room.tightest();
  j["headroom"] = {{"max_ready", r.room.max_ready}, {"ready_left", r.room.ready_left},
                   {"max_bytes", r.room.max_bytes}, {"bytes_left", r.room.bytes_left},
                   {"fs_size", r.room.fs_size},     {"fs_free", r.room.fs_free},
                   {"tightest", what},              {"tightest_left", left}};
  // The forward/pull bridges running on it (cli/bridge_status.h); only those, in the list.
  json bridges = json::array();
  for (const cli::BridgeStatus& b : r.bridges) {
    bridges.push_back({{"kind", b.kind}, {"pid", b.pid}, {"peer", b.peer}, {"moved", b.moved}, {"last_id", b.last_id},
                       {"last_at", b.last_at}, {"lag", b.lag}, {"lag_s", b.lag_s}, {"updated_at", b.updated_at}});
  }
  j["bridges"] = std::move(bridges);
  json h{{"send", json::array()}, {"ack", json::array()}};
  if (all_series) {
    for (const char* k : {"t", "receive", "redeliver", "nack", "dead_lettered", "ready", "in_flight", "dead"}) {
      h[k] = json::array();
    }
  }
  const size_t from = r.history.size() > history ? r.history.size() - history : 0;
  for (size_t i = from; i < r.history.size(); ++i) {
    const cli::Sample& x = r.history[i];
    h["send"].push_back(x.rates.send);
    h["ack"].push_back(x.rates.ack);
    if (!all_series) continue;
    h["t"].push_back(std::chrono::duration_cast<std::chrono::milliseconds>(x.at.time_since_epoch()).count());
    h["receive"].push_back(x.rates.receive);
    h["redeliver"].push_back(x.rates.redeliver);
    h["nack"].push_back(x.rates.nack);
    h["dead_lettered"].push_back(x.rates.dead_lettered);
    h["ready"].push_back(x.ready);
    h["in_flight"].push_back(x.in_flight);
    h["dead"].push_back(x.dead);
  }
  j["history"] = std::move(h);
  return j;
}

// The first kPreview bytes of a payload as text, or a note that it is binary.
json preview(const std::string& payload) {
  std::string head = payload.substr(0, kPreview);
  // A cut in the middle of a UTF-8 sequence: drop its first bytes (at most 3).
  for (int i = 0; i < 3 && head.size() < payload.size() && !cli::valid_utf8(head); ++i) head.pop_back();
  json j{{"size", payload.size()}, {"truncated", payload.size() > head.size()}};
  if (cli::valid_utf8(head)) {
    j["text"] = head;
  } else {
    j["binary"] = true;
  }
  return j;
}

bool same_site(const std::string& origin, const std::string& host) {
  for (const char* scheme : {"http://", "https://"}) {
    if (origin == scheme + host) return true;
  }
  return false;
}

}  // namespace

Result<std::string> read_token(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status(Code::kIo, path + ": cannot read the token file");
  std::string line;
  std::getline(in, line);
  const size_t a = line.find_first_not_of(" \t\r");
  const size_t b = line.find_last_not_of(" \t\r");
  const std::string token = a == std::string::npos ? "" : line.substr(a, b - a + 1);
  if (token.empty()) return Status(Code::kInvalidArgument, path + ": the token file's first line is empty");
  if (token.size() < 16) {
    return Status(Code::kInvalidArgument,
                  path + ": the token is shorter than 16 characters (make one: head -c 24 /dev/urandom | base64 > " + path + ")");
  }
  return token;
}

DashPart::DashPart(DashOptions opts) : opts_(std::move(opts)), survey_(opts_.roots, opts_.depth) {
  {
    sys::MutexLock l(mu_);
    survey_.discover();
    survey_.sample();
  }
  thread_ = std::thread([this] { refresh_loop(); });
}

DashPart::~DashPart() {
  stop();
}

void DashPart::stop() {
  {
    std::lock_guard<std::mutex> l(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DashPart::refresh_loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> l(stop_mu_);
      if (stop_cv_.wait_for(l, opts_.interval, [this] { return stopping_; })) return;
    }
    sys::MutexLock l(mu_);
    survey_.sample();
  }
}

bool DashPart::host_ok(const httplib::Request& req) const {
  if (!opts_.loopback) return true;
  std::string host = req.get_header_value("Host");
  if (!host.empty() && host[0] == '[') {
    host = host.substr(1, host.find(']') - 1);
  } else if (size_t colon = host.rfind(':'); colon != std::string::npos) {
    host = host.substr(0, colon);
  }
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

bool DashPart::token_ok(const httplib::Request& req) const {
  if (opts_.token.empty()) return false;
  const std::string h = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  if (h.size() != prefix.size() + opts_.token.size() || h.compare(0, prefix.size(), prefix) != 0) return false;
  // Compared in time that does not depend on where they differ.
  unsigned char diff = 0;
  for (size_t i = 0; i < opts_.token.size(); ++i) diff |= static_cast<unsigned char>(h[prefix.size() + i] ^ opts_.token[i]);
  return diff == 0;
}

void DashPart::mount(httplib::Server& http) {
  // Every route first checks the Host (DNS rebinding) and, for what changes a queue, the
  // token and the Origin.
  auto get = [this, &http](const std::string& path, auto fn) {
    http.Get(path, [this, fn](const httplib::Request& req, httplib::Response& res) {
      if (!host_ok(req)) return reply_error(res, 403, "the Host header names no loopback address");
      fn(req, res);
    });
  };
  for (const Asset& a : dash_assets()) {
    const std::string path = a.name == "index.html" ? "/dashboard/" : "/dashboard/" + std::string(a.name);
    get(path, [a](const httplib::Request&, httplib::Response& res) {
      res.set_content(std::string(a.body), std::string(a.type));
      // The page runs its own script and reads its own API, nothing else.
      res.set_header("Content-Security-Policy",
                     "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                     "connect-src 'self'; frame-ancestors 'none'; form-action 'none'");
      res.set_header("X-Content-Type-Options", "nosniff");
    });
  }
  // The page at "/" too, unless an SQS face on the same address answers there (it is
  // mounted first, and httplib takes the first route that matches).
  get("/", [](const httplib::Request&, httplib::Response& res) { res.set_redirect("/dashboard/"); });
  get("/dashboard", [](const httplib::Request&, httplib::Response& res) { res.set_redirect("/dashboard/"); });
  get("/api/v1/queues", [this](const httplib::Request& req, httplib::Response& res) { queues(req, res); });
  get("/api/v1/queue", [this](const httplib::Request& req, httplib::Response& res) { detail(req, res); });
  get("/metrics", [this](const httplib::Request& req, httplib::Response& res) { metrics(req, res); });
  for (const char* what : {"pause", "resume", "purge", "redrive", "move", "release"}) {
    http.Post(std::string("/api/v1/queue/") + what,
              [this, what](const httplib::Request& req, httplib::Response& res) { action(what, req, res); });
  }
}

void DashPart::queues(const httplib::Request&, httplib::Response& res) {
  json list = json::array();
  sys::MutexLock l(mu_);
  for (const auto& r : survey_.queues()) list.push_back(row_json(*r, kListHistory, false));
  l.unlock();
  reply(res, 200,
        json{{"now", cli::iso_time(std::chrono::system_clock::now())},
             {"interval_ms", opts_.interval.count()},
             {"actions", !opts_.token.empty()},
             {"roots", opts_.roots},
             {"queues", std::move(list)}});
}

void DashPart::detail(const httplib::Request& req, httplib::Response& res) {
  const std::string name = req.get_param_value("name");
  sys::MutexLock l(mu_);
  const cli::SurveyedQueue* r = survey_.find(name);
  if (r == nullptr) {
    l.unlock();
    return reply_error(res, 404, "no queue '" + name + "' under the roots");
  }
  json j = row_json(*r, cli::Survey::kHistory, true);
  std::shared_ptr<Queue> q = r->q;
  const Stats st = r->st;
  l.unlock();
  if (!q) return reply(res, 200, j);
  j["stats"] = cli::stats_json(st);
  const QueueOptions& o = q->options();
  j["options"] = {{"visibility_ms", o.visibility.count()}, {"max_receives", o.max_receives},
                  {"max_ready", o.max_ready},              {"max_bytes", o.max_bytes},
                  {"retention_max_age_ms", o.retention_max_age.count()},
                  {"dedup_window_ms", o.dedup_window.count()}};
  // Payloads only to whoever holds the token: the queue's files may be readable by fewer
  // users than can reach this address.
  const bool payloads = token_ok(req);
  j["payloads"] = payloads;
  const cli::Detail d = cli::read_detail(*q, st, kLeasesShown, kDeadScanned, kDeadShown);
  // The leases, with their holder's pid where bound (spool work binds), by holder too.
  json leases = json::array();
  const auto now = std::chrono::system_clock::now();
  for (const MessageInfo& m : d.leases) {
    json x = cli::info_json(m);
    x["ends_in_s"] = std::chrono::duration<double>(m.due - now).count();
    leases.push_back(std::move(x));
  }
  j["leases"] = std::move(leases);
  j["lease_holders"] = json::array();
  for (const auto& [pid, n] : d.leases_by_holder) {
    json x{{"pid", pid}, {"leases", n}};
    // A bound holder's time since its last receive or extend (Stats::Holder).
    for (const Stats::Holder& h : st.holders) {
      if (pid != 0 && h.pid == pid && h.renewed_ago_s >= 0) x["renewed_ago_s"] = h.renewed_ago_s;
    }
    j["lease_holders"].push_back(std::move(x));
  }
  json dead{{"count", st.dead}, {"by_reason", d.dead_by_reason}, {"letters", json::array()}, {"scanned", d.dead_read}};
  for (const cli::DeadLetter& x : d.dead) {
    json letter{{"id", x.id}, {"reason", x.reason}, {"original_id", x.original_id}, {"receive_count", x.receive_count},
           {"enqueued_at", x.enqueued_at}};
    json other = json::object();
    for (const auto& [k, v] : x.other) {
      if (cli::valid_utf8(k) && cli::valid_utf8(v)) other[k] = v;
    }
    letter["attributes"] = std::move(other);
    if (payloads) letter["payload"] = preview(x.payload);
    dead["letters"].push_back(std::move(letter));
  }
  j["dead_letters"] = std::move(dead);
  if (payloads) {
    json peeked = json::array();
    if (auto p = q->peek(kPeeked); p.ok()) {
      for (const Message& m : *p) {
        peeked.push_back({{"id", m.id}, {"enqueued_at", cli::iso_time(m.enqueued)}, {"payload", preview(m.payload)}});
      }
    }
    j["peek"] = std::move(peeked);
  }
  reply(res, 200, j);
}

void DashPart::metrics(const httplib::Request&, httplib::Response& res) {
  std::vector<std::pair<std::string, Stats>> copies;
  {
    sys::MutexLock l(mu_);
    for (const auto& r : survey_.queues()) {
      // A queue that cannot be read now has no series (rather than its last figures).
      if (r->have && r->error.empty()) copies.emplace_back(r->name, r->st);
    }
  }
  std::vector<std::pair<std::string, const Stats*>> in;
  for (const auto& [name, st] : copies) in.emplace_back(name, &st);
  res.set_header("Cache-Control", "no-store");
  res.set_content(cli::prometheus(in), "text/plain; version=0.0.4; charset=utf-8");
}

void DashPart::action(const std::string& what, const httplib::Request& req, httplib::Response& res) {
  if (!host_ok(req)) return reply_error(res, 403, "the Host header names no loopback address");
  if (opts_.token.empty()) {
    return reply_error(res, 403, "read-only: spool serve was started without --token-file, so no action is allowed");
  }
  const std::string origin = req.get_header_value("Origin");
  if (!origin.empty() && !same_site(origin, req.get_header_value("Host"))) {
    return reply_error(res, 403, "a request from another site (Origin " + origin + ") is refused");
  }
  if (!token_ok(req)) return reply_error(res, 403, "the token is missing or wrong (header Authorization: Bearer TOKEN)");
  json in = json::parse(req.body, nullptr, false);
  if (in.is_discarded() || !in.is_object()) return reply_error(res, 400, "the request body is not a JSON object");
  // Fields of the body; one of another type is refused, not taken as absent.
  std::string bad;
  auto field = [&](const char* key, json::value_t type, bool required) -> const json* {
    auto it = in.find(key);
    const bool fits = it != in.end() && it->type() == type;
    if (it != in.end() && !fits && bad.empty()) bad = std::string("\"") + key + "\" has the wrong type";
    if (it == in.end() && required && bad.empty()) bad = std::string("\"") + key + "\" is missing";
    return fits ? &*it : nullptr;
  };
  const json* name_field = field("name", json::value_t::string, true);
  const std::string name = name_field != nullptr ? name_field->get<std::string>() : "";
  if (!bad.empty()) return reply_error(res, 400, bad);
  auto queue_of = [this](const std::string& n) -> std::shared_ptr<Queue> {
    sys::MutexLock l(mu_);
    const cli::SurveyedQueue* r = survey_.find(n);
    return r != nullptr ? r->q : nullptr;
  };
  std::shared_ptr<Queue> q = queue_of(name);
  if (!q) return reply_error(res, 404, "no queue '" + name + "' under the roots (or it cannot be opened)");
  const json* max_field = field("max", json::value_t::number_unsigned, false);
  const uint64_t max = max_field != nullptr ? max_field->get<uint64_t>() : UINT64_MAX;
  const json* confirm = field("confirm", json::value_t::string, false);
  const json* to_field = field("to", json::value_t::string, what == "move");
  const json* dlq = field("dlq", json::value_t::boolean, false);
  const json* id = field("id", json::value_t::number_unsigned, what == "release");
  if (!bad.empty()) return reply_error(res, 400, bad);
  json out{{"ok", true}, {"name", name}, {"action", what}};
  Status s;
  if (what == "pause") {
    s = q->pause();
  } else if (what == "resume") {
    s = q->resume();
  } else if (what == "purge") {
    // The page asks for the queue's name to be typed; the API wants it too.
    if (confirm == nullptr || confirm->get<std::string>() != name) {
      return reply_error(res, 400, "purge removes every message: send \"confirm\" with the queue's name to go on");
    }
    auto n = q->purge();
    if (n.ok()) out["purged"] = *n;
    s = n.status();
  } else if (what == "redrive") {
    auto n = q->redrive(static_cast<size_t>(std::min<uint64_t>(max, SIZE_MAX)));
    if (n.ok()) out["redriven"] = *n;
    s = n.status();
  } else if (what == "move") {
    const std::string to = to_field->get<std::string>();
    std::shared_ptr<Queue> dst = queue_of(to);
    if (!dst) return reply_error(res, 404, "no queue '" + to + "' under the roots to move to");
    if (dst->dir() == q->dir()) return reply_error(res, 400, "a queue cannot be moved into itself");
    Queue* from = q.get();
    if (dlq != nullptr && dlq->get<bool>()) {
      auto d = q->dead_letters();
      if (!d.ok()) return reply_error(res, http_status(d.status().code()), d.status().message());
      from = *d;
    }
    Queue::MoveOptions mo;
    mo.max = max;
    auto r = from->move_to(*dst, mo);
    if (r.ok()) {
      out["moved"] = r->moved;
      out["already_there"] = r->already;
    }
    s = r.status();
    sys::MutexLock l(mu_);
    if (cli::SurveyedQueue* row = survey_.find(to); row != nullptr) survey_.sample(*row);
  } else if (what == "release") {
    s = q->release(id->get<uint64_t>());
  }
  spdlog::info("dashboard: {} {} from {}: {}", what, name, req.remote_addr, s.ok() ? "done" : s.message());
  {
    sys::MutexLock l(mu_);
    if (cli::SurveyedQueue* row = survey_.find(name); row != nullptr) survey_.sample(*row);
  }
  if (!s.ok()) return reply_error(res, http_status(s.code()), s.message());
  reply(res, 200, out);
}

}  // namespace spool::serve
