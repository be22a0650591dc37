#include "coordinator/models/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace charm {
namespace {

/// Inverse dimension formula: the dim whose wavelength makes `num_rotations` turns over
/// `max_position_embeddings` positions (find_correction_dim).
double correction_dim(double num_rotations, double dim, double base, double max_position_embeddings) {
  return (dim * std::log(max_position_embeddings / (num_rotations * 2 * std::numbers::pi))) / (2 * std::log(base));
}

}  // namespace

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

YarnFrequencies yarn_frequencies(size_t dim, double theta, const YarnRopeScaling& yarn) {
  YarnFrequencies out;
  const double factor = yarn.factor;
  if (yarn.attention_factor) {
    out.attention_factor = *yarn.attention_factor;
  } else if (yarn.mscale != 0 && yarn.mscale_all_dim != 0) {
    out.attention_factor = yarn_get_mscale(factor, yarn.mscale) / yarn_get_mscale(factor, yarn.mscale_all_dim);
  } else {
    out.attention_factor = yarn_get_mscale(factor, 1.0);
  }
  // find_correction_range, in Python floats.
  const double d = static_cast<double>(dim);
  const double orig = static_cast<double>(yarn.original_max_position_embeddings);
  double low = correction_dim(yarn.beta_fast, d, theta, orig);
  double high = correction_dim(yarn.beta_slow, d, theta, orig);
  if (yarn.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, d - 1);
  if (low == high) high += 0.001;  // linear_ramp_factor: prevent a singularity
  // The torch part in f32: pos_freqs = base ** (arange(0, dim, 2) / dim), ramp over dim/2.
  const size_t half = dim / 2;
  out.inv_freq.resize(half);
  const float base = static_cast<float>(theta);
  const float factor_f = static_cast<float>(factor);
  const float low_f = static_cast<float>(low);
  const float span_f = static_cast<float>(high - low);
  for (size_t i = 0; i < half; ++i) {
    const float pos_freq = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor_f * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - low_f) / span_f, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    out.inv_freq[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return out;
}

double yarn_softmax_scale_factor(const ModelConfig& config) {
  if (!config.yarn || config.yarn->mscale_all_dim == 0) return 1.0;
  const double m = yarn_get_mscale(config.yarn->factor, config.yarn->mscale_all_dim);
  return m * m;
}

Rope make_rope(const ModelConfig& config) {
  const RopeLayout layout = config.rope_interleave ? RopeLayout::kInterleaved : RopeLayout::kHalves;
  const auto dim = static_cast<size_t>(config.rotary_dim());
  if (!config.yarn) return Rope(dim, config.rope_theta, layout);
  YarnFrequencies f = yarn_frequencies(dim, config.rope_theta, *config.yarn);
  return Rope(std::move(f.inv_freq), static_cast<float>(f.attention_factor), layout);
}

}  // namespace charm
