#include "serve/sqs_service.h"

#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <thread>

#include "serve/sigv4.h"

namespace spool::serve {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::system_clock;

constexpr const char* kAttrPrefix =
    "sqs.a.";  // a message attribute NAME is the spool attribute sqs.a.NAME
constexpr int64_t kMaxSqsBody = 262144;

[[noreturn]] void fail(const std::string& name, const std::string& message) {
  throw SqsError{name, message};
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
      .count();
}

bool valid_queue_name(const std::string& n) {
  std::string base = n;
  if (base.size() > 5 && base.ends_with(".fifo")) base.resize(base.size() - 5);
  if (n.empty() || n.size() > 80 || base.empty()) return false;
  return std::all_of(base.begin(), base.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  });
}

void check_name(const std::string& n) {
  if (!valid_queue_name(n)) {
    fail("InvalidParameterValue",
         "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in "
         "length (a FIFO queue's name ends in .fifo); got '" +
             n + "'");
  }
}

// A parameter as a string, whichever protocol: JSON gives numbers and booleans, the query
// protocol strings.
std::string str_of(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number()) return v.dump();
  return "";
}

std::string get_str(const json& in, const char* key, bool required) {
  auto it = in.find(key);
  if (it == in.end() || it->is_null()) {
    if (required)
      fail("MissingParameter", std::string("The request must contain the parameter ") + key + ".");
    return "";
  }
  return str_of(*it);
}

int64_t parse_int(const std::string& what, const std::string& s, int64_t lo, int64_t hi) {
  int64_t v = 0;
  size_t used = 0;
  try {
    v = std::stoll(s, &used);
  } catch (...) {
    used = 0;
  }
  if (s.empty() || used != s.size() || v < lo || v > hi) {
    fail("InvalidParameterValue", "Value " + s + " for parameter " + what +
                                      " is invalid. Reason: must be an integer from " +
                                      std::to_string(lo) + " to " + std::to_string(hi) + ".");
  }
  return v;
}

std::optional<int64_t> get_int(const json& in, const char* key, int64_t lo, int64_t hi) {
  auto it = in.find(key);
  if (it == in.end() || it->is_null()) return std::nullopt;
  return parse_int(key, str_of(*it), lo, hi);
}

bool parse_bool(const std::string& what, const std::string& s) {
  if (s == "true") return true;
  if (s == "false") return false;
  fail("InvalidAttributeValue",
       "Invalid value for the parameter " + what + ": '" + s + "' (true or false)");
}

std::vector<std::string> str_list(const json& in, const char* key) {
  std::vector<std::string> out;
  auto it = in.find(key);
  if (it == in.end() || !it->is_array()) return out;
  for (const auto& v : *it) out.push_back(str_of(v));
  return out;
}

std::map<std::string, std::string> str_map(const json& in, const char* key) {
  std::map<std::string, std::string> out;
  auto it = in.find(key);
  if (it == in.end() || !it->is_object()) return out;
  for (const auto& [k, v] : it->items()) out[k] = str_of(v);
  return out;
}

std::string b64_decode(const std::string& what, const std::string& s) {
  std::string clean;
  for (char c : s) {
    if (!std::isspace(static_cast<unsigned char>(c))) clean += c;
  }
  if (clean.size() % 4 != 0) fail("InvalidParameterValue", what + " is not valid base64");
  std::string out(clean.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(clean.data()),
                          static_cast<int>(clean.size()));
  if (n < 0) fail("InvalidParameterValue", what + " is not valid base64");
  size_t pad = 0;
  if (!clean.empty() && clean.back() == '=')
    pad = clean.size() > 1 && clean[clean.size() - 2] == '=' ? 2 : 1;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

std::string b64_encode(std::string_view s) {
  std::string out((s.size() + 2) / 3 * 4 + 1, '\0');
  int n =
      EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

// SQS allows #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF, in UTF-8.
bool valid_body(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    uint32_t cp = 0;
    size_t len = 0;
    if (c < 0x80)
      cp = c, len = 1;
    else if ((c & 0xE0) == 0xC0)
      cp = c & 0x1F, len = 2;
    else if ((c & 0xF0) == 0xE0)
      cp = c & 0x0F, len = 3;
    else if ((c & 0xF8) == 0xF0)
      cp = c & 0x07, len = 4;
    else
      return false;
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    bool ok = cp == 0x9 || cp == 0xA || cp == 0xD || (cp >= 0x20 && cp <= 0xD7FF) ||
              (cp >= 0xE000 && cp <= 0xFFFD) || (cp >= 0x10000 && cp <= 0x10FFFF);
    if (!ok) return false;
    i += len;
  }
  return true;
}

// A message attribute as SQS carries it.
struct MsgAttr {
  std::string type;   // String, Number, Binary, or one with a custom suffix (Number.int)
  std::string value;  // the string, or the binary's bytes
  bool binary() const { return type.rfind("Binary", 0) == 0; }
};

// MD5OfMessageAttributes: SQS's encoding, attributes in name order, each as length-prefixed
// (4 bytes, big-endian) name and type, a transport byte (1 string/number, 2 binary), and the
// length-prefixed value.
std::string attributes_md5(const std::map<std::string, MsgAttr>& attrs) {
  std::string buf;
  auto put = [&](std::string_view s) {
    uint32_t n = static_cast<uint32_t>(s.size());
    for (int shift = 24; shift >= 0; shift -= 8) buf += static_cast<char>((n >> shift) & 0xFF);
    buf += s;
  };
  for (const auto& [name, a] : attrs) {
    put(name);
    put(a.type);
    buf += static_cast<char>(a.binary() ? 2 : 1);
    put(a.value);
  }
  return md5_hex(buf);
}

// The MessageAttributes of a request, checked as SQS checks them and for what spool's
// attributes hold (docs/sqs.md).
std::map<std::string, MsgAttr> parse_msg_attrs(const json& in) {
  std::map<std::string, MsgAttr> out;
  auto it = in.find("MessageAttributes");
  if (it == in.end() || !it->is_object()) return out;
  if (it->size() > 10)
    fail("InvalidParameterValue", "Number of message attributes [" + std::to_string(it->size()) +
                                      "] exceeds the allowed maximum [10].");
  for (const auto& [name, v] : it->items()) {
    bool ok_name =
        !name.empty() && name.size() <= 256 && name.front() != '.' && name.back() != '.' &&
        name.find("..") == std::string::npos && name.rfind("AWS.", 0) != 0 &&
        name.rfind("Amazon.", 0) != 0 && std::all_of(name.begin(), name.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
        });
    if (!ok_name)
      fail("InvalidParameterValue", "Message attribute name '" + name + "' is invalid.");
    if (name.size() + std::string_view(kAttrPrefix).size() > 64) {
      fail("InvalidParameterValue",
           "Message attribute name '" + name +
               "' is longer than spool keeps (58 characters; docs/sqs.md).");
    }
    MsgAttr a;
    a.type = v.is_object() ? get_str(v, "DataType", false) : "";
    const std::string base = a.type.substr(0, a.type.find('.'));
    if (base != "String" && base != "Number" && base != "Binary") {
      fail("InvalidParameterValue", "The message attribute '" + name +
                                        "' has an invalid message attribute type '" + a.type +
                                        "'.");
    }
    if (a.type.size() > 256 || a.type.find(':') != std::string::npos)
      fail("InvalidParameterValue", "Message attribute '" + name + "': invalid DataType.");
    if (base == "Binary") {
      a.value = b64_decode("Message attribute '" + name + "' BinaryValue",
                           get_str(v, "BinaryValue", false));
    } else {
      a.value = get_str(v, "StringValue", false);
      if (!valid_body(a.value))
        fail("InvalidParameterValue",
             "Message attribute '" + name + "' has characters outside those SQS allows.");
    }
    if (a.value.empty())
      fail("InvalidParameterValue",
           "Message attribute '" + name +
               "' must contain a non-empty value of message attribute type '" + a.type + "'.");
    if (base == "Number") {
      char* end = nullptr;
      std::strtod(a.value.c_str(), &end);
      if (end == a.value.c_str() || *end != '\0')
        fail("InvalidParameterValue",
             "Message attribute '" + name + "': '" + a.value + "' is not a number.");
    }
    out[name] = std::move(a);
  }
  return out;
}

