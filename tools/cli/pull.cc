#include "cli/pull.h"

#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "cli/bridge_status.h"
#include "cli/output.h"
#include "cli/units.h"
#include "sys/crashpoint.h"

namespace spool::cli {
namespace {

// A stream or consumer name: what JetStream accepts (no white space, '.', '*', '>', path
// separators).
std::string check_js_name(const std::string& name) {
  if (name.empty()) return "empty name";
  if (name.find_first_of(" \t\r\n.*>/\\") != std::string::npos) {
    return "'" + name + "' holds a character JetStream does not allow in a name (white space . * > / \\)";
  }
  return "";
}

// A subject filter: dot-separated tokens, '*' a whole token, '>' only the last one.
std::string check_filter(const std::string& subject) { return check_subject_text(subject, true); }

}  // namespace

CLI::App* add_pull_command(CLI::App& app, std::string& dir, PullArgs& a) {
  auto* c = app.add_subcommand("pull", "Pull messages from a NATS JetStream consumer into the queue; each is acked "
                                       "there once it is on disk here");
  c->add_option("DIR", dir, "Queue directory")->required();
  add_nats_options(c, a.nats);
  c->add_option("--stream", a.stream, "Stream to consume (must exist)")
      ->required()
      ->check(CLI::Validator(check_js_name, "NAME"));
  c->add_option("--consumer", a.consumer,
                "Durable pull consumer; created if missing (explicit acks, no delivery limit)")
      ->required()
      ->check(CLI::Validator(check_js_name, "NAME"));
  c->add_option("--filter", a.filter, "Subject filter of the consumer (wildcards allowed); an existing consumer "
                                      "must have this filter")
      ->check(CLI::Validator(check_filter, "SUBJECT"));
  c->add_option("--ack-wait", a.ack_wait, "AckWait of a consumer pull creates (default 30s); at most half the "
                                          "queue's dedup window")
      ->check(CLI::Validator(check_positive_duration, "DURATION"));
  c->add_option("-j", a.batch, "Messages fetched, queued, synced and acked at once (default 256)")
      ->check(CLI::Range(size_t{1}, size_t{4096}));
  c->add_flag("--once", a.once, "Take what the stream holds now and exit: 0 once the consumer has nothing pending, "
                                "75 at once when the queue is full (the rest stays in the stream), 1 when messages "
                                "the queue can never take were left there");
  c->footer(
      "Exactly once into the queue: a batch is sent with a dedup id per message, js:STREAM:CREATED:SEQ\n"
      "(the stream's creation time and the message's stream sequence), synced to disk, and only\n"
      "then acked to JetStream. A redelivery after a crash is dropped by the queue's dedup window,\n"
      "which must be at least twice the consumer's AckWait (checked at start).\n"
      "Headers become attributes; nats.stream, nats.seq, nats.subject and Nats-Msg-Id first, then\n"
      "the others by name while they fit (docs/beyond-one-host.md says which do not).\n"
      "A full queue (--max-ready/--max-bytes): fetching stops; the fetched messages wait (their\n"
      "AckWait renewed), the rest stays in the stream.\n"
      "Reconnects for ever; a consumer deleted meanwhile is created again as it was, a stream\n"
      "deleted is waited for. SIGTERM/SIGINT: finish the batch in hand (one waiting for room goes\n"
      "back to the stream), exit 0. Credentials and TLS as for spool forward.\n"
      "Example: spool pull /var/spool/work --nats nats://hub:4222 --stream JOBS --consumer edge-7");
  return c;
}

#if !SPOOL_HAVE_NATS

int run_pull(Queue&, const PullArgs&) {
  return nats_not_built("spool pull");
}

#else

namespace {

std::atomic<bool> g_stop{false};
void on_stop(int) { g_stop = true; }

constexpr int64_t kNsPerMs = 1000 * 1000;

// Attribute limits of the queue (include/spool/queue.h, Attributes).
constexpr size_t kMaxPairs = 16, kMaxKey = 64, kMaxValue = 1024, kMaxTotal = 4096;
// Kept for the marker of dropped headers: "nats.headers-dropped" and a count.
constexpr size_t kDroppedKeyBytes = 20 + 5;

bool valid_key(std::string_view k) {
  if (k.empty() || k.size() > kMaxKey) return false;
  return std::all_of(k.begin(), k.end(), [](char ch) {
    return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' ||
           ch == '_' || ch == '-';
  });
}

// A message's attributes from its stream position and headers (docs/beyond-one-host.md,
// "Headers and attributes"): nats.stream, nats.seq, nats.subject and Nats-Msg-Id first, then
// the other headers in name order while they fit; `*dropped` counts the headers left out.
Attributes to_attributes(natsMsg* m, const std::string& stream, uint64_t seq, size_t* dropped) {
  Attributes a;
  size_t total = 0;
  *dropped = 0;
  auto put = [&](const std::string& k, const std::string& v, size_t reserve) {
    if (!valid_key(k) || v.size() > kMaxValue || a.size() + (reserve > 0 ? 1 : 0) >= kMaxPairs ||
        total + k.size() + v.size() + reserve > kMaxTotal || a.count(k) != 0) {
      return false;
    }
    a.emplace(k, v);
    total += k.size() + v.size();
    return true;
  };
  put("nats.stream", stream, 0);
  put("nats.seq", std::to_string(seq), 0);
  const char* subject = natsMsg_GetSubject(m);
  if (subject != nullptr && !put("nats.subject", subject, 0)) ++*dropped;
  const char** keys = nullptr;
  int n = 0;
  if (natsMsgHeader_Keys(m, &keys, &n) != NATS_OK) return a;
  std::vector<std::string> names(keys, keys + n);
  std::free(static_cast<void*>(keys));
  std::sort(names.begin(), names.end());
  // Nats-Msg-Id first: it names the message to its publisher.
  auto id = std::find(names.begin(), names.end(), "Nats-Msg-Id");
  if (id != names.end()) std::rotate(names.begin(), id, id + 1);
  for (const auto& k : names) {
    const char** values = nullptr;
    int nv = 0;
    std::string v;
    if (natsMsgHeader_Values(m, k.c_str(), &values, &nv) == NATS_OK) {
      for (int i = 0; i < nv; ++i) v += (i > 0 ? ", " : "") + std::string(values[i]);
      std::free(static_cast<void*>(values));
    }
    // An attribute spool forward sent base64 (its value holds a control byte): KEY again.
    if (k.size() > kBase64Header.size() && k.compare(0, kBase64Header.size(), kBase64Header) == 0) {
      if (auto raw = unbase64(v)) {
        if (!put(k.substr(kBase64Header.size()), *raw, kDroppedKeyBytes)) ++*dropped;
        continue;
      }
    }
    // Room for the marker is kept while any header is left to place.
    if (!put(k, v, kDroppedKeyBytes)) ++*dropped;
  }
  if (*dropped > 0) put("nats.headers-dropped", std::to_string(*dropped), 0);
  return a;
}

class Puller {
 public:
  Puller(Queue& q, const PullArgs& a, Credentials creds)
      : q_(q), args_(a), creds_(std::move(creds)), warnings_("spool pull", creds_.secrets),
        url_(redact_url(a.nats.url)), status_(q.dir()) {}

