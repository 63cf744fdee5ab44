#include "serve/sqs_wire.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

namespace spool::serve {
namespace {

bool is_index(const std::string& s) {
  return !s.empty() && s.size() < 6 && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c));
  });
}

// Query names of lists (NAME.N) and maps (NAME.N.Key/Value), and their JSON names.
const std::map<std::string, std::string> kLists = {
    {"AttributeName", "AttributeNames"},
    {"MessageAttributeName", "MessageAttributeNames"},
    {"MessageSystemAttributeName", "MessageSystemAttributeNames"},
    {"TagKey", "TagKeys"},
    {"SendMessageBatchRequestEntry", "Entries"},
    {"DeleteMessageBatchRequestEntry", "Entries"},
    {"ChangeMessageVisibilityBatchRequestEntry", "Entries"},
    {"AWSAccountId", "AWSAccountIds"},
    {"ActionName", "Actions"},
    {"StringListValue", "StringListValues"},
    {"BinaryListValue", "BinaryListValues"}};
struct MapNames {
  std::string json, key, value;
};
const std::map<std::string, MapNames> kMaps = {
    {"Attribute", {"Attributes", "Name", "Value"}},
    {"MessageAttribute", {"MessageAttributes", "Name", "Value"}},
    {"MessageSystemAttribute", {"MessageSystemAttributes", "Name", "Value"}},
    {"Tag", {"Tags", "Key", "Value"}}};

json normalize(const json& tree);

// {"1": x, "2": y} -> [x, y] in index order.
std::vector<json> indexed(const json& obj) {
  std::vector<std::pair<int, json>> items;
  if (obj.is_object()) {
    for (const auto& [k, v] : obj.items()) {
      if (is_index(k)) items.emplace_back(std::stoi(k), v);
    }
  }
  std::sort(items.begin(), items.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<json> out;
  for (auto& [i, v] : items) out.push_back(std::move(v));
  return out;
}

json normalize(const json& tree) {
  if (!tree.is_object()) return tree;
  json out = json::object();
  for (const auto& [k, v] : tree.items()) {
    if (auto l = kLists.find(k); l != kLists.end() && v.is_object()) {
      json arr = json::array();
      for (const auto& e : indexed(v)) arr.push_back(normalize(e));
      out[l->second] = arr;
    } else if (auto m = kMaps.find(k); m != kMaps.end() && v.is_object()) {
      json obj = json::object();
      for (const auto& e : indexed(v)) {
        if (e.is_object() && e.contains(m->second.key) && e[m->second.key].is_string()) {
          obj[e[m->second.key].get<std::string>()] =
              e.contains(m->second.value) ? normalize(e[m->second.value]) : json("");
        }
      }
      out[m->second.json] = obj;
    } else {
      out[k] = normalize(v);
    }
  }
  return out;
}

// The element name of each member of a list in a query response.
std::string member_name(const std::string& action, const std::string& key) {
  if (key == "QueueUrls" || key == "queueUrls") return "QueueUrl";
  if (key == "Messages") return "Message";
  if (key == "Successful") return action + "ResultEntry";
  if (key == "Failed") return "BatchResultErrorEntry";
  if (key == "Results") return "ListMessageMoveTasksResultEntry";
  return key;
}

void emit(std::string& out, const std::string& action, const std::string& key, const json& v);

void emit_value(std::string& out, const std::string& action, const json& v) {
  if (v.is_object()) {
    for (const auto& [k, c] : v.items()) emit(out, action, k, c);
  } else if (v.is_string()) {
    out += xml_escape(v.get<std::string>());
  } else if (v.is_boolean()) {
    out += v.get<bool>() ? "true" : "false";
  } else if (!v.is_null()) {
    out += v.dump();
  }
}

void emit(std::string& out, const std::string& action, const std::string& key, const json& v) {
  if (v.is_array()) {  // flattened: one element per member
    const std::string m = member_name(action, key);
    for (const auto& e : v) {
      out += "<" + m + ">";
      emit_value(out, action, e);
      out += "</" + m + ">";
    }
    return;
  }
  // The maps: Attributes, MessageAttributes, Tags, flattened as entries.
  static const std::map<std::string, MapNames> kOut = {
      {"Attributes", {"Attribute", "Name", "Value"}},
      {"MessageAttributes", {"MessageAttribute", "Name", "Value"}},
      {"Tags", {"Tag", "Key", "Value"}}};
  if (auto m = kOut.find(key); m != kOut.end() && v.is_object()) {
    for (const auto& [k, c] : v.items()) {
      out += "<" + m->second.json + "><" + m->second.key + ">" + xml_escape(k) + "</" +
             m->second.key + "><" + m->second.value + ">";
      emit_value(out, action, c);
      out += "</" + m->second.value + "></" + m->second.json + ">";
    }
    return;
  }
  out += "<" + key + ">";
  emit_value(out, action, v);
  out += "</" + key + ">";
}

struct ErrorRow {
  const char* name;
  const char* query_code;
  int status;
};
constexpr ErrorRow kErrors[] = {
    {"QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue", 400},
    {"QueueAlreadyExists", "QueueAlreadyExists", 400},
    {"QueueDeletedRecently", "AWS.SimpleQueueService.QueueDeletedRecently", 400},
    {"MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight", 400},
    {"EmptyBatchRequest", "AWS.SimpleQueueService.EmptyBatchRequest", 400},
    {"TooManyEntriesInBatchRequest", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest", 400},
    {"BatchEntryIdsNotDistinct", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400},
    {"InvalidBatchEntryId", "AWS.SimpleQueueService.InvalidBatchEntryId", 400},
    {"BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong", 400},
    {"UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation", 400},
    {"InternalError", "InternalError", 500},
    {"ServiceUnavailable", "ServiceUnavailable", 503},
    {"AccessDenied", "AccessDenied", 403},
    {"MissingAuthenticationToken", "MissingAuthenticationToken", 403},
    {"InvalidClientTokenId", "InvalidClientTokenId", 403},
    {"SignatureDoesNotMatch", "SignatureDoesNotMatch", 403},
    {"IncompleteSignature", "IncompleteSignature", 403},
    {"RequestExpired", "RequestExpired", 403},
    {"ResourceNotFoundException", "ResourceNotFoundException", 404},
};

}  // namespace

std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      case '\r':
        out += "&#13;";
        break;  // a bare CR would be read back as LF
      default:
        out += c;
    }
  }
  return out;
}