// Into spool attributes (sqs.a.NAME = TYPE:VALUE, a binary value in base64) and back.
Attributes to_spool(const std::map<std::string, MsgAttr>& attrs) {
  Attributes out;
  for (const auto& [name, a] : attrs)
    out[kAttrPrefix + name] = a.type + ":" + (a.binary() ? b64_encode(a.value) : a.value);
  return out;
}

std::map<std::string, MsgAttr> from_spool(const Attributes& attrs) {
  std::map<std::string, MsgAttr> out;
  const std::string prefix = kAttrPrefix;
  for (const auto& [k, v] : attrs) {
    if (k.rfind(prefix, 0) != 0) continue;
    size_t colon = v.find(':');
    if (colon == std::string::npos) continue;
    MsgAttr a{v.substr(0, colon), v.substr(colon + 1)};
    if (a.binary()) {
      try {
        a.value = b64_decode(k, a.value);
      } catch (const SqsError&) {
        continue;
      }
    }
    out[k.substr(prefix.size())] = std::move(a);
  }
  return out;
}

json attrs_json(const std::map<std::string, MsgAttr>& attrs) {
  json out = json::object();
  for (const auto& [name, a] : attrs) {
    json v = {{"DataType", a.type}};
    if (a.binary())
      v["BinaryValue"] = b64_encode(a.value);
    else
      v["StringValue"] = a.value;
    out[name] = v;
  }
  return out;
}

bool wanted(const std::vector<std::string>& names, const std::string& name) {
  for (const auto& n : names) {
    if (n == "All" || n == ".*" || n == name) return true;
    if (n.size() > 2 && n.ends_with(".*") && name.rfind(n.substr(0, n.size() - 1), 0) == 0)
      return true;
  }
  return false;
}

json meta_json(const SqsService::Meta& m) {
  return {{"fifo", m.fifo},
          {"content_dedup", m.content_dedup},
          {"delay_s", m.delay_s},
          {"wait_s", m.wait_s},
          {"created_s", m.created_s},
          {"modified_s", m.modified_s},
          {"extra", m.extra},
          {"tags", m.tags},
          {"dlq", m.dlq}};
}

std::string status_text(const Status& s) {
  return s.message().empty() ? code_name(s.code()) : s.message();
}

// A spool error on a whole request, as SQS would name it.
[[noreturn]] void fail_status(const Status& s) {
  switch (s.code()) {
    case Code::kNotAQueue:
      fail("QueueDoesNotExist", "The specified queue does not exist: " + status_text(s));
    case Code::kQueueFull:
      fail("ThrottlingException",
           "The queue is full (its max_ready / max_bytes); retry later: " + status_text(s));
    case Code::kTooLarge:
      fail("InvalidParameterValue", "The message is too long: " + status_text(s));
    case Code::kInvalidArgument:
      fail("InvalidParameterValue", status_text(s));
    case Code::kReadOnly:
      fail("AccessDenied", "The server may not change this queue: " + status_text(s));
    case Code::kNoSpace:
      fail("ServiceUnavailable", "The disk is full; free space, then retry: " + status_text(s));
    default:
      fail("InternalError", status_text(s));
  }
}

const std::set<std::string> kExtraAttrs = {"Policy",
                                           "KmsMasterKeyId",
                                           "KmsDataKeyReusePeriodSeconds",
                                           "SqsManagedSseEnabled",
                                           "RedriveAllowPolicy",
                                           "DeduplicationScope",
                                           "FifoThroughputLimit"};

struct Settings {  // what CreateQueue / SetQueueAttributes ask for
  std::optional<int64_t> visibility, max_size, retention, delay, wait, max_receives;
  std::optional<std::string> dlq;  // the dead-letter queue's name
  std::optional<bool> fifo, content_dedup;
  std::map<std::string, std::string> extra;
};

