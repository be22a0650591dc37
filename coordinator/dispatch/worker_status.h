// What the coordinator knows of each worker, for `charm status`, /cluster/status and
// /metrics: the state of a worker as one enum, its text only at the edges (JSON, the
// status table, log lines), and the per-worker status record.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "common/moe_types.h"

namespace charm {

/// A worker as the coordinator sees it. Text forms (worker_state_name): "up", "suspect",
/// "down", "in-process"; they are what /cluster/status and `charm status` print.
enum class WorkerState {
  kUp,         ///< connected and answering
  kSuspect,    ///< a probe of it is unanswered (a layer reply of it is late)
  kDown,       ///< failed, until it rejoins (handshake passed again)
  kInProcess,  ///< single-node mode: the experts run in the coordinator's process
};

/// The text form of `state` ("up", "suspect", "down", "in-process"). Pure; never throws.
const char* worker_state_name(WorkerState state);

/// The state named `name` (worker_state_name's inverse). Throws Error(kProtocol) naming
/// `name` and the accepted names for any other text (a coordinator's JSON, read back).
WorkerState parse_worker_state(std::string_view name);

/// True when `state`'s text form is `name`: lets a check read `status.state == "up"`.
inline bool operator==(WorkerState state, std::string_view name) { return worker_state_name(state) == name; }

/// What the coordinator knows of one worker, for `charm status` and /cluster/status.
struct WorkerStatus {
  std::string name;
  std::string address;             ///< host:port ("in-process" in single-node mode)
  WorkerState state = WorkerState::kDown;
  uint64_t experts_held = 0;
  uint64_t requests = 0;           ///< layer requests sent
  double rtt_p50_ms = 0;           ///< round trip of layer requests, as the coordinator saw it
  double rtt_p99_ms = 0;
  uint64_t bytes_out = 0;          ///< bytes the coordinator sent to this worker
  uint64_t bytes_in = 0;           ///< bytes received from it
  // Resilience (cluster mode; zero / empty elsewhere).
  uint64_t failovers = 0;          ///< times it failed mid-layer and its share went to a replica
                                   ///< (or the layer failed for want of one); the same count
                                   ///< is exported as charm_worker_failovers_total
  uint64_t rejoins = 0;            ///< times it came back (handshake passed) after being down
  double last_seen_ms = -1;        ///< ms since its last reply (layer, heartbeat, hello); -1 never
  bool slow = false;               ///< layer RTT p50 over timeouts.slow_ms, or 4x the others' median
  std::string slow_reason;         ///< both numbers, when slow
  std::string last_error;          ///< why it last went down or failed to rejoin; empty if never
  /// (layer, expert) pairs held per tier ("ram", "disk"; "vram" reserved), from the
  /// worker's tier counters (split_by_tier); empty while the coordinator has not had a
  /// health reply from this worker since it (re)connected.
  std::map<std::string, uint64_t> experts_by_tier;
  /// The expert-tier counters per MoE layer: the in-process store's now, a remote
  /// worker's from its last health reply (as residency_age_ms); empty before one.
  std::map<uint32_t, TierCounters> tier_layers;
  /// Per MoE layer, which of its experts are in RAM (pinned, or in an LRU slot); an owned
  /// expert in neither list is on disk. The in-process store's now, a remote worker's
  /// from its last health reply; empty before one (or from a worker that predates it).
  std::map<uint32_t, LayerResidency> residency;
  /// How old tier_layers and residency are, ms: the time since the health reply they came
  /// from (heartbeats come every timeouts.heartbeat_ms); 0 in-process; -1 none yet.
  double residency_age_ms = -1;
  // Wire cost per token (issue 17; last, so positional initialisers above keep working).
  uint64_t layer_bytes_out = 0;    ///< of bytes_out: layer request frames alone (no health, hints)
  uint64_t layer_bytes_in = 0;     ///< of bytes_in: layer reply frames alone
  uint64_t token_layers = 0;       ///< positions the coordinator has run through MoE layers
                                   ///< since start, summed over layers (every worker alike)
  uint32_t moe_layers = 0;         ///< MoE layers of the model (placement map)
};

/// Layer-frame bytes per token per MoE layer: `layer_bytes` / s.token_layers (0 before
/// any). The wire cost of one position on one layer, the issue-17 figure. Pure.
inline double bytes_per_token_layer(uint64_t layer_bytes, const WorkerStatus& s) {
  return s.token_layers ? static_cast<double>(layer_bytes) / static_cast<double>(s.token_layers) : 0.0;
}

/// Layer-frame bytes per token through the whole model: bytes_per_token_layer times the
/// MoE layers (a token crosses each once). Pure.
inline double bytes_per_token(uint64_t layer_bytes, const WorkerStatus& s) {
  return bytes_per_token_layer(layer_bytes, s) * s.moe_layers;
}

/// Experts per tier from a worker's counts: `experts_held` (layer, expert) pairs,
/// `ram_slots` RAM expert slots (HealthReply.slots: pinned + LRU over all layers) and
/// `vram_experts` experts in its VRAM tier now (vram_experts_of its residency).
/// "vram": the VRAM experts (left out when there are none); of the rest, "ram": all of
/// them when each has a RAM slot of its own (no budget, or one that holds them all) and
/// when ram_slots is 0 (a service that keeps no tiers holds everything in RAM), else
/// ram_slots, with "disk" the remainder: at most ram_slots are resident at once and the
/// rest is read from disk on a miss. "ram" counts the slots, not which of them are filled
/// at this moment (workers do not send that).
inline std::map<std::string, uint64_t> split_by_tier(uint64_t experts_held, uint64_t ram_slots,
                                                     uint64_t vram_experts = 0) {
  const uint64_t vram = std::min(vram_experts, experts_held);
  const uint64_t rest = experts_held - vram;
  std::map<std::string, uint64_t> out;
  if (vram) out["vram"] = vram;
  if (ram_slots == 0 || ram_slots >= rest) {
    out["ram"] = rest;
  } else {
    out["ram"] = ram_slots;
    out["disk"] = rest - ram_slots;
  }
  return out;
}

/// The experts a residency report puts in VRAM, over all layers.
inline uint64_t vram_experts_of(const std::map<uint32_t, LayerResidency>& residency) {
  uint64_t n = 0;
  for (const auto& [layer, r] : residency) n += r.vram.size();
  return n;
}

}  // namespace charm
