// The lightning indexer of DeepSeek Sparse Attention (DSA; DeepSeek-AI, "DeepSeek-V3.2:
// Pushing the Frontier of Open Large Language Models", 2025, section 2.1; GLM-5), following
// transformers' models/glm_moe_dsa/modeling_glm_moe_dsa.py: GlmMoeDsaIndexer and the
// top-k mask GlmMoeDsaAttention builds from it.
//
// Per token t the indexer keeps one key k_t = LayerNorm(wk x_t) [index_head_dim], its first
// qk_rope_head_dim dims turned by RoPE (interleaved pairs in GLM-5, as its MLA; halves in
// DeepSeek-V3.2's DeepseekV32Indexer: ModelConfig::index_rope_interleave). A query at
// position p has index_n_heads heads q_h = wq_b(q_latent) and weights
// w_h = weights_proj(x_p) * index_n_heads^-1/2, and scores every key t <= p by
//   I(p, t) = sum_h w_h * relu(q_h . k_t * index_head_dim^-1/2);
// it attends the index_topk keys of highest score (all of 0..p when p + 1 <= index_topk).
// transformers' bf16 path skips the reference's Hadamard rotation (orthogonal: it keeps
// q . k) and its fp8 scoring; so does this one. The keys live in the MLA cache row after the
// latent and the rotated key (MlaAttention::cache_row_dim), so the paged KV pool, the
// prefix cache and chunked prefill carry them unchanged.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/model_config.h"
#include "coordinator/models/blocks.h"
#include "coordinator/models/mla_attention.h"

namespace charm {

class LightningIndexer {
 public:
  /// Loads "<prefix>.wq_b" [index_n_heads * index_head_dim, q_lora_rank], "<prefix>.wk"
  /// [index_head_dim, hidden], "<prefix>.k_norm" (nn.LayerNorm weight and bias
  /// [index_head_dim], eps 1e-6) and "<prefix>.weights_proj" [index_n_heads, hidden] for
  /// config's index_* fields, and the model's RoPE in the index_rope_interleave layout.
  /// Throws what Checkpoint::load_f32 throws.
  static LightningIndexer load(const Checkpoint& ckpt, const std::string& prefix, const ModelConfig& config);

  /// Writes the key of every row of `batch` (x [rows, hidden] the normed input, q_latent
  /// [rows, q_lora_rank] MLA's query latent) into its cache row of `layer` after the MLA
  /// part, then returns each row's selection: the positions of its index_topk highest
  /// scores among 0..p (ties to the earlier position), ascending; all of 0..p when p + 1 <=
  /// index_topk. A row's selection depends only on its own inputs and its sequence's cached
  /// keys 0..p (the batch-invariance contract).
  MlaAttention::KeySelection select(const float* x, const std::vector<float>& q_latent, size_t rows,
                                    std::span<const SequenceRows> batch, size_t layer) const;

 private:
  /// Keys [rows, index_head_dim] of x's rows at positions pos0.., rotated and normalised.
  std::vector<float> keys(const float* x, size_t rows, size_t pos0) const;
  /// The selection of one query at position `pos`: q [heads, head_dim] rotated, w [heads].
  std::vector<uint32_t> select_row(const float* q, const float* w, const KvCache& cache, size_t layer, size_t pos) const;

  size_t heads_ = 0, head_dim_ = 0, topk_ = 0;
  size_t key_offset_ = 0;  // where the key starts in the cache row: kv_lora_rank + qk_rope_head_dim
  float softmax_scale_ = 1.0f, weight_scale_ = 1.0f;
  Rope rope_;  // the model's RoPE (frequencies, YaRN) in the indexer's pair layout
  Linear wq_b_, wk_, weights_proj_;
  std::vector<float> k_norm_weight_, k_norm_bias_;
};

}  // namespace charm
