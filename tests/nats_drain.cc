// Test helper for tests/forward_test.sh and bench/bench_forward: reads a JetStream stream back.
//
//   nats_drain URL STREAM count   prints the number of messages in the stream
//   nats_drain URL STREAM drain   consumes every message with a pull consumer (acking it, so
//                                 a work-queue stream ends empty) and prints one line each:
//                                 SPOOL_ID RECEIVE_COUNT ENQUEUED_AT NATS_MSG_ID PAYLOAD
//
// Exit code 0 on success, 1 on any error (printed on stderr).
#include <nats/nats.h>

#include <cstdio>
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
  if (argc != 4 || (std::strcmp(argv[3], "count") != 0 && std::strcmp(argv[3], "drain") != 0)) {
    std::fprintf(stderr, "usage: nats_drain URL STREAM count|drain\n");
    return 2;
  }
  natsConnection* nc = nullptr;
  natsStatus s = natsConnection_ConnectTo(&nc, argv[1]);
  if (s != NATS_OK) return die("connect", s);
  int rc = run(nc, argv[2], std::strcmp(argv[3], "drain") == 0);
  natsConnection_Destroy(nc);
  nats_CloseAndWait(2000);
  return rc;
}
