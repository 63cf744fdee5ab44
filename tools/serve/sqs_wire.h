// SQS's two wire protocols around SqsService: the query protocol (a form-encoded
// Action=...&QueueUrl=... request, an XML response; what boto3 1.26 and aws-cli 2.9 speak)
// and JSON 1.0 (X-Amz-Target: AmazonSQS.<Action>; what current SDKs speak). Both carry the
// same actions; the query protocol is translated into the JSON shapes and back here.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "serve/sqs_service.h"

namespace spool::serve {

// Form or query parameters (decoded) -> the action's input in JSON 1.0 shape:
// Attribute.1.Name/Value -> Attributes{}, AttributeName.1 -> AttributeNames[],
// SendMessageBatchRequestEntry.1.* -> Entries[], MessageAttribute.1.Value.StringValue -> ...
json query_to_json(const std::vector<std::pair<std::string, std::string>>& params);

// An action's output as the query protocol's XML document.
std::string json_to_xml(const std::string& action, const json& result,
                        const std::string& request_id);

// An error in each protocol's format, and its HTTP status.
struct WireError {
  int status = 400;
  std::string query_code;  // e.g. AWS.SimpleQueueService.NonExistentQueue
  bool sender = true;      // the client's fault (Sender) or the server's (Receiver)
};
WireError wire_error(const std::string& name);
std::string error_xml(const SqsError& e, const std::string& request_id);
std::string error_json(const SqsError& e);
// The x-amzn-query-error header value of a JSON error: "QUERY_CODE;Sender".
std::string query_error_header(const SqsError& e);

std::string xml_escape(std::string_view s);

}  // namespace spool::serve
