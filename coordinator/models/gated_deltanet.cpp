#include "coordinator/models/gated_deltanet.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include <fmt/format.h>

#include "common/error.h"
#include "common/kernels.h"

namespace charm {

namespace {

/// F.softplus with beta 1 and threshold 20: log(1 + exp(x)), x itself above 20.
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

/// l2norm of transformers' Qwen3-Next (FLA's): x * rsqrt(sum(x^2) + 1e-6), then times `scale`.
void l2_normalise(const float* x, size_t n, float scale, float* y) {
  float sum = 0.0f;
  for (size_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum + 1e-6f);
  for (size_t i = 0; i < n; ++i) y[i] = x[i] * inv / scale;
}

/// Whether the checkpoint holds "<prefix>.<form>" (true) or the `others` (false), which
/// store the same weights another way (fused or apart, A or A_log). Throws
/// Error(kInvalidInput) naming both tensors and files when it holds both: which of the two
/// to serve is not charm's to guess.
bool holds_form(const Checkpoint& ckpt, const std::string& prefix, const std::string& form,
                std::initializer_list<const char*> others) {
  const TensorInfo* one = ckpt.find(prefix + "." + form);
  if (one == nullptr) return false;
  for (const char* name : others) {
    if (const TensorInfo* other = ckpt.find(prefix + "." + name)) {
      fail_invalid(one->file.string() + ": tensor '" + one->name + "' and " + other->file.string() + ": tensor '" +
                   other->name + "' are two forms of the same weights; a checkpoint holds one form");
    }
  }
  return true;
}

}  // namespace

size_t GatedDeltaNet::state_floats(const ModelConfig& config) {
  const size_t key_dim = static_cast<size_t>(config.linear_num_key_heads * config.linear_key_head_dim);
  const size_t value_dim = static_cast<size_t>(config.linear_num_value_heads * config.linear_value_head_dim);
  const size_t conv = static_cast<size_t>(config.linear_conv_kernel_dim - 1) * (2 * key_dim + value_dim);
  return conv + static_cast<size_t>(config.linear_num_value_heads * config.linear_key_head_dim *
                                    config.linear_value_head_dim);
}

GatedDeltaNet GatedDeltaNet::load(const Checkpoint& ckpt, const std::string& prefix, const ModelConfig& config,
                                  size_t state_offset) {
  GatedDeltaNet d;
  d.k_heads_ = static_cast<size_t>(config.linear_num_key_heads);
  d.v_heads_ = static_cast<size_t>(config.linear_num_value_heads);
  d.dk_ = static_cast<size_t>(config.linear_key_head_dim);
  d.dv_ = static_cast<size_t>(config.linear_value_head_dim);
  d.kernel_ = static_cast<size_t>(config.linear_conv_kernel_dim);
  d.v_heads_tiled_ = config.linear_value_heads_tiled;
  d.key_dim_ = d.k_heads_ * d.dk_;
  d.value_dim_ = d.v_heads_ * d.dv_;
  d.conv_dim_ = 2 * d.key_dim_ + d.value_dim_;
  d.state_offset_ = state_offset;
  d.norm_eps_ = static_cast<float>(config.rms_norm_eps);
  const size_t h = config.hidden_size;
  // Qwen3-Next fuses q, k, v, z and b, a per key head; Qwen3.5-MoE has one projection
  // each; a Qwen3-Next GGUF by today's converter has q, k, v and z apart but b, a fused.
  if (holds_form(ckpt, prefix, "in_proj_qkvz.weight", {"in_proj_qkv.weight", "in_proj_z.weight"})) {
    d.in_proj_qkvz_ = Linear::load(ckpt, prefix + ".in_proj_qkvz", 2 * d.key_dim_ + 2 * d.value_dim_, h);
  } else {
    d.in_proj_qkv_ = Linear::load(ckpt, prefix + ".in_proj_qkv", d.conv_dim_, h);
    d.in_proj_z_ = Linear::load(ckpt, prefix + ".in_proj_z", d.value_dim_, h);
  }
  if (holds_form(ckpt, prefix, "in_proj_ba.weight", {"in_proj_b.weight", "in_proj_a.weight"})) {
    d.in_proj_ba_ = Linear::load(ckpt, prefix + ".in_proj_ba", 2 * d.v_heads_, h);
  } else {
    d.in_proj_b_ = Linear::load(ckpt, prefix + ".in_proj_b", d.v_heads_, h);
    d.in_proj_a_ = Linear::load(ckpt, prefix + ".in_proj_a", d.v_heads_, h);
  }
  d.out_proj_ = Linear::load(ckpt, prefix + ".out_proj", h, d.value_dim_);
  const auto n = [](size_t v) { return static_cast<int64_t>(v); };
  d.conv_weight_ = ckpt.load_f32(prefix + ".conv1d.weight", {n(d.conv_dim_), 1, n(d.kernel_)});
  if (holds_form(ckpt, prefix, "A", {"A_log"})) {  // a GGUF's ssm_a: -exp(A_log) as its converter computed it
    d.a_neg_exp_ = ckpt.load_f32(prefix + ".A", {n(d.v_heads_)});
    // -exp(x) is below zero for every finite x (-0 where it underflows); above zero the
    // state would grow without bound instead of decaying.
    for (size_t head = 0; head < d.a_neg_exp_.size(); ++head) {
      if (d.a_neg_exp_[head] > 0.0f) {
        const TensorInfo* a = ckpt.find(prefix + ".A");
        fail_invalid(fmt::format("{}: tensor '{}' holds {} at value head {}; it must be -exp(A_log), never above zero",
                                 a->file.string(), a->name, d.a_neg_exp_[head], head));
      }
    }
  } else {
    d.a_neg_exp_ = ckpt.load_f32(prefix + ".A_log", {n(d.v_heads_)});
    for (float& a : d.a_neg_exp_) a = -std::exp(a);
  }
  d.dt_bias_ = ckpt.load_f32(prefix + ".dt_bias", {n(d.v_heads_)});
  d.norm_weight_ = ckpt.load_f32(prefix + ".norm.weight", {n(d.dv_)});
  return d;
}

GatedDeltaNet::Projections GatedDeltaNet::project(const float* x, size_t rows) const {
  Projections p{std::vector<float>(rows * conv_dim_), std::vector<float>(rows * value_dim_),
                std::vector<float>(rows * v_heads_), std::vector<float>(rows * v_heads_)};
  project_qkvz(x, rows, p);
  project_ba(x, rows, p);
  return p;
}

// Per key head group g the fused projections hold [q | k | v (r heads) | z (r heads)] and
// [b (r) | a (r)] (fix_query_key_value_ordering); the separate ones are in place already.
void GatedDeltaNet::project_qkvz(const float* x, size_t rows, Projections& p) const {
  if (in_proj_qkvz_.out() == 0) {
    in_proj_qkv_(x, rows, p.mixed.data());
    in_proj_z_(x, rows, p.z.data());
    return;
  }
  std::vector<float> qkvz(rows * in_proj_qkvz_.out());
  in_proj_qkvz_(x, rows, qkvz.data());
  const size_t r = v_heads_ / k_heads_, group = 2 * dk_ + 2 * r * dv_;
  for (size_t row = 0; row < rows; ++row) {
    for (size_t g = 0; g < k_heads_; ++g) {
      const float* src = qkvz.data() + row * in_proj_qkvz_.out() + g * group;
      float* dst = p.mixed.data() + row * conv_dim_;
      std::copy(src, src + dk_, dst + g * dk_);
      std::copy(src + dk_, src + 2 * dk_, dst + key_dim_ + g * dk_);
      std::copy(src + 2 * dk_, src + 2 * dk_ + r * dv_, dst + 2 * key_dim_ + g * r * dv_);
      std::copy(src + 2 * dk_ + r * dv_, src + group, p.z.data() + row * value_dim_ + g * r * dv_);
    }
  }
}

void GatedDeltaNet::project_ba(const float* x, size_t rows, Projections& p) const {
  if (in_proj_ba_.out() == 0) {
    in_proj_b_(x, rows, p.b.data());
    in_proj_a_(x, rows, p.a.data());
    return;
  }
  std::vector<float> ba(rows * in_proj_ba_.out());
  in_proj_ba_(x, rows, ba.data());
  const size_t r = v_heads_ / k_heads_;
  for (size_t row = 0; row < rows; ++row) {
    for (size_t g = 0; g < k_heads_; ++g) {
      const float* src = ba.data() + row * in_proj_ba_.out() + g * 2 * r;
      std::copy(src, src + r, p.b.data() + row * v_heads_ + g * r);
      std::copy(src + r, src + 2 * r, p.a.data() + row * v_heads_ + g * r);
    }
  }
}

void GatedDeltaNet::operator()(const float* x, size_t rows, std::span<const SequenceRows> batch, float* out) const {
  Projections p = project(x, rows);
  std::vector<float> core(rows * value_dim_);
  for (const SequenceRows& seq : batch) {
    run_sequence(p.mixed.data() + seq.row0 * conv_dim_, p.b.data() + seq.row0 * v_heads_,
                 p.a.data() + seq.row0 * v_heads_, seq.cache->state() + state_offset_, seq.rows,
                 core.data() + seq.row0 * value_dim_);
  }
  // Qwen3NextRMSNormGated per value head: weight * norm(o) * silu(z).
  for (size_t i = 0; i < rows * v_heads_; ++i) {
    float* o = core.data() + i * dv_;
    const float* gate = p.z.data() + i * dv_;
    float sum = 0.0f;
    for (size_t j = 0; j < dv_; ++j) sum += o[j] * o[j];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(dv_) + norm_eps_);
    for (size_t j = 0; j < dv_; ++j) o[j] = norm_weight_[j] * (o[j] * inv) * silu(gate[j]);
  }
  out_proj_(core.data(), rows, out);
}

