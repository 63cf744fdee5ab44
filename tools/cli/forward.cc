#include "cli/forward.h"

#include <cinttypes>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cli/bridge_status.h"
#include "cli/nats_conn.h"
#include "cli/output.h"
#include "cli/units.h"

namespace spool::cli {
namespace {

// A subject to publish to: dot-separated tokens, no wildcards, no white space.
std::string check_subject(const std::string& subject) { return check_subject_text(subject, false); }

}  // namespace

CLI::App* add_forward_command(CLI::App& app, std::string& dir, ForwardArgs& a) {
  auto* c = app.add_subcommand("forward", "Forward messages to NATS JetStream; each is acked once the stream has it");
  c->add_option("DIR", dir, "Queue directory")->required();
  add_nats_options(c, a.nats);
  c->add_option("--subject", a.subject, "Subject to publish to")
      ->required()
      ->check(CLI::Validator(check_subject, "SUBJECT"));
  c->add_option("--stream", a.stream,
                "Create this stream (work queue, file storage, 2m duplicate window) if it does not exist; "
                "without it a stream must already capture the subject");
  c->add_option("-j", a.window, "Publishes awaiting their PubAck at once (default 256)")
      ->check(CLI::Range(size_t{1}, size_t{65536}));
  c->add_option("--ack-timeout", a.ack_timeout, "Wait this long for a PubAck before retrying (default 5s)")
      ->check(CLI::Validator(check_positive_duration, "DURATION"));
  c->add_flag("--once", a.once, "Exit when the queue is empty (nothing ready, delayed or leased)");
  c->add_option("--give-up", a.give_up,
                "With --once: exit 1 once NATS has been out of reach this long, at start or later (default 30s)")
      ->check(CLI::Validator(check_positive_duration, "DURATION"));
  c->footer(
      "At-least-once: a message is acked locally only after JetStream confirmed it; a failed or\n"
      "timed-out publish returns it to the queue with backoff. Each message carries Nats-Msg-Id\n"
      "<queue uid>-<id>, so the stream drops a resend after a forwarder crash, and the headers\n"
      "Spool-Id, Spool-Enqueued-At and Spool-Receive-Count.\n"
      "While the server is unreachable (also at start) it warns once and keeps retrying; with\n"
      "--once, for at most --give-up (then exit 1, what was not confirmed back in the queue).\n"
      "SIGTERM/SIGINT: stop receiving, wait for outstanding PubAcks (up to --ack-timeout), return\n"
      "the rest to the queue, exit 0. See docs/beyond-one-host.md.\n"
      "Credentials: --creds-file, or the environment; a URL's user:password@ shows in ps\n"
      "(docs/security.md). No secret is ever printed: URLs are shown as nats://***@host.\n"
      "Example: spool forward /var/spool/jobs --nats nats://hub:4222 --subject jobs --stream JOBS");
  return c;
}

#if !SPOOL_HAVE_NATS

int run_forward(Queue&, const ForwardArgs&) {
  return nats_not_built("spool forward");
}

#else

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> g_stop{false};
std::atomic<bool> g_force{false};  // a second signal: stop waiting for PubAcks
void on_stop(int) {
  if (g_stop) g_force = true;
  g_stop = true;
}

// The queue's identity for de-duplication ids: the random `uid` fixed in DIR/spool.conf when
// the queue was created (the library API does not expose it). With the message id, which
// never repeats within a queue, "<uid>-<id>" names one message across forwarder restarts,
// and a queue re-created at the same path gets a new uid.
std::string queue_identity(const std::string& dir) {
  std::ifstream conf(dir + "/spool.conf");
  std::string line;
  while (std::getline(conf, line)) {
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    key.erase(key.find_last_not_of(' ') + 1);
    value.erase(0, value.find_first_not_of(' '));
    value.erase(value.find_last_not_of(" \r") + 1);
    if (key == "uid" && !value.empty() && value.find_first_not_of("0123456789") == std::string::npos) return value;
  }
  return "";
}

// Delay before a message whose publish failed is ready again: 250 ms, 500 ms, 1 s, ... 30 s.
// Kept well inside the stream's 2-minute duplicate window, so a resend of a message that did
// reach the stream (its PubAck was lost) is still recognised.
Millis retry_delay(uint32_t receive_count) {
  uint32_t shift = std::min<uint32_t>(receive_count == 0 ? 0 : receive_count - 1, 7);
  return std::min(Millis(250ll << shift), Millis(30000));
}

constexpr int64_t kDuplicateWindowNs = 120ll * 1000 * 1000 * 1000;

class Forwarder {
 public:
  Forwarder(Queue& q, const ForwardArgs& a, Credentials creds, std::string identity, Millis ack_timeout)
      : q_(q), args_(a), give_up_(*parse_duration(a.give_up)), creds_(std::move(creds)),
        warnings_("spool forward", creds_.secrets), url_(redact_url(a.nats.url)), identity_(std::move(identity)),
        ack_timeout_(ack_timeout),
        // Longer than a publish can be outstanding (the PubAck timeout turns it into a retry),
        // so a lease does not run out under a live forwarder; renew_leases() is the backstop.
        lease_(std::max(Millis(1000), 4 * ack_timeout)), status_(q.dir()) {}