  ~Puller() {
    closing_ = true;
    natsSubscription_Destroy(sub_);
    jsCtx_Destroy(js_);
    natsConnection_Destroy(nc_);
    nats_CloseAndWait(2000);
  }

  int run() {
    NatsCallbacks cb{on_disconnected, on_reconnected, on_async_error, this};
    int rc = connect_nats(args_.nats, creds_, warnings_, "spool pull " + q_.dir(), cb,
                          "(the queue stays usable meanwhile)", g_stop, &nc_);
    if (rc == 0) return summary(0);
    if (rc > 0) return rc;
    for (bool first = true;; first = false) {
      for (Millis pause(250);; pause = std::min(pause * 2, Millis(5000))) {
        Setup st = prepare(first);
        if (st == Setup::kOk) break;
        if (st == Setup::kFatal) return first ? 1 : summary(1);  // at the start: the one error line
        if (!sleep_unless(g_stop, pause)) return summary(0);
      }
      if (first) {
        std::fprintf(stderr, "spool pull: pulling stream %s (consumer %s) at %s into %s\n", args_.stream.c_str(),
                     args_.consumer.c_str(), url_.c_str(), q_.dir().c_str());
      }
      rc = pull();
      if (rc != kLost) break;
      // The consumer (or its stream) was deleted under us: set up again, as at the start.
      natsSubscription_Destroy(sub_);
      sub_ = nullptr;
    }
    // Acks are sent without waiting for the server; they reach it before the exit.
    natsConnection_FlushTimeout(nc_, 2000);
    if (rc == 0 && args_.once && !refused_seqs_.empty()) {
      std::fprintf(stderr, "spool pull: --once: %s the queue can never take %s left in the stream "
                           "(warnings above); raise the queue's limits, or take them out with NATS tools\n",
                   count_of(refused_seqs_.size(), "message").c_str(), refused_seqs_.size() == 1 ? "is" : "are");
      rc = 1;
    }
    return summary(rc);
  }

  static void on_disconnected(natsConnection*, void* self) {
    auto* p = static_cast<Puller*>(self);
    if (!p->closing_) p->warnings_.warn("lost the connection to NATS; reconnecting");
  }
  static void on_reconnected(natsConnection*, void* self) {
    auto* p = static_cast<Puller*>(self);
    if (!p->closing_) p->warnings_.warn("reconnected to NATS");
  }
  static void on_async_error(natsConnection*, natsSubscription*, natsStatus err, void* self) {
    static_cast<Puller*>(self)->warnings_.warn(std::string("NATS: ") + natsStatus_GetText(err));
  }

 private:
  using Setup = NatsSetup;

