// How the coordinator gets routed-expert outputs for one MoE layer: in-process
// (single-node mode) or from the workers that own the experts (cluster mode).
#pragma once

#include <cstdint>
#include <vector>

#include "common/moe_types.h"
#include "coordinator/dispatch/worker_status.h"

namespace charm {

/// Runs routed experts for the coordinator and sums their router-weighted outputs per
/// position in fixed point (common/fixed_point.h): for every row r, sums[r] becomes the
/// fixed_add over r's assignments of to_fixed(weight * expert(hidden[r])), each product
/// exactly as ExpertExecutor::run_into computes it. Integer addition is associative, so
/// these are the same integers whichever workers computed which assignments and in
/// whatever order their partial sums arrive (docs/architecture.md).
/// A layer is started with begin_layer and completed with finish_layer, so the caller can
/// compute something else (a shared expert) while remote workers are busy.
/// Up to kMaxLayersInFlight layers may be begun and not yet finished (ping-pong
/// micro-batches: one half's experts run while the other half's attention does);
/// finish_layer completes them in the order they were begun.
/// Thread-safety: the engine loop is the only caller.
inline constexpr size_t kMaxLayersInFlight = 2;

class ExpertDispatcher {
 public:
  virtual ~ExpertDispatcher() = default;

  /// Starts the routed experts of one MoE layer. hidden: [num_rows, hidden_size] f32;
  /// sums: [num_rows, hidden_size] int64, set to 0 (here, or in finish_layer before any
  /// term) and accumulated with fixed_add as partial sums arrive (each worker's reply is added whole, once, only when complete and
  /// valid, so a failed-over share is never counted twice). Each row may have at most
  /// kMaxTermsPerRow assignments. Cluster mode sends the requests and returns; in-process
  /// mode may defer the work to finish_layer. `hidden`, `assignments` and `sums` must stay
  /// valid and unchanged until its finish_layer returns. A begin_layer while
  /// kMaxLayersInFlight layers are unfinished first drops them all (drop_unfinished). Throws
  /// Error(kInvalidInput) for a layer or expert the placement does not have, or a row
  /// with too many assignments; worker failures may surface here or in finish_layer.
  virtual void begin_layer(uint32_t layer, const float* hidden, uint32_t num_rows, uint32_t hidden_size,
                           const std::vector<ExpertAssignment>& assignments, int64_t* sums) = 0;

  /// Waits for the oldest unfinished layer; its `sums` are complete on return.
  /// Throws Error(kUnavailable) naming the layer, experts and workers when a failed or
  /// timed-out worker's share cannot be served by a replica (then `sums` holds only
  /// part of the layer and must not be used), Error(kInternal) without a begun layer.
  virtual void finish_layer() = 0;

  /// Forgets every unfinished layer (a forward pass that threw left them): their results
  /// are dropped, and the next finish_layer is for a layer begun after this. Call at the
  /// start of every forward pass.
  virtual void drop_unfinished() = 0;

  /// begin_layer then finish_layer.
  void run_layer(uint32_t layer, const float* hidden, uint32_t num_rows, uint32_t hidden_size,
                 const std::vector<ExpertAssignment>& assignments, int64_t* sums) {
    begin_layer(layer, hidden, num_rows, hidden_size, assignments, sums);
    finish_layer();
  }

  /// Fire-and-forget prefetch hint: `experts` (ascending) of MoE layer `layer` are
  /// predicted for a coming begin_layer. Call it just before the begin_layer it should
  /// travel with (the layer before `layer`): the hint goes with that layer's work, and the
  /// experts' owners start reading them once that layer's own reads are queued, while they
  /// compute it, so the reads overlap a whole layer. Never changes any output and never
  /// throws for a worker that cannot take it (the hint is dropped). The default drops
  /// every hint.
  virtual void hint_layer(uint32_t /*layer*/, const std::vector<uint32_t>& /*experts*/) {}

  /// Whether the model should compute predictions for hint_layer at all (prefetch on, or
  /// a routing trace that records them). Plain dispatchers say no; see RoutingObserver.
  virtual bool wants_hints() const { return false; }

  /// Per-worker view for status; in-process mode reports one "in-process" entry.
  virtual std::vector<WorkerStatus> status() const = 0;
};

}  // namespace charm
