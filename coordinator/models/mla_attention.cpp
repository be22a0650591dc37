#include "coordinator/models/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "common/attention.h"
#include "common/config_fields.h"
#include "common/error.h"
#include "common/kernels.h"
#include "coordinator/models/rope_scaling.h"

namespace charm {

namespace {

/// One layer of the compressed cache as common/attention.h reads it: one KV head whose
/// key is the whole row [latent | k_rot] and whose value is the latent (the row's first
/// kv_lora_rank floats).
class LatentRows final : public KvRows {
 public:
  LatentRows(const KvCache& cache, size_t layer) : cache_(cache), layer_(layer) {}
  const float* key(size_t, size_t pos) const override { return cache_.key(layer_, pos); }
  const float* value(size_t, size_t pos) const override { return cache_.key(layer_, pos); }

 private:
  const KvCache& cache_;
  size_t layer_;
};

/// LatentRows of the selected positions only: the j-th row is the cache row at
/// positions[j] (ascending), so the kernel's tiles run over the selection in order.
class SelectedLatentRows final : public KvRows {
 public:
  SelectedLatentRows(const KvCache& cache, size_t layer, std::span<const uint32_t> positions)
      : cache_(cache), layer_(layer), positions_(positions) {}
  const float* key(size_t, size_t j) const override { return cache_.key(layer_, positions_[j]); }
  const float* value(size_t, size_t j) const override { return cache_.key(layer_, positions_[j]); }