  // One fetched message on its way into the queue.
  struct Item {
    natsMsg* msg = nullptr;
    uint64_t seq = 0;
    std::string dedup_id;
    Attributes attributes;
  };

  Setup classify(natsStatus s, const std::string& what) { return classify_setup_failure(warnings_, s, what, url_); }

  // Where a consumer created again starts: as the deleted one was configured to (nothing of
  // it was acked yet), at the stream's first message, or at stream sequence `seq`.
  struct StartAt {
    enum Kind { kAsBefore, kFirst, kSeq } kind = kAsBefore;
    uint64_t seq = 0;
  };

  // The configuration of the consumer pulled from, kept to create it again as it was when it
  // is deleted under a running pull. Where it starts is chosen by the caller (StartAt).
  struct ConsumerShape {
    bool known = false;
    std::string description, filter, sample;
    int64_t ack_wait = 0, max_deliver = 0, max_waiting = 0, max_ack_pending = 0, max_request_batch = 0,
            max_request_expires = 0, max_request_max_bytes = 0, replicas = 0;
    uint64_t rate_limit = 0;
    bool headers_only = false, memory_storage = false;
    jsReplayPolicy replay = js_ReplayInstant;
    jsDeliverPolicy deliver = js_DeliverAll;
    uint64_t opt_start_seq = 0;
    int64_t opt_start_time = 0;
    std::vector<int64_t> backoff;

    void keep(const jsConsumerConfig& c) {
      known = true;
      auto str = [](const char* p) { return std::string(p != nullptr ? p : ""); };
      description = str(c.Description);
      filter = str(c.FilterSubject);
      sample = str(c.SampleFrequency);
      ack_wait = c.AckWait;
      max_deliver = c.MaxDeliver;
      max_waiting = c.MaxWaiting;
      max_ack_pending = c.MaxAckPending;
      max_request_batch = c.MaxRequestBatch;
      max_request_expires = c.MaxRequestExpires;
      max_request_max_bytes = c.MaxRequestMaxBytes;
      replicas = c.Replicas;
      rate_limit = c.RateLimit;
      headers_only = c.HeadersOnly;
      memory_storage = c.MemoryStorage;
      replay = c.ReplayPolicy;
      deliver = c.DeliverPolicy;
      opt_start_seq = c.OptStartSeq;
      opt_start_time = c.OptStartTime;
      backoff.assign(c.BackOff, c.BackOff + (c.BackOff != nullptr ? c.BackOffLen : 0));
    }

    // `*c` as kept, durable `name` (the strings point into this and `name`), starting `at`.
    void fill(jsConsumerConfig* c, const std::string& name, StartAt at) const {
      jsConsumerConfig_Init(c);
      c->Durable = name.c_str();
      if (!description.empty()) c->Description = description.c_str();
      if (!filter.empty()) c->FilterSubject = filter.c_str();
      if (!sample.empty()) c->SampleFrequency = sample.c_str();
      switch (at.kind) {
        case StartAt::kAsBefore:
          c->DeliverPolicy = deliver;
          c->OptStartSeq = opt_start_seq;
          c->OptStartTime = opt_start_time;
          break;
        case StartAt::kFirst: c->DeliverPolicy = js_DeliverAll; break;
        case StartAt::kSeq:
          c->DeliverPolicy = js_DeliverByStartSequence;
          c->OptStartSeq = at.seq;
          break;
      }
      c->AckPolicy = js_AckExplicit;
      c->AckWait = ack_wait;
      c->MaxDeliver = max_deliver;
      c->MaxWaiting = max_waiting;
      c->MaxAckPending = max_ack_pending;
      c->MaxRequestBatch = max_request_batch;
      c->MaxRequestExpires = max_request_expires;
      c->MaxRequestMaxBytes = max_request_max_bytes;
      c->Replicas = replicas;
      c->RateLimit = rate_limit;
      c->HeadersOnly = headers_only;
      c->MemoryStorage = memory_storage;
      c->ReplayPolicy = replay;
      c->BackOff = backoff.empty() ? nullptr : const_cast<int64_t*>(backoff.data());
      c->BackOffLen = static_cast<int>(backoff.size());
    }
  };


  // Where the consumer, deleted under a running pull, is created again from. On a work-queue
  // stream (which holds only what no consumer acked) and on a stream created again: the
  // first message. Otherwise the one after its ack floor when last looked up (at most 5 s
  // old): what it delivered unacked or had naked comes again, and what was queued already
  // is recognised by its dedup id. (After the last message this process acked skipped the
  // lower ones it had naked or that another puller held.) Nothing acked yet: where it was
  // configured to start (DeliverAll there would flood a DeliverNew consumer with history).
  StartAt restart_at(bool work_queue) const {
    if (work_queue || stream_created_again_) return {StartAt::kFirst, 0};
    if (ack_floor_ > 0 || max_acked_seq_ > 0) return {StartAt::kSeq, ack_floor_ + 1};
    return {StartAt::kAsBefore, 0};
  }

