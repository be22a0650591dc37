// Shared building blocks of the decoder families (one file per family composes them, as
// the Hugging Face modeling files do): linear layers, RMSNorm, rotary embeddings, causal
// GQA attention over the KV cache, the dense SwiGLU MLP, softmax top-k routing and the
// routed-expert step that goes through the ExpertDispatcher.
// Activations are f32 row-major [rows, width]; rows are token positions of one sequence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/weight_format.h"
#include "coordinator/dispatch/expert_dispatch.h"
#include "coordinator/models/kv_cache.h"

namespace charm {

/// nn.Linear: weight [out, in] at the checkpoint's precision (common/matmul.h computes
/// from it in f32), optional bias [out] f32.
struct Linear {
  StoredMatrix weight;
  std::vector<float> bias;
  size_t in() const { return static_cast<size_t>(weight.shape.cols); }
  size_t out() const { return static_cast<size_t>(weight.shape.rows); }
  /// Loads "<name>.weight" (and "<name>.bias" when `with_bias`), checking [out, in].
  static Linear load(const Checkpoint& ckpt, const std::string& name, size_t out, size_t in, bool with_bias = false);
  /// y [rows, out] = x [rows, in] W^T + b.
  void operator()(const float* x, size_t rows, float* y) const;
};

/// RMSNorm with weight [n] (Qwen3MoeRMSNorm / OlmoeRMSNorm).
struct RmsNorm {
  std::vector<float> weight;
  float eps = 1e-6f;
  static RmsNorm load(const Checkpoint& ckpt, const std::string& name, size_t n, double eps);
  /// Normalises `rows` rows of width weight.size(); in place allowed.
  void operator()(const float* x, size_t rows, float* y) const;
};

/// Which dims of a head form a rotation pair.
enum class RopeLayout {
  kHalves,       ///< "rotate_half" (GPT-NeoX): dims i and i + head_dim/2 (Llama, Qwen3-MoE, OLMoE)
  kInterleaved,  ///< dims 2i and 2i+1, written back de-interleaved: out[i], out[i + head_dim/2]
                 ///< (DeepSeek-V3's apply_rotary_pos_emb_interleave, rope_interleave = true)
};

/// Rotary position embedding: pair i turns by angle pos * inv_freq[i]; cos and sin are
/// multiplied by attention_factor (1 for plain RoPE; YaRN's cos/sin scale, see
/// coordinator/models/rope_scaling.h).
class Rope {
 public:
  /// Plain RoPE: inv_freq = theta^(-2i/head_dim), computed in f32.
  Rope(size_t head_dim, double theta, RopeLayout layout = RopeLayout::kHalves);
  /// Given inverse frequencies [head_dim / 2], cos/sin scale and layout.
  Rope(std::vector<float> inv_freq, float attention_factor, RopeLayout layout);
  /// Rotates x [rows, heads, head_dim] in place; row r is at position pos0 + r.
  void apply(float* x, size_t rows, size_t heads, size_t pos0) const;
  size_t head_dim() const { return head_dim_; }

 private:
  size_t head_dim_;
  std::vector<float> inv_freq_;
  float attention_factor_ = 1.0f;
  RopeLayout layout_ = RopeLayout::kHalves;
};

/// Causal scaled-dot-product attention with grouped KV heads over the cache of `layer`.
/// q [rows, num_heads, head_dim] for positions pos0..pos0+rows-1 (keys/values for those
/// positions must already be in the cache); out [rows, num_heads * head_dim].
void causal_gqa_attention(const float* q, size_t rows, size_t pos0, const KvCache& cache, size_t layer,
                          size_t num_heads, size_t num_kv_heads, size_t head_dim, float* out);

/// The common tail of a RoPE GQA attention block, after the family's own q/k/v
/// projections and norms: rotates q [rows, num_heads, head_dim] and k [rows,
/// num_kv_heads, head_dim] in place for positions pos0.., stores k and v in the cache of
/// `layer`, attends causally and projects with o_proj into out [rows, hidden].
void rope_attention(const Rope& rope, float* q, float* k, const float* v, size_t rows, size_t pos0, KvCache& cache,
                    size_t layer, size_t num_heads, size_t num_kv_heads, size_t head_dim, const Linear& o_proj,
                    float* out);

/// The plain Llama-style attention block (MixtralAttention, Qwen2MoeAttention): q/k/v
/// projections (biased when `qkv_bias`), no q/k norm, then rope_attention; o_proj has no
/// bias. Weights "<prefix>.{q,k,v,o}_proj.weight" (+ ".bias" for q/k/v).
struct RopeGqaAttention {
  Linear q_proj, k_proj, v_proj, o_proj;
  size_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  static RopeGqaAttention load(const Checkpoint& ckpt, const std::string& prefix, size_t hidden, size_t num_heads,
                               size_t num_kv_heads, size_t head_dim, bool qkv_bias);
  /// out [rows, hidden] for x [rows, hidden] (normed) at positions pos0..; stores the
  /// positions' K/V in the cache of `layer`.
  void operator()(const Rope& rope, const float* x, size_t rows, size_t pos0, KvCache& cache, size_t layer,
                  float* out) const;
};

/// Dense SwiGLU MLP: down(silu(gate(x)) * up(x)) (Qwen3MoeMLP).
struct DenseMlp {
  Linear gate, up, down;
  static DenseMlp load(const Checkpoint& ckpt, const std::string& prefix, size_t hidden, size_t intermediate);
  void operator()(const float* x, size_t rows, float* y) const;
};

/// Adds b to a elementwise (the residual connection): a[i] += b[i], i < n.
void add_residual(float* a, const float* b, size_t n);

/// Writes the keys and values of positions pos0 .. pos0+rows-1 of `layer` into the cache.
/// k, v: [rows, kv_dim] f32, kv_dim = num_key_value_heads * head_dim.
void store_kv(KvCache& cache, size_t layer, size_t pos0, size_t rows, size_t kv_dim, const float* k, const float* v);

/// The final RMSNorm and lm_head (or the tied embedding matrix) of a causal LM.
struct OutputHead {
  RmsNorm norm;
  Linear lm_head;  ///< empty when tie_word_embeddings
  /// Loads "model.norm" and, unless `tied`, "lm_head" [vocab, hidden].
  static OutputHead load(const Checkpoint& ckpt, size_t hidden, size_t vocab, double eps, bool tied);
  /// logits [vocab] of one hidden row [hidden]; `embed` [vocab, hidden] is used when tied.
  void operator()(const float* hidden_row, const StoredMatrix& embed, float* logits) const;
};

/// Router decisions for `rows` positions: top_k experts per row, best first, with their
/// combine weights.
struct Routing {
  size_t top_k = 0;
  std::vector<uint32_t> experts;  ///< [rows, top_k]
  std::vector<float> weights;     ///< [rows, top_k]
};

/// Softmax over router logits [rows, num_experts] in f32, then top-k (ties: lower id
/// first), renormalised to sum 1 when `norm_topk_prob` (Qwen3MoeTopKRouter, OlmoeTopKRouter).
Routing softmax_topk(const float* router_logits, size_t rows, size_t num_experts, size_t top_k, bool norm_topk_prob);

/// The routed-expert step of one MoE layer while it is in flight: the constructor sends
/// x [rows, hidden]'s assignments through `dispatcher` (begin_layer) and returns, so the
/// caller can run a shared expert meanwhile; finish() waits and writes out[r] = sum over
/// ranks k (in rank order) of weights[r,k] * expert_k(x[r]). The sum happens here, in one
/// fixed order, so it is the same whatever the placement. `x` must stay unchanged and the
/// dispatcher must see no other layer until finish() returns. Errors as
/// ExpertDispatcher::begin_layer / finish_layer.
class RoutedExpertsCall {
 public:
  RoutedExpertsCall(ExpertDispatcher& dispatcher, uint32_t layer, const float* x, size_t rows, size_t hidden,
                    Routing routing);
  // The dispatcher holds the addresses of assignments_ and outputs_ until finish():
  // the call must not move.
  RoutedExpertsCall(const RoutedExpertsCall&) = delete;
  RoutedExpertsCall& operator=(const RoutedExpertsCall&) = delete;
  /// out [rows, hidden]: the weighted rank-order sum.
  void finish(float* out);

