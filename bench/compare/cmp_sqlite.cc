// The SQS-style SQLite table people use as a brokerless queue, one connection per process:
//   CREATE TABLE q (id INTEGER PRIMARY KEY, payload BLOB, visible_at INTEGER, receive_count INTEGER)
//   send        INSERT INTO q (payload, visible_at, receive_count) VALUES (?, now, 0)
//   send_batch  BEGIN IMMEDIATE; `batch` INSERTs; COMMIT
//   receive     UPDATE q SET visible_at = now + 60 s, receive_count = receive_count + 1
//                 WHERE id = (SELECT id FROM q WHERE visible_at <= now ORDER BY id LIMIT 1)
//                 RETURNING id, payload
//               SQLite cannot block until a row arrives: an empty receive sleeps --poll-us
//               (default 1 ms) and tries again until its wait runs out
//   ack         DELETE FROM q WHERE id = ?
// journal_mode = WAL; synchronous = FULL (--sync=always), NORMAL (interval: in WAL mode the
// WAL is synced at checkpoints only), OFF (never); busy_timeout = 10 s, and a statement that
// still gets SQLITE_BUSY is retried. Prepared statements throughout. The file is DIR/TAG.db.
#include <sqlite3.h>
#include <time.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "harness.h"

namespace {

constexpr int64_t kLeaseMs = 60000;

int64_t now_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

std::string db_path(const cmp::Args& a) { return a.dir + "/" + a.tag + ".db"; }

class Db {
 public:
  explicit Db(const cmp::Args& a) {
    if (sqlite3_open_v2(db_path(a).c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) != SQLITE_OK) {
      cmp::fail("sqlite open " + db_path(a) + ": " + sqlite3_errmsg(db_));
    }
    sqlite3_busy_timeout(db_, 10000);
  }
  ~Db() {
    for (auto* s : stmts_) sqlite3_finalize(s);
    sqlite3_close(db_);
  }
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  void exec(const std::string& sql) {
    for (;;) {
      char* err = nullptr;
      int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
      if (rc == SQLITE_OK) return;
      std::string msg = err != nullptr ? err : "?";
      sqlite3_free(err);
      if (rc == SQLITE_BUSY) continue;
      cmp::fail("sqlite " + sql + ": " + msg);
    }
  }
  sqlite3_stmt* prepare(const char* sql) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &s, nullptr) != SQLITE_OK) {
      cmp::fail(std::string("sqlite prepare ") + sql + ": " + sqlite3_errmsg(db_));
    }
    stmts_.push_back(s);
    return s;
  }
  // Steps `s` once; retries the whole statement on SQLITE_BUSY (after busy_timeout).
  int step(sqlite3_stmt* s) {
    for (;;) {
      int rc = sqlite3_step(s);
      if (rc == SQLITE_ROW || rc == SQLITE_DONE) return rc;
      if (rc == SQLITE_BUSY || rc == SQLITE_LOCKED) {
        sqlite3_reset(s);
        continue;
      }
      cmp::fail(std::string("sqlite step: ") + sqlite3_errmsg(db_));
    }
  }
  sqlite3* db() { return db_; }

 private:
  sqlite3* db_ = nullptr;
  std::vector<sqlite3_stmt*> stmts_;
};

