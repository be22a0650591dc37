// Runs a layer's batch-union on the experts a worker holds: for every assignment
// (row, expert, weight), y = down_proj(silu(gate_proj(x)) * up_proj(x)) (SwiGLU, as
// Qwen3MoeMLP / OlmoeMLP), added to row's fixed-point sum as weight * y
// (common/fixed_point.h). Experts in the VRAM tier compute on the device while the CPU
// computes the rest; of those, experts already resident are computed first while
// the missing ones are read (worker/experts/expert_store.h); the rows sharing an expert are one
// GEMM (worker/experts/swiglu_batch.h). Each output row has the same bits whatever else is in
// the batch and whichever tier held the expert, so results are bit-identical across
// topologies and budgets, and the integer sums make any split of a row's experts over
// workers add up to the same bits.
#pragma once

#include <functional>

#include "common/moe_types.h"
#include "worker/experts/expert_store.h"

namespace charm {

class ExpertExecutor {
 public:
  explicit ExpertExecutor(const ExpertStore& store) : store_(store) {}

  /// Computes every assignment of `request`; outputs are [num_rows, hidden] int64 sums.
  /// Its prefetch, if any, is started as run_into's `after_fetch` (start_prefetch).
  /// Throws Error(kInvalidInput) naming the layer and expert when an assignment names an
  /// expert this store does not hold, a row out of range or with more than
  /// kMaxTermsPerRow assignments, or when hidden_size / hidden.size() disagree with the
  /// store; Error(kIo) when an expert cannot be read from disk.
  LayerResponse run(const LayerRequest& request) const;

  /// Same, ADDING each row's terms into `sums` ([num_rows, hidden] int64 fixed point,
  /// fixed_add) directly, for the in-process path and the in-place reply. A row no
  /// assignment names is left as it was. stats.saturated counts clamped terms.
  /// `after_fetch` (when set) is called once, right after this layer's reads are queued
  /// and before any expert computes: the place to start the next layer's prefetch, so
  /// its reads queue behind this layer's and overlap its compute. It must not throw.
  LayerStats run_into(uint32_t layer, const float* hidden, uint32_t num_rows,
                       const std::vector<ExpertAssignment>& assignments, int64_t* sums,
                       const std::function<void()>& after_fetch = {}) const;

  /// Starts the store's prefetch of `hint` (ExpertStore::prefetch); a hint is advice, so
  /// a failure is logged and dropped, never thrown.
  void start_prefetch(const PrefetchHintMsg& hint) const noexcept;

  const ExpertStore& store() const { return store_; }

 private:
  const ExpertStore& store_;
};

}  // namespace charm
