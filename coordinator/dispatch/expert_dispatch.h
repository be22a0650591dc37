// How the coordinator gets routed-expert outputs for one MoE layer: in-process
// (single-node mode) or from the workers that own the experts (cluster mode).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/moe_types.h"

namespace charm {

/// What the coordinator knows of one worker, for `charm status` and /cluster/status.
struct WorkerStatus {
  std::string name;
  std::string address;             ///< host:port
  std::string state;               ///< "up", "down", "in-process"
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
  /// In-process experts only: the store's tier counters per MoE layer (a remote worker
  /// reports its own in healthReply).
  std::map<uint32_t, TierCounters> tier_layers;
};

/// Experts per tier from a worker's counts: `experts_held` (layer, expert) pairs and
/// `ram_slots` RAM expert slots (HealthReply.slots: pinned + LRU over all layers).
/// {"ram": experts_held} when every held expert has a slot of its own (no budget, or one
/// that holds them all), and when ram_slots is 0 (a service that keeps no tiers holds
/// everything in RAM); else {"ram": ram_slots, "disk": experts_held - ram_slots}: at most
/// ram_slots are resident at once and the rest is read from disk on a miss. "ram" counts
/// the slots, not which of them are filled at this moment (workers do not send that).
inline std::map<std::string, uint64_t> split_by_tier(uint64_t experts_held, uint64_t ram_slots) {
  if (ram_slots == 0 || ram_slots >= experts_held) return {{"ram", experts_held}};
  return {{"ram", ram_slots}, {"disk", experts_held - ram_slots}};
}

/// Runs routed experts for the coordinator. Implementations must return exactly the
/// bytes ExpertExecutor::run_into produces for each assignment.
/// A layer is started with begin_layer and completed with finish_layer, so the caller can
/// compute something else (a shared expert) while remote workers are busy.
/// Thread-safety: one layer at a time (the engine serialises generation).
class ExpertDispatcher {
 public:
  virtual ~ExpertDispatcher() = default;

  /// Starts the routed experts of one MoE layer: for each assignments[i] = (row, expert),
  /// expert(hidden[row]) is to be written to outputs[i * hidden_size .. +hidden_size).
  /// hidden: [num_rows, hidden_size] f32. Cluster mode sends the requests and returns;
  /// in-process mode may defer the work to finish_layer. `hidden`, `assignments` and
  /// `outputs` must stay valid and unchanged until finish_layer returns. A begin_layer
  /// while another layer is unfinished (its caller threw) first drains that layer and
  /// drops its results. Throws Error(kInvalidInput) for a layer or expert the placement
  /// does not have; worker failures may surface here or in finish_layer.
  virtual void begin_layer(uint32_t layer, const float* hidden, uint32_t num_rows, uint32_t hidden_size,
                           const std::vector<ExpertAssignment>& assignments, float* outputs) = 0;

  /// Waits for the layer started by the last begin_layer; `outputs` is complete on
  /// return. Throws Error(kUnavailable) naming the layer, experts and workers when a
  /// failed or timed-out worker's share cannot be served by a replica,
  /// Error(kInternal) without a begun layer.
  virtual void finish_layer() = 0;

  /// begin_layer then finish_layer.
  void run_layer(uint32_t layer, const float* hidden, uint32_t num_rows, uint32_t hidden_size,
                 const std::vector<ExpertAssignment>& assignments, float* outputs) {
    begin_layer(layer, hidden, num_rows, hidden_size, assignments, outputs);
    finish_layer();
  }

  /// Fire-and-forget prefetch hint: `experts` (ascending) of MoE layer `layer` are
  /// predicted for a coming begin_layer. Delivered after the layer in flight (if any), so
  /// a worker reads it once it has answered that layer. Never changes any output and
  /// never throws for a worker that cannot take it (the hint is dropped). The default
  /// drops every hint.
  virtual void hint_layer(uint32_t /*layer*/, const std::vector<uint32_t>& /*experts*/) {}

  /// Whether the model should compute predictions for hint_layer at all (prefetch on, or
  /// a routing trace that records them). Plain dispatchers say no; see RoutingObserver.
  virtual bool wants_hints() const { return false; }

  /// Per-worker view for status; in-process mode reports one "in-process" entry.
  virtual std::vector<WorkerStatus> status() const = 0;
};

}  // namespace charm
