#include "serve/server.h"

#include <spdlog/spdlog.h>

#include <thread>

namespace spool::serve {

Server::~Server() {
  stop();
}

void Server::add(std::unique_ptr<Part> part, const std::string& host, int port) {
  Listener* l = nullptr;
  for (auto& x : listeners_) {
    if (x.host == host && x.port == port) l = &x;
  }
  if (l == nullptr) {
    Listener fresh;
    fresh.host = host;
    fresh.port = port;
    fresh.http = std::make_unique<httplib::Server>();
    const size_t n = opts_.threads;
    fresh.http->new_task_queue = [n] { return new httplib::ThreadPool(n); };
    fresh.http->set_keep_alive_timeout(opts_.keep_alive_s);
    // httplib writes a response's headers and body separately: with Nagle's algorithm the
    // body then waits for the client's delayed ACK, 40 ms per request.
    fresh.http->set_tcp_nodelay(true);
    fresh.http->set_payload_max_length(opts_.max_body);
    listeners_.push_back(std::move(fresh));
    l = &listeners_.back();
  }
  part->mount(*l->http);
  l->parts.push_back(part.get());
  parts_.push_back(std::move(part));
}

Status Server::bind() {
  for (auto& l : listeners_) {
    if (!l.http->bind_to_port(l.host, l.port)) {
      return Status(Code::kIo, "cannot listen on " + l.host + ":" + std::to_string(l.port) +
                                   " (in use, or not an address of this host)");
    }
    for (Part* p : l.parts)
      spdlog::info("{} on http://{}:{}", p->name(), l.host, l.port);
  }
  return {};
}

void Server::run() {
  std::vector<std::thread> threads;
  for (auto& l : listeners_) threads.emplace_back([&l] { l.http->listen_after_bind(); });
  for (auto& t : threads) t.join();
}

void Server::stop() {
  for (auto& p : parts_) p->stop();
  for (auto& l : listeners_) l.http->stop();
}

}  // namespace spool::serve
