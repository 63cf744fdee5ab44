#include "next_reader.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <utility>

#include "common.h"

namespace spoolfs {

NextReader::NextReader(Receive receive, Deliver deliver, GiveBack give_back)
    : receive_(std::move(receive)), deliver_(std::move(deliver)), give_back_(std::move(give_back)) {}

NextReader::~NextReader() {
  // stop() answered every read already (its contract); only the thread is left to end.
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    waiting_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void NextReader::add(fuse_req_t req, void* key, size_t size, off_t off) {
  std::lock_guard lock(mu_);
  if (stopping_) return (void)fuse_reply_err(req, stop_err_);
  waiting_.push_back({req, key, size, off});
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  cv_.notify_all();
}

void NextReader::stop(int err) {
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      stopping_ = true;
      stop_err_ = err;
    }
    fail_all(stop_err_);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void NextReader::drop_interrupted() {
  std::erase_if(waiting_, [](const Waiter& w) {
    if (!fuse_req_interrupted(w.req)) return false;
    fuse_reply_err(w.req, EINTR);
    return true;
  });
}

void NextReader::fail_all(int err) {
  for (Waiter& w : waiting_) fuse_reply_err(w.req, err);
  waiting_.clear();
}

void NextReader::run() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    drop_interrupted();
    if (waiting_.empty()) {
      cv_.wait(lock, [&] { return stopping_ || !waiting_.empty(); });
      continue;
    }
    size_t n = waiting_.size();
    lock.unlock();
    auto got = receive_(n, kSlice);
    lock.lock();
    if (!got.ok()) {
      if (got.status().code() == spool::Code::kEmpty) continue;
      // The queue cannot be received from (removed, unreadable): waiting reads fail with
      // what the queue said rather than wait for what cannot come.
      spdlog::warn(".next: receive failed: {}", got.status().to_string());
      fail_all(errno_of(got.status()));
      continue;
    }
    drop_interrupted();
    std::vector<std::pair<Waiter, spool::Message*>> given;
    std::vector<spool::Message*> left;
    for (spool::Message& m : *got) {
      if (waiting_.empty() || stopping_) {
        left.push_back(&m);
        continue;
      }
      given.emplace_back(waiting_.front(), &m);
      waiting_.pop_front();
    }
    lock.unlock();
    for (auto& [w, m] : given) {
      // Interrupted since drop_interrupted: the reader must not be handed a message it
      // will never see, so it goes back to the queue now rather than when its lease ends.
      if (fuse_req_interrupted(w.req)) {
        fuse_reply_err(w.req, EINTR);
        left.push_back(m);
      } else if (!deliver_(w.req, w.key, w.size, w.off, *m)) {
        left.push_back(m);
      }
    }
    for (const spool::Message* m : left) give_back_(*m);
    lock.lock();
  }
}

}  // namespace spoolfs
