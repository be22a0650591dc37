// The activation between a routed expert's gate/up and down projections: the one place
// that knows it, used by the worker's kernel (worker/experts/swiglu_batch.h) for every
// family, so every worker and the single-node path compute it identically.
#pragma once

#include <algorithm>
#include <cmath>

#include "common/kernels.h"

namespace charm {

/// Which gated activation an expert applies to its gate g and up u (per feature, f32).
struct ExpertActivation {
  enum class Kind {
    kSwiglu,         ///< silu(g) * u (Qwen3MoeMLP, OlmoeMLP, MixtralBlockSparseTop2MLP, ...)
    kClampedSwiglu,  ///< GptOssExperts._apply_gate: g = min(g, limit), u = clamp(u, -limit,
                     ///< limit), (u + 1) * g * sigmoid(g * alpha)
  };
  Kind kind = Kind::kSwiglu;
  float alpha = 1.702f;  ///< GptOssConfig.swiglu_alpha
  float limit = 7.0f;    ///< GptOssConfig.swiglu_limit

  bool operator==(const ExpertActivation&) const = default;

  /// The activation of one feature, in f32 in the order the modeling files write it.
  float operator()(float g, float u) const {
    if (kind == Kind::kSwiglu) return silu(g) * u;
    g = std::min(g, limit);
    u = std::clamp(u, -limit, limit);
    const float glu = g * (1.0f / (1.0f + std::exp(-(g * alpha))));
    return (u + 1.0f) * glu;
  }
};

}  // namespace charm
