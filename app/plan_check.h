// `charm plan --check`: the plan's prediction against what a running coordinator has
// measured (GET /metrics and /cluster/status, with the topology's API key as `charm
// status` sends it). Compared, each with its relative error (predicted - measured) /
// measured:
//   - decode tok/s: 1 / mean of charm_time_per_output_token_seconds (sum / count: every
//     token after a request's first, over every request since the coordinator started;
//     with several streams at once each is slower than the one-stream prediction);
//   - hit rate, per worker and overall: charm_expert_hits_total / (hits + misses);
//   - layer round trip, per worker: /cluster/status rtt_p50_ms against the plan's
//     layer_round_trip_s (the median is mostly decode requests; prefill ones carry more rows).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/plan.h"
#include "coordinator/dispatch/worker_status.h"

namespace charm {

/// One sample of the Prometheus text format: `name{label="v",...} value`.
struct MetricSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

/// The largest /metrics body read, bytes.
inline constexpr uint64_t kMaxMetricsBytes = 16ull << 20;

/// Parses the Prometheus text exposition format (version 0.0.4) as charm writes it:
/// comment lines (#) and blank lines skipped; label values with \\, \" and \n escapes;
/// an optional timestamp after the value ignored. Throws Error(kProtocol) naming the line
/// number for a line that is not that shape, and for text over kMaxMetricsBytes.
std::vector<MetricSample> parse_prometheus(const std::string& text);

/// What a run measured, from the coordinator's endpoints.
struct MeasuredRun {
  std::optional<double> decode_tokens_per_s;  ///< nullopt before two tokens of a request
  uint64_t tokens_timed = 0;                  ///< charm_time_per_output_token_seconds_count
  std::map<std::string, uint64_t> hits, misses;  ///< per worker label
  std::map<std::string, double> rtt_p50_ms;      ///< per worker, /cluster/status
};

/// Reads `samples` (and `cluster`, /cluster/status's workers, possibly empty) into a
/// MeasuredRun. Pure.
MeasuredRun measured_run(const std::vector<MetricSample>& samples, const std::vector<WorkerStatus>& cluster);

/// One compared quantity.
struct Comparison {
  std::string what;      ///< "decode tok/s", "hit rate w0", "layer RTT w0 (ms)"
  double predicted = 0;
  std::optional<double> measured;  ///< nullopt: not measured (yet)
  std::string why_not;   ///< when not measured
  /// (predicted - measured) / measured; nullopt when not measured or measured is 0.
  std::optional<double> relative_error() const;
};

/// The comparisons of `plan` with `run`: decode tok/s, the overall hit rate, each
/// worker's hit rate and layer round trip. Pure.
std::vector<Comparison> compare_plan(const PlanReport& plan, const MeasuredRun& run);

/// A table: WHAT, PREDICTED, MEASURED, ERROR ("+12.3%", "-" when not measured).
std::string format_check(const std::vector<Comparison>& rows);

/// The comparisons as JSON: [{what, predicted, measured (null), relative_error (null),
/// why_not}].
nlohmann::json check_json(const std::vector<Comparison>& rows);

/// Checks that `models_body` (the coordinator's GET /v1/models, OpenAI's list shape) lists
/// `model_name`, so --check never compares a plan with another model's run. Throws
/// Error(kInvalidInput) naming both models when it does not, Error(kProtocol) for a body
/// that is not such a list.
void require_served_model(const std::string& models_body, const std::string& model_name, const std::string& where);

/// GET `path` from the coordinator (topology.api_host:api_port, bearer topology.api_key
/// when set) within `timeout_ms`, reading at most `cap` bytes. Throws
/// Error(kUnavailable) naming the address and the HTTP error or status, and
/// Error(kProtocol) for a body over the cap.
std::string fetch_coordinator(const Topology& topology, const std::string& path, int timeout_ms, uint64_t cap);

}  // namespace charm
