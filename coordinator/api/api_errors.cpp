// Failures while serving HTTP, mapped to what the client sees; see api_errors.h.
#include "coordinator/api/api_errors.h"

#include <cstdio>
#include <random>

#include <spdlog/spdlog.h>

#include "common/error.h"

namespace charm {
namespace {

/// The 5xx ApiError for a failure whose `detail` (logged here, with the id) the client
/// must not see.
ApiError server_failure(int status, const std::string& request_id, const std::string& detail) {
  spdlog::error("http api: request {} failed ({}): {}", request_id, status, detail);
  const std::string text =
      status == 503 ? "the cluster cannot serve this request now: a worker holding experts it needs is unavailable; "
                      "retry later"
                    : "internal server error";
  return ApiError(status, text + " (request " + request_id + "; the server log has the details)", "", "server_error");
}

}  // namespace

std::string new_request_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(rng()));
  return std::string("req-") + hex;
}

ApiError client_error(std::exception_ptr failure, FailureStage stage, const std::string& request_id) {
  try {
    std::rethrow_exception(failure);
  } catch (const ApiError& e) {
    return e;
  } catch (const Error& e) {
    if (e.category() == ErrorCategory::kInvalidInput && stage == FailureStage::kRequest) {
      return ApiError(400, e.message());
    }
    // A full queue: the client may retry (Retry-After), as OpenAI's rate limits answer.
    if (e.category() == ErrorCategory::kBusy) return ApiError(429, e.message(), "", "rate_limit_error");
    // No live replica for an expert: the cluster, not the request, is at fault, and a
    // retry may succeed once a worker rejoins.
    return server_failure(e.category() == ErrorCategory::kUnavailable ? 503 : 500, request_id, e.what());
  } catch (const std::exception& e) {
    return server_failure(500, request_id, e.what());
  } catch (...) {
    return server_failure(500, request_id, "an exception that is not a std::exception");
  }
}

}  // namespace charm
