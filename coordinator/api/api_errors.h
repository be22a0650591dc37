// How a failure while serving an HTTP request reaches the client: the one place that maps
// charm::Error categories to HTTP statuses. A client sees what it can act on; what only
// the operator can (file paths, tensor names, worker addresses, OS errors) stays in the
// server log, tied to the response by a request id. Documented in docs/api.md, "Errors".
#pragma once

#include <exception>
#include <string>

#include "coordinator/api/openai_request.h"

namespace charm {

/// Where serving a request failed, which decides whose fault an Error is.
enum class FailureStage {
  kRequest,     ///< reading the request: parsing, the chat template, tokenizing, the context check
  kGeneration,  ///< generating, or any endpoint's work once the request was read: the server's fault
};

/// A fresh id "req-<16 hex digits>" for responses that carry no completion id.
/// Thread-safe.
std::string new_request_id();

/// The ApiError the client gets for the exception `failure` thrown while serving request
/// `request_id` at `stage`:
///   ApiError                            as it is (its text was written for the client);
///   Error(kInvalidInput), kRequest      400 with the Error's message (the request is at
///                                       fault: a template's raise_exception, a prompt the
///                                       engine refuses);
///   Error(kUnavailable)                 503, a fixed text: retry later;
///   anything else                       500, a fixed text: kIo, kProtocol, kInternal,
///                                       kUnsupported, kInvalidInput while generating (a bad
///                                       file or a bug, never the client's), other exceptions.
/// The 5xx texts name `request_id` and hide the detail, which is logged (spdlog error)
/// with the id. Never throws. Thread-safe.
ApiError client_error(std::exception_ptr failure, FailureStage stage, const std::string& request_id);

}  // namespace charm