  // The stream (its creation time goes into the dedup ids), the consumer (created if
  // missing, checked if not) and the pull subscription bound to it. `first`: at the start;
  // later, after the consumer or the stream was deleted under a running pull, a missing
  // stream is waited for (not with --once) and a missing consumer is created again with the
  // configuration it had.
  Setup prepare(bool first) {
    if (js_ == nullptr) {
      if (natsStatus s = natsConnection_JetStream(&js_, nc_, nullptr); s != NATS_OK) return classify(s, "JetStream");
    }
    const std::string& stream = args_.stream;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    jsStreamInfo* si = nullptr;
    natsStatus s = js_GetStreamInfo(&si, js_, stream.c_str(), nullptr, &jerr);
    if (s == NATS_NOT_FOUND && (first || args_.once)) {
      std::fprintf(stderr, "spool pull: no stream %s at %s (spool pull consumes a stream that exists%s)\n",
                   stream.c_str(), url_.c_str(), first ? "" : "; it was deleted while pulling");
      return Setup::kFatal;
    }
    if (s == NATS_NOT_FOUND) {
      warnings_.warn("stream " + stream + " is gone (deleted?); waiting for it to be created again", "no stream");
      return Setup::kRetry;
    }
    if (s != NATS_OK) return classify(s, "cannot look up stream " + stream);
    std::string prefix = "js:" + stream + ":" + std::to_string(si->Created) + ":";
    const bool work_queue = si->Config != nullptr && si->Config->Retention == js_WorkQueuePolicy;
    jsStreamInfo_Destroy(si);
    if (prefix.size() + 20 > 128) {
      std::fprintf(stderr, "spool pull: stream name %s is too long for spool's dedup ids (at most %zu bytes)\n",
                   stream.c_str(), 128 - (prefix.size() - stream.size()) - 20);
      return Setup::kFatal;
    }
    if (!dedup_prefix_.empty() && prefix != dedup_prefix_) {
      // Created again: its sequences start again at 1, and are other messages than the old ones.
      std::fprintf(stderr, "spool pull: stream %s was created again; its messages get new dedup ids (%s...)\n",
                   stream.c_str(), prefix.c_str());
      recent_.clear();
      recent_order_.clear();
      refused_seqs_.clear();
      max_acked_seq_ = 0;
      ack_floor_ = 0;
      stream_created_again_ = true;
    }
    dedup_prefix_ = std::move(prefix);
    jsConsumerInfo* ci = nullptr;
    s = js_GetConsumerInfo(&ci, js_, stream.c_str(), args_.consumer.c_str(), nullptr, &jerr);
    if (s != NATS_OK && jerr == JSStreamNotFoundErr && !first && !args_.once) {
      return Setup::kRetry;  // the stream deleted (again) just now: looked up again
    }
    if (s == NATS_NOT_FOUND) {
      jsConsumerConfig cc;
      if (shape_.known) {  // the configuration the deleted one had
        shape_.fill(&cc, args_.consumer, restart_at(work_queue));
      } else {
        jsConsumerConfig_Init(&cc);
        cc.Durable = args_.consumer.c_str();
        cc.AckPolicy = js_AckExplicit;
        cc.AckWait = parse_duration(args_.ack_wait)->count() * kNsPerMs;
        cc.MaxDeliver = -1;  // the local queue counts deliveries (max_receives); a nak while full is no failure
        cc.MaxAckPending = static_cast<int64_t>(std::max<size_t>(1000, 4 * args_.batch));
        if (!args_.filter.empty()) cc.FilterSubject = args_.filter.c_str();
      }
      s = js_AddConsumer(&ci, js_, stream.c_str(), &cc, nullptr, &jerr);
      if (s == NATS_OK) {
        stream_created_again_ = false;
        const std::string ack_wait = std::to_string(cc.AckWait / kNsPerMs) + " ms";
        const char* filter = cc.FilterSubject != nullptr ? cc.FilterSubject : "";
        if (first) {
          std::fprintf(stderr, "spool pull: created consumer %s on stream %s (AckWait %s%s%s)\n",
                       args_.consumer.c_str(), stream.c_str(), args_.ack_wait.c_str(), *filter ? ", filter " : "",
                       filter);
        } else {
          std::fprintf(stderr, "spool pull: created consumer %s on stream %s again, as it was (AckWait %s%s%s); "
                               "what it had delivered unacked comes again\n",
                       args_.consumer.c_str(), stream.c_str(), ack_wait.c_str(), *filter ? ", filter " : "", filter);
        }
      } else if (jerr == JSConsumerNameExistErr || jerr == JSConsumerExistingActiveErr) {
        return Setup::kRetry;  // another puller created it just now: look it up again
      } else if (gone(s, jerr) && !first && !args_.once) {
        return Setup::kRetry;  // deleted again just now
      } else {
        return classify(s, "cannot create consumer " + args_.consumer + " on stream " + stream);
      }
    } else if (s != NATS_OK) {
      return classify(s, "cannot look up consumer " + args_.consumer);
    }
    Setup st = check_consumer(ci);
    if (st == Setup::kOk) {
      shape_.keep(*ci->Config);
      ack_floor_ = ci->AckFloor.Stream;
      last_info_ = SteadyClock::now();
    }
    jsConsumerInfo_Destroy(ci);
    if (st != Setup::kOk) return st;
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = stream.c_str();
    so.Consumer = args_.consumer.c_str();  // bind to it, as it is
    s = js_PullSubscribe(&sub_, js_, filter_.c_str(), args_.consumer.c_str(), nullptr, &so, &jerr);
    // Deleted again between the look-up above and this bind (an operator deleting it twice,
    // a script that retries `nats consumer rm`): set up again, as after any deletion.
    if (s != NATS_OK && !first && !args_.once && gone(s, jerr)) return Setup::kRetry;
    if (s != NATS_OK) return classify(s, "cannot subscribe to consumer " + args_.consumer);
    return Setup::kOk;
  }