 private:
  ExpertDispatcher& dispatcher_;
  size_t rows_;
  size_t hidden_;
  Routing routing_;
  std::vector<ExpertAssignment> assignments_;
  std::vector<float> outputs_;  // [rows * top_k, hidden], unweighted, rank order per row
};

/// A softmax top-k routed MoE block without shared experts (Qwen3MoeSparseMoeBlock,
/// OlmoeSparseMoeBlock, MixtralSparseMoeBlock's routing): router "<prefix>.gate"
/// [num_experts, hidden], then softmax_topk, then a RoutedExpertsCall.
struct SoftmaxTopkMoe {
  Linear router;
  size_t top_k = 0;
  bool norm_topk_prob = false;
  /// Loads "<prefix>.gate.weight" [num_experts, hidden].
  static SoftmaxTopkMoe load(const Checkpoint& ckpt, const std::string& prefix, size_t hidden, size_t num_experts,
                             size_t top_k, bool norm_topk_prob);
  /// Routes x and starts its experts; the caller finishes the returned call (and may do
  /// other work, such as a prefetch hint, in between). `x` must stay unchanged until then.
  RoutedExpertsCall begin(ExpertDispatcher& dispatcher, uint32_t layer, const float* x, size_t rows) const;
  /// The batch-union (ascending) of the experts this router picks for x [rows, hidden].
  std::vector<uint32_t> predict(const float* x, size_t rows) const;
  /// The router's decisions for x [rows, hidden].
  Routing route(const float* x, size_t rows) const;
};

/// A shared expert scaled by a learned sigmoid gate per position (Qwen2MoeSparseMoeBlock's
/// shared_expert and shared_expert_gate): out[r] = sigmoid(gate . x[r]) * mlp(x[r]).
/// Runs on the coordinator, between the routed experts' begin and finish.
struct GatedSharedExpert {
  DenseMlp mlp;  ///< "<prefix>.shared_expert.{gate,up,down}_proj", width `intermediate`
  Linear gate;   ///< "<prefix>.shared_expert_gate" [1, hidden], no bias
  static GatedSharedExpert load(const Checkpoint& ckpt, const std::string& prefix, size_t hidden,
                                size_t intermediate);
  /// out [rows, hidden] for x [rows, hidden].
  void operator()(const float* x, size_t rows, float* out) const;
};

/// Speculative expert loading ("apply layer L+1's router to layer L's state", Eliseev &
/// Mazur 2023, "Fast Inference of Mixture-of-Experts Language Models with Offloading",
/// sec. 3.2): normalises the residual stream `hidden` [rows, hidden_size] as the next MoE
/// layer's post_attention_layernorm would, applies that layer's router, and, when
/// dispatcher.wants_hints(), sends the predicted batch-union with hint_layer(next_layer).
/// Reads only; nothing the model computes depends on it.
void hint_next_moe_layer(ExpertDispatcher& dispatcher, uint32_t next_layer, const RmsNorm& next_norm,
                         const SoftmaxTopkMoe& next_moe, const float* hidden, size_t rows);

}  // namespace charm