Settings parse_settings(const std::map<std::string, std::string>& attrs) {
  Settings s;
  for (const auto& [k, v] : attrs) {
    if (k == "VisibilityTimeout")
      s.visibility = parse_int(k, v, 0, 43200);
    else if (k == "MaximumMessageSize")
      s.max_size = parse_int(k, v, 1024, kMaxSqsBody);
    else if (k == "MessageRetentionPeriod")
      s.retention = parse_int(k, v, 60, 1209600);
    else if (k == "DelaySeconds")
      s.delay = parse_int(k, v, 0, 900);
    else if (k == "ReceiveMessageWaitTimeSeconds")
      s.wait = parse_int(k, v, 0, 20);
    else if (k == "FifoQueue")
      s.fifo = parse_bool(k, v);
    else if (k == "ContentBasedDeduplication")
      s.content_dedup = parse_bool(k, v);
    else if (k == "RedrivePolicy") {
      json p = json::parse(v, nullptr, false);
      if (!p.is_object() || !p.contains("deadLetterTargetArn") || !p.contains("maxReceiveCount")) {
        fail("InvalidAttributeValue",
             "Invalid value for the parameter RedrivePolicy. Reason: Redrive policy is not a JSON "
             "object with deadLetterTargetArn and maxReceiveCount.");
      }
      s.max_receives = parse_int("maxReceiveCount", str_of(p["maxReceiveCount"]), 1, 1000);
      std::string target = str_of(p["deadLetterTargetArn"]);
      s.dlq = target.substr(target.rfind(':') + 1);
    } else if (kExtraAttrs.count(k)) {
      s.extra[k] = v;
    } else {
      fail("InvalidAttributeName", "Unknown Attribute " + k + ".");
    }
  }
  return s;
}

}  // namespace

SqsService::SqsService(std::string root) : root_(std::move(root)) {
  pump_thread_ = std::thread([this] { pump_loop(); });
}

SqsService::~SqsService() {
  stopping_ = true;
  pump_thread_.join();
}

std::string SqsService::url(const SqsContext& ctx, const std::string& name) const {
  return ctx.base_url + "/" + kAccount + "/" + name;
}

std::string SqsService::arn(const SqsContext& ctx, const std::string& name) const {
  return "arn:aws:sqs:" + ctx.region + ":" + kAccount + ":" + name;
}

std::string SqsService::message_id(const std::string& name, const Meta& m, uint64_t id) const {
  // A UUID-shaped id: a hash of the queue (its name and creation time, so a queue made again
  // under the same name gives new ids) and the spool id.
  uint64_t h = 1469598103934665603ull;
  for (char c : name + "/" + std::to_string(m.created_s))
    h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  char buf[40];
  std::snprintf(buf, sizeof buf,
                "%08" PRIx64 "-%04" PRIx64 "-%04" PRIx64 "-%04" PRIx64 "-%012" PRIx64, h >> 32,
                (h >> 16) & 0xFFFF, h & 0xFFFF, (id >> 48) & 0xFFFF, id & uint64_t{0xFFFFFFFFFFFF});
  return buf;
}

void SqsService::save_meta(const std::string& name, const Meta& m) {
  const std::string dir = root_ + "/.sqs";
  if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
    fail_status(errno_status(errno, "create " + dir));
  const std::string path = dir + "/" + name + ".json", tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << meta_json(m).dump(2) << "\n";
    out.flush();
    if (!out) fail_status(errno_status(errno, "write " + tmp));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail_status(errno_status(errno, "rename " + tmp));
}

std::shared_ptr<SqsService::Open> SqsService::open(const std::string& name) {
  check_name(name);
  std::lock_guard lock(mu_);
  if (auto it = open_.find(name); it != open_.end()) return it->second;
  const std::string dir = root_ + "/" + name;
  if (::access((dir + "/spool.conf").c_str(), F_OK) != 0)
    fail("QueueDoesNotExist", "The specified queue does not exist.");
  QueueOptions opts;
  opts.create = false;
  auto q = Queue::open(dir, opts);
  if (!q.ok()) fail_status(q.status());
  auto o = std::make_shared<Open>();
  o->q = std::shared_ptr<Queue>(std::move(*q));
  std::ifstream in(root_ + "/.sqs/" + name + ".json");
  json j = in ? json::parse(in, nullptr, false) : json();
  if (j.is_object()) {
    o->meta.fifo = j.value("fifo", false);
    o->meta.content_dedup = j.value("content_dedup", false);
    o->meta.delay_s = j.value("delay_s", int64_t{0});
    o->meta.wait_s = j.value("wait_s", int64_t{0});
    o->meta.created_s = j.value("created_s", int64_t{0});
    o->meta.modified_s = j.value("modified_s", int64_t{0});
    o->meta.extra = j.value("extra", std::map<std::string, std::string>{});
    o->meta.tags = j.value("tags", std::map<std::string, std::string>{});
    o->meta.dlq = j.value("dlq", std::string());
  } else {
    struct stat st {};  // a queue made by the CLI or the library: its spool.conf's age
    if (::stat((dir + "/spool.conf").c_str(), &st) == 0)
      o->meta.created_s = o->meta.modified_s = st.st_mtime;
  }
  open_[name] = o;
  return o;
}

std::shared_ptr<SqsService::Open> SqsService::open_from(const json& in, const SqsContext& ctx,
                                                        std::string* name) {
  std::string u = get_str(in, "QueueUrl", ctx.path_queue.empty());
  *name = u.empty() ? ctx.path_queue : u.substr(u.rfind('/') + 1);
  return open(*name);
}

json SqsService::call(const std::string& action, const json& in, const SqsContext& ctx) {
  if (!in.is_object()) fail("InvalidParameterValue", "the request body is not a JSON object");
  if (action == "CreateQueue") return create_queue(in, ctx);
  if (action == "GetQueueUrl") {
    std::string name = get_str(in, "QueueName", true);
    open(name);
    return {{"QueueUrl", url(ctx, name)}};
  }
  if (action == "ListQueues") return list_queues(in, ctx);
  if (action == "DeleteQueue") return delete_queue(in, ctx);
  if (action == "PurgeQueue") {
    std::string name;
    auto o = open_from(in, ctx, &name);
    if (auto r = o->q->purge(); !r.ok()) fail_status(r.status());
    return json::object();
  }
  if (action == "GetQueueAttributes") return get_attributes(in, ctx);
  if (action == "SetQueueAttributes") return set_attributes(in, ctx);
  if (action == "SendMessage") return send(in, ctx, false);
  if (action == "SendMessageBatch") return send(in, ctx, true);
  if (action == "ReceiveMessage") return receive(in, ctx);
  if (action == "DeleteMessage") return delete_message(in, ctx, false);
  if (action == "DeleteMessageBatch") return delete_message(in, ctx, true);
  if (action == "ChangeMessageVisibility") return change_visibility(in, ctx, false);
  if (action == "ChangeMessageVisibilityBatch") return change_visibility(in, ctx, true);
  if (action == "ListDeadLetterSourceQueues") return dead_letter_sources(in, ctx);
  if (action == "TagQueue" || action == "UntagQueue" || action == "ListQueueTags")
    return tags(action, in, ctx);
  if (action == "StartMessageMoveTask" || action == "ListMessageMoveTasks" ||
      action == "CancelMessageMoveTask") {
    return move_task(action, in, ctx);
  }
  if (action == "AddPermission" || action == "RemovePermission") {
    fail("UnsupportedOperation",
         action + " is not supported by spool's SQS face (docs/sqs.md says why).");
  }
  fail("InvalidAction", "The action " + action + " is not valid for this endpoint.");
}