json query_to_json(const std::vector<std::pair<std::string, std::string>>& params) {
  json tree = json::object();
  for (const auto& [key, value] : params) {
    if (key == "Action" || key == "Version") continue;
    json* node = &tree;
    size_t pos = 0;
    for (;;) {
      size_t dot = key.find('.', pos);
      std::string part = key.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
      if (!node->is_object()) *node = json::object();
      if (dot == std::string::npos) {
        (*node)[part] = value;
        break;
      }
      node = &(*node)[part];
      pos = dot + 1;
    }
  }
  return normalize(tree);
}

std::string json_to_xml(const std::string& action, const json& result,
                        const std::string& request_id) {
  std::string out = "<?xml version=\"1.0\"?><" + action +
                    "Response xmlns=\"http://queue.amazonaws.com/doc/2012-11-05/\">";
  // Actions with an output shape always carry their Result element, empty or not.
  static const std::set<std::string> kNoOutput = {"DeleteQueue",
                                                  "PurgeQueue",
                                                  "SetQueueAttributes",
                                                  "DeleteMessage",
                                                  "ChangeMessageVisibility",
                                                  "TagQueue",
                                                  "UntagQueue",
                                                  "AddPermission",
                                                  "RemovePermission"};
  if (!kNoOutput.count(action)) {
    out += "<" + action + "Result>";
    emit_value(out, action, result);
    out += "</" + action + "Result>";
  }
  out += "<ResponseMetadata><RequestId>" + request_id + "</RequestId></ResponseMetadata></" +
         action + "Response>";
  return out;
}

WireError wire_error(const std::string& name) {
  for (const auto& row : kErrors) {
    if (name == row.name) return {row.status, row.query_code, row.status < 500};
  }
  return {400, name, true};
}

std::string error_xml(const SqsError& e, const std::string& request_id) {
  WireError w = wire_error(e.name);
  return "<?xml version=\"1.0\"?><ErrorResponse "
         "xmlns=\"http://queue.amazonaws.com/doc/2012-11-05/\"><Error><Type>" +
         std::string(w.sender ? "Sender" : "Receiver") + "</Type><Code>" + w.query_code +
         "</Code><Message>" + xml_escape(e.message) + "</Message><Detail/></Error><RequestId>" +
         request_id + "</RequestId></ErrorResponse>";
}

std::string error_json(const SqsError& e) {
  return json({{"__type", "com.amazonaws.sqs#" + e.name}, {"message", e.message}}).dump();
}

std::string query_error_header(const SqsError& e) {
  WireError w = wire_error(e.name);
  return w.query_code + (w.sender ? ";Sender" : ";Receiver");
}

}  // namespace spool::serve
