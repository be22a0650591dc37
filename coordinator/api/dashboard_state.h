// The JSON document of GET /dashboard/state: what the dashboard page (/) shows, from the
// engine's view of the workers, its load, the routing counts and the metrics' totals.
// Its fields, units and stability rule are documented in docs/api.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/api/metrics.h"
#include "coordinator/dispatch/worker_status.h"
#include "coordinator/engine_load.h"

namespace charm {

/// One worker as GET /cluster/status lists it (docs/api.md): name, address, state,
/// experts_held, requests, rtt_p50_ms/rtt_p99_ms, bytes_out/bytes_in, failovers, rejoins,
/// last_seen_ms, slow, slow_reason, last_error, experts_by_tier. /dashboard/state's
/// workers carry these and more.
nlohmann::json worker_status_json(const WorkerStatus& w);

/// The schema version of the document; raised only when a field changes meaning or goes
/// away (new fields may appear without a raise).
constexpr int kDashboardStateVersion = 1;

/// Everything the document is made of, gathered by the caller (so that this is a pure
/// function, tested without an engine).
struct DashboardInputs {
  std::string model;                                 ///< the served model's name
  double uptime_s = 0;                               ///< since the HTTP API started (monotonic)
  std::vector<WorkerStatus> workers;                 ///< Engine::cluster_status
  EngineLoad load;                                   ///< Engine::load
  std::map<uint32_t, std::vector<uint64_t>> routing; ///< Engine::routing_counts
  MetricsSummary metrics;                            ///< Metrics::summary
};

/// One letter per expert of a layer, where it lives (docs/api.md, `heat.layers[].tiers`):
/// 'V' in some worker's VRAM tier; 'P' RAM, pinned on some worker; 'L' RAM, in an LRU slot; 'D' on disk only (read on a
/// miss); '?' unknown (a worker that is not down has not reported its residency).
/// `num_experts` letters. Pure.
std::string expert_tiers(uint32_t layer, size_t num_experts, const std::vector<WorkerStatus>& workers);

/// The /dashboard/state document (version kDashboardStateVersion). Pure; never throws.
nlohmann::json dashboard_state(const DashboardInputs& in);

}  // namespace charm
