// charm's one error type. Every failure a caller may see is a charm::Error with a
// category and a message that names the file, tensor, field or peer at fault.
#pragma once

#include <stdexcept>
#include <string>

namespace charm {

/// What kind of failure an Error reports; callers branch on this, never on text.
enum class ErrorCategory {
  kInvalidInput,  ///< malformed file, config, request or argument (the user can fix it)
  kIo,            ///< the operating system refused a read, write, open or map
  kProtocol,      ///< a peer sent a malformed or unexpected wire message
  kUnsupported,   ///< well-formed input that names something charm does not implement
  kUnavailable,   ///< a peer is down, timed out or refused the connection
  kInternal,      ///< a broken invariant inside charm (a bug)
  kBusy,          ///< the server is at capacity (its queue is full); retrying later may succeed
};

/// Returns a short lower-case name for `category` ("invalid input", "io", ...).
const char* category_name(ErrorCategory category);

/// The exception charm throws. what() is "<category>: <message>".
class Error : public std::runtime_error {
 public:
  Error(ErrorCategory category, const std::string& message);
  ErrorCategory category() const { return category_; }
  /// The message without the category prefix.
  const std::string& message() const { return message_; }

 private:
  ErrorCategory category_;
  std::string message_;
};

/// Shorthands: throw an Error of the named category.
[[noreturn]] void fail_invalid(const std::string& message);
[[noreturn]] void fail_io(const std::string& message);
[[noreturn]] void fail_protocol(const std::string& message);
[[noreturn]] void fail_unsupported(const std::string& message);
[[noreturn]] void fail_unavailable(const std::string& message);
[[noreturn]] void fail_internal(const std::string& message);
[[noreturn]] void fail_busy(const std::string& message);

}  // namespace charm