  ~Forwarder() {
    // The library's threads call back into this object: they are gone once this returns.
    closing_ = true;  // closing the connection is no outage to warn about
    jsCtx_Destroy(js_);
    natsConnection_Destroy(nc_);
    nats_CloseAndWait(2000);
  }

  int run() {
    // A SIGKILLed forwarder gives its leases back at once, not after the lease.
    if (Status s = q_.bind_leases(); !s.ok()) {
      std::fprintf(stderr, "spool forward: leases not bound to this process (%s); a crash returns them only "
                           "when they run out\n", s.to_string().c_str());
    }
    if (int rc = connect(); rc >= 0) return rc;
    const auto setup_start = Clock::now();
    for (Millis pause(250);; pause = std::min(pause * 2, Millis(5000))) {
      Setup st = prepare_stream();
      if (st == Setup::kOk) break;
      if (st == Setup::kFatal) return 1;
      if (args_.once && Clock::now() - setup_start >= give_up_) {
        std::fprintf(stderr, "spool forward: the stream at %s is still not ready after %.3gs; giving up (--once, "
                             "--give-up)\n", url_.c_str(), static_cast<double>(give_up_.count()) / 1000);
        return 1;
      }
      if (!sleep_unless(g_stop, pause)) return summary(0);
    }
    std::fprintf(stderr, "spool forward: forwarding %s to stream %s (subject %s) at %s\n", q_.dir().c_str(),
                 stream_.c_str(), args_.subject.c_str(), url_.c_str());
    int rc = forward();
    stop();
    return summary(rc);
  }

  // Called by the library (its reply-subscription thread) for each PubAck or failure.
  static void on_puback(jsCtx*, natsMsg* msg, jsPubAck* pa, jsPubAckErr* pae, void* self) {
    static_cast<Forwarder*>(self)->completed(msg, pa, pae);
    natsMsg_Destroy(msg);
  }
  static void on_disconnected(natsConnection*, void* self) {
    auto* f = static_cast<Forwarder*>(self);
    f->connected_ = false;
    if (f->closing_) return;
    f->warn("lost the connection to NATS; reconnecting (the queue keeps accepting messages)");
    f->abandon_inflight();
  }
  static void on_reconnected(natsConnection*, void* self) {
    auto* f = static_cast<Forwarder*>(self);
    f->connected_ = true;
    if (!f->closing_) f->warn("reconnected to NATS");
    f->cv_.notify_all();
  }
  static void on_async_error(natsConnection*, natsSubscription*, natsStatus err, void* self) {
    static_cast<Forwarder*>(self)->warn(std::string("NATS: ") + natsStatus_GetText(err));
  }

 private:
  using Setup = NatsSetup;

  struct Inflight {
    uint64_t id = 0;
    std::string receipt;
    uint32_t receive_count = 0;
    Clock::time_point lease_end;
  };

