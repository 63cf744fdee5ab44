// Errors as values. Every fallible spool call returns a Status or a Result<T>;
// nothing throws across the public API and nothing is printed.
#pragma once

#include <cassert>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace spool {

enum class Code {
  kOk = 0,
  kEmpty,            // receive found nothing before its wait ran out
  kLeaseLost,        // the receipt's lease expired and the message was received again
  kNotFound,         // unknown or already-acked message / receipt
  kInvalidArgument,  // malformed receipt, option or input
  kTooLarge,         // payload over the queue's max_payload
  kQueueFull,        // back-pressure limit reached
  kNotAQueue,        // directory or file is not a spool queue / segment
  kIncompatible,     // newer format version or an index built by an incompatible build
  kNoSpace,          // ENOSPC: free space, then retry
  kIo,               // any other I/O error (errno in the message)
  kCorrupt,          // checksum or structure failure in stored data
  kReadOnly,         // the caller may not change this queue
};

// Short stable name of a code, e.g. "lease lost".
const char* code_name(Code c);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message)
      : code_(code), message_(std::make_shared<const std::string>(std::move(message))) {}
  static Status Ok() { return {}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_ ? *message_ : no_message(); }
  // "<code name>: <message>", for people.
  std::string to_string() const;

 private:
  static const std::string& no_message() {
    static const std::string none;
    return none;
  }

  Code code_ = Code::kOk;
  // Behind a pointer: every call returns a Status, almost always ok, and an ok one is then
  // two null words to move and nothing to free (a std::string's move is out of line).
  std::shared_ptr<const std::string> message_;
};

// Builds a Status for a failed system call: "<what>: <strerror(err)>", with ENOSPC mapped to
// kNoSpace and EACCES/EPERM/EROFS to kReadOnly. `err` is a positive errno.
Status errno_status(int err, const std::string& what);

// A value or an error, in the spirit of std::expected (C++23).
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace spool
