// Test helper for tests/forward_test.sh and bench/bench_forward: reads a JetStream stream back.
//
//   nats_drain URL STREAM count   prints the number of messages in the stream
//   nats_drain URL STREAM drain   consumes every message with a pull consumer (acking it, so
//                                 a work-queue stream ends empty) and prints one line each:
//                                 SPOOL_ID RECEIVE_COUNT ENQUEUED_AT NATS_MSG_ID PAYLOAD
//   nats_drain URL STREAM publish SUBJECT FROM TO [KEY=VALUE...]
//                                 creates the stream if missing (work queue, file storage,
//                                 subject SUBJECT), then publishes FROM..TO: payload the
//                                 number, header Nats-Msg-Id m-NUMBER, and the KEY=VALUEs
//   nats_drain URL STREAM consumer NAME
//                                 prints the consumer's NumPending and NumAckPending
//   nats_drain URL STREAM delete-consumer NAME
//                                 deletes the consumer (as `nats consumer rm` does)
//   nats_drain URL STREAM delete-stream
//                                 deletes the stream, its messages and consumers with it
//
// Exit code 0 on success, 1 on any error (printed on stderr).
#include <nats/nats.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

int die(const char* what, natsStatus s) {
  const char* text = nats_GetLastError(nullptr);
  std::fprintf(stderr, "nats_drain: %s: %s\n", what, text != nullptr && *text != '\0' ? text : natsStatus_GetText(s));
  return 1;
}

std::string header(natsMsg* m, const char* key) {
  const char* v = nullptr;
  return natsMsgHeader_Get(m, key, &v) == NATS_OK && v != nullptr ? v : "-";
}

int publish(jsCtx* js, const char* stream, int argc, char** argv) {
  const char* subject = argv[0];
  const long from = std::atol(argv[1]), to = std::atol(argv[2]);
  jsErrCode jerr = static_cast<jsErrCode>(0);
  jsStreamConfig cfg;
  jsStreamConfig_Init(&cfg);
  const char* subjects[] = {subject};
  cfg.Name = stream;
  cfg.Subjects = subjects;
  cfg.SubjectsLen = 1;
  // A work queue (what no consumer acked), or with NATS_DRAIN_RETENTION=limits a stream
  // that keeps what was acked.
  const char* retention = std::getenv("NATS_DRAIN_RETENTION");
  cfg.Retention = retention != nullptr && std::strcmp(retention, "limits") == 0 ? js_LimitsPolicy : js_WorkQueuePolicy;
  cfg.Storage = js_FileStorage;
  natsStatus s = js_AddStream(nullptr, js, &cfg, nullptr, &jerr);
  if (s != NATS_OK && jerr != JSStreamNameExistErr) return die("add stream", s);
  for (long i = from; i <= to; ++i) {
    std::string body = std::to_string(i), id = "m-" + body;
    natsMsg* m = nullptr;
    s = natsMsg_Create(&m, subject, nullptr, body.data(), static_cast<int>(body.size()));
    for (int h = 3; s == NATS_OK && h < argc; ++h) {
      std::string kv = argv[h];
      size_t eq = kv.find('=');
      s = natsMsgHeader_Add(m, kv.substr(0, eq).c_str(), eq == std::string::npos ? "" : kv.c_str() + eq + 1);
    }
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MsgId = id.c_str();
    po.MaxWait = 30000;
    // One at a time, each waiting for its ack: libnats 3.4's asynchronous publish may still
    // hold a message at exit after js_PublishAsyncComplete, which LeakSanitizer reports.
    if (s == NATS_OK) s = js_PublishMsg(nullptr, js, m, &po, nullptr);
    natsMsg_Destroy(m);
    if (s != NATS_OK) return die("publish", s);
  }
  return 0;
}

int consumer(jsCtx* js, const char* stream, const char* name) {
  jsConsumerInfo* ci = nullptr;
  natsStatus s = js_GetConsumerInfo(&ci, js, stream, name, nullptr, nullptr);
  if (s != NATS_OK) return die("consumer info", s);
  std::printf("%lu %lu\n", static_cast<unsigned long>(ci->NumPending), static_cast<unsigned long>(ci->NumAckPending));
  jsConsumerInfo_Destroy(ci);
  return 0;
}

int delete_consumer(jsCtx* js, const char* stream, const char* name) {
  natsStatus s = js_DeleteConsumer(js, stream, name, nullptr, nullptr);
  return s == NATS_OK ? 0 : die("delete consumer", s);
}