  // Connects, retrying while the server is unreachable. -1 when connected, else the exit code.
  int connect() {
    NatsCallbacks cb{on_disconnected, on_reconnected, on_async_error, this};
    int rc = connect_nats(args_.nats, creds_, warnings_, "spool forward " + q_.dir(), cb,
                          "(the queue keeps accepting messages)", g_stop, &nc_, args_.once ? give_up_ : Millis(0));
    if (rc == 0) return summary(0);
    if (rc < 0) connected_ = true;
    return rc;
  }

  Setup classify(natsStatus s, const std::string& what) { return classify_setup_failure(warnings_, s, what, url_); }


  // Finds the stream that captures the subject, creating it first with --stream.
  Setup prepare_stream() {
    if (js_ == nullptr) {
      jsOptions jo;
      jsOptions_Init(&jo);
      jo.Wait = ack_timeout_.count();
      jo.PublishAsync.AckHandler = on_puback;
      jo.PublishAsync.AckHandlerClosure = this;
      if (natsStatus s = natsConnection_JetStream(&js_, nc_, &jo); s != NATS_OK) return classify(s, "JetStream");
    }
    jsErrCode jerr = static_cast<jsErrCode>(0);
    const std::string& name = args_.stream;
    if (!name.empty()) {
      jsStreamInfo* si = nullptr;
      natsStatus s = js_GetStreamInfo(&si, js_, name.c_str(), nullptr, &jerr);
      jsStreamInfo_Destroy(si);
      if (s == NATS_NOT_FOUND) {
        jsStreamConfig cfg;
        jsStreamConfig_Init(&cfg);
        const char* subjects[] = {args_.subject.c_str()};
        cfg.Name = name.c_str();
        cfg.Subjects = subjects;
        cfg.SubjectsLen = 1;
        cfg.Retention = js_WorkQueuePolicy;  // a message leaves the stream once a consumer acks it, as in spool
        cfg.Storage = js_FileStorage;
        cfg.Duplicates = kDuplicateWindowNs;
        si = nullptr;
        s = js_AddStream(&si, js_, &cfg, nullptr, &jerr);
        jsStreamInfo_Destroy(si);
        if (s == NATS_OK) {
          std::fprintf(stderr, "spool forward: created stream %s (work queue, file storage, subject %s, "
                               "2m duplicate window)\n", name.c_str(), args_.subject.c_str());
        } else if (jerr != JSStreamNameExistErr) {  // else another forwarder just created it
          return classify(s, "cannot create stream " + name);
        }
      } else if (s != NATS_OK) {
        return classify(s, "cannot look up stream " + name);
      }
    }
    jsOptions lo;
    jsOptions_Init(&lo);
    lo.Stream.Info.SubjectsFilter = args_.subject.c_str();
    jsStreamNamesList* names = nullptr;
    natsStatus s = js_StreamNames(&names, js_, &lo, &jerr);
    if (s == NATS_NOT_FOUND) {
      if (name.empty()) {
        std::fprintf(stderr, "spool forward: no JetStream stream captures subject %s at %s (create one, or pass "
                             "--stream NAME to have it created)\n", args_.subject.c_str(), url_.c_str());
      } else {
        std::fprintf(stderr, "spool forward: stream %s does not capture subject %s\n", name.c_str(),
                     args_.subject.c_str());
      }
      return Setup::kFatal;
    }
    if (s != NATS_OK) return classify(s, "cannot list streams");
    std::string found = names->Count > 0 ? names->List[0] : "";
    bool listed = false;
    for (int i = 0; i < names->Count; ++i) listed = listed || name == names->List[i];
    jsStreamNamesList_Destroy(names);
    if (!name.empty() && !listed) {
      std::fprintf(stderr, "spool forward: subject %s belongs to stream %s, not %s\n", args_.subject.c_str(),
                   found.c_str(), name.c_str());
      return Setup::kFatal;
    }
    stream_ = name.empty() ? found : name;
    return Setup::kOk;
  }

