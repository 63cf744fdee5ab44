#include "serve/sigv4.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>
#include <ctime>
#include <fstream>

namespace spool::serve {
namespace {

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string digest(const EVP_MD* md, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), out, &n, md, nullptr);
  return std::string(reinterpret_cast<char*>(out), n);
}

std::string hmac(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &n);
  return std::string(reinterpret_cast<char*>(out), n);
}

// RFC 3986 encoding as SigV4 asks: everything but unreserved characters, '/' kept in paths.
std::string uri_encode(std::string_view s, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// Percent-decoding without turning '+' into a space (a path or a SigV4 query component).
std::string pct_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// "20261207T043000Z" -> time point; nullopt if malformed.
std::optional<std::chrono::system_clock::time_point> parse_amz_date(const std::string& s) {
  std::tm tm{};
  if (s.size() != 16 || s[8] != 'T' || s[15] != 'Z') return std::nullopt;
  if (std::sscanf(s.c_str(), "%4d%2d%2dT%2d%2d%2dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec) != 6) {
    return std::nullopt;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return std::chrono::system_clock::from_time_t(timegm(&tm));
}

AuthResult refuse(std::string code, std::string message) {
  AuthResult r;
  r.code = std::move(code);
  r.message = std::move(message);
  return r;
}

}  // namespace

std::string hex(const unsigned char* data, size_t n) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    out += kHex[data[i] >> 4];
    out += kHex[data[i] & 15];
  }
  return out;
}

std::string sha256_hex(std::string_view data) {
  std::string d = digest(EVP_sha256(), data);
  return hex(reinterpret_cast<const unsigned char*>(d.data()), d.size());
}

std::string md5_hex(std::string_view data) {
  std::string d = digest(EVP_md5(), data);
  return hex(reinterpret_cast<const unsigned char*>(d.data()), d.size());
}

std::string url_decode(std::string_view s) {
  std::string plus(s);
  std::replace(plus.begin(), plus.end(), '+', ' ');
  return pct_decode(plus);
}

Result<Keys> read_credentials(const std::string& path) {
  std::ifstream in(path);
  if (!in) return errno_status(errno, "read credentials file " + path);
  Keys keys;
  std::string line, section, id, secret;
  int lineno = 0, id_line = 0;
  auto close_section = [&]() -> Status {
    if (!id.empty() && secret.empty()) {
      return Status(Code::kInvalidArgument,
                    path + ":" + std::to_string(id_line) + ": profile [" + section +
                        "] has aws_access_key_id but no aws_secret_access_key");
    }
    if (!id.empty()) keys[id] = secret;
    id.clear();
    secret.clear();
    return {};
  };
  while (std::getline(in, line)) {
    ++lineno;
    std::string t = trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[' && t.back() == ']') {
      if (Status s = close_section(); !s.ok()) return s;
      section = trim(std::string_view(t).substr(1, t.size() - 2));
      continue;
    }
    size_t eq = t.find('=');
    if (eq == std::string::npos)
      continue;  // other settings of the format (e.g. continuation lines)
    std::string k = lower(trim(std::string_view(t).substr(0, eq))),
                v = trim(std::string_view(t).substr(eq + 1));
    if (k == "aws_access_key_id") {
      id = v;
      id_line = lineno;
    } else if (k == "aws_secret_access_key") {
      secret = v;
    }
  }
  if (Status s = close_section(); !s.ok()) return s;
  if (keys.empty()) {
    return Status(Code::kInvalidArgument,
                  path + ": no aws_access_key_id / aws_secret_access_key pair in any [profile]");
  }
  return keys;
}