class SqliteClient : public cmp::Client {
 public:
  explicit SqliteClient(const cmp::Args& a) : db_(a), poll_us_(a.poll_us) {
    const char* sync = a.sync == "always" ? "FULL" : a.sync == "interval" ? "NORMAL" : a.sync == "never" ? "OFF" : nullptr;
    if (sync == nullptr) cmp::fail("sqlite: --sync must be always, interval or never");
    db_.exec(std::string("PRAGMA synchronous = ") + sync);
    ins_ = db_.prepare("INSERT INTO q (payload, visible_at, receive_count) VALUES (?1, ?2, 0)");
    recv_ = db_.prepare(
        "UPDATE q SET visible_at = ?1, receive_count = receive_count + 1 "
        "WHERE id = (SELECT id FROM q WHERE visible_at <= ?2 ORDER BY id LIMIT 1) RETURNING id, payload");
    del_ = db_.prepare("DELETE FROM q WHERE id = ?1");
    begin_ = db_.prepare("BEGIN IMMEDIATE");
    commit_ = db_.prepare("COMMIT");
  }
  void send(std::string_view p) override { insert(p); }
  void send_batch(std::span<const std::string_view> ps) override {
    run(begin_);
    for (auto p : ps) insert(p);
    run(commit_);
  }
  bool receive(std::string& payload, cmp::Handle& h, int wait_ms) override {
    uint64_t deadline = cmp::mono_ns() + static_cast<uint64_t>(wait_ms) * 1000000ull;
    for (;;) {
      int64_t now = now_ms();
      sqlite3_bind_int64(recv_, 1, now + kLeaseMs);
      sqlite3_bind_int64(recv_, 2, now);
      int rc = db_.step(recv_);
      if (rc == SQLITE_ROW) {
        h.id = static_cast<uint64_t>(sqlite3_column_int64(recv_, 0));
        const void* b = sqlite3_column_blob(recv_, 1);
        payload.assign(static_cast<const char*>(b), static_cast<size_t>(sqlite3_column_bytes(recv_, 1)));
        while (rc == SQLITE_ROW) rc = db_.step(recv_);  // runs the statement to completion: commits
        sqlite3_reset(recv_);
        return true;
      }
      sqlite3_reset(recv_);
      if (cmp::mono_ns() >= deadline) return false;
      ::usleep(static_cast<useconds_t>(poll_us_));
    }
  }
  void ack(const cmp::Handle& h) override {
    sqlite3_bind_int64(del_, 1, static_cast<int64_t>(h.id));
    run(del_);
    if (sqlite3_changes(db_.db()) != 1) cmp::fail("sqlite: ack deleted no row");
  }

 private:
  void insert(std::string_view p) {
    sqlite3_bind_blob(ins_, 1, p.data(), static_cast<int>(p.size()), SQLITE_STATIC);
    sqlite3_bind_int64(ins_, 2, now_ms());
    run(ins_);
  }
  void run(sqlite3_stmt* s) {
    db_.step(s);
    sqlite3_reset(s);
  }
  Db db_;
  int poll_us_;
  sqlite3_stmt *ins_, *recv_, *del_, *begin_, *commit_;
};

void remove_db(const cmp::Args& a) {
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) std::filesystem::remove(db_path(a) + suffix, ec);
}

class SqliteSystem : public cmp::System {
 public:
  void prepare(const cmp::Args& a) override {
    remove_db(a);
    Db db(a);  // closed before the fork
    db.exec("PRAGMA journal_mode = WAL");
    db.exec("CREATE TABLE q (id INTEGER PRIMARY KEY, payload BLOB, visible_at INTEGER, receive_count INTEGER)");
  }
  std::unique_ptr<cmp::Client> connect(const cmp::Args& a) override { return std::make_unique<SqliteClient>(a); }
  std::string check(const cmp::Args& a, uint64_t want_left) override {
    Db db(a);
    sqlite3_stmt* s = db.prepare("SELECT count(*), coalesce(sum(visible_at > ?1), 0) FROM q");
    sqlite3_bind_int64(s, 1, now_ms());
    if (db.step(s) != SQLITE_ROW) return "count failed";
    auto rows = static_cast<uint64_t>(sqlite3_column_int64(s, 0));
    auto leased = static_cast<uint64_t>(sqlite3_column_int64(s, 1));
    if (rows != want_left || leased != 0) {
      return "rows=" + std::to_string(rows) + " (want " + std::to_string(want_left) + ") leased=" + std::to_string(leased);
    }
    return "ok";
  }
  void cleanup(const cmp::Args& a) override { remove_db(a); }
};

}  // namespace

int main(int argc, char** argv) {
  SqliteSystem sys;
  return cmp::run(argc, argv, "sqlite-queue", sys);
}