  // The consumer must be a pull consumer with explicit acks, of the filter asked for, and its
  // AckWait short enough for the queue's dedup window to cover a redelivery.
  Setup check_consumer(const jsConsumerInfo* ci) {
    const jsConsumerConfig* c = ci->Config;
    const std::string name = args_.consumer;
    if (c->DeliverSubject != nullptr && *c->DeliverSubject != '\0') {
      std::fprintf(stderr, "spool pull: consumer %s is a push consumer (it has a deliver subject); give the name "
                           "of a pull consumer, or a new name\n", name.c_str());
      return Setup::kFatal;
    }
    if (c->AckPolicy != js_AckExplicit) {
      std::fprintf(stderr, "spool pull: consumer %s does not use explicit acks; spool pull acks each message once "
                           "it is on disk, and needs AckPolicy explicit\n", name.c_str());
      return Setup::kFatal;
    }
    filter_ = c->FilterSubject != nullptr ? c->FilterSubject : "";
    if (!args_.filter.empty() && filter_ != args_.filter) {
      std::fprintf(stderr, "spool pull: consumer %s filters %s, not %s (drop --filter, or use another consumer "
                           "name)\n", name.c_str(), filter_.empty() ? "nothing" : filter_.c_str(), args_.filter.c_str());
      return Setup::kFatal;
    }
    ack_wait_ = Millis(c->AckWait / kNsPerMs);
    if (ack_wait_.count() <= 0) ack_wait_ = Millis(30000);  // the server's default
    const Millis window = q_.options().dedup_window;
    if (window < 2 * ack_wait_) {
      std::fprintf(stderr, "spool pull: the queue's dedup window (%lld ms) is shorter than twice consumer %s's "
                           "AckWait (%lld ms): a message redelivered after a crash could be queued twice; use a "
                           "consumer with AckWait at most %lld ms (--ack-wait), or a queue made with "
                           "--dedup-window of at least %lld ms\n",
                   static_cast<long long>(window.count()), name.c_str(), static_cast<long long>(ack_wait_.count()),
                   static_cast<long long>(window.count() / 2), static_cast<long long>(2 * ack_wait_.count()));
      return Setup::kFatal;
    }
    return Setup::kOk;
  }

  // Batches that can fit the queue's max_ready (half of it, as `spool send` does).
  size_t batch_size() const {
    const uint64_t max_ready = q_.options().max_ready;
    if (max_ready == 0) return args_.batch;
    return std::min<size_t>(args_.batch, std::max<uint64_t>(1, max_ready / 2));
  }

  // The main loop: fetch a batch, queue it, sync, ack. Returns the exit code.
  int pull() {
    const size_t batch = batch_size();
    // When the consumer was last known to exist; time_point::min(): just now it delivered.
    auto last_seen = SteadyClock::now();
    while (!g_stop) {
      natsMsgList list{};
      jsErrCode jerr = static_cast<jsErrCode>(0);
      natsStatus s = natsSubscription_Fetch(&list, sub_, static_cast<int>(batch), 1000, &jerr);
      if (list.Count == 0 && s == NATS_TIMEOUT) pending_ = 0;  // nothing came within the fetch's second
      report();
      if (list.Count > 0) {
        last_seen = SteadyClock::time_point::min();
        std::vector<natsMsg*> msgs(list.Msgs, list.Msgs + list.Count);
        size_t fresh = 0;
        int rc = deliver(msgs, &fresh);
        natsMsgList_Destroy(&list);
        if (rc >= 0) return rc;
        // The consumer's ack floor, where it is created again from if it is deleted, is
        // looked up every 5 s while messages flow too.
        if (!args_.once && SteadyClock::now() - last_info_ >= Millis(5000) && pending() == Pending::kGone) return kLost;
        // A short batch may have been the last: --once looks now, not after an empty fetch;
        // also after a batch of messages refused before only (back after their nak delay).
        if (args_.once && (msgs.size() < batch || fresh == 0)) {
          if (Pending p = pending(); p != Pending::kSome) return p == Pending::kGone ? kLost : 0;
        }
        continue;
      }
      natsMsgList_Destroy(&list);
      if (s == NATS_TIMEOUT || s == NATS_OK) {
        if (args_.once) {
          if (Pending p = pending(); p != Pending::kSome) return p == Pending::kGone ? kLost : 0;
        } else if (last_seen == SteadyClock::time_point::min() || SteadyClock::now() - last_seen >= Millis(5000)) {
          // A look that the consumer is still there, at the first empty fetch after messages
          // and every 5 s while idle: a fetch from a consumer deleted while a pull request of
          // ours waits fails ("Consumer Deleted", below), but one deleted between requests
          // only times out.
          if (Pending p = pending(); p == Pending::kGone) return kLost;
          last_seen = SteadyClock::now();
        }
        continue;
      }
      // Deleted (the consumer or its stream: "Consumer Deleted"), or the link is down: the
      // consumer's info says which.
      if (natsConnection_Status(nc_) == NATS_CONN_STATUS_CONNECTED && pending() == Pending::kGone) return kLost;
      warnings_.warn("fetch failed: " + warnings_.nats_text(s) + "; retrying", "fetch");
      if (!sleep_unless(g_stop, Millis(250))) break;
    }
    return 0;
  }

