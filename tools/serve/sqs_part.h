// The SQS face as a part of `spool serve` (server.h): authenticates each request (SigV4
// against the credentials file, sigv4.h), tells the two wire protocols apart (sqs_wire.h)
// and runs the action (sqs_service.h).
#pragma once

#include <atomic>
#include <string>

#include "serve/server.h"
#include "serve/sigv4.h"
#include "serve/sqs_service.h"

namespace spool::serve {

struct SqsOptions {
  std::string root;
  Keys keys;             // empty with no_auth
  bool no_auth = false;  // loopback only; the caller checks
  std::string region = "us-east-1";
};

class SqsPart : public Part {
 public:
  explicit SqsPart(SqsOptions opts);
  const char* name() const override { return "SQS"; }
  void mount(httplib::Server& http) override;
  void stop() override { service_.stop(); }

 private:
  void handle(const httplib::Request& req, httplib::Response& res);
  SqsOptions opts_;
  SqsService service_;
  std::atomic<uint64_t> requests_{0};
};

}  // namespace spool::serve
