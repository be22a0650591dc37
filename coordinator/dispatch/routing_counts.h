// How often each routed expert was chosen over the server's life, per MoE layer: the
// counts behind the dashboard's heat map (GET /dashboard/state, docs/api.md).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "common/moe_types.h"

namespace charm {

/// Per (MoE layer, expert): the number of (token position, expert) assignments routed to
/// it, summed over every forward pass since start (prefill and decode rows alike; a
/// position that picks an expert counts once for it). Cumulative, never reset.
/// Thread-safety: add() and snapshot() may be called from any thread (one mutex).
class RoutingCounts {
 public:
  /// Starts every layer of `layers` with `num_experts` zero counts, so that a layer seen
  /// by no request yet is there too.
  RoutingCounts(const std::vector<uint32_t>& layers, uint32_t num_experts);

  /// Counts one MoE layer's assignments. A layer or expert outside the shape given at
  /// construction is counted too (the layer's row grows), never refused: counting must
  /// not fail a forward pass.
  void add(uint32_t layer, const std::vector<ExpertAssignment>& assignments);

  /// Layer -> counts indexed by expert id (every row at least num_experts long).
  std::map<uint32_t, std::vector<uint64_t>> snapshot() const;

 private:
  mutable std::mutex mutex_;
  uint32_t num_experts_;
  std::map<uint32_t, std::vector<uint64_t>> counts_;
};

}  // namespace charm
