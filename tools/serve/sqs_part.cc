#include "serve/sqs_part.h"

#include <spdlog/spdlog.h>

#include <random>

#include "serve/sqs_wire.h"

namespace spool::serve {
namespace {

std::vector<std::pair<std::string, std::string>> parse_form(std::string_view s) {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t pos = 0; pos < s.size();) {
    size_t amp = s.find('&', pos);
    if (amp == std::string_view::npos) amp = s.size();
    std::string_view kv = s.substr(pos, amp - pos);
    if (!kv.empty()) {
      size_t eq = kv.find('=');
      out.emplace_back(url_decode(kv.substr(0, eq)),
                       eq == std::string_view::npos ? "" : url_decode(kv.substr(eq + 1)));
    }
    pos = amp + 1;
  }
  return out;
}

}  // namespace

SqsPart::SqsPart(SqsOptions opts) : opts_(std::move(opts)), service_(opts_.root) {}

void SqsPart::mount(httplib::Server& http) {
  auto h = [this](const httplib::Request& req, httplib::Response& res) { handle(req, res); };
  // Only SQS's paths (the endpoint, and queue URLs /ACCOUNT/NAME, which older SDKs post to),
  // so that another part may serve the rest of the same address (/metrics, say).
  for (const char* path : {R"(/)", R"(/\d+/[A-Za-z0-9_-]+(\.fifo)?)"}) {
    http.Post(path, h);
    http.Get(path, h);
  }
}

void SqsPart::handle(const httplib::Request& req, httplib::Response& res) {
  char rid[40];
  std::snprintf(rid, sizeof rid, "spool-%016llx-%llu",
                static_cast<unsigned long long>(std::random_device{}()),
                static_cast<unsigned long long>(++requests_));
  const std::string request_id = rid;
  res.set_header("x-amzn-RequestId", request_id);
  const std::string target = req.get_header_value("X-Amz-Target");
  const bool json_protocol = !target.empty();
  auto reply_error = [&](const SqsError& e) {
    WireError w = wire_error(e.name);
    res.status = w.status;
    if (json_protocol) {
      res.set_header("x-amzn-query-error", query_error_header(e));
      res.set_content(error_json(e), "application/x-amz-json-1.0");
    } else {
      res.set_content(error_xml(e, request_id), "text/xml");
    }
  };

  const size_t q = req.target.find('?');
  const std::string raw_path = req.target.substr(0, q);
  const std::string raw_query = q == std::string::npos ? "" : req.target.substr(q + 1);
  SqsContext ctx;
  ctx.region = opts_.region;
  ctx.base_url = "http://" + req.get_header_value("Host");
  if (size_t slash = raw_path.rfind('/'); slash != std::string::npos && slash > 0)
    ctx.path_queue = raw_path.substr(slash + 1);

  if (!opts_.no_auth) {
    SignedRequest sr{req.method, raw_path, raw_query, {}, req.body};
    for (const auto& [k, v] : req.headers) {
      // httplib adds these itself; they were not sent and so not signed.
      if (k == "REMOTE_ADDR" || k == "REMOTE_PORT" || k == "LOCAL_ADDR" || k == "LOCAL_PORT")
        continue;
      sr.headers.emplace_back(k, v);
    }
    AuthResult a = verify_sigv4(sr, opts_.keys, std::chrono::system_clock::now());
    if (!a.ok()) {
      spdlog::debug("sqs: refused a request from {}: {}", req.remote_addr, a.message);
      reply_error(SqsError{a.code, a.message});
      return;
    }
    if (!a.region.empty()) ctx.region = a.region;
  }

  std::string action;
  json in;
  if (json_protocol) {
    const std::string prefix = "AmazonSQS.";
    if (target.rfind(prefix, 0) != 0) {
      reply_error(
          SqsError{"InvalidAction", "X-Amz-Target '" + target + "' is not AmazonSQS.<Action>"});
      return;
    }
    action = target.substr(prefix.size());
    in = req.body.empty() ? json::object() : json::parse(req.body, nullptr, false);
    if (in.is_discarded() || !in.is_object()) {
      reply_error(SqsError{"InvalidParameterValue", "the request body is not a JSON object"});
      return;
    }
  } else {
    auto params = parse_form(raw_query);
    if (req.get_header_value("Content-Type").find("application/x-www-form-urlencoded") !=
        std::string::npos) {
      for (auto& p : parse_form(req.body)) params.push_back(std::move(p));
    }
    for (const auto& [k, v] : params) {
      if (k == "Action") action = v;
    }
    if (action.empty()) {
      reply_error(SqsError{"MissingAction", "The request must contain the parameter Action."});
      return;
    }
    in = query_to_json(params);
  }
  try {
    json out = service_.call(action, in, ctx);
    res.status = 200;
    if (json_protocol) {
      res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace),
                      "application/x-amz-json-1.0");
    } else {
      res.set_content(json_to_xml(action, out, request_id), "text/xml");
    }
  } catch (const SqsError& e) {
    reply_error(e);
  } catch (const std::exception& e) {
    reply_error(SqsError{"InternalError", e.what()});
  }
}

}  // namespace spool::serve