  // The main loop: receive while there is room in the window, publish, repeat. Returns the
  // exit code.
  int forward() {
    auto next_renewal = Clock::now() + lease_ / 4;
    while (!g_stop) {
      report();
      auto now = Clock::now();
      if (now >= next_renewal) {
        renew_leases();
        next_renewal = now + lease_ / 4;
      }
      size_t room = 0;
      bool idle = false;
      {
        std::unique_lock lock(mu_);
        // After a failure, probe with one message at a time until a publish succeeds, so an
        // outage or a missing stream costs few deliveries (each counts toward max_receives).
        size_t limit = failures_ > 0 ? 1 : args_.window;
        if (connected_) {
          lost_since_.reset();
        } else if (!lost_since_) {
          lost_since_ = now;
        } else if (args_.once && now - *lost_since_ >= give_up_) {
          std::fprintf(stderr, "spool forward: NATS at %s out of reach for %.3gs; giving up (--once, --give-up)\n",
                       url_.c_str(), static_cast<double>(give_up_.count()) / 1000);
          return 1;
        }
        if (!connected_ || now < pause_until_ || inflight_.size() >= limit) {
          cv_.wait_for(lock, Millis(100));
          continue;
        }
        room = limit - inflight_.size();
        idle = inflight_.empty();
      }
      // Checked before receiving, so --once ends as soon as the last PubAck is in, not after
      // a long poll (stats() is O(backlog), but the window is empty only now and then).
      if (args_.once && idle && drained()) break;
      auto msgs = q_.receive_views(room, lease_, idle ? Millis(250) : Millis(20));
      if (!msgs.ok()) {
        if (msgs.status().code() != Code::kEmpty) {
          std::fprintf(stderr, "spool forward: receive failed: %s\n", msgs.status().to_string().c_str());
          return 1;
        }
        continue;
      }
      for (auto& m : *msgs) publish(m);
    }
    return 0;
  }

  void publish(const MessageView& m) {
    Inflight e{m.id, m.receipt, m.receive_count, Clock::now() + lease_};
    std::string id = std::to_string(m.id), msg_id = identity_ + "-" + id, count = std::to_string(m.receive_count);
    natsMsg* msg = nullptr;
    natsStatus s = natsMsg_Create(&msg, args_.subject.c_str(), nullptr, m.payload.data(),
                                  static_cast<int>(m.payload.size()));
    // The message's attributes as headers of the same names (attribute keys are valid header
    // names); a value a header cannot carry (a control byte: CR or LF would end the header
    // line) goes base64 under Spool-B64-KEY, which spool pull decodes back to KEY.
    for (const auto& [key, value] : m.attributes) {
      if (s != NATS_OK) break;
      const bool text = std::none_of(value.begin(), value.end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
      });
      s = text ? natsMsgHeader_Set(msg, key.c_str(), value.c_str())
               : natsMsgHeader_Set(msg, (kBase64Header + key).c_str(), base64(value).c_str());
    }
    if (s == NATS_OK) s = natsMsgHeader_Set(msg, "Spool-Id", id.c_str());
    if (s == NATS_OK) s = natsMsgHeader_Set(msg, "Spool-Enqueued-At", iso_time(m.enqueued).c_str());
    if (s == NATS_OK) s = natsMsgHeader_Set(msg, "Spool-Receive-Count", count.c_str());
    if (s == NATS_OK) {
      jsPubOptions po;
      jsPubOptions_Init(&po);
      po.MsgId = msg_id.c_str();  // Nats-Msg-Id: the stream drops a second copy within its window
      po.ExpectStream = stream_.c_str();
      po.MaxWait = ack_timeout_.count();  // no PubAck by then: on_puback gets a timeout
      // Registered before the publish: the PubAck may arrive before js_PublishMsgAsync returns.
      {
        std::lock_guard lock(mu_);
        inflight_[msg] = e;
      }
      s = js_PublishMsgAsync(js_, &msg, &po);  // takes `msg` (sets it to null) on success
      if (s != NATS_OK) {
        std::lock_guard lock(mu_);
        inflight_.erase(msg);
      }
    }
    if (s != NATS_OK) {
      std::string why = nats_text(s);
      natsMsg_Destroy(msg);
      retry_later(e, why);
    }
  }

