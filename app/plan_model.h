// `charm plan`'s arithmetic: from what the topology places where, what fits in each
// worker's RAM, how the routing mass is spread over the experts, and measured (or
// assumed) bandwidths and round trips, the expected time of one decode token of one
// stream and which resource bounds it. Pure functions of their inputs: no probes, no
// files, no clock (app/plan.cpp gathers the inputs; tests inject them). The formula is
// docs/architecture.md, "Planning a cluster: charm plan".
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace charm {

/// One owned expert of one MoE layer as the plan sees it.
struct PlanExpert {
  uint32_t expert = 0;
  /// Fraction of the layer's routing mass this worker receives for the expert: the
  /// expert's share of the layer's selections (usage count / layer total, or 1/E when
  /// uniform) divided by the number of replicas holding it (the coordinator spreads a
  /// replicated expert's rows over its live replicas).
  double mass = 0;
  bool in_ram = false;  ///< pinned, or one of the LRU slots' expected residents
};

/// Measured or assumed rates of one machine. Units: GB/s are 1e9 bytes per second.
struct MachineRates {
  double memory_gb_per_s = 0;  ///< bytes an expert GEMV streams from RAM per second
  double disk_gb_per_s = 0;    ///< bytes a miss reads from the disk tier per second
};

/// The link from the coordinator to a worker.
struct LinkRates {
  double rtt_ms = 0;             ///< one small round trip (health request), ms
  double bandwidth_gb_per_s = 0; ///< payload bytes per second each way
};

/// Frame bytes of one decode layer request/reply (common/wire.h's encoders): the
/// request carries one hidden row (hidden_size f32) plus the assignments; the reply one
/// int64 fixed-point row of hidden_size per position (protocol 4), whatever number of
/// experts it used.
struct WireSizes {
  double request_bytes = 0;           ///< one row, no assignments
  double request_bytes_per_expert = 0;  ///< each further assignment
  double reply_bytes = 0;             ///< the one-row reply
  double reply_bytes_per_expert = 0;  ///< 0 since protocol 4 (kept for the JSON's shape)
};

/// Everything the plan needs about one worker (single-node mode: one entry, no network).
struct WorkerPlanInput {
  std::string name;
  uint64_t expert_bytes = 0;  ///< mean bytes of one of its experts (what a GEMV streams)
  std::map<uint32_t, std::vector<PlanExpert>> layers;  ///< MoE layer -> owned experts
  MachineRates machine;
  std::optional<LinkRates> link;  ///< nullopt: in-process (single-node), no network cost
};

/// The whole model's inputs.
struct PlanInput {
  int64_t top_k = 0;           ///< experts per token per MoE layer (num_experts_per_tok)
  uint64_t dense_bytes = 0;    ///< coordinator bytes read per token (every tensor but the
                               ///< routed experts and the input embedding table)
  MachineRates coordinator;    ///< the coordinator's machine (its memory bandwidth)
  WireSizes wire;
  std::vector<WorkerPlanInput> workers;
};

/// One worker's expected share of one decode token, summed over the MoE layers.
/// Times in seconds; counts are expectations per token.
struct WorkerPlan {
  std::string name;
  double experts_per_token = 0;  ///< top_k * mass held, summed over layers
  double hit_rate = 0;           ///< mass in RAM / mass held (1 when it holds no mass)
  double contact_probability = 0;  ///< mean over layers of P(at least one of top_k lands here)
  double memory_s = 0;   ///< touched expert bytes / memory bandwidth
  double disk_s = 0;     ///< missed expert bytes / disk bandwidth
  double network_s = 0;  ///< P(contact) * (RTT + request and reply bytes / link bandwidth)
  /// The mean layer round trip the coordinator would measure for this worker
  /// (charm_worker_rpc_seconds): per contacted layer, RTT + transfer + memory + disk of
  /// the experts it gets given that it was contacted. Seconds; 0 without a link.
  double layer_round_trip_s = 0;
};

/// The prediction.
struct PlanResult {
  std::vector<WorkerPlan> workers;
  double compute_s = 0;   ///< coordinator dense part: dense_bytes / coordinator memory bandwidth
  // Per token, summed over MoE layers, the components of the slowest worker of each
  // layer (workers of one layer run in parallel; the coordinator waits for the last).
  double memory_s = 0;
  double disk_s = 0;
  double network_s = 0;
  double token_s = 0;     ///< compute_s + sum over layers of the slowest worker's time
  double tokens_per_s = 0;  ///< 1 / token_s (0 when token_s is 0)
  double hit_rate = 0;    ///< mass in RAM / total mass, over every worker and layer
  std::string bottleneck; ///< "compute", "memory", "disk" or "network": the largest part
};

/// The formula predict() computes, as the --json output and docs/architecture.md state it.
inline constexpr const char* kPlanFormula =
    "per MoE layer l and worker w holding routing mass m (h of it in RAM): k = top_k*m experts touched, "
    "p = 1-(1-m)^top_k chance it is asked at all; t(w,l) = k*expert_bytes/mem_bw + top_k*(m-h)*expert_bytes/disk_bw "
    "+ p*(rtt + (request_bytes + reply_bytes of k/p experts)/link_bw); "
    "token_s = dense_bytes/coordinator_mem_bw + sum over l of max over w of t(w,l); tokens_per_s = 1/token_s";

/// Computes the prediction. Per MoE layer l and worker w holding mass m (sum of its
/// experts' mass) of which h is in RAM:
///   experts touched  k = top_k * m (hits top_k * h, misses top_k * (m - h)),
///   P(contact)       p = 1 - (1 - m)^top_k,
///   t_w,l = k * expert_bytes / mem_bw + top_k * (m - h) * expert_bytes / disk_bw
///           + p * (rtt + (request + reply bytes for k/p experts) / link_bw),
///   token = dense_bytes / coordinator mem_bw + sum_l max_w t_w,l.
/// Throws Error(kInvalidInput) for top_k < 1, a mass outside [0, 1], and a bandwidth
/// that is not > 0 where it is needed (naming the worker and the rate).
PlanResult predict(const PlanInput& input);

/// Hit rate of one worker's layer: mass in RAM / mass held; 1 for no mass. Pure.
double layer_hit_rate(const std::vector<PlanExpert>& experts);

/// Marks which experts of one layer are expected in RAM: every `pinned` one, then the
/// `lru_slots` heaviest of the rest (ties to the lower id): in steady state an LRU holds
/// about the most used experts, so this is an upper bound on what LRU achieves.
void mark_resident(std::vector<PlanExpert>& experts, const std::vector<uint32_t>& pinned, size_t lru_slots);

/// The name of the largest of the four parts (ties: the order compute, memory, disk,
/// network). Pure.
std::string bottleneck_of(double compute_s, double memory_s, double disk_s, double network_s);

/// The prediction as JSON (docs/configuration.md, "charm plan --json"): token_s,
/// tokens_per_s, bottleneck, hit_rate, parts {compute_s, memory_s, disk_s, network_s},
/// workers [{name, experts_per_token, hit_rate, contact_probability, memory_s, disk_s,
/// network_s, layer_round_trip_s}].
nlohmann::json prediction_json(const PlanResult& result);

}  // namespace charm
