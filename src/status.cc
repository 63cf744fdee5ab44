#include "spool/status.h"

#include <cerrno>
#include <cstring>

namespace spool {

const char* code_name(Code c) {
  switch (c) {
    case Code::kOk: return "ok";
    case Code::kEmpty: return "empty";
    case Code::kLeaseLost: return "lease lost";
    case Code::kNotFound: return "not found";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kTooLarge: return "too large";
    case Code::kQueueFull: return "queue full";
    case Code::kNotAQueue: return "not a queue";
    case Code::kIncompatible: return "incompatible";
    case Code::kNoSpace: return "no space";
    case Code::kIo: return "I/O error";
    case Code::kCorrupt: return "corrupt";
    case Code::kReadOnly: return "read-only";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  // "<code name>: <message>" once: a message that already starts with its code's name
  // ("queue full: q has 3 messages waiting") is not prefixed again.
  const std::string prefix = std::string(code_name(code_)) + ": ";
  if (message().starts_with(prefix)) return message();
  return prefix + message();
}

Status errno_status(int err, const std::string& what) {
  Code code = Code::kIo;
  if (err == ENOSPC || err == EDQUOT) code = Code::kNoSpace;
  if (err == EACCES || err == EPERM || err == EROFS) code = Code::kReadOnly;
  return Status(code, what + ": " + std::strerror(err));
}

}  // namespace spool
