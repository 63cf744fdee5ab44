// Redis Streams through hiredis: stream TAG, consumer group "g", one connection per process.
//   send        XADD TAG * p <payload>, one command, wait for the reply
//   send_batch  `batch` XADDs pipelined (redisAppendCommand x batch, then the replies)
//   receive     XREADGROUP GROUP g c<pid> COUNT 1 BLOCK <ms> STREAMS TAG >: the entry goes
//               to the group's pending list, which is the lease (another consumer takes it
//               over with XAUTOCLAIM after the lease length; nothing per message is stored)
//   ack         XACK TAG g <id> and XDEL TAG <id>, pipelined in one round trip: the entry
//               leaves the pending list and the stream (as a delete does in the others;
//               XACK alone would keep every message in memory)
// The server is started by bench/compare/run.sh on 127.0.0.1:PORT (AOF per sync, no RDB).
#include <hiredis/hiredis.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "harness.h"

namespace {

struct Reply {
  redisReply* r = nullptr;
  explicit Reply(void* p) : r(static_cast<redisReply*>(p)) {}
  ~Reply() {
    if (r != nullptr) freeReplyObject(r);
  }
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;
};

redisContext* connect_to(const cmp::Args& a) {
  redisContext* c = redisConnect(a.host.c_str(), a.port);
  if (c == nullptr || c->err) {
    cmp::fail("connect to redis at " + a.host + ":" + std::to_string(a.port) + ": " + (c ? c->errstr : "out of memory"));
  }
  return c;
}

void check_reply(redisContext* c, redisReply* r, const char* what) {
  if (r == nullptr) cmp::fail(std::string("redis ") + what + ": " + c->errstr);
  if (r->type == REDIS_REPLY_ERROR) cmp::fail(std::string("redis ") + what + ": " + r->str);
}

std::string consumer_name() {
  char b[32];
  std::snprintf(b, sizeof b, "c%d", static_cast<int>(::getpid()));
  return b;
}

class RedisClient : public cmp::Client {
 public:
  explicit RedisClient(const cmp::Args& a) : c_(connect_to(a)), key_(a.tag), consumer_(consumer_name()) {}
  ~RedisClient() override { redisFree(c_); }
  void send(std::string_view p) override {
    Reply r(redisCommand(c_, "XADD %s * p %b", key_.c_str(), p.data(), p.size()));
    check_reply(c_, r.r, "XADD");
  }
  void send_batch(std::span<const std::string_view> ps) override {
    for (auto p : ps) {
      if (redisAppendCommand(c_, "XADD %s * p %b", key_.c_str(), p.data(), p.size()) != REDIS_OK) cmp::fail("redis append");
    }
    for (size_t i = 0; i < ps.size(); ++i) {
      void* v = nullptr;
      if (redisGetReply(c_, &v) != REDIS_OK) cmp::fail(std::string("redis XADD: ") + c_->errstr);
      Reply r(v);
      check_reply(c_, r.r, "XADD");
    }
  }
  bool receive(std::string& payload, cmp::Handle& h, int wait_ms) override {
    Reply r(wait_ms > 0 ? redisCommand(c_, "XREADGROUP GROUP g %s COUNT 1 BLOCK %d STREAMS %s >", consumer_.c_str(),
                                       wait_ms, key_.c_str())
                        : redisCommand(c_, "XREADGROUP GROUP g %s COUNT 1 STREAMS %s >", consumer_.c_str(), key_.c_str()));
    check_reply(c_, r.r, "XREADGROUP");
    if (r.r->type == REDIS_REPLY_NIL) return false;
    // [[key, [[id, [field, value]]]]]
    if (r.r->type != REDIS_REPLY_ARRAY || r.r->elements < 1) cmp::fail("redis XREADGROUP: unexpected reply");
    redisReply* entries = r.r->element[0]->element[1];
    if (entries->elements == 0) return false;
    redisReply* e = entries->element[0];
    h.receipt.assign(e->element[0]->str, e->element[0]->len);
    redisReply* fv = e->element[1];
    payload.assign(fv->element[1]->str, fv->element[1]->len);
    return true;
  }
  void ack(const cmp::Handle& h) override {
    redisAppendCommand(c_, "XACK %s g %b", key_.c_str(), h.receipt.data(), h.receipt.size());
    redisAppendCommand(c_, "XDEL %s %b", key_.c_str(), h.receipt.data(), h.receipt.size());
    for (const char* what : {"XACK", "XDEL"}) {
      void* v = nullptr;
      if (redisGetReply(c_, &v) != REDIS_OK) cmp::fail(std::string("redis ") + what + ": " + c_->errstr);
      Reply r(v);
      check_reply(c_, r.r, what);
      if (r.r->integer != 1) cmp::fail(std::string("redis ") + what + " did not remove the entry");
    }
  }
  redisContext* ctx() { return c_; }

 private:
  redisContext* c_;
  std::string key_, consumer_;
};

class RedisSystem : public cmp::System {
 public:
  void prepare(const cmp::Args& a) override {
    RedisClient c(a);
    Reply d(redisCommand(c.ctx(), "DEL %s", a.tag.c_str()));
    check_reply(c.ctx(), d.r, "DEL");
    Reply g(redisCommand(c.ctx(), "XGROUP CREATE %s g $ MKSTREAM", a.tag.c_str()));
    check_reply(c.ctx(), g.r, "XGROUP CREATE");
  }
  std::unique_ptr<cmp::Client> connect(const cmp::Args& a) override { return std::make_unique<RedisClient>(a); }
  std::string check(const cmp::Args& a, uint64_t want_left) override {
    RedisClient c(a);
    Reply len(redisCommand(c.ctx(), "XLEN %s", a.tag.c_str()));
    check_reply(c.ctx(), len.r, "XLEN");
    Reply pend(redisCommand(c.ctx(), "XPENDING %s g", a.tag.c_str()));
    check_reply(c.ctx(), pend.r, "XPENDING");
    long long pending = pend.r->type == REDIS_REPLY_ARRAY && pend.r->elements > 0 ? pend.r->element[0]->integer : -1;
    if (static_cast<uint64_t>(len.r->integer) != want_left || pending != 0) {
      return "xlen=" + std::to_string(len.r->integer) + " (want " + std::to_string(want_left) +
             ") pending=" + std::to_string(pending);
    }
    return "ok";
  }
  void cleanup(const cmp::Args& a) override {
    RedisClient c(a);
    Reply d(redisCommand(c.ctx(), "DEL %s", a.tag.c_str()));
  }
};

}  // namespace

int main(int argc, char** argv) {
  RedisSystem sys;
  return cmp::run(argc, argv, "redis-streams", sys);
}
