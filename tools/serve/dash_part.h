// The dashboard as a part of `spool serve` (server.h; docs/operations.md, "The dashboard"):
// a page of every queue under the roots with live figures and charts, the JSON API the page
// reads, /metrics in the Prometheus text format, and the operator's actions.
//
// One thread refreshes the survey (cli/survey.h, what `spool top` shows) every interval; a
// request reads the last refresh under a lock, so any number of open pages costs the queues
// nothing more. Actions need the token of --token-file (header "Authorization: Bearer
// TOKEN"); without one the dashboard is read-only. No cookie is ever accepted, so a page
// of another site cannot act with the browser's credentials; a request whose Origin is not
// this server is refused too, and on a loopback address so is one whose Host is not a
// loopback name (a DNS-rebinding page).
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cli/survey.h"
#include "serve/server.h"
#include "sys/mutex.h"

namespace spool::serve {

struct DashOptions {
  std::vector<std::string> roots;
  int depth = 3;
  std::string token;  // empty: read-only
  std::chrono::milliseconds interval{1000};
  bool loopback = true;  // listening on a loopback address: requests must name one as Host
};

class DashPart : public Part {
 public:
  explicit DashPart(DashOptions opts);
  ~DashPart() override;
  const char* name() const override { return "dashboard"; }
  void mount(httplib::Server& http) override;
  void stop() override;

 private:
  void refresh_loop();
  bool host_ok(const httplib::Request& req) const;
  bool token_ok(const httplib::Request& req) const;
  void queues(const httplib::Request& req, httplib::Response& res);
  void detail(const httplib::Request& req, httplib::Response& res);
  void metrics(const httplib::Request& req, httplib::Response& res);
  void action(const std::string& what, const httplib::Request& req, httplib::Response& res);

  DashOptions opts_;
  sys::Mutex mu_;
  cli::Survey survey_ GUARDED_BY(mu_);
  // The refresh thread sleeps on this between refreshes; stop() wakes it.
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread thread_;
};

// The token in `path` (its first line, surrounding blanks dropped); an error names the file
// and the problem (missing, empty, shorter than 16 characters).
Result<std::string> read_token(const std::string& path);

}  // namespace spool::serve