json SqsService::create_queue(const json& in, const SqsContext& ctx) {
  const std::string name = get_str(in, "QueueName", true);
  check_name(name);
  Settings s = parse_settings(str_map(in, "Attributes"));
  auto tags_in = str_map(in, "tags");
  for (auto& [k, v] : str_map(in, "Tags")) tags_in[k] = v;
  const bool fifo = s.fifo.value_or(false);
  if (fifo != name.ends_with(".fifo")) {
    fail("InvalidParameterValue",
         fifo ? "The name of a FIFO queue can only include alphanumeric characters, hyphens, or "
                "underscores, must end with .fifo suffix."
              : "Can only include alphanumeric characters, hyphens, or underscores; a name ending "
                "in .fifo needs FifoQueue=true.");
  }
  if (s.content_dedup && !fifo)
    fail("InvalidAttributeName", "ContentBasedDeduplication is only for FIFO queues.");
  const std::string dir = root_ + "/" + name;
  if (::access((dir + "/spool.conf").c_str(), F_OK) == 0) {
    // SQS: the same name with the same attributes returns the queue; different ones are an error.
    auto o = open(name);
    const auto& opts = o->q->options();
    bool same = (!s.visibility || *s.visibility == opts.visibility.count() / 1000) &&
                (!s.max_size || static_cast<uint64_t>(*s.max_size) == opts.max_payload) &&
                (!s.retention || *s.retention * 1000 == opts.retention_max_age.count()) &&
                (!s.delay || *s.delay == o->meta.delay_s) &&
                (!s.wait || *s.wait == o->meta.wait_s) && fifo == o->meta.fifo &&
                (!s.content_dedup || *s.content_dedup == o->meta.content_dedup) &&
                (!s.max_receives || static_cast<uint32_t>(*s.max_receives) == opts.max_receives);
    if (!same)
      fail("QueueAlreadyExists",
           "A queue already exists with the same name and a different value for attribute(s).");
    return {{"QueueUrl", url(ctx, name)}};
  }
  if (s.dlq) {
    auto d = open(*s.dlq);  // SQS: the dead-letter queue must exist, and be of the same kind
    if (d->meta.fifo != fifo)
      fail("InvalidParameterValue",
           "Dead-letter target queue must be of the same type (FIFO or standard).");
  }
  QueueOptions opts;
  opts.visibility = Millis(std::max<int64_t>(1, s.visibility.value_or(30) * 1000));
  opts.max_receives =
      static_cast<uint32_t>(s.max_receives.value_or(0));  // no RedrivePolicy: never dead-letter
  opts.max_payload = static_cast<uint64_t>(s.max_size.value_or(kMaxSqsBody));
  opts.retention_max_age = Millis(s.retention.value_or(345600) * 1000);  // SQS's default: 4 days
  opts.dedup_window = Millis(300000);  // SQS's FIFO deduplication interval
  auto q = Queue::open(dir, opts);
  if (!q.ok()) fail_status(q.status());
  Meta m;
  m.dlq = s.dlq.value_or("");
  m.fifo = fifo;
  m.content_dedup = s.content_dedup.value_or(false);
  m.delay_s = s.delay.value_or(0);
  m.wait_s = s.wait.value_or(0);
  m.created_s = m.modified_s = now_ms() / 1000;
  m.extra = s.extra;
  m.tags = tags_in;
  save_meta(name, m);
  {
    std::lock_guard lock(mu_);
    open_.erase(name);
  }
  return {{"QueueUrl", url(ctx, name)}};
}

json SqsService::list_queues(const json& in, const SqsContext& ctx) {
  const std::string prefix = get_str(in, "QueueNamePrefix", false);
  const auto max = get_int(in, "MaxResults", 1, 1000);
  const std::string after = get_str(in, "NextToken", false);
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    std::string n = e.path().filename().string();
    if (!valid_queue_name(n) || n.rfind(prefix, 0) != 0 || (!after.empty() && n <= after)) continue;
    if (::access((e.path().string() + "/spool.conf").c_str(), F_OK) == 0) names.push_back(n);
  }
  if (ec) fail("InternalError", "list " + root_ + ": " + ec.message());
  std::sort(names.begin(), names.end());
  json out = json::object();
  size_t limit = max ? static_cast<size_t>(*max) : 1000;
  if (names.size() > limit) {
    names.resize(limit);
    if (max) out["NextToken"] = names.back();
  }
  if (!names.empty()) {
    out["QueueUrls"] = json::array();
    for (const auto& n : names) out["QueueUrls"].push_back(url(ctx, n));
  }
  return out;
}

json SqsService::delete_queue(const json& in, const SqsContext& ctx) {
  std::string name;
  auto o = open_from(in, ctx, &name);
  {
    std::lock_guard lock(mu_);
    open_.erase(name);
  }
  // Out of sight in one step (a rename), then removed; processes that have it open keep
  // their mappings until they close it.
  const std::string dir = root_ + "/.sqs";
  if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
    fail_status(errno_status(errno, "create " + dir));
  std::mt19937_64 rng(std::random_device{}());
  const std::string gone = dir + "/deleted-" + name + "-" + std::to_string(rng());
  if (::rename((root_ + "/" + name).c_str(), gone.c_str()) != 0)
    fail_status(errno_status(errno, "delete queue " + name));
  std::error_code ec;
  fs::remove_all(gone, ec);
  fs::remove(dir + "/" + name + ".json", ec);
  return json::object();
}

