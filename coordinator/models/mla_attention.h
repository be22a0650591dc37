// Multi-head latent attention (MLA, DeepSeek-V2/V3) over a compressed KV cache, following
// transformers' models/deepseek_v3/modeling_deepseek_v3.py: DeepseekV3Attention.
//
// Per token the layer stores only c = kv_a_layernorm(latent) [kv_lora_rank] and the
// rotated shared key k_rot [qk_rope_head_dim] (one KvCache key row, no values). The
// reference expands c with kv_b_proj into per-head k_nope [qk_nope_head_dim] and v
// [v_head_dim]; here kv_b_proj is absorbed instead (same maths, other rounding):
//   q_nope . (W_uk c) = (W_uk^T q_nope) . c        (score, per head)
//   sum_t p_t (W_uv c_t) = W_uv (sum_t p_t c_t)      (output, per head)
// so attention reads kv_lora_rank + qk_rope_head_dim floats per cached token instead of
// num_heads * (qk_nope_head_dim + qk_rope_head_dim + v_head_dim).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/checkpoint.h"
#include "common/model_config.h"
#include "coordinator/models/blocks.h"
#include "coordinator/models/kv_cache.h"

namespace charm {

/// MLA's config.json fields (DeepseekV3Config, GlmMoeDsaConfig): q_lora_rank (required,
/// null for a plain q_proj), kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim (even),
/// v_head_dim, all positive; num_key_value_heads must equal num_attention_heads; saved
/// head_dim / qk_head_dim must be the derived ones. Sets head_dim = qk_rope_head_dim.
/// Throws Error(kInvalidInput) or kUnsupported naming `source` and the field.
void read_mla_fields(const nlohmann::json& j, const std::string& source, ModelConfig& c);

class MlaAttention {
 public:
  /// Loads "<prefix>.{q_proj | q_a_proj, q_a_layernorm, q_b_proj}", "<prefix>.kv_a_proj_with_mqa",
  /// "<prefix>.kv_a_layernorm", "<prefix>.kv_b_proj", "<prefix>.o_proj" with the shapes the
  /// config's MLA fields give (biases on q_a/kv_a/o when attention_bias). The softmax
  /// scale is (qk_nope_head_dim + qk_rope_head_dim)^-0.5 times YaRN's mscale^2.
  /// Throws what Checkpoint::load_f32 throws.
  static MlaAttention load(const Checkpoint& ckpt, const std::string& prefix, const ModelConfig& config);

  /// Width of this attention's cache row: kv_lora_rank + qk_rope_head_dim, plus
  /// index_head_dim under DeepSeek Sparse Attention (index_topk > 0), whose lightning
  /// indexer keeps its key in the same row after them (coordinator/models/dsa_indexer.h).
  static size_t cache_row_dim(const ModelConfig& config);

  /// Per query row of a call, the cache positions it attends, ascending (DeepSeek Sparse
  /// Attention's selection, coordinator/models/dsa_indexer.h): row r is selection[r].
  using KeySelection = std::vector<std::vector<uint32_t>>;

  /// The query latent q_a_layernorm(q_a_proj(x)) [rows, q_lora_rank] f32 of x [rows,
  /// hidden]; empty when q_lora_rank is 0 (a plain q_proj).
  std::vector<float> query_latent(const float* x, size_t rows) const;

  /// out [rows, hidden] = attention of x [rows, hidden] (normalised input), the rows of
  /// the sequences `batch` lays out, after appending each one's cache rows to `layer` of
  /// its cache (whose key width must be cache_row_dim). Causal, per sequence, by the tiled
  /// online-softmax kernel of common/attention.h over the absorbed queries, under its bit
  /// contract: a row's output depends only on x's row and its cache rows 0..its position.
  void operator()(const Rope& rope, const float* x, size_t rows, std::span<const SequenceRows> batch, size_t layer,
                  float* out) const;

  /// operator() with the query latent given (query_latent(x, rows)) and, when `selection`
  /// is not null ([rows] lists), each row attending only its selected positions, which
  /// must be stored, ascending, distinct, non-empty and at most the row's own position:
  /// the same kernel over the selected cache rows in their order, so a selection of every
  /// position 0..p gives operator()'s bits. Throws Error(kInvalidInput) for a selection of
  /// another row count, an empty one or one whose last position is past its row.
  void attend(const Rope& rope, const float* x, const std::vector<float>& q_latent, size_t rows,
              std::span<const SequenceRows> batch, size_t layer, const KeySelection* selection, float* out) const;

 private:
  /// Query heads [rows, num_heads, qk_nope + qk_rope], before RoPE, from x (plain q_proj)
  /// or the query latent.
  std::vector<float> queries(const float* x, const std::vector<float>& q_latent, size_t rows) const;
  /// One sequence's part after the projections: compressed [rows, kv_lora + qk_rope] and
  /// q [rows, num_heads, qk_nope + qk_rope] of its rows, its rows' selections (empty: all
  /// of 0..p); writes attn [rows, num_heads * v_head_dim].
  void attend_sequence(const Rope& rope, float* compressed, const float* q, const SequenceRows& seq, size_t layer,
                       std::span<const std::vector<uint32_t>> selection, float* attn) const;

  size_t num_heads_ = 0, kv_lora_ = 0, nope_ = 0, rope_dim_ = 0, v_dim_ = 0;
  float scale_ = 1.0f;
  Linear q_proj_;                   // when q_lora_rank == 0
  Linear q_a_proj_, q_b_proj_;      // when q_lora_rank > 0
  RmsNorm q_a_layernorm_;
  Linear kv_a_proj_with_mqa_;       // [kv_lora + qk_rope, hidden]
  RmsNorm kv_a_layernorm_;
  std::vector<float> w_uk_t_;       // per head [kv_lora, qk_nope]: kv_b_proj's key rows, transposed
  std::vector<float> w_uv_;         // per head [v_head_dim, kv_lora]: kv_b_proj's value rows
  Linear o_proj_;                   // [hidden, num_heads * v_head_dim]
};

}  // namespace charm
