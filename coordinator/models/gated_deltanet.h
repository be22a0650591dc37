// Gated DeltaNet linear attention (Yang, Kautz, Hatamizadeh, "Gated Delta Networks:
// Improving Mamba2 with Delta Rule", ICLR 2025) as Qwen3-Next and Qwen3.5-MoE run it,
// following transformers' models/qwen3_next/modeling_qwen3_next.py: Qwen3NextGatedDeltaNet
// with torch_recurrent_gated_delta_rule (Qwen3_5MoeGatedDeltaNet differs only in its
// projections' layout).
//
// Per token: in_proj_qkvz and in_proj_ba give, per key head group, q and k [head_k_dim],
// v and the output gate z [r, head_v_dim] (r = value heads per key head), b and a [r]; q, k
// and v go through a depthwise causal conv1d (kernel linear_conv_kernel_dim) and SiLU.
// Each value head h (key head h / r; h % num_k_heads when the heads are tiled,
// ModelConfig::linear_value_heads_tiled) keeps a state S [head_k_dim, head_v_dim]:
//   S *= exp(g),  g = -exp(A_log) * softplus(a + dt_bias)
//   S += k (beta (v - S^T k))^T,  beta = sigmoid(b)        (the delta rule)
//   o = S^T q
// with q and k L2-normalised (eps 1e-6) and q scaled by head_k_dim^-1/2; then o goes
// through the gated RMSNorm (weight * norm(o) * silu(z)) and out_proj. The state and the
// conv's last kernel - 1 inputs live in the sequence's KvCache::state(), so the output
// of a position depends only on the tokens up to it, computed one token after another
// whatever the chunking (transformers' prefill uses the chunked form of the same sums,
// which rounds differently).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/model_config.h"
#include "coordinator/models/blocks.h"

namespace charm {

class GatedDeltaNet {
 public:
  /// Loads "<prefix>.in_proj_qkvz.weight" (Qwen3NextGatedDeltaNet: q, k, v, z grouped per
  /// key head) or, when the checkpoint has none, "<prefix>.{in_proj_qkv, in_proj_z}.weight"
  /// (Qwen3_5MoeGatedDeltaNet, and a Qwen3-Next GGUF's attn_qkv / attn_gate); likewise
  /// "<prefix>.in_proj_ba.weight" or "<prefix>.{in_proj_b, in_proj_a}.weight"; then
  /// "<prefix>.{conv1d, out_proj}.weight", "<prefix>.A_log" (or "<prefix>.A", a GGUF's
  /// ssm_a: -exp(A_log) as stored, used as it is), "<prefix>.dt_bias" and
  /// "<prefix>.norm.weight" for config's linear_* fields; its state
  /// is floats [state_offset, state_offset + state_floats(config)) of each sequence's
  /// KvCache::state(). Throws what Checkpoint::load_f32 throws, and Error(kInvalidInput)
  /// naming the tensors when a projection is there both fused and apart (or both A and
  /// A_log), or when A holds a value above zero.
  static GatedDeltaNet load(const Checkpoint& ckpt, const std::string& prefix, const ModelConfig& config,
                            size_t state_offset);

  /// Floats of one layer's state per sequence: the conv's (kernel - 1) * conv_dim inputs
  /// and num_v_heads * head_k_dim * head_v_dim recurrent state.
  static size_t state_floats(const ModelConfig& config);

  /// out [rows, hidden] for x [rows, hidden] (normed), the rows of the sequences `batch`
  /// lays out, each continuing from and updating its cache's state.
  void operator()(const float* x, size_t rows, std::span<const SequenceRows> batch, float* out) const;

 private:
  /// x's rows projected and regrouped: mixed [rows, conv_dim] (q of every key head | k |
  /// v of every value head, before the conv), z [rows, value_dim], b and a [rows, num_v_heads].
  struct Projections {
    std::vector<float> mixed, z, b, a;
  };
  Projections project(const float* x, size_t rows) const;
  /// project's two halves: mixed and z (from in_proj_qkvz, or in_proj_qkv and in_proj_z),
  /// b and a (from in_proj_ba, or in_proj_b and in_proj_a).
  void project_qkvz(const float* x, size_t rows, Projections& p) const;
  void project_ba(const float* x, size_t rows, Projections& p) const;
  /// One sequence: mixed [rows, conv_dim] (q | k | v, before the conv), z [rows, value_dim],
  /// b and a [rows, num_v_heads]; writes core [rows, value_dim] (before the gated norm).
  void run_sequence(float* mixed, const float* b, const float* a, float* state, size_t rows, float* core) const;
  /// The conv over `rows` rows of mixed in place (then SiLU), continuing from conv_state.
  void convolve(float* mixed, size_t rows, float* conv_state) const;
  /// One token of the delta rule for every value head: q, k [num_k_heads, head_k_dim]
  /// (conv'd), v [value_dim]; updates s and writes o [value_dim].
  void step(const float* q, const float* k, const float* v, const float* beta, const float* g, float* s,
            float* o) const;

  size_t k_heads_ = 0, v_heads_ = 0, dk_ = 0, dv_ = 0, kernel_ = 0;
  size_t key_dim_ = 0, value_dim_ = 0, conv_dim_ = 0;
  size_t state_offset_ = 0;
  float norm_eps_ = 1e-6f;
  bool v_heads_tiled_ = false;  // value head h reads key head h % k_heads_, not h / r (ModelConfig)
  Linear in_proj_qkvz_, in_proj_ba_;                     // Qwen3-Next: fused, grouped per key head
  Linear in_proj_qkv_, in_proj_z_, in_proj_b_, in_proj_a_;  // or apart (Qwen3.5-MoE; GGUF's q, k, v, z)
  Linear out_proj_;
  std::vector<float> conv_weight_;  // [conv_dim, kernel]
  std::vector<float> a_neg_exp_;    // -exp(A_log) [num_v_heads], f32 as transformers computes it
  std::vector<float> dt_bias_;      // [num_v_heads]
  std::vector<float> norm_weight_;  // [head_v_dim]
};

}  // namespace charm
