// `spool serve`: one process that serves a spool root over HTTP through parts. A part (the SQS
// face today; a dashboard with /metrics and a JSON API later) registers its routes on a
// listener; parts that name the same address share it. The server owns the listeners, their
// threads and shutdown; a part owns only its routes and the state behind them, so adding a
// part touches no other part.
//
// HTTP: cpp-httplib (Debian's libcpp-httplib-dev). Its server runs each connection on a
// thread of a pool whose size is ours to set (new_task_queue). That fits spool: its long poll
// is a blocking receive (a futex wait) and the library has no asynchronous API, so whatever
// HTTP library we used, every long poll under way would hold a thread; an event loop
// (Boost.Beast/Asio, libmicrohttpd's suspend/resume) would only move the blocking one level
// down. So the pool is sized for the long polls (--threads, 256 by default: a parked thread
// costs its stack's touched pages, some KiB) and idle keep-alive connections give their
// thread back after a few seconds (set_keep_alive_timeout).
#pragma once

#include <httplib.h>

#include <memory>
#include <string>
#include <vector>

#include "spool/status.h"

namespace spool::serve {

class Part {
 public:
  virtual ~Part() = default;
  virtual const char* name() const = 0;
  // Registers the part's routes; called once before the listener starts.
  virtual void mount(httplib::Server& http) = 0;
  // The server is stopping: end long-running handlers (long polls) soon.
  virtual void stop() {}
};

struct ListenOptions {
  size_t threads = 256;        // handler threads of a listener (each long poll holds one)
  time_t keep_alive_s = 5;     // an idle keep-alive connection is closed after this
  size_t max_body = 2u << 20;  // larger request bodies are refused (413)
};

class Server {
 public:
  explicit Server(ListenOptions opts = {}) : opts_(opts) {}
  ~Server();
  // Adds `part` on HOST:PORT (a listener made for the first part on that address). Parts
  // that share an address must register disjoint routes.
  void add(std::unique_ptr<Part> part, const std::string& host, int port);
  // Binds every listener; an error names the address that could not be bound.
  Status bind();
  // Serves until stop() (from another thread, e.g. a signal watcher).
  void run();
  void stop();

 private:
  struct Listener {
    std::string host;
    int port = 0;
    std::unique_ptr<httplib::Server> http;
    std::vector<Part*> parts;
  };
  ListenOptions opts_;
  std::vector<std::unique_ptr<Part>> parts_;
  std::vector<Listener> listeners_;
};

}  // namespace spool::serve
