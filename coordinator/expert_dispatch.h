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
  double last_seen_s = -1;         ///< seconds since the coordinator last heard from it
                                   ///< (handshake or reply); -1: never
  uint64_t failovers = 0;          ///< requests moved off this worker to a replica
  /// (layer, expert) pairs held per tier ("vram", "ram", "disk"); workers report no tiers
  /// yet, so this is {"ram": experts_held} until the tier statistics reach the wire.
  std::map<std::string, uint64_t> experts_by_tier;
};

/// Runs routed experts for the coordinator. Implementations must return exactly the
/// bytes ExpertExecutor::run_into produces for each assignment.
/// Thread-safety: one run_layer at a time (the engine serialises generation).
class ExpertDispatcher {
 public:
  virtual ~ExpertDispatcher() = default;

  /// For each assignments[i] = (row, expert), writes expert(hidden[row]) to
  /// outputs[i * hidden_size .. +hidden_size). hidden: [num_rows, hidden_size] f32.
  /// Throws Error(kUnavailable) naming the worker when one fails or times out, and
  /// Error(kProtocol) on a malformed reply.
  virtual void run_layer(uint32_t layer, const float* hidden, uint32_t num_rows,
                         uint32_t hidden_size, const std::vector<ExpertAssignment>& assignments,
                         float* outputs) = 0;

  /// Per-worker view for status; in-process mode reports one "in-process" entry.
  virtual std::vector<WorkerStatus> status() const = 0;
};

}  // namespace charm
