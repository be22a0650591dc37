#include "coordinator/api/dashboard_state.h"

#include <algorithm>

namespace charm {

using json = nlohmann::json;

namespace {

double ratio(double num, double den) { return den > 0 ? num / den : 0.0; }

json worker_json(const WorkerStatus& w, const MetricsSummary& m) {
  ExpertTotals e;
  if (auto it = m.experts.find(w.name); it != m.experts.end()) e = it->second;
  json out = worker_status_json(w);
  out["expert_hits"] = e.hits;
  out["expert_misses"] = e.misses;
  out["expert_bytes_read"] = e.bytes_read;
  out["hit_rate"] = ratio(double(e.hits), double(e.hits + e.misses));
  out["residency_age_ms"] = w.residency_age_ms;
  return out;
}

json heat_json(const DashboardInputs& in) {
  size_t num_experts = 0;
  for (const auto& [layer, counts] : in.routing) num_experts = std::max(num_experts, counts.size());
  json layers = json::array();
  uint64_t max_count = 0;
  for (const auto& [layer, counts] : in.routing) {
    std::vector<uint64_t> row = counts;
    row.resize(num_experts, 0);
    for (uint64_t c : row) max_count = std::max(max_count, c);
    layers.push_back({{"layer", layer}, {"counts", row}, {"tiers", expert_tiers(layer, num_experts, in.workers)}});
  }
  return {{"num_experts", num_experts}, {"max_count", max_count}, {"layers", layers}};
}

json totals_json(const DashboardInputs& in) {
  const MetricsSummary& m = in.metrics;
  ExpertTotals e;
  for (const auto& [name, t] : m.experts) e.hits += t.hits, e.misses += t.misses, e.bytes_read += t.bytes_read;
  return {{"prompt_tokens", m.prompt_tokens},
          {"completion_tokens", m.completion_tokens},
          {"generations", m.ttft_count},
          {"ttft_mean_ms", 1000.0 * ratio(m.ttft_sum_s, double(m.ttft_count))},
          {"decode_tokens_per_s", ratio(double(m.token_latency_count), m.token_latency_sum_s)},
          {"queue_time_mean_ms", 1000.0 * ratio(m.queue_sum_s, double(m.queue_count))},
          {"expert_hits", e.hits},
          {"expert_misses", e.misses},
          {"expert_bytes_read", e.bytes_read},
          {"hit_rate", ratio(double(e.hits), double(e.hits + e.misses))}};
}

json load_json(const EngineLoad& l) {
  return {{"running", l.running},
          {"waiting", l.waiting},
          {"kv_blocks_total", l.kv_blocks_total},
          {"kv_blocks_used", l.kv_blocks_used},
          {"kv_blocks_cached", l.kv_blocks_cached},
          {"kv_block_tokens", l.kv_block_tokens},
          {"prefix_hits", l.prefix_hits},
          {"prefix_misses", l.prefix_misses},
          {"preemptions", l.preemptions},
          {"tokens_sampled", l.tokens_sampled}};
}

}  // namespace

json worker_status_json(const WorkerStatus& w) {
  return {{"name", w.name},
          {"address", w.address},
          {"state", worker_state_name(w.state)},
          {"experts_held", w.experts_held},
          {"requests", w.requests},
          {"rtt_p50_ms", w.rtt_p50_ms},
          {"rtt_p99_ms", w.rtt_p99_ms},
          {"bytes_out", w.bytes_out},
          {"bytes_in", w.bytes_in},
          {"layer_bytes_out", w.layer_bytes_out},
          {"layer_bytes_in", w.layer_bytes_in},
          {"token_layers", w.token_layers},
          {"moe_layers", w.moe_layers},
          {"bytes_out_per_token", bytes_per_token(w.layer_bytes_out, w)},
          {"bytes_in_per_token", bytes_per_token(w.layer_bytes_in, w)},
          {"bytes_out_per_token_layer", bytes_per_token_layer(w.layer_bytes_out, w)},
          {"bytes_in_per_token_layer", bytes_per_token_layer(w.layer_bytes_in, w)},
          {"failovers", w.failovers},
          {"rejoins", w.rejoins},
          {"last_seen_ms", w.last_seen_ms},
          {"slow", w.slow},
          {"slow_reason", w.slow_reason},
          {"last_error", w.last_error},
          {"experts_by_tier", w.experts_by_tier}};
}

std::string expert_tiers(uint32_t layer, size_t num_experts, const std::vector<WorkerStatus>& workers) {
  std::string tiers(num_experts, 'D');
  bool known = true;  // every worker that can serve has said what it holds in RAM
  // VRAM beats pinned beats LRU: the letter is the best copy any worker reported.
  for (const WorkerStatus& w : workers) {
    if (w.state == WorkerState::kDown) continue;
    if (w.residency_age_ms < 0) known = false;
    auto it = w.residency.find(layer);
    if (it == w.residency.end()) continue;
    for (uint32_t e : it->second.cached)
      if (e < num_experts && tiers[e] != 'P' && tiers[e] != 'V') tiers[e] = 'L';
    for (uint32_t e : it->second.pinned)
      if (e < num_experts && tiers[e] != 'V') tiers[e] = 'P';
    for (uint32_t e : it->second.vram)
      if (e < num_experts) tiers[e] = 'V';
  }
  if (!known) std::replace(tiers.begin(), tiers.end(), 'D', '?');
  return tiers;
}

json dashboard_state(const DashboardInputs& in) {
  json workers = json::array();
  for (const WorkerStatus& w : in.workers) workers.push_back(worker_json(w, in.metrics));
  return {{"version", kDashboardStateVersion},
          {"model", in.model},
          {"uptime_s", in.uptime_s},
          {"workers", workers},
          {"totals", totals_json(in)},
          {"load", load_json(in.load)},
          {"heat", heat_json(in)}};
}

}  // namespace charm
