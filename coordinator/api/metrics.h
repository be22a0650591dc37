// The coordinator's counters and histograms, exported at GET /metrics in the Prometheus
// text exposition format (version 0.0.4,
// https://prometheus.io/docs/instrumenting/exposition_formats/). Written by hand: the
// format is a few lines of text and Debian 12 packages no Prometheus client for C++.
//
// Who records what:
//   HttpApi            http_request, generation (tokens, TTFT, per-token latency)
//   ClusterDispatcher  worker_rpc (per-worker round trip, every reply), expert_stats (the
//                      reply's LayerStats hits, misses, bytesRead), and worker_error +
//                      failover(worker) where it fails a worker over (the same event
//                      WorkerStatus::failovers counts)
//   LocalDispatcher    expert_stats as worker "local" (the in-process store's counts)
//   Engine             queue_time (each request, when first scheduled), engine_step
//                      (tokens of every step); its load (EngineLoad) is passed to render()
// Thread-safety: every method may be called from any thread (one mutex).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "coordinator/dispatch/worker_status.h"
#include "coordinator/engine_load.h"

namespace charm {

/// A histogram's cumulative state: counts[i] observations <= bounds[i] (not yet
/// cumulative: render() accumulates), plus the +Inf bucket as `count`.
struct HistogramData {
  std::vector<uint64_t> counts;  ///< per bucket, same length as the family's bounds
  double sum = 0;
  uint64_t count = 0;
};

/// Expert-tier totals one worker reported in its layer replies (Metrics::expert_stats).
struct ExpertTotals {
  uint64_t hits = 0;        ///< experts found in memory
  uint64_t misses = 0;      ///< experts read from storage
  uint64_t bytes_read = 0;  ///< bytes those reads fetched
};

/// The running totals behind /metrics as plain numbers (for GET /dashboard/state): what
/// the counters and the histograms' sums and counts hold. Units: tokens, seconds, bytes.
struct MetricsSummary {
  uint64_t prompt_tokens = 0;
  uint64_t completion_tokens = 0;
  uint64_t ttft_count = 0;            ///< generations that produced a first token
  double ttft_sum_s = 0;              ///< their times to first token, summed
  uint64_t token_latency_count = 0;   ///< tokens after each generation's first
  double token_latency_sum_s = 0;     ///< their inter-token times, summed
  uint64_t queue_count = 0;           ///< requests scheduled
  double queue_sum_s = 0;             ///< their times in the queue, summed
  std::map<std::string, ExpertTotals> experts;  ///< per worker name
};

class Metrics {
 public:
  Metrics();

  /// One HTTP request answered: `endpoint` is the route path ("/v1/chat/completions";
  /// unknown paths should be passed as "other" to bound the label set), `status` the
  /// HTTP status code.
  void http_request(const std::string& endpoint, int status);

  /// One finished generation: prompt and completion token counts, time to first token
  /// (seconds) and the latency of every later token (seconds each, one observation per
  /// token: the time from the previous sampled token to this one).
  void generation(int64_t prompt_tokens, int64_t completion_tokens, double ttft_s,
                  const std::vector<double>& token_latencies_s);

  /// One layer request's round trip to `worker` (send to reply decoded), seconds.
  void worker_rpc(const std::string& worker, double seconds);
  /// One failed layer request to `worker` (socket error, timeout, error reply).
  void worker_error(const std::string& worker);
  /// `worker` failed mid-layer and its share went to replicas (or the layer failed for
  /// want of one): ClusterDispatcher calls it where it counts WorkerStatus::failovers.
  void failover(const std::string& worker);
  /// Expert tier statistics a worker reported for one layer request (LayerStats): distinct
  /// experts found in RAM (hits, prefetched ones included), experts the request read from
  /// disk (misses) and the bytes those reads fetched.
  void expert_stats(const std::string& worker, uint64_t hits, uint64_t misses, uint64_t bytes_read);

  /// A request's wait in the queue, from submission to its first step (seconds).
  void queue_time(double seconds);
  /// One engine step ran `tokens` rows (decode tokens and prompt chunks together).
  void engine_step(size_t tokens);

  /// The totals now, taken under the lock (one consistent look).
  MetricsSummary summary() const;

  /// Failovers counted so far per worker (for /cluster/status and `charm status`).
  uint64_t failovers(const std::string& worker) const;

  /// Everything in the text exposition format, families in a fixed order, each with
  /// # HELP and # TYPE lines; `workers` adds the gauges charm_worker_up and
  /// charm_worker_experts_held from the dispatcher's current view; `load` (when not null)
  /// the engine's gauges: sequences running and waiting, KV blocks, prefix-cache hits,
  /// preemptions.
  std::string render(const std::vector<WorkerStatus>& workers = {}, const EngineLoad* load = nullptr) const;

 private:
  using Labels = std::vector<std::string>;  // values, in the family's label-name order
  struct CounterFamily {
    std::string name, help;
    std::vector<std::string> label_names;
    std::map<Labels, double> values;
  };
  struct HistogramFamily {
    std::string name, help;
    std::vector<std::string> label_names;
    std::vector<double> bounds;  // upper bounds, ascending, seconds
    std::map<Labels, HistogramData> values;
  };

  void add(CounterFamily& family, const Labels& labels, double amount);
  void observe(HistogramFamily& family, const Labels& labels, double value);

  mutable std::mutex mutex_;
  CounterFamily http_requests_, prompt_tokens_, completion_tokens_, worker_errors_, failovers_,
      expert_hits_, expert_misses_, expert_bytes_read_;
  HistogramFamily ttft_, token_latency_, worker_rpc_, queue_time_, step_tokens_;
};

/// Escapes a label value for the text format (backslash, double quote, newline).
std::string escape_label_value(const std::string& value);

}  // namespace charm
