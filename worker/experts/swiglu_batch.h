// The routed experts' MLP over a layer's batch-union: for every expert, all the rows it
// was assigned at once, y = down_proj(act(gate_proj(x), up_proj(x))) (SwiGLU, as
// Qwen3MoeMLP / OlmoeMLP, or gpt-oss's clamped SwiGLU: common/expert_activation.h; each
// projection + its bias where the expert has one, GptOssExperts), as GEMMs (common/matmul.h) rather than one GEMV chain per row.
// Each output row has common/matmul.h's bits, so it does not depend on which other rows
// or experts shared the call, nor on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/expert_activation.h"
#include "worker/experts/expert_layout.h"

namespace charm {

/// One expert's share of a batch-union: `rows` rows of x [rows, hidden] (gathered, row-
/// major) in, y [rows, hidden] out. `weights` has gate and up [intermediate, hidden]
/// and down [hidden, intermediate].
struct SwigluJob {
  const ExpertView* weights = nullptr;
  const float* x = nullptr;
  size_t rows = 0;
  float* y = nullptr;
};

/// Computes every job. One OpenMP parallel region for them all: first work items of
/// (job, tile of intermediate features) compute gate, up and silu(gate) * up for that
/// tile, then items of (job, tile of hidden features) compute down. Flat items keep both
/// cores busy whether a layer brings 8 experts of 1 row (decode) or a few experts of
/// many rows (prefill). Serial below a size where waking threads costs more than it
/// saves. Throws Error(kInvalidInput) for a weight view matmul cannot read (before any
/// thread starts) and CHARM_KERNELS' errors (common/matmul.h).
void swiglu_batch(const std::vector<SwigluJob>& jobs, int64_t hidden, int64_t intermediate,
                  const ExpertActivation& activation = {});

}  // namespace charm