void GatedDeltaNet::run_sequence(float* mixed, const float* b, const float* a, float* state, size_t rows,
                                 float* core) const {
  float* conv_state = state;
  float* s = state + (kernel_ - 1) * conv_dim_;
  convolve(mixed, rows, conv_state);
  std::vector<float> beta(v_heads_), g(v_heads_);
  for (size_t row = 0; row < rows; ++row) {
    for (size_t h = 0; h < v_heads_; ++h) {
      beta[h] = sigmoid(b[row * v_heads_ + h]);
      g[h] = a_neg_exp_[h] * softplus(a[row * v_heads_ + h] + dt_bias_[h]);
    }
    const float* m = mixed + row * conv_dim_;
    step(m, m + key_dim_, m + 2 * key_dim_, beta.data(), g.data(), s, core + row * value_dim_);
  }
}

void GatedDeltaNet::convolve(float* mixed, size_t rows, float* conv_state) const {
  const size_t history = kernel_ - 1;
  // The inputs in time order: the previous kernel - 1 (the state), then these rows.
  std::vector<float> window((history + rows) * conv_dim_);
  std::copy(conv_state, conv_state + history * conv_dim_, window.begin());
  std::copy(mixed, mixed + rows * conv_dim_, window.begin() + static_cast<std::ptrdiff_t>(history * conv_dim_));
  for (size_t row = 0; row < rows; ++row) {
    for (size_t c = 0; c < conv_dim_; ++c) {
      float sum = 0.0f;
      for (size_t i = 0; i < kernel_; ++i) sum += conv_weight_[c * kernel_ + i] * window[(row + i) * conv_dim_ + c];
      mixed[row * conv_dim_ + c] = silu(sum);
    }
  }
  std::copy(window.end() - static_cast<std::ptrdiff_t>(history * conv_dim_), window.end(), conv_state);
}