json SqsService::queue_attributes(const std::string& name, Open& o, const SqsContext& ctx) {
  auto st = o.q->stats();
  if (!st.ok()) fail_status(st.status());
  const auto& opts = o.q->options();
  json a = {
      {"ApproximateNumberOfMessages", std::to_string(st->ready + st->blocked)},
      {"ApproximateNumberOfMessagesNotVisible", std::to_string(st->in_flight)},
      {"ApproximateNumberOfMessagesDelayed", std::to_string(st->delayed)},
      {"CreatedTimestamp", std::to_string(o.meta.created_s)},
      {"LastModifiedTimestamp", std::to_string(o.meta.modified_s)},
      {"QueueArn", arn(ctx, name)},
      {"VisibilityTimeout", std::to_string(opts.visibility.count() / 1000)},
      {"MaximumMessageSize", std::to_string(opts.max_payload)},
      {"MessageRetentionPeriod", std::to_string(opts.retention_max_age.count() / 1000)},
      {"DelaySeconds", std::to_string(o.meta.delay_s)},
      {"ReceiveMessageWaitTimeSeconds", std::to_string(o.meta.wait_s)},
      {"SqsManagedSseEnabled", "false"},
  };
  if (opts.max_receives > 0) {
    // A queue made by the CLI dead-letters into its own DIR/dlq, which has no SQS name.
    std::string dlq = o.meta.dlq.empty() ? name + "/dlq" : o.meta.dlq;
    a["RedrivePolicy"] =
        json({{"deadLetterTargetArn", arn(ctx, dlq)}, {"maxReceiveCount", opts.max_receives}})
            .dump();
  }
  if (o.meta.fifo) {
    a["FifoQueue"] = "true";
    a["ContentBasedDeduplication"] = o.meta.content_dedup ? "true" : "false";
  }
  for (const auto& [k, v] : o.meta.extra) a[k] = v;
  return a;
}

json SqsService::get_attributes(const json& in, const SqsContext& ctx) {
  std::string name;
  auto o = open_from(in, ctx, &name);
  json all = queue_attributes(name, *o, ctx);
  json out = json::object();
  static const std::set<std::string> kKnown = {"All",
                                               "Policy",
                                               "VisibilityTimeout",
                                               "MaximumMessageSize",
                                               "MessageRetentionPeriod",
                                               "ApproximateNumberOfMessages",
                                               "ApproximateNumberOfMessagesNotVisible",
                                               "CreatedTimestamp",
                                               "LastModifiedTimestamp",
                                               "QueueArn",
                                               "ApproximateNumberOfMessagesDelayed",
                                               "DelaySeconds",
                                               "ReceiveMessageWaitTimeSeconds",
                                               "RedrivePolicy",
                                               "FifoQueue",
                                               "ContentBasedDeduplication",
                                               "KmsMasterKeyId",
                                               "KmsDataKeyReusePeriodSeconds",
                                               "DeduplicationScope",
                                               "FifoThroughputLimit",
                                               "RedriveAllowPolicy",
                                               "SqsManagedSseEnabled"};
  auto names = str_list(in, "AttributeNames");
  for (const auto& n : names) {
    if (!kKnown.count(n)) fail("InvalidAttributeName", "Unknown Attribute " + n + ".");
  }
  for (const auto& [k, v] : all.items()) {
    if (wanted(names, k)) out[k] = v;
  }
  return out.empty() ? json::object() : json{{"Attributes", out}};
}

json SqsService::set_attributes(const json& in, const SqsContext& ctx) {
  std::string name;
  auto o = open_from(in, ctx, &name);
  auto attrs = str_map(in, "Attributes");
  if (attrs.empty())
    fail("MissingParameter", "The request must contain the parameter Attribute.Name.");
  Settings s = parse_settings(attrs);
  const auto& opts = o->q->options();
  // spool fixes these in spool.conf when a queue is made; the public API cannot change them.
  auto fixed = [](const char* what) {
    fail("InvalidAttributeValue",
         std::string("spool fixes ") + what +
             " when a queue is created; make a new queue to change it (docs/sqs.md).");
  };
  if (s.visibility && *s.visibility != opts.visibility.count() / 1000) fixed("VisibilityTimeout");
  if (s.max_size && static_cast<uint64_t>(*s.max_size) != opts.max_payload)
    fixed("MaximumMessageSize");
  if (s.retention && *s.retention * 1000 != opts.retention_max_age.count())
    fixed("MessageRetentionPeriod");
  if (s.max_receives && static_cast<uint32_t>(*s.max_receives) != opts.max_receives)
    fixed("RedrivePolicy's maxReceiveCount");
  if (s.fifo && *s.fifo != o->meta.fifo)
    fail("InvalidAttributeName", "FifoQueue cannot be changed.");
  if (s.content_dedup && !o->meta.fifo)
    fail("InvalidAttributeName", "ContentBasedDeduplication is only for FIFO queues.");
  std::lock_guard lock(mu_);
  Meta m = o->meta;
  if (s.delay) m.delay_s = *s.delay;
  if (s.wait) m.wait_s = *s.wait;
  if (s.content_dedup) m.content_dedup = *s.content_dedup;
  for (const auto& [k, v] : s.extra) m.extra[k] = v;
  m.modified_s = now_ms() / 1000;
  save_meta(name, m);
  o->meta = m;
  return json::object();
}

namespace {

void check_batch(const json& entries) {
  if (!entries.is_array() || entries.empty())
    fail("EmptyBatchRequest", "There should be at least one entry in the request.");
  if (entries.size() > 10)
    fail("TooManyEntriesInBatchRequest",
         "Maximum number of entries per request are 10. You have sent " +
             std::to_string(entries.size()) + ".");
  std::set<std::string> ids;
  for (const auto& e : entries) {
    std::string id = get_str(e, "Id", true);
    bool ok = !id.empty() && id.size() <= 80 && std::all_of(id.begin(), id.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
    });
    if (!ok)
      fail("InvalidBatchEntryId",
           "A batch entry id can only contain alphanumeric characters, hyphens and underscores. It "
           "can be at most 80 letters long.");
    if (!ids.insert(id).second) fail("BatchEntryIdsNotDistinct", "Id " + id + " repeated.");
  }
}

json batch_failure(const std::string& id, const SqsError& e) {
  return {{"Id", id},
          {"SenderFault", e.name != "InternalError" && e.name != "ServiceUnavailable"},
          {"Code", e.name},
          {"Message", e.message}};
}

// A batch action whose entries succeed or fail one by one: `one` per entry of in.Entries.
json each_entry(const json& in, const std::function<void(const json&)>& one) {
  json entries = in.contains("Entries") ? in["Entries"] : json::array();
  check_batch(entries);
  json ok = json::array(), failed = json::array();
  for (const auto& e : entries) {
    std::string id = get_str(e, "Id", true);
    try {
      one(e);
      ok.push_back({{"Id", id}});
    } catch (const SqsError& err) {
      failed.push_back(batch_failure(id, err));
    }
  }
  return {{"Successful", ok}, {"Failed", failed}};
}

}  // namespace