 private:
  const KvCache& cache_;
  size_t layer_;
  std::span<const uint32_t> positions_;
};

}  // namespace

void read_mla_fields(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  using namespace hf;
  // q_lora_rank may be null (a plain q_proj) but must be spelled out: transformers'
  // default (1536) belongs to the full-size model.
  if (!j.contains("q_lora_rank")) fail_invalid(source + ": missing required field 'q_lora_rank'");
  c.q_lora_rank = get_int(j, source, "q_lora_rank", 0);
  if (c.q_lora_rank < 0) fail_invalid(source + ": field 'q_lora_rank' must be positive or null");
  c.kv_lora_rank = get_int(j, source, "kv_lora_rank", std::nullopt);
  c.qk_nope_head_dim = get_int(j, source, "qk_nope_head_dim", std::nullopt);
  c.qk_rope_head_dim = get_int(j, source, "qk_rope_head_dim", std::nullopt);
  c.v_head_dim = get_int(j, source, "v_head_dim", std::nullopt);
  for (auto [key, value] : {std::pair{"kv_lora_rank", c.kv_lora_rank}, {"qk_nope_head_dim", c.qk_nope_head_dim},
                            {"qk_rope_head_dim", c.qk_rope_head_dim}, {"v_head_dim", c.v_head_dim}}) {
    require_positive(source, key, value);
  }
  if (c.qk_rope_head_dim % 2 != 0) fail_invalid(source + ": field 'qk_rope_head_dim' must be even");
  // MLA expands the latent to one key/value per query head; transformers' repeat_kv
  // would break for any other num_key_value_heads.
  if (c.num_key_value_heads != c.num_attention_heads) {
    fail_unsupported(source + ": num_key_value_heads " + std::to_string(c.num_key_value_heads) +
                     " differs from num_attention_heads " + std::to_string(c.num_attention_heads) +
                     " (MLA has one key per head)");
  }
  // The config classes derive head_dim and qk_head_dim (DeepseekV3Config.__post_init__,
  // GlmMoeDsaConfig's), and transformers writes them back; a saved value that disagrees
  // is not this model.
  const int64_t qk_head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
  for (auto [key, derived, from] : {std::tuple{"head_dim", c.qk_rope_head_dim, "qk_rope_head_dim"},
                                    {"qk_head_dim", qk_head_dim, "qk_nope_head_dim + qk_rope_head_dim"}}) {
    const int64_t saved = get_int(j, source, key, derived);
    if (saved != derived) {
      fail_invalid(source + ": field '" + key + "' is " + std::to_string(saved) + " but " + from + " is " +
                   std::to_string(derived) + "; the config class derives one from the other");
    }
  }
  c.head_dim = c.qk_rope_head_dim;
}

size_t MlaAttention::cache_row_dim(const ModelConfig& config) {
  const int64_t indexer_key = config.index_topk > 0 ? config.index_head_dim : 0;
  return static_cast<size_t>(config.kv_lora_rank + config.qk_rope_head_dim + indexer_key);
}

MlaAttention MlaAttention::load(const Checkpoint& ckpt, const std::string& prefix, const ModelConfig& config) {
  MlaAttention a;
  a.num_heads_ = config.num_attention_heads;
  a.kv_lora_ = config.kv_lora_rank;
  a.nope_ = config.qk_nope_head_dim;
  a.rope_dim_ = config.qk_rope_head_dim;
  a.v_dim_ = config.v_head_dim;
  const size_t h = config.hidden_size;
  const size_t qk = a.nope_ + a.rope_dim_;
  const bool bias = config.attention_bias;
  a.scale_ = static_cast<float>(std::pow(static_cast<double>(qk), -0.5) * yarn_softmax_scale_factor(config));
  if (config.q_lora_rank == 0) {
    a.q_proj_ = Linear::load(ckpt, prefix + ".q_proj", a.num_heads_ * qk, h);
  } else {
    const size_t q_lora = config.q_lora_rank;
    a.q_a_proj_ = Linear::load(ckpt, prefix + ".q_a_proj", q_lora, h, bias);
    a.q_a_layernorm_ = RmsNorm::load(ckpt, prefix + ".q_a_layernorm", q_lora, 1e-6);  // DeepseekV3RMSNorm default eps
    a.q_b_proj_ = Linear::load(ckpt, prefix + ".q_b_proj", a.num_heads_ * qk, q_lora);
  }
  a.kv_a_proj_with_mqa_ = Linear::load(ckpt, prefix + ".kv_a_proj_with_mqa", a.kv_lora_ + a.rope_dim_, h, bias);
  a.kv_a_layernorm_ = RmsNorm::load(ckpt, prefix + ".kv_a_layernorm", a.kv_lora_, 1e-6);
  const std::vector<float> kv_b = ckpt.load_f32(
      prefix + ".kv_b_proj.weight",
      {static_cast<int64_t>(a.num_heads_ * (a.nope_ + a.v_dim_)), static_cast<int64_t>(a.kv_lora_)});
  // kv_b_proj rows per head: nope key rows, then v_head_dim value rows.
  a.w_uk_t_.resize(a.num_heads_ * a.kv_lora_ * a.nope_);
  a.w_uv_.resize(a.num_heads_ * a.v_dim_ * a.kv_lora_);
  for (size_t head = 0; head < a.num_heads_; ++head) {
    const float* rows = kv_b.data() + head * (a.nope_ + a.v_dim_) * a.kv_lora_;
    float* uk_t = a.w_uk_t_.data() + head * a.kv_lora_ * a.nope_;
    for (size_t d = 0; d < a.nope_; ++d) {
      for (size_t c = 0; c < a.kv_lora_; ++c) uk_t[c * a.nope_ + d] = rows[d * a.kv_lora_ + c];
    }
    std::copy(rows + a.nope_ * a.kv_lora_, rows + (a.nope_ + a.v_dim_) * a.kv_lora_,
              a.w_uv_.data() + head * a.v_dim_ * a.kv_lora_);
  }
  a.o_proj_ = Linear::load(ckpt, prefix + ".o_proj", h, a.num_heads_ * a.v_dim_, bias);
  return a;
}

std::vector<float> MlaAttention::query_latent(const float* x, size_t rows) const {
  if (q_a_proj_.out() == 0) return {};
  std::vector<float> q_latent(rows * q_a_proj_.out());
  q_a_proj_(x, rows, q_latent.data());
  q_a_layernorm_(q_latent.data(), rows, q_latent.data());
  return q_latent;
}

std::vector<float> MlaAttention::queries(const float* x, const std::vector<float>& q_latent, size_t rows) const {
  std::vector<float> q(rows * num_heads_ * (nope_ + rope_dim_));
  if (q_a_proj_.out() == 0) {
    q_proj_(x, rows, q.data());
  } else {
    q_b_proj_(q_latent.data(), rows, q.data());
  }
  return q;
}

void MlaAttention::operator()(const Rope& rope, const float* x, size_t rows, std::span<const SequenceRows> batch,
                              size_t layer, float* out) const {
  attend(rope, x, query_latent(x, rows), rows, batch, layer, nullptr, out);
}

void MlaAttention::attend(const Rope& rope, const float* x, const std::vector<float>& q_latent, size_t rows,
                          std::span<const SequenceRows> batch, size_t layer, const KeySelection* selection,
                          float* out) const {
  if (selection != nullptr && selection->size() != rows) {
    fail_invalid("MLA attention: a key selection of " + std::to_string(selection->size()) + " rows for " +
                 std::to_string(rows) + " query rows");
  }
  const size_t qk = nope_ + rope_dim_;
  const size_t row_dim = kv_lora_ + rope_dim_;
  const std::vector<float> q = queries(x, q_latent, rows);
  // Compressed KV: [latent | k_rot] per position, latent normalised, k_rot rotated below.
  std::vector<float> compressed(rows * row_dim);
  kv_a_proj_with_mqa_(x, rows, compressed.data());
  std::vector<float> attn(rows * num_heads_ * v_dim_);
  for (const SequenceRows& seq : batch) {
    const std::span<const std::vector<uint32_t>> chosen =
        selection ? std::span<const std::vector<uint32_t>>(selection->data() + seq.row0, seq.rows)
                  : std::span<const std::vector<uint32_t>>();
    attend_sequence(rope, compressed.data() + seq.row0 * row_dim, q.data() + seq.row0 * num_heads_ * qk, seq, layer,
                    chosen, attn.data() + seq.row0 * num_heads_ * v_dim_);
  }
  o_proj_(attn.data(), rows, out);
}

void MlaAttention::attend_sequence(const Rope& rope, float* compressed, const float* q, const SequenceRows& seq,
                                   size_t layer, std::span<const std::vector<uint32_t>> selection, float* attn) const {
  const size_t qk = nope_ + rope_dim_;
  const size_t row_dim = kv_lora_ + rope_dim_;
  const size_t rows = seq.rows, pos0 = seq.pos0;
  KvCache& cache = *seq.cache;
  std::vector<float> k_rot(rows * rope_dim_);
  for (size_t r = 0; r < rows; ++r) {
    float* row = compressed + r * row_dim;
    kv_a_layernorm_(row, 1, row);
    std::copy(row + kv_lora_, row + row_dim, k_rot.data() + r * rope_dim_);
  }
  rope.apply(k_rot.data(), rows, 1, pos0);
  for (size_t r = 0; r < rows; ++r) {
    float* dst = cache.key(layer, pos0 + r);
    std::copy(compressed + r * row_dim, compressed + r * row_dim + kv_lora_, dst);
    std::copy(k_rot.data() + r * rope_dim_, k_rot.data() + (r + 1) * rope_dim_, dst + kv_lora_);
  }
  // Rotated query parts [rows, num_heads, qk_rope].
  std::vector<float> q_rot(rows * num_heads_ * rope_dim_);
  for (size_t i = 0; i < rows * num_heads_; ++i) {
    std::copy(q + i * qk + nope_, q + (i + 1) * qk, q_rot.data() + i * rope_dim_);
  }
  rope.apply(q_rot.data(), rows, num_heads_, pos0);

  // Absorbed queries [rows, num_heads, kv_lora + qk_rope]: W_uk^T q_nope (the query in
  // latent space), then the rotated part; one KV head whose key row is the cache row and
  // whose value row is its latent part.
  const size_t pairs = rows * num_heads_;
  std::vector<float> q_abs(pairs * row_dim);
#pragma omp parallel for schedule(static) if (pairs > 1)
  for (size_t i = 0; i < pairs; ++i) {
    const size_t head = i % num_heads_;
    linear_serial(q + i * qk, 1, w_uk_t_.data() + head * kv_lora_ * nope_, nope_, kv_lora_,
                  q_abs.data() + i * row_dim);
    std::copy(q_rot.data() + i * rope_dim_, q_rot.data() + (i + 1) * rope_dim_, q_abs.data() + i * row_dim + kv_lora_);
  }
  AttentionShape shape;
  shape.num_heads = num_heads_;
  shape.num_kv_heads = 1;
  shape.key_dim = row_dim;
  shape.value_dim = kv_lora_;
  shape.scale = scale_;
  std::vector<float> o_lat(pairs * kv_lora_);  // sum_t p_t c_t per (row, head)
  if (selection.empty()) {
    causal_attention(q_abs.data(), rows, pos0, shape, LatentRows(cache, layer), o_lat.data());
  } else {
    // Each row over its own selection: one query whose keys are the selected rows.
    for (size_t r = 0; r < rows; ++r) {
      const std::vector<uint32_t>& chosen = selection[r];
      if (chosen.empty() || chosen.back() > pos0 + r) {
        fail_invalid("MLA attention: the key selection of position " + std::to_string(pos0 + r) +
                     " is empty or reaches past it");
      }
      causal_attention(q_abs.data() + r * num_heads_ * row_dim, 1, chosen.size() - 1, shape,
                       SelectedLatentRows(cache, layer, chosen), o_lat.data() + r * num_heads_ * kv_lora_);
    }
  }
  // Per head W_uv (sum_t p_t c_t).
#pragma omp parallel for schedule(static) if (pairs > 1)
  for (size_t i = 0; i < pairs; ++i) {
    linear_serial(o_lat.data() + i * kv_lora_, 1, w_uv_.data() + (i % num_heads_) * v_dim_ * kv_lora_, kv_lora_, v_dim_,
                  attn + i * v_dim_);
  }
}

}  // namespace charm
