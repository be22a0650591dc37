// Watches the routing decisions on their way to the experts: counts every expert's
// assignments (RoutingCounts, for the dashboard), counts how well prefetch
// hints predicted each MoE layer's experts (recall), optionally writes every layer's
// routing to a trace file for offline replay (scripts/replay_routing.py), and is the
// prefetch switch: hints reach the real dispatcher only when prefetch is on.
#pragma once

#include <cstdint>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/dispatch/expert_dispatch.h"
#include "coordinator/dispatch/routing_counts.h"

namespace charm {

/// How well the hints for one MoE layer predicted its batch-union, summed over steps.
/// recall = correct / actual (of the experts the layer used, the share hinted);
/// precision = correct / predicted (of the experts hinted, the share used).
struct PrefetchLayerStats {
  uint64_t steps = 0;      ///< begin_layer calls on this layer that had a hint
  uint64_t actual = 0;     ///< distinct experts those calls used, summed
  uint64_t predicted = 0;  ///< distinct experts hinted, summed
  uint64_t correct = 0;    ///< hinted and used, summed
  double recall() const { return actual ? static_cast<double>(correct) / static_cast<double>(actual) : 0.0; }
  double precision() const {
    return predicted ? static_cast<double>(correct) / static_cast<double>(predicted) : 0.0;
  }
};

/// What to do with the routing seen.
struct RoutingObserverOptions {
  bool prefetch = false;      ///< forward hints to the dispatcher (the `prefetch` YAML key)
  std::string trace_path;     ///< write a routing trace here (JSON lines); empty = none
};

/// An ExpertDispatcher decorator; every call reaches `inner` unchanged (outputs are the
/// inner dispatcher's bytes), hints only when options.prefetch.
///
/// Routing trace format (one JSON object per line, one line per begin_layer, in call
/// order; documented in docs/benchmarks.md):
///   {"step": S, "layer": L, "rows": R, "experts": [[e, ...], ...], "predicted": [e, ...]}
/// `step` counts forward passes (it grows when a layer id is not above the previous
/// one); `experts` holds each row's selected experts in rank order (the assignments as
/// the model built them); `predicted` (ascending) is present when a hint for this layer
/// came since the layer's last begin_layer.
/// Thread-safety: as ExpertDispatcher (one layer at a time); stats() from that thread.
class RoutingObserver final : public ExpertDispatcher {
 public:
  /// `moe_layers` and `num_experts` (the model's shape) give routing_counts its rows
  /// from the start. Throws Error(kIo) naming the file when the trace cannot be created.
  RoutingObserver(std::unique_ptr<ExpertDispatcher> inner, RoutingObserverOptions options,
                  const std::vector<uint32_t>& moe_layers = {}, uint32_t num_experts = 0);

  void begin_layer(uint32_t layer, const float* hidden, uint32_t num_rows, uint32_t hidden_size,
                   const std::vector<ExpertAssignment>& assignments, int64_t* sums) override;
  void finish_layer() override;
  void drop_unfinished() override;
  /// Remembers the prediction for recall and the trace; forwards it when prefetch is on.
  void hint_layer(uint32_t layer, const std::vector<uint32_t>& experts) override;
  /// True when prefetch is on or a trace is written.
  bool wants_hints() const override;
  std::vector<WorkerStatus> status() const override { return inner_->status(); }

  /// Per MoE layer: how the hints did so far.
  const std::map<uint32_t, PrefetchLayerStats>& prefetch_stats() const { return stats_; }
  /// All layers summed.
  PrefetchLayerStats prefetch_total() const;
  bool prefetch_enabled() const { return options_.prefetch; }
  /// Every expert's assignments since start; may be read from any thread.
  const RoutingCounts& routing_counts() const { return counts_; }

 private:
  void record(uint32_t layer, uint32_t num_rows, const std::vector<ExpertAssignment>& assignments,
              const std::vector<uint32_t>& used, const std::optional<std::vector<uint32_t>>& predicted);

  std::unique_ptr<ExpertDispatcher> inner_;
  RoutingObserverOptions options_;
  std::ofstream trace_;
  // layer -> its predictions not yet matched by a begin_layer, oldest first (one per
  // micro-batch in flight), each ascending
  std::map<uint32_t, std::deque<std::vector<uint32_t>>> hints_;
  std::map<uint32_t, PrefetchLayerStats> stats_;
  RoutingCounts counts_;
  int64_t step_ = -1;
  int64_t last_layer_ = -1;
};

/// |a ∩ b| for two ascending id lists.
uint64_t count_common(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b);

}  // namespace charm