json SqsService::send(const json& in, const SqsContext& ctx, bool batch) {
  std::string name;
  auto o = open_from(in, ctx, &name);
  Meta meta;
  {
    std::lock_guard lock(mu_);
    meta = o->meta;
  }
  json entries = json::array();
  if (batch) {
    entries = in.contains("Entries") ? in["Entries"] : json::array();
    check_batch(entries);
  } else {
    entries.push_back(in);
    entries[0]["Id"] = "0";
  }
  struct Ready {
    std::string id;
    SendItem item;
    std::string body;
    int64_t delay_s = 0;
    std::map<std::string, MsgAttr> attrs;
  };
  std::vector<Ready> ready;
  json failed = json::array();
  int64_t total = 0;
  for (const auto& e : entries) {
    Ready r;
    r.id = get_str(e, "Id", true);
    try {
      r.body = get_str(e, "MessageBody", true);
      if (r.body.empty())
        fail("InvalidParameterValue", "The request must contain a non-empty message body.");
      if (!valid_body(r.body))
        fail(
            "InvalidMessageContents",
            "Invalid characters found in the message body (SQS allows only valid XML characters).");
      r.attrs = parse_msg_attrs(e);
      auto d = get_int(e, "DelaySeconds", 0, 900);
      if (d && meta.fifo)
        fail("InvalidParameterValue",
             "Value " + std::to_string(*d) +
                 " for parameter DelaySeconds is invalid. Reason: The request include parameter "
                 "that is not valid for this queue type.");
      r.delay_s = d.value_or(meta.delay_s);
      std::string group = get_str(e, "MessageGroupId", false),
                  dedup = get_str(e, "MessageDeduplicationId", false);
      if (meta.fifo) {
        if (group.empty())
          fail("MissingParameter", "The request must contain the parameter MessageGroupId.");
        if (dedup.empty() && !meta.content_dedup) {
          fail("InvalidParameterValue",
               "The queue should either have ContentBasedDeduplication enabled or "
               "MessageDeduplicationId provided explicitly");
        }
        if (dedup.empty()) dedup = sha256_hex(r.body);
        if (group.size() > 128 || dedup.size() > 128)
          fail("InvalidParameterValue",
               "MessageGroupId and MessageDeduplicationId are at most 128 characters.");
      } else if (!dedup.empty()) {
        fail("InvalidParameterValue",
             "The request include parameter MessageDeduplicationId that is not valid for this "
             "queue type");
      } else if (!group.empty()) {
        fail("InvalidParameterValue",
             "The request include parameter MessageGroupId that is not valid for this queue type");
      }
      int64_t size = static_cast<int64_t>(r.body.size());
      for (const auto& [k, a] : r.attrs)
        size += static_cast<int64_t>(k.size() + a.type.size() + a.value.size());
      if (static_cast<uint64_t>(size) > o->q->options().max_payload) {
        fail("InvalidParameterValue",
             "One or more parameters are invalid. Reason: Message must be shorter than " +
                 std::to_string(o->q->options().max_payload) + " bytes.");
      }
      total += size;
      r.item.group = group;
      r.item.dedup_id = dedup;
      r.item.attributes = to_spool(r.attrs);
      ready.push_back(std::move(r));
    } catch (const SqsError& err) {
      if (!batch) throw;
      failed.push_back(batch_failure(r.id, err));
    }
  }
  if (batch && total > kMaxSqsBody)
    fail("BatchRequestTooLong", "Batch requests cannot be longer than 262144 bytes.");
  // One spool send per delay (a batch almost always has one): all or nothing each.
  std::vector<uint64_t> ids(ready.size());
  std::vector<bool> dup_flags(ready.size());
  std::set<int64_t> delays;
  for (const auto& r : ready) delays.insert(r.delay_s);
  for (int64_t d : delays) {
    std::vector<size_t> idx;
    std::vector<SendItem> items;
    for (size_t i = 0; i < ready.size(); ++i) {
      if (ready[i].delay_s != d) continue;
      idx.push_back(i);
      ready[i].item.payload = ready[i].body;
      items.push_back(ready[i].item);
    }
    SendOptions so;
    so.delay = Millis(d * 1000);
    std::vector<bool> dups;
    auto r = o->q->send_batch(std::span<const SendItem>(items), so, &dups);
    if (!r.ok()) fail_status(r.status());
    for (size_t k = 0; k < idx.size(); ++k) ids[idx[k]] = (*r)[k];
  }
  json ok = json::array();
  for (size_t i = 0; i < ready.size(); ++i) {
    json res = {{"Id", ready[i].id},
                {"MessageId", message_id(name, meta, ids[i])},
                {"MD5OfMessageBody", md5_hex(ready[i].body)}};
    if (!ready[i].attrs.empty()) res["MD5OfMessageAttributes"] = attributes_md5(ready[i].attrs);
    if (meta.fifo) {
      char seq[24];
      std::snprintf(seq, sizeof seq, "%020" PRIu64, ids[i]);
      res["SequenceNumber"] = seq;
    }
    ok.push_back(res);
  }
  if (!batch) {
    ok[0].erase("Id");
    return ok[0];
  }
  return {{"Successful", ok}, {"Failed", failed}};
}