void GatedDeltaNet::step(const float* q, const float* k, const float* v, const float* beta, const float* g, float* s,
                         float* o) const {
  const size_t r = v_heads_ / k_heads_;
  std::vector<float> qn(key_dim_), kn(key_dim_), delta(dv_);
  const float q_scale = std::sqrt(static_cast<float>(dk_));
  for (size_t kh = 0; kh < k_heads_; ++kh) {
    l2_normalise(q + kh * dk_, dk_, q_scale, qn.data() + kh * dk_);
    l2_normalise(k + kh * dk_, dk_, 1.0f, kn.data() + kh * dk_);
  }
  for (size_t h = 0; h < v_heads_; ++h) {
    const size_t key_head = v_heads_tiled_ ? h % k_heads_ : h / r;
    const float* qh = qn.data() + key_head * dk_;
    const float* kh = kn.data() + key_head * dk_;
    const float* vh = v + h * dv_;
    float* sh = s + h * dk_ * dv_;  // [dk, dv]
    const float decay = std::exp(g[h]);
    for (size_t i = 0; i < dk_ * dv_; ++i) sh[i] = sh[i] * decay;
    for (size_t j = 0; j < dv_; ++j) {
      float memory = 0.0f;  // (S^T k)_j
      for (size_t i = 0; i < dk_; ++i) memory += sh[i * dv_ + j] * kh[i];
      delta[j] = (vh[j] - memory) * beta[h];
    }
    for (size_t i = 0; i < dk_; ++i) {
      for (size_t j = 0; j < dv_; ++j) sh[i * dv_ + j] += kh[i] * delta[j];
    }
    for (size_t j = 0; j < dv_; ++j) {
      float sum = 0.0f;  // (S^T q)_j
      for (size_t i = 0; i < dk_; ++i) sum += sh[i * dv_ + j] * qh[i];
      o[h * dv_ + j] = sum;
    }
  }
}

}  // namespace charm