  // The status file viewers read (cli/bridge_status.h), about once a second: the lag is
  // the consumer's pending count as the last message fetched told it.
  void report() {
    if (!status_.due()) return;
    BridgeStatus b;
    b.kind = "pull";
    b.peer = url_ + " stream " + args_.stream + " consumer " + args_.consumer;
    b.moved = pulled_;
    b.last_id = last_seq_;
    b.last_at = last_at_;
    b.lag = pending_;
    b.lag_s = last_age_s_;
    status_.write(std::move(b));
  }

  // What the consumer holds for us: nothing (nothing left to deliver, nothing delivered
  // unacked but the messages refused here, which wait out their nak delay), some, or it is
  // gone (it, or its stream, was deleted: said on stderr). kSome also when the server cannot
  // be asked.
  enum class Pending { kNone, kSome, kGone };

  // Whether a JetStream call failed because the consumer or its stream does not exist. The
  // library says NATS_NOT_FOUND for a missing consumer (10014), NATS_ERR for a missing stream.
  static bool gone(natsStatus s, jsErrCode jerr) {
    return s == NATS_NOT_FOUND || (s != NATS_OK && (jerr == JSConsumerNotFoundErr || jerr == JSStreamNotFoundErr));
  }
  Pending pending() {
    natsConnection_FlushTimeout(nc_, 2000);  // our acks first, so that they are not counted
    jsConsumerInfo* ci = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    natsStatus s = js_GetConsumerInfo(&ci, js_, args_.stream.c_str(), args_.consumer.c_str(), nullptr, &jerr);
    if (gone(s, jerr)) {
      const std::string what = jerr == JSStreamNotFoundErr
                                   ? "stream " + args_.stream + " is gone (deleted?), and consumer " + args_.consumer +
                                         " with it; setting them up again"
                                   : "consumer " + args_.consumer + " is gone from stream " + args_.stream +
                                         " (deleted?); creating it again";
      std::fprintf(stderr, "spool pull: %s\n", what.c_str());
      return Pending::kGone;
    }
    if (s != NATS_OK) return Pending::kSome;
    ack_floor_ = ci->AckFloor.Stream;
    last_info_ = SteadyClock::now();
    bool none = ci->NumPending == 0 && ci->NumAckPending <= static_cast<int64_t>(refused_seqs_.size());
    jsConsumerInfo_Destroy(ci);
    return none ? Pending::kNone : Pending::kSome;
  }

  // Queues, syncs and acks `msgs` (the caller frees them). -1 to go on, else the exit code.
  // `*fresh`: how many were not refused before (with --once, one refused before is naked again,
  // untried).
  int deliver(const std::vector<natsMsg*>& msgs, size_t* fresh) {
    *fresh = 0;
    // Redeliveries are rare (a crash, an outage, an ack lost): each batch that holds any says
    // so when it happens, since a puller killed later prints no summary.
    const unsigned long known = duplicates_;
    struct SayKnown {
      const unsigned long& now;
      unsigned long before;
      ~SayKnown() {
        if (now > before) std::fprintf(stderr, "spool pull: acked %lu redelivered message(s) already in the queue\n", now - before);
      }
    } say{duplicates_, known};
    std::vector<Item> items;
    items.reserve(msgs.size());
    for (natsMsg* m : msgs) {
      jsMsgMetaData* meta = nullptr;
      if (natsMsg_GetMetaData(&meta, m) != NATS_OK) {
        warnings_.warn("a fetched message has no JetStream metadata; left to be redelivered", "metadata");
        continue;
      }
      Item it{m, meta->Sequence.Stream, "", {}};
      pending_ = static_cast<int64_t>(meta->NumPending);  // the consumer's, after this message
      published_ns_ = meta->Timestamp;
      jsMsgMetaData_Destroy(meta);
      if (refused_seqs_.count(it.seq) != 0) {  // --once: refused before, back after its delay: not tried again
        natsMsg_NakWithDelay(m, refused_delay(), nullptr);
        continue;
      }
      ++*fresh;
      // Already queued by this process (its ack was lost, say with the connection): ack only.
      if (recent_.count(it.seq) != 0) {
        natsMsg_Ack(m, nullptr);
        ++duplicates_;
        continue;
      }
      it.dedup_id = dedup_prefix_ + std::to_string(it.seq);
      size_t dropped = 0;
      it.attributes = to_attributes(m, args_.stream, it.seq, &dropped);
      if (dropped > 0) {
        warnings_.warn("message " + std::to_string(it.seq) + " of stream " + args_.stream + ": " +
                           std::to_string(dropped) + " header(s) did not fit the queue's attributes; the message is "
                           "queued without them (attribute nats.headers-dropped)", "headers");
      }
      items.push_back(std::move(it));
    }
    return send_all(items);
  }

