// RoPE as a config asks for it: plain, or YaRN-scaled (https://arxiv.org/abs/2309.00071)
// as transformers computes it in modeling_rope_utils._compute_yarn_parameters, with
// DeepSeek-V3's softmax-scale correction (modeling_deepseek_v3.py: yarn_apply_mscale).
#pragma once

#include <vector>

#include "common/model_config.h"
#include "coordinator/models/blocks.h"

namespace charm {

/// YaRN's inverse frequencies [dim / 2] and cos/sin scale (attention_factor).
struct YarnFrequencies {
  std::vector<float> inv_freq;
  double attention_factor = 1.0;
};

/// _compute_yarn_parameters for rotary dim `dim` (even) and base `theta`: frequencies
/// interpolated by `factor` below the correction range [low, high] found from beta_fast /
/// beta_slow and original_max_position_embeddings, extrapolated above it, blended by a
/// linear ramp; attention_factor = the explicit one, else
/// get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both are set,
/// else get_mscale(factor). f32 where torch uses f32 tensors, double where Python floats.
YarnFrequencies yarn_frequencies(size_t dim, double theta, const YarnRopeScaling& yarn);

/// 0.1 * mscale * ln(scale) + 1 for scale > 1, else 1 (yarn_get_mscale).
double yarn_get_mscale(double scale, double mscale);

/// The factor DeepSeek-V3 multiplies its softmax scale qk_head_dim^-0.5 by:
/// yarn_get_mscale(factor, mscale_all_dim)^2 under YaRN with mscale_all_dim != 0, else 1.
double yarn_softmax_scale_factor(const ModelConfig& config);

/// The Rope of `config`: dim rotary_dim() (head_dim unless partial_rotary_factor < 1),
/// rope_theta, YaRN when config.yarn is set, the interleaved layout when
/// config.rope_interleave.
Rope make_rope(const ModelConfig& config);

}  // namespace charm