AuthResult verify_sigv4(const SignedRequest& req, const Keys& keys,
                        std::chrono::system_clock::time_point now) {
  std::map<std::string, std::string> headers;  // lower-case name -> values joined by ','
  for (const auto& [k, v] : req.headers) {
    std::string name = lower(k);
    std::string value = trim(v);
    std::string squeezed;  // sequential spaces become one
    for (char c : value) {
      if (c == ' ' && !squeezed.empty() && squeezed.back() == ' ') continue;
      squeezed += c;
    }
    auto [it, fresh] = headers.emplace(name, squeezed);
    if (!fresh) it->second += "," + squeezed;
  }
  // The query's parameters, decoded; a presigned URL carries the signature here.
  std::vector<std::pair<std::string, std::string>> params;
  for (size_t pos = 0; pos < req.query.size();) {
    size_t amp = req.query.find('&', pos);
    if (amp == std::string::npos) amp = req.query.size();
    std::string_view kv = std::string_view(req.query).substr(pos, amp - pos);
    if (!kv.empty()) {
      size_t eq = kv.find('=');
      std::string k = pct_decode(kv.substr(0, eq));
      std::string v = eq == std::string_view::npos ? "" : pct_decode(kv.substr(eq + 1));
      params.emplace_back(k, v);
    }
    pos = amp + 1;
  }
  auto param = [&](const std::string& k) -> std::string {
    for (const auto& [pk, pv] : params) {
      if (pk == k) return pv;
    }
    return "";
  };

  std::string credential, signed_headers, signature, amz_date;
  bool presigned = false;
  if (auto it = headers.find("authorization"); it != headers.end()) {
    const std::string& a = it->second;
    const std::string algo = "AWS4-HMAC-SHA256 ";
    if (a.rfind(algo, 0) != 0) {
      return refuse("IncompleteSignature",
                    "the Authorization header is not AWS4-HMAC-SHA256 (Signature Version 4)");
    }
    std::string rest = a.substr(algo.size());
    for (size_t pos = 0; pos < rest.size();) {
      size_t comma = rest.find(',', pos);
      if (comma == std::string::npos) comma = rest.size();
      std::string part = trim(std::string_view(rest).substr(pos, comma - pos));
      size_t eq = part.find('=');
      if (eq != std::string::npos) {
        std::string k = part.substr(0, eq), v = part.substr(eq + 1);
        if (k == "Credential") credential = v;
        if (k == "SignedHeaders") signed_headers = v;
        if (k == "Signature") signature = v;
      }
      pos = comma + 1;
    }
    if (auto d = headers.find("x-amz-date"); d != headers.end()) amz_date = d->second;
  } else if (!param("X-Amz-Signature").empty()) {
    presigned = true;
    if (param("X-Amz-Algorithm") != "AWS4-HMAC-SHA256") {
      return refuse("IncompleteSignature", "X-Amz-Algorithm is not AWS4-HMAC-SHA256");
    }
    credential = param("X-Amz-Credential");
    signed_headers = param("X-Amz-SignedHeaders");
    signature = param("X-Amz-Signature");
    amz_date = param("X-Amz-Date");
  } else {
    return refuse(
        "MissingAuthenticationToken",
        "the request is not signed: it needs an AWS Signature Version 4 Authorization header");
  }
  if (credential.empty() || signed_headers.empty() || signature.empty()) {
    return refuse("IncompleteSignature",
                  "the signature lacks Credential, SignedHeaders or Signature");
  }
  // Credential = AKID/DATE/REGION/SERVICE/aws4_request
  std::vector<std::string> scope_parts;
  for (size_t pos = 0;;) {
    size_t slash = credential.find('/', pos);
    scope_parts.push_back(
        credential.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos));
    if (slash == std::string::npos) break;
    pos = slash + 1;
  }
  if (scope_parts.size() != 5 || scope_parts[4] != "aws4_request") {
    return refuse("IncompleteSignature", "malformed Credential '" + credential +
                                             "' (want AKID/DATE/REGION/SERVICE/aws4_request)");
  }
  auto key = keys.find(scope_parts[0]);
  if (key == keys.end()) {
    return refuse("InvalidClientTokenId",
                  "the access key id '" + scope_parts[0] + "' is not in the credentials file");
  }
  auto when = parse_amz_date(amz_date);
  if (!when)
    return refuse("IncompleteSignature", "missing or malformed X-Amz-Date '" + amz_date + "'");
  if (amz_date.substr(0, 8) != scope_parts[1]) {
    return refuse("SignatureDoesNotMatch", "the credential scope's date is not X-Amz-Date's");
  }
  // A signed request is good within 15 minutes of its date either way; a presigned URL from
  // its date until X-Amz-Expires seconds later (at most 7 days).
  auto until = *when + std::chrono::minutes(15);
  if (presigned) {
    const std::string e = param("X-Amz-Expires");
    if (e.empty() || e.size() > 6 || e.find_first_not_of("0123456789") != std::string::npos ||
        std::stol(e) > 604800) {
      return refuse("IncompleteSignature",
                    "a presigned URL needs X-Amz-Expires, 1 to 604800 seconds");
    }
    until = *when + std::chrono::seconds(std::stol(e));
  }
  if (*when > now + std::chrono::minutes(15) || now > until) {
    return refuse("RequestExpired", "the request (X-Amz-Date " + amz_date +
                                        ") has expired or is dated in the future "
                                        "by more than 15 minutes of the server's clock");
  }

  // The canonical request.
  std::string canonical = req.method + "\n";
  // Services other than S3 sign the path encoded once more, segment by segment.
  canonical += uri_encode(req.path.empty() ? "/" : req.path, true) + "\n";
  std::vector<std::pair<std::string, std::string>> q;
  for (const auto& [k, v] : params) {
    if (presigned && k == "X-Amz-Signature") continue;
    q.emplace_back(uri_encode(k, false), uri_encode(v, false));
  }
  std::sort(q.begin(), q.end());
  for (size_t i = 0; i < q.size(); ++i)
    canonical += (i ? "&" : "") + q[i].first + "=" + q[i].second;
  canonical += "\n";
  for (size_t pos = 0; pos <= signed_headers.size();) {
    size_t semi = signed_headers.find(';', pos);
    if (semi == std::string::npos) semi = signed_headers.size();
    std::string name = signed_headers.substr(pos, semi - pos);
    auto h = headers.find(name);
    if (h == headers.end())
      return refuse("SignatureDoesNotMatch", "signed header '" + name + "' is not in the request");
    canonical += name + ":" + h->second + "\n";
    pos = semi + 1;
  }
  canonical += "\n" + signed_headers + "\n";
  std::string payload_hash;
  if (auto h = headers.find("x-amz-content-sha256"); h != headers.end()) payload_hash = h->second;
  if (payload_hash.empty()) payload_hash = sha256_hex(req.body);
  canonical += payload_hash;

  const std::string scope =
      scope_parts[1] + "/" + scope_parts[2] + "/" + scope_parts[3] + "/aws4_request";
  const std::string to_sign =
      "AWS4-HMAC-SHA256\n" + amz_date + "\n" + scope + "\n" + sha256_hex(canonical);
  std::string k = hmac("AWS4" + key->second, scope_parts[1]);
  k = hmac(k, scope_parts[2]);
  k = hmac(k, scope_parts[3]);
  k = hmac(k, "aws4_request");
  std::string mac = hmac(k, to_sign);
  std::string expect = hex(reinterpret_cast<const unsigned char*>(mac.data()), mac.size());
  if (expect.size() != signature.size() ||
      CRYPTO_memcmp(expect.data(), signature.data(), expect.size()) != 0) {
    return refuse(
        "SignatureDoesNotMatch",
        "the request signature we calculated does not match the signature you provided; check your "
        "AWS secret access key and signing method");
  }
  AuthResult ok;
  ok.access_key = scope_parts[0];
  ok.region = scope_parts[2];
  return ok;
}

}  // namespace spool::serve