json SqsService::receive(const json& in, const SqsContext& ctx) {
  std::string name;
  auto o = open_from(in, ctx, &name);
  Meta meta;
  {
    std::lock_guard lock(mu_);
    meta = o->meta;
  }
  const int64_t max = get_int(in, "MaxNumberOfMessages", 1, 10).value_or(1);
  const auto vis_s = get_int(in, "VisibilityTimeout", 0, 43200);
  const int64_t wait_s = get_int(in, "WaitTimeSeconds", 0, 20).value_or(meta.wait_s);
  // A visibility timeout of 0 makes the message receivable again at once: spool's shortest
  // lease, 1 ms (its 0 means the queue's default).
  const Millis vis =
      vis_s ? Millis(std::max<int64_t>(1, *vis_s * 1000)) : o->q->options().visibility;
  auto sys_names = str_list(in, "AttributeNames");
  for (auto& n : str_list(in, "MessageSystemAttributeNames")) sys_names.push_back(n);
  const auto attr_names = str_list(in, "MessageAttributeNames");

  // The long poll in slices of at most a second, so that a server shutting down is not held
  // up for the whole wait; spool wakes each slice at once when a message becomes ready.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(wait_s);
  std::vector<Message> msgs;
  for (;;) {
    auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    auto r =
        o->q->receive(static_cast<size_t>(max), vis, std::clamp(left, Millis(0), Millis(1000)));
    if (r.ok()) {
      msgs = std::move(*r);
      break;
    }
    if (r.status().code() != Code::kEmpty) fail_status(r.status());
    if (left <= Millis(0) || stopping_) break;
  }
  json out = json::array();
  const int64_t now = now_ms();
  for (auto& m : msgs) {
    const int64_t sent =
        std::chrono::duration_cast<std::chrono::milliseconds>(m.enqueued.time_since_epoch())
            .count();
    int64_t first = now;
    {
      std::lock_guard lock(mu_);
      auto [it, fresh] = first_receive_.emplace(name + "/" + std::to_string(m.id), now);
      if (!fresh)
        first = it->second;
      else if (m.receive_count > 1)
        it->second = first = sent;  // first received before this process knew it
      if (first_receive_.size() > 1000000)
        first_receive_.clear();  // bounded; the value is approximate anyway
    }
    json sys = {{"SenderId", SqsService::kAccount},
                {"SentTimestamp", std::to_string(sent)},
                {"ApproximateReceiveCount", std::to_string(m.receive_count)},
                {"ApproximateFirstReceiveTimestamp", std::to_string(first)}};
    if (meta.fifo) {
      char seq[24];
      std::snprintf(seq, sizeof seq, "%020" PRIu64, m.id);
      sys["SequenceNumber"] = seq;
      sys["MessageGroupId"] = m.group;
    }
    json msg = {{"MessageId", message_id(name, meta, m.id)},
                {"ReceiptHandle", m.receipt},
                {"MD5OfBody", md5_hex(m.payload)},
                {"Body", m.payload}};
    json sys_out = json::object();
    for (const auto& [k, v] : sys.items()) {
      if (wanted(sys_names, k)) sys_out[k] = v;
    }
    if (!sys_out.empty()) msg["Attributes"] = sys_out;
    std::map<std::string, MsgAttr> attrs;
    for (auto& [k, a] : from_spool(m.attributes)) {
      if (wanted(attr_names, k)) attrs[k] = a;
    }
    if (!attrs.empty()) {
      msg["MessageAttributes"] = attrs_json(attrs);
      msg["MD5OfMessageAttributes"] = attributes_md5(attrs);
    }
    out.push_back(msg);
  }
  return out.empty() ? json::object() : json{{"Messages", out}};
}

json SqsService::delete_message(const json& in, const SqsContext& ctx, bool batch) {
  std::string name;
  auto o = open_from(in, ctx, &name);
  // What one receipt's ack gave (`s`) makes of it: nothing (done), or an SqsError.
  auto settle = [&](const std::string& receipt, const Status& s) {
    // SQS deletes with a stale handle "successfully" (and may not delete): so does this
    // face. spool's fencing keeps the message (it was received again since, the new lease
    // holds it); an already deleted message is gone either way.
    if (s.ok() || s.code() == Code::kLeaseLost || s.code() == Code::kNotFound) {
      std::lock_guard lock(mu_);
      first_receive_.erase(name + "/" + receipt.substr(0, receipt.find('.')));
      return;
    }
    if (s.code() == Code::kInvalidArgument)
      fail("ReceiptHandleIsInvalid",
           "The input receipt handle \"" + receipt + "\" is not a valid receipt handle.");
    fail_status(s);
  };
  if (!batch) {
    const std::string receipt = get_str(in, "ReceiptHandle", true);
    settle(receipt, o->q->ack(receipt));
    return json::object();
  }
  // The batch in one ack_batch (one lock, one append, one ACK record per delivery number);
  // each entry's outcome as its own ack's.
  json entries = in.contains("Entries") ? in["Entries"] : json::array();
  check_batch(entries);
  json ok = json::array(), failed = json::array();
  std::vector<std::string> ids, receipts;
  for (const auto& e : entries) {
    std::string id = get_str(e, "Id", true);
    try {
      receipts.push_back(get_str(e, "ReceiptHandle", true));
      ids.push_back(std::move(id));
    } catch (const SqsError& err) {
      failed.push_back(batch_failure(id, err));
    }
  }
  const std::vector<std::string_view> rs(receipts.begin(), receipts.end());
  auto acked = o->q->ack_batch(rs);
  if (!acked.ok()) fail_status(acked.status());
  for (size_t i = 0; i < ids.size(); ++i) {
    try {
      settle(receipts[i], (*acked)[i]);
      ok.push_back({{"Id", ids[i]}});
    } catch (const SqsError& err) {
      failed.push_back(batch_failure(ids[i], err));
    }
  }
  return {{"Successful", ok}, {"Failed", failed}};
}

json SqsService::change_visibility(const json& in, const SqsContext& ctx, bool batch) {
  std::string name;
  auto o = open_from(in, ctx, &name);
  auto one = [&](const json& e) {
    std::string receipt = get_str(e, "ReceiptHandle", true);
    auto vt = get_int(e, "VisibilityTimeout", 0, 43200);
    if (!vt) fail("MissingParameter", "The request must contain the parameter VisibilityTimeout.");
    // 0: visible again now (spool's nack); otherwise the lease ends VT from now (extend).
    Status s = *vt == 0 ? o->q->nack(receipt) : o->q->extend(receipt, Millis(*vt * 1000));
    if (s.ok()) return;
    if (s.code() == Code::kInvalidArgument)
      fail("ReceiptHandleIsInvalid",
           "The input receipt handle \"" + receipt + "\" is not a valid receipt handle.");
    if (s.code() == Code::kLeaseLost || s.code() == Code::kNotFound) {
      fail("MessageNotInflight",
           "Value " + receipt +
               " for parameter ReceiptHandle is invalid. Reason: Message does not exist or is not "
               "available for visibility timeout change.");
    }
    fail_status(s);
  };
  if (!batch) {
    one(in);
    return json::object();
  }
  return each_entry(in, one);
}

json SqsService::dead_letter_sources(const json& in, const SqsContext& ctx) {
  std::string name;
  auto o = open_from(in, ctx, &name);
  json urls = json::array();
  std::vector<std::string> names;
  for (const auto& [source, target] : redrives()) {
    if (target == name) names.push_back(source);
  }
  for (const auto& n : names) urls.push_back(url(ctx, n));
  return {{"queueUrls", urls}};
}