int delete_stream(jsCtx* js, const char* stream) {
  natsStatus s = js_DeleteStream(js, stream, nullptr, nullptr);
  return s == NATS_OK ? 0 : die("delete stream", s);
}

int run(natsConnection* nc, const char* stream, bool drain) {
  jsCtx* js = nullptr;
  natsStatus s = natsConnection_JetStream(&js, nc, nullptr);
  if (s != NATS_OK) return die("JetStream", s);
  jsErrCode jerr = static_cast<jsErrCode>(0);
  jsStreamInfo* si = nullptr;
  s = js_GetStreamInfo(&si, js, stream, nullptr, &jerr);
  if (s != NATS_OK) {
    jsCtx_Destroy(js);
    return die("stream info", s);
  }
  if (!drain) {
    std::printf("%lu\n", static_cast<unsigned long>(si->State.Msgs));
    jsStreamInfo_Destroy(si);
    jsCtx_Destroy(js);
    return 0;
  }
  std::string subject = si->Config->SubjectsLen > 0 ? si->Config->Subjects[0] : ">";
  const uint64_t expected = si->State.Msgs;
  jsStreamInfo_Destroy(si);

  jsSubOptions so;
  jsSubOptions_Init(&so);
  so.Stream = stream;
  so.Config.AckPolicy = js_AckExplicit;
  natsSubscription* sub = nullptr;
  s = js_PullSubscribe(&sub, js, subject.c_str(), "spool-drain", nullptr, &so, &jerr);
  if (s != NATS_OK) {
    jsCtx_Destroy(js);
    return die("pull subscribe", s);
  }
  int rc = 0;
  for (uint64_t got = 0;;) {
    natsMsgList list{};
    // Until all that the stream held are in, then one short look for any more.
    s = natsSubscription_Fetch(&list, sub, 500, got < expected ? 2000 : 200, &jerr);
    if (s == NATS_TIMEOUT && list.Count == 0) break;
    got += static_cast<uint64_t>(list.Count);
    if (s != NATS_OK && s != NATS_TIMEOUT) {
      rc = die("fetch", s);
      break;
    }
    for (int i = 0; i < list.Count; ++i) {
      natsMsg* m = list.Msgs[i];
      std::printf("%s %s %s %s %.*s\n", header(m, "Spool-Id").c_str(), header(m, "Spool-Receive-Count").c_str(),
                  header(m, "Spool-Enqueued-At").c_str(), header(m, "Nats-Msg-Id").c_str(),
                  natsMsg_GetDataLength(m), natsMsg_GetData(m));
      natsMsg_Ack(m, nullptr);
    }
    natsMsgList_Destroy(&list);
  }
  natsConnection_FlushTimeout(nc, 5000);  // the acks reach the server before the consumer goes
  (void)js_DeleteConsumer(js, stream, "spool-drain", nullptr, nullptr);
  natsSubscription_Destroy(sub);
  jsCtx_Destroy(js);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  bool pub = argc >= 7 && std::strcmp(argv[3], "publish") == 0;
  bool cons = argc == 5 && std::strcmp(argv[3], "consumer") == 0;
  bool del_cons = argc == 5 && std::strcmp(argv[3], "delete-consumer") == 0;
  bool del_stream = argc == 4 && std::strcmp(argv[3], "delete-stream") == 0;
  bool js_only = pub || cons || del_cons || del_stream;
  if (!js_only && (argc != 4 || (std::strcmp(argv[3], "count") != 0 && std::strcmp(argv[3], "drain") != 0))) {
    std::fprintf(stderr, "usage: nats_drain URL STREAM count|drain|publish SUBJECT FROM TO [KEY=VALUE...]|consumer NAME|"
                         "delete-consumer NAME|delete-stream\n");
    return 2;
  }
  natsConnection* nc = nullptr;
  natsStatus s = natsConnection_ConnectTo(&nc, argv[1]);
  if (s != NATS_OK) return die("connect", s);
  int rc = 0;
  if (js_only) {
    jsCtx* js = nullptr;
    s = natsConnection_JetStream(&js, nc, nullptr);
    rc = s != NATS_OK    ? die("JetStream", s)
         : pub           ? publish(js, argv[2], argc - 4, argv + 4)
         : cons          ? consumer(js, argv[2], argv[4])
         : del_cons      ? delete_consumer(js, argv[2], argv[4])
                         : delete_stream(js, argv[2]);
    jsCtx_Destroy(js);
  } else {
    rc = run(nc, argv[2], std::strcmp(argv[3], "drain") == 0);
  }
  natsConnection_Destroy(nc);
  nats_CloseAndWait(2000);
  return rc;
}
