#include "coordinator/models/dsa_indexer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "coordinator/models/rope_scaling.h"

namespace charm {

namespace {

constexpr double kLayerNormEps = 1e-6;  // GlmMoeDsaIndexer's nn.LayerNorm(head_dim, eps=1e-6)

/// nn.LayerNorm over `n` floats in place: (x - mean) / sqrt(biased variance + eps) * w + b.
void layer_norm(float* x, size_t n, const std::vector<float>& weight, const std::vector<float>& bias) {
  float mean = 0.0f;
  for (size_t i = 0; i < n; ++i) mean += x[i];
  mean /= static_cast<float>(n);
  float var = 0.0f;
  for (size_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(var + static_cast<float>(kLayerNormEps));
  for (size_t i = 0; i < n; ++i) x[i] = (x[i] - mean) * inv * weight[i] + bias[i];
}

}  // namespace

LightningIndexer LightningIndexer::load(const Checkpoint& ckpt, const std::string& prefix, const ModelConfig& config) {
  LightningIndexer ix;
  ix.heads_ = static_cast<size_t>(config.index_n_heads);
  ix.head_dim_ = static_cast<size_t>(config.index_head_dim);
  ix.topk_ = static_cast<size_t>(config.index_topk);
  ix.key_offset_ = static_cast<size_t>(config.kv_lora_rank + config.qk_rope_head_dim);
  ix.softmax_scale_ = static_cast<float>(std::pow(static_cast<double>(ix.head_dim_), -0.5));
  ix.weight_scale_ = static_cast<float>(std::pow(static_cast<double>(ix.heads_), -0.5));
  const size_t h = config.hidden_size;
  ix.wq_b_ = Linear::load(ckpt, prefix + ".wq_b", ix.heads_ * ix.head_dim_, config.q_lora_rank);
  ix.wk_ = Linear::load(ckpt, prefix + ".wk", ix.head_dim_, h);
  ix.weights_proj_ = Linear::load_exact(ckpt, prefix + ".weights_proj", ix.heads_, h);
  ModelConfig rope_config = config;
  rope_config.rope_interleave = config.index_rope_interleave;
  ix.rope_ = make_rope(rope_config);
  const int64_t d = config.index_head_dim;
  ix.k_norm_weight_ = ckpt.load_f32(prefix + ".k_norm.weight", {d});
  ix.k_norm_bias_ = ckpt.load_f32(prefix + ".k_norm.bias", {d});
  return ix;
}

std::vector<float> LightningIndexer::keys(const float* x, size_t rows, size_t pos0) const {
  std::vector<float> k(rows * head_dim_);
  wk_(x, rows, k.data());
  for (size_t r = 0; r < rows; ++r) layer_norm(k.data() + r * head_dim_, head_dim_, k_norm_weight_, k_norm_bias_);
  rope_.apply(k.data(), rows, 1, pos0, head_dim_);  // the first qk_rope_head_dim dims turn
  return k;
}

std::vector<uint32_t> LightningIndexer::select_row(const float* q, const float* w, const KvCache& cache, size_t layer,
                                                   size_t pos) const {
  std::vector<uint32_t> chosen(pos + 1);
  std::iota(chosen.begin(), chosen.end(), 0u);
  if (pos + 1 <= topk_) return chosen;
  std::vector<float> score(pos + 1);
  for (size_t t = 0; t <= pos; ++t) {
    const float* k = cache.key(layer, t) + key_offset_;
    float total = 0.0f;
    for (size_t head = 0; head < heads_; ++head) {
      const float* qh = q + head * head_dim_;
      float dot = 0.0f;
      for (size_t d = 0; d < head_dim_; ++d) dot += qh[d] * k[d];
      total += w[head] * std::max(dot * softmax_scale_, 0.0f);
    }
    score[t] = total;
  }
  // The topk highest scores, the earlier position first among equal ones; then in order.
  const auto higher = [&](uint32_t a, uint32_t b) { return score[a] > score[b] || (score[a] == score[b] && a < b); };
  std::nth_element(chosen.begin(), chosen.begin() + static_cast<std::ptrdiff_t>(topk_ - 1), chosen.end(), higher);
  // A vector of its own size: selections stay alive through every layer of the step.
  std::vector<uint32_t> top(chosen.begin(), chosen.begin() + static_cast<std::ptrdiff_t>(topk_));
  std::sort(top.begin(), top.end());
  return top;
}

MlaAttention::KeySelection LightningIndexer::select(const float* x, const std::vector<float>& q_latent, size_t rows,
                                                    std::span<const SequenceRows> batch, size_t layer) const {
  std::vector<float> q(rows * heads_ * head_dim_);
  wq_b_(q_latent.data(), rows, q.data());
  std::vector<float> w(rows * heads_);
  weights_proj_(x, rows, w.data());
  for (float& v : w) v *= weight_scale_;
  MlaAttention::KeySelection selection(rows);
  for (const SequenceRows& seq : batch) {
    KvCache& cache = *seq.cache;
    const std::vector<float> k = keys(x + seq.row0 * wk_.in(), seq.rows, seq.pos0);
    for (size_t r = 0; r < seq.rows; ++r) {
      std::copy(k.data() + r * head_dim_, k.data() + (r + 1) * head_dim_,
                cache.key(layer, seq.pos0 + r) + key_offset_);
    }
    float* qs = q.data() + seq.row0 * heads_ * head_dim_;
    rope_.apply(qs, seq.rows, heads_, seq.pos0, head_dim_);
#pragma omp parallel for schedule(dynamic) if (seq.rows > 1)
    for (size_t r = 0; r < seq.rows; ++r) {
      selection[seq.row0 + r] = select_row(qs + r * heads_ * head_dim_, w.data() + (seq.row0 + r) * heads_, cache,
                                           layer, seq.pos0 + r);
    }
  }
  return selection;
}

}  // namespace charm
