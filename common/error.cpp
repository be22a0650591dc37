#include "common/error.h"

namespace charm {

const char* category_name(ErrorCategory category) {
  switch (category) {
    case ErrorCategory::kInvalidInput: return "invalid input";
    case ErrorCategory::kIo: return "io";
    case ErrorCategory::kProtocol: return "protocol";
    case ErrorCategory::kUnsupported: return "unsupported";
    case ErrorCategory::kUnavailable: return "unavailable";
    case ErrorCategory::kInternal: return "internal";
    case ErrorCategory::kBusy: return "busy";
  }
  return "unknown";
}

Error::Error(ErrorCategory category, const std::string& message)
    : std::runtime_error(std::string(category_name(category)) + ": " + message),
      category_(category),
      message_(message) {}

void fail_invalid(const std::string& m) { throw Error(ErrorCategory::kInvalidInput, m); }
void fail_io(const std::string& m) { throw Error(ErrorCategory::kIo, m); }
void fail_protocol(const std::string& m) { throw Error(ErrorCategory::kProtocol, m); }
void fail_unsupported(const std::string& m) { throw Error(ErrorCategory::kUnsupported, m); }
void fail_unavailable(const std::string& m) { throw Error(ErrorCategory::kUnavailable, m); }
void fail_internal(const std::string& m) { throw Error(ErrorCategory::kInternal, m); }
void fail_busy(const std::string& m) { throw Error(ErrorCategory::kBusy, m); }

}  // namespace charm