json SqsService::tags(const std::string& action, const json& in, const SqsContext& ctx) {
  std::string name;
  auto o = open_from(in, ctx, &name);
  std::lock_guard lock(mu_);
  if (action == "ListQueueTags")
    return o->meta.tags.empty() ? json::object() : json{{"Tags", o->meta.tags}};
  Meta m = o->meta;
  if (action == "TagQueue") {
    for (const auto& [k, v] : str_map(in, "Tags")) m.tags[k] = v;
  } else {
    for (const auto& k : str_list(in, "TagKeys")) m.tags.erase(k);
  }
  save_meta(name, m);
  o->meta = m;
  return json::object();
}

std::map<std::string, std::string> SqsService::redrives() {
  std::map<std::string, std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root_ + "/.sqs", ec)) {
    std::string f = e.path().filename().string();
    if (!f.ends_with(".json")) continue;
    std::ifstream in(e.path());
    json j = json::parse(in, nullptr, false);
    if (j.is_object() && j.value("dlq", std::string()) != "") {
      out[f.substr(0, f.size() - 5)] = j["dlq"].get<std::string>();
    }
  }
  return out;
}

void SqsService::pump(const std::string& source, const std::string& target) {
  const std::string dir = root_ + "/" + source + "/dlq";
  if (!valid_queue_name(source) || ::access((dir + "/spool.conf").c_str(), F_OK) != 0) return;
  std::lock_guard lock(pump_mu_);
  auto& from = pumps_[source];
  if (!from) {
    QueueOptions opts;
    opts.create = false;
    auto q = Queue::open(dir, opts);
    if (!q.ok()) return;
    from = std::move(*q);
  }
  std::shared_ptr<Open> to;
  try {
    to = open(target);
  } catch (const SqsError&) {
    return;  // the dead-letter queue was deleted: its letters wait in SOURCE/dlq
  }
  for (;;) {
    // Sent, then deleted here: a crash in between leaves a copy in both (at-least-once).
    auto r = from->receive(100, Millis(60000), Millis(0));
    if (!r.ok()) return;
    std::vector<SendItem> items;
    for (const auto& m : *r) {
      SendItem item{m.payload};
      item.attributes = m.attributes;
      item.group = m.group;
      items.push_back(std::move(item));
    }
    if (!to->q->send_batch(std::span<const SendItem>(items)).ok()) {
      for (const auto& m : *r) (void)from->nack(m.receipt);
      return;
    }
    for (const auto& m : *r) (void)from->ack(m.receipt);
  }
}

void SqsService::pump_loop() {
  while (!stopping_) {
    for (const auto& [source, target] : redrives()) pump(source, target);
    for (int i = 0; i < 5 && !stopping_; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

json SqsService::move_task(const std::string& action, const json& in, const SqsContext& ctx) {
  if (action == "CancelMessageMoveTask") {
    get_str(in, "TaskHandle", true);
    // A move runs to its end within StartMessageMoveTask: there is never one to cancel.
    fail("ResourceNotFoundException",
         "The task has completed: moves finish within StartMessageMoveTask.");
  }
  const std::string src_arn = get_str(in, "SourceArn", true);
  const std::string src = src_arn.substr(src_arn.rfind(':') + 1);
  if (action == "ListMessageMoveTasks") {
    open(src);
    const int64_t max = get_int(in, "MaxResults", 1, 10).value_or(1);
    std::lock_guard lock(mu_);
    json results = json::array();
    auto it = moves_.find(src);
    if (it != moves_.end()) {
      for (auto r = it->second.rbegin(); r != it->second.rend() && std::ssize(results) < max; ++r) {
        results.push_back(*r);
      }
    }
    return {{"Results", results}};
  }
  // StartMessageMoveTask: the dead letters of SourceArn back into DestinationArn, or into
  // the one queue that dead-letters into it.
  auto from = open(src);
  for (const auto& [source, target] : redrives()) {
    if (target == src) pump(source, target);  // dead letters still on their way in
  }
  std::string dst_arn = get_str(in, "DestinationArn", false);
  if (dst_arn.empty()) {
    json sources = dead_letter_sources({{"QueueUrl", url(ctx, src)}}, ctx)["queueUrls"];
    if (sources.size() != 1) {
      fail("InvalidParameterValue", "The queue " + src + " is the dead-letter queue of " +
                                        std::to_string(sources.size()) +
                                        " queues; give DestinationArn.");
    }
    std::string u = sources[0].get<std::string>();
    dst_arn = arn(ctx, u.substr(u.rfind('/') + 1));
  }
  auto to = open(dst_arn.substr(dst_arn.rfind(':') + 1));
  uint64_t moved = 0;
  for (;;) {
    // Each batch: sent to the destination, then deleted here; a crash in between leaves
    // copies in both (at-least-once, as every move in spool).
    auto r = from->q->receive(100, Millis(60000), Millis(0));
    if (!r.ok()) {
      if (r.status().code() == Code::kEmpty) break;
      fail_status(r.status());
    }
    std::vector<SendItem> items;
    for (const auto& m : *r) {
      SendItem item{m.payload};
      for (const auto& [k, v] : m.attributes) {
        if (k.rfind("spool.dead.", 0) != 0) item.attributes[k] = v;  // as spool's redrive does
      }
      item.group = m.group;
      items.push_back(std::move(item));
    }
    if (auto sent = to->q->send_batch(std::span<const SendItem>(items)); !sent.ok()) {
      for (const auto& m : *r) (void)from->q->nack(m.receipt);
      fail_status(sent.status());
    }
    for (const auto& m : *r) (void)from->q->ack(m.receipt);
    moved += r->size();
  }
  std::mt19937_64 rng(std::random_device{}());
  char handle[40];
  std::snprintf(handle, sizeof handle, "spool-move-%016" PRIx64, static_cast<uint64_t>(rng()));
  json task = {{"TaskHandle", handle},
               {"Status", "COMPLETED"},
               {"SourceArn", src_arn},
               {"DestinationArn", dst_arn},
               {"ApproximateNumberOfMessagesMoved", moved},
               {"ApproximateNumberOfMessagesToMove", moved},
               {"StartedTimestamp", now_ms()}};
  std::lock_guard lock(mu_);
  auto& list = moves_[src];
  list.push_back(task);
  if (list.size() > 10) list.erase(list.begin());
  return {{"TaskHandle", handle}};
}

}  // namespace spool::serve