  void completed(natsMsg* msg, jsPubAck* pa, jsPubAckErr* pae) {
    Inflight e;
    {
      std::lock_guard lock(mu_);
      auto it = inflight_.find(msg);
      // Not found: stop() already returned it to the queue; a late PubAck changes nothing.
      if (closing_ || it == inflight_.end()) return;
      e = std::move(it->second);
      inflight_.erase(it);
    }
    if (pa != nullptr) {
      Status s = q_.ack(e.receipt);
      if (s.ok()) {
        ++forwarded_;
        last_id_ = e.id;
        last_at_ = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
        if (pa->Duplicate) ++duplicates_;
      } else {
        // The stream has the message; the local copy stays (say the lease was lost), and its
        // next publish is dropped as a duplicate and acked then.
        warn("message " + std::to_string(e.id) + " is in the stream but the local ack failed: " + s.to_string());
      }
      std::lock_guard lock(mu_);
      failures_ = 0;
    } else {
      std::string why = pae != nullptr && pae->ErrText != nullptr ? pae->ErrText : "publish failed";
      if (pae != nullptr && pae->Err == NATS_TIMEOUT) why = "no PubAck within --ack-timeout";
      retry_later(e, why);
    }
    cv_.notify_all();
  }

  // Returns the message to the queue after a backoff, and slows the main loop down.
  void retry_later(const Inflight& e, const std::string& why) {
    (void)q_.nack(e.receipt, retry_delay(e.receive_count));  // fails only if the lease is gone: fine
    ++retries_;
    {
      std::lock_guard lock(mu_);
      failures_ = std::min<uint32_t>(failures_ + 1, 5);
      pause_until_ = Clock::now() + std::min(Millis(250ll << failures_), Millis(5000));
    }
    warn("publishing failed (" + why + "); message " + std::to_string(e.id) + " retried with backoff",
         "publish " + why);
  }

  // The PubAcks of publishes outstanding when the connection dropped went with it (a
  // reconnect gets a new one), so waiting for their timeouts would only stall the window
  // after the outage: they go back to the queue now, to be published again (with the same
  // Nats-Msg-Id: the stream drops the copy of any that did arrive). Their late timeouts find
  // no entry and change nothing.
  void abandon_inflight() {
    std::vector<Inflight> lost;
    {
      std::lock_guard lock(mu_);
      for (auto& [msg, e] : inflight_) lost.push_back(std::move(e));
      inflight_.clear();
      failures_ = std::max<uint32_t>(failures_, 1);  // probe with one message after the reconnect
    }
    for (const auto& e : lost) (void)q_.nack(e.receipt);
    retries_ += lost.size();
    cv_.notify_all();
  }

  // Renews the leases of messages in flight for long (say, held back while disconnected).
  void renew_leases() {
    std::vector<std::string> due;
    auto now = Clock::now();
    {
      std::lock_guard lock(mu_);
      for (auto& [msg, e] : inflight_) {
        if (e.lease_end - now < lease_ / 2) {
          due.push_back(e.receipt);
          e.lease_end = now + lease_;
        }
      }
    }
    for (const auto& r : due) (void)q_.extend(r, lease_);  // fails only if acked or nacked since
  }

  // The status file viewers read (cli/bridge_status.h), about once a second: the lag is
  // what drained() waits for, every message not yet forwarded (ready, delayed: a publish
  // retried after its backoff, leased: a publish awaiting its PubAck).
  void report() {
    if (!status_.due()) return;
    BridgeStatus b;
    b.kind = "forward";
    b.peer = url_ + " subject " + args_.subject + (stream_.empty() ? "" : " (stream " + stream_ + ")");
    b.moved = forwarded_.load();
    b.last_id = last_id_.load();
    b.last_at = last_at_.load();
    if (auto st = q_.stats(); st.ok()) {
      b.lag = static_cast<int64_t>(st->ready + st->delayed + st->in_flight);
      b.lag_s = st->oldest_ready_age_s;
    }
    status_.write(std::move(b));
  }

