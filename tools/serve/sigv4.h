// AWS Signature Version 4: verifying the signature an SQS client puts on each request, with
// the keys of a credentials file in the ~/.aws/credentials format. OpenSSL's libcrypto does
// the hashing (SHA-256, HMAC-SHA256); this file only builds the canonical request.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "spool/status.h"

namespace spool::serve {

// access key id -> secret access key, from every [profile] of the file.
using Keys = std::map<std::string, std::string>;

// Reads FILE: `[profile]` sections with `aws_access_key_id` and `aws_secret_access_key`.
// kInvalidArgument naming the line for a key without a secret, or a file with no key.
Result<Keys> read_credentials(const std::string& path);

// What the verifier needs of a request, as it came off the wire.
struct SignedRequest {
  std::string method;
  std::string path;                                          // raw, before '?'
  std::string query;                                         // raw, after '?'
  std::vector<std::pair<std::string, std::string>> headers;  // names in any case
  std::string body;
};

// Why a request is refused; empty `code` when it is accepted.
struct AuthResult {
  std::string
      code;  // SQS's: MissingAuthenticationToken, InvalidClientTokenId, SignatureDoesNotMatch, ...
  std::string message;     // names the problem
  std::string access_key;  // of an accepted request
  std::string region;      // from the credential scope
  bool ok() const { return code.empty(); }
};

// Checks the Authorization header's AWS4-HMAC-SHA256 signature (or a presigned query's
// X-Amz-Signature) against `keys`, and that X-Amz-Date is within 15 minutes of `now`.
AuthResult verify_sigv4(const SignedRequest& req, const Keys& keys,
                        std::chrono::system_clock::time_point now);

// Hex helpers shared with the SQS part (MD5 of bodies and attributes, SHA-256 dedup ids).
std::string hex(const unsigned char* data, size_t n);
std::string sha256_hex(std::string_view data);
std::string md5_hex(std::string_view data);
// %XX-decoding of a form or query component ('+' is a space).
std::string url_decode(std::string_view s);

}  // namespace spool::serve