  // Sends `items` (synced), then acks them; waits while the queue is full. -1 to go on.
  int send_all(std::vector<Item>& items) {
    if (items.empty()) return -1;
    const QueueOptions& qo = q_.options();
    uint64_t bytes = 0;
    for (const auto& it : items) bytes += static_cast<uint64_t>(natsMsg_GetDataLength(it.msg));
    bool never_fits = (qo.max_ready != 0 && items.size() > qo.max_ready) || (qo.max_bytes != 0 && bytes > qo.max_bytes);
    if (never_fits && items.size() > 1) {  // in halves, each of which may fit
      std::vector<Item> rest(std::make_move_iterator(items.begin() + static_cast<std::ptrdiff_t>(items.size() / 2)),
                             std::make_move_iterator(items.end()));
      items.resize(items.size() / 2);
      if (int rc = send_all(items); rc >= 0) {
        for (auto& it : rest) natsMsg_Nak(it.msg, nullptr);  // not queued: for the next fetch
        returned_ += rest.size();
        return rc;
      }
      return send_all(rest);
    }
    if (never_fits) {  // one message larger than max_bytes
      refuse(items[0], "it alone is larger than the queue's max_bytes");
      return -1;
    }
    std::vector<SendItem> batch;
    batch.reserve(items.size());
    for (const auto& it : items) {
      batch.push_back(SendItem{std::string_view(natsMsg_GetData(it.msg), static_cast<size_t>(natsMsg_GetDataLength(it.msg))),
                               it.attributes, it.dedup_id});
    }
    SendOptions so;
    so.durability = Durability::kSync;  // on disk before the ack below
    so.wait_for_room = Millis(500);
    auto next_renewal = SteadyClock::now() + ack_wait_ / 3;
    bool said_full = false;
    for (;;) {
      report();  // also while it waits for room (the status would go stale)
      uint64_t next_id = 0;
      if (auto st = q_.stats(); st.ok()) next_id = st->next_id;
      auto ids = q_.send_batch(std::span<const SendItem>(batch), so);
      if (ids.ok()) {
        crashpoint("pull.after_sync");
        for (size_t i = 0; i < items.size(); ++i) {
          natsMsg_Ack(items[i].msg, nullptr);
          remember(items[i].seq);
          ++((*ids)[i] >= next_id ? pulled_ : duplicates_);
        }
        last_seq_ = items.back().seq;
        last_at_ = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
        last_age_s_ = published_ns_ > 0 ? std::max(0.0, last_at_ - static_cast<double>(published_ns_) / 1e9) : 0;
        if (said_full) warnings_.warn("the queue has room again; fetching", "room");
        return -1;
      }
      Code code = ids.status().code();
      if ((code == Code::kQueueFull || code == Code::kNoSpace) && args_.once) {
        // --once takes what fits now: no waiting for a consumer that may not come (a script
        // that runs one after the other would wait for ever). Back to the stream, at once.
        for (auto& it : items) natsMsg_Nak(it.msg, nullptr);
        returned_ += items.size();
        std::fprintf(stderr, "spool pull: --once: stopped, the queue has no room (%s); %zu fetched message(s) "
                             "returned to the stream, and what was not fetched stays there for the next run\n",
                     ids.status().message().c_str(), items.size());
        return kOnceFull;
      }
      if (code == Code::kQueueFull || code == Code::kNoSpace) {
        if (!said_full) {
          warnings_.warn("holding " + std::to_string(items.size()) + " fetched message(s) and fetching no more: " +
                             ids.status().message(), "full");
          said_full = true;
        }
        if (g_stop) {  // SIGTERM while waiting for room: back to the stream, at once
          for (auto& it : items) natsMsg_Nak(it.msg, nullptr);
          returned_ += items.size();
          return 0;
        }
        if (SteadyClock::now() >= next_renewal) {  // keep them ours in the stream meanwhile
          for (auto& it : items) natsMsg_InProgress(it.msg, nullptr);
          next_renewal = SteadyClock::now() + ack_wait_ / 3;
        }
        if (code == Code::kNoSpace) sleep_unless(g_stop, Millis(500));
        continue;
      }
      if (items.size() > 1) {  // find the message the queue refuses: one at a time
        for (size_t i = 0; i < items.size(); ++i) {
          std::vector<Item> one;
          one.push_back(std::move(items[i]));
          if (int rc = send_all(one); rc >= 0) {
            for (size_t j = i + 1; j < items.size(); ++j) natsMsg_Nak(items[j].msg, nullptr);
            returned_ += items.size() - i - 1;
            return rc;
          }
        }
        return -1;
      }
      if (code == Code::kTooLarge || code == Code::kInvalidArgument) {
        refuse(items[0], ids.status().message());
        return -1;
      }
      std::fprintf(stderr, "spool pull: send failed: %s\n", ids.status().to_string().c_str());
      natsMsg_Nak(items[0].msg, nullptr);
      return 1;
    }
  }