  // Nothing left to forward: no message ready, delayed or leased (by anyone).
  bool drained() {
    auto st = q_.stats();
    return st.ok() && st->ready == 0 && st->delayed == 0 && st->in_flight == 0;
  }

  // Stops: waits (bounded) for outstanding PubAcks, then returns the unconfirmed messages.
  void stop() {
    std::vector<Inflight> left;
    {
      std::unique_lock lock(mu_);
      if (!inflight_.empty()) {
        std::fprintf(stderr, "spool forward: stopping; waiting up to %llds for %zu PubAck(s)\n",
                     static_cast<long long>((ack_timeout_.count() + 999) / 1000), inflight_.size());
      }
      auto deadline = Clock::now() + ack_timeout_ + Millis(500);
      while (!inflight_.empty() && !g_force && Clock::now() < deadline) cv_.wait_for(lock, Millis(100));
      closing_ = true;
      for (auto& [msg, e] : inflight_) left.push_back(std::move(e));
      inflight_.clear();
    }
    // Ready at once for the next forwarder; if one of these did reach the stream, its resend
    // is dropped there as a duplicate.
    for (const auto& e : left) (void)q_.nack(e.receipt);
    if (!left.empty()) {
      std::fprintf(stderr, "spool forward: returned %s to the queue\n",
                   count_of(left.size(), "unconfirmed message").c_str());
    }
  }

  int summary(int rc) {
    std::fprintf(stderr, "spool forward: forwarded %s (%" PRIu64 " already in the stream), %s\n",
                 count_of(forwarded_.load(), "message").c_str(), duplicates_.load(),
                 count_of(retries_.load(), "publish retry", "publish retries").c_str());
    return rc;
  }

  void warn(const std::string& text, const std::string& kind = "") { warnings_.warn(text, kind); }
  std::string nats_text(natsStatus s) const { return warnings_.nats_text(s); }

  Queue& q_;
  const ForwardArgs& args_;
  const Millis give_up_;  // --give-up: with --once, how long NATS may stay out of reach
  const Credentials creds_;
  Warnings warnings_;
  const std::string url_;  // args_.nats.url as shown: redact_url()
  const std::string identity_;
  const Millis ack_timeout_;
  const Millis lease_;
  natsConnection* nc_ = nullptr;
  jsCtx* js_ = nullptr;
  std::string stream_;
  std::atomic<bool> connected_{false};
  std::atomic<bool> closing_{false};

  std::mutex mu_;  // guards what follows
  std::condition_variable cv_;
  // Keyed by the library's message: the PubAck callback hands it back.
  std::unordered_map<natsMsg*, Inflight> inflight_;
  uint32_t failures_ = 0;  // publishes failed in a row (capped)
  std::optional<Clock::time_point> lost_since_;  // forward() only: when the connection was lost
  Clock::time_point pause_until_;

  std::atomic<uint64_t> forwarded_{0}, duplicates_{0}, retries_{0};
  std::atomic<uint64_t> last_id_{0};  // the last message acked after its PubAck
  std::atomic<double> last_at_{0};    // when (Unix time)
  BridgeStatusFile status_;           // forward() only; removed when this ends
};

}  // namespace

int run_forward(Queue& q, const ForwardArgs& args) {
  Credentials creds;
  if (int rc = load_nats_credentials(args.nats, "spool forward", &creds); rc != 0) return rc;
  std::string identity = queue_identity(q.dir());
  if (identity.empty()) {
    std::fprintf(stderr, "spool forward: cannot read the queue's uid from %s/spool.conf\n", q.dir().c_str());
    return 1;
  }
  on_stop_signals(on_stop);
  Forwarder f(q, args, std::move(creds), identity, *parse_duration(args.ack_timeout));
  return f.run();
}

#endif  // SPOOL_HAVE_NATS

}  // namespace spool::cli