  // A message the queue can never take: it stays in the stream (never dropped), retried after
  // refused_delay(). --once does not wait for it (pending()).
  void refuse(const Item& it, const std::string& why) {
    natsMsg_NakWithDelay(it.msg, refused_delay(), nullptr);
    ++refused_;
    if (args_.once) refused_seqs_.insert(it.seq);
    warnings_.warn("message " + std::to_string(it.seq) + " of stream " + args_.stream + " cannot be queued (" + why +
                       "); left in the stream, retried in " + std::to_string(refused_delay() / 1000) + " s",
                   "refused " + why);
  }

  // The nak delay of a refused message, in ms: 60 s; 5 s with --once, so that a run soon after
  // waits at most that long for it (a nak delay cannot be told from a message held by another
  // puller). Never 0: a refused message naked at once comes back before any other, and a batch
  // of them would keep the rest from being fetched.
  int64_t refused_delay() const { return args_.once ? 5000 : 60000; }

  // The stream sequences this process queued lately (bounded): a redelivery of one of them
  // (an ack lost with the connection) is acked without a send, even past the dedup window.
  void remember(uint64_t seq) {
    max_acked_seq_ = std::max(max_acked_seq_, seq);
    if (!recent_.insert(seq).second) return;
    recent_order_.push_back(seq);
    if (recent_order_.size() > kRecent) {
      recent_.erase(recent_order_.front());
      recent_order_.pop_front();
    }
  }

  int summary(int rc) {
    std::fprintf(stderr, "spool pull: pulled %s (%lu already in the queue), %lu returned to the stream, %lu refused\n",
                 count_of(pulled_, "message").c_str(), duplicates_, returned_, refused_);
    return rc;
  }

  static constexpr size_t kRecent = 65536;
  // pull(): the consumer or its stream was deleted (set up again, then pull on).
  static constexpr int kLost = -2;
  // The exit code of --once stopped by a full queue (or disk), messages left in the stream:
  // EX_TEMPFAIL, try again later.
  static constexpr int kOnceFull = 75;

  Queue& q_;
  const PullArgs& args_;
  const Credentials creds_;
  Warnings warnings_;
  const std::string url_;  // args_.nats.url as shown: redact_url()
  natsConnection* nc_ = nullptr;
  jsCtx* js_ = nullptr;
  natsSubscription* sub_ = nullptr;
  std::string dedup_prefix_;  // "js:STREAM:CREATED:"
  std::string filter_;        // the consumer's filter subject ("" for none)
  Millis ack_wait_{30000};    // the consumer's AckWait
  std::atomic<bool> closing_{false};
  std::unordered_set<uint64_t> recent_;
  std::deque<uint64_t> recent_order_;
  uint64_t max_acked_seq_ = 0;                // the highest stream sequence this process acked
  uint64_t ack_floor_ = 0;                    // the consumer's, when last looked up: all up to it are acked
  SteadyClock::time_point last_info_{};       // when the consumer's info was last looked up
  bool stream_created_again_ = false;         // the consumer is to be created on a new stream
  std::unordered_set<uint64_t> refused_seqs_;  // --once: stream sequences refused (naked with a delay)
  ConsumerShape shape_;                       // the consumer as last set up
  unsigned long pulled_ = 0, duplicates_ = 0, returned_ = 0, refused_ = 0;
  // For the status file: the consumer's pending count after the last message fetched (-1:
  // none yet), that message's publish time (ns), the last sequence queued, when, and how old.
  int64_t pending_ = -1;
  int64_t published_ns_ = 0;
  uint64_t last_seq_ = 0;
  double last_at_ = 0, last_age_s_ = 0;
  BridgeStatusFile status_;  // removed when this ends
};

}  // namespace

int run_pull(Queue& q, const PullArgs& args) {
  Credentials creds;
  if (int rc = load_nats_credentials(args.nats, "spool pull", &creds); rc != 0) return rc;
  on_stop_signals(on_stop);
  Puller p(q, args, std::move(creds));
  return p.run();
}

#endif  // SPOOL_HAVE_NATS

}  // namespace spool::cli
