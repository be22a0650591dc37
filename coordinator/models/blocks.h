// Shared building blocks of the decoder families (one file per family composes them, as
// the Hugging Face modeling files do): linear layers, RMSNorm, rotary embeddings, causal
// GQA attention over the KV cache (with the families' q/k-norm variants), the dense
// SwiGLU MLP, softmax top-k routing, and the one MoE block every family runs (routed
// experts through the ExpertDispatcher, an optional shared expert, the prefetch hint).
// Activations are f32 row-major [rows, width]; rows are token positions of one or more
// sequences (a step's ragged batch, SequenceRows), and no row's result depends on the
// others: every kernel here is row-independent, attention reads only its own sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/weight_format.h"
#include "coordinator/dispatch/expert_dispatch.h"
#include "coordinator/models/kv_cache.h"

namespace charm {

/// Where one sequence's rows sit in a step's batch: rows [row0, row0 + rows) of the
/// activations are its positions pos0 .. pos0 + rows - 1, whose K/V go to `cache`.
struct SequenceRows {
  size_t row0 = 0;
  size_t rows = 0;
  size_t pos0 = 0;
  KvCache* cache = nullptr;
};

/// nn.Linear: weight [out, in] at the checkpoint's precision (common/matmul.h computes
/// from it in f32), optional bias [out] f32.
struct Linear {
  StoredMatrix weight;
  std::vector<float> bias;
  size_t in() const { return static_cast<size_t>(weight.shape.cols); }
  size_t out() const { return static_cast<size_t>(weight.shape.rows); }
  /// Loads "<name>.weight" (and "<name>.bias" when `with_bias`), checking [out, in]; the
  /// weight is quantised when the checkpoint's dense_quant() is set (quantize_dense's rules
  /// and errors). For the projections.
  static Linear load(const Checkpoint& ckpt, const std::string& name, size_t out, size_t in, bool with_bias = false);
  /// As load, but always at the stored precision: for the linears whose outputs are
  /// decisions (routers, the shared expert's gate, DSA's index weights), which llama.cpp's
  /// quantiser keeps unquantised too, so that quant_dense never changes which experts or
  /// keys are chosen through their scores' precision alone.
  static Linear load_exact(const Checkpoint& ckpt, const std::string& name, size_t out, size_t in,
                           bool with_bias = false);
  /// y [rows, out] = x [rows, in] W^T + b.
  void operator()(const float* x, size_t rows, float* y) const;
};

/// RMSNorm with weight [n] (Qwen3MoeRMSNorm / OlmoeRMSNorm).
struct RmsNorm {
  std::vector<float> weight;
  float eps = 1e-6f;
  /// Loads "<name>.weight" [n]. With unit_offset the checkpoint stores weight - 1 and the
  /// norm scales by 1 + stored (Qwen3NextRMSNorm's zero-centred weight: 1 + w in f32,
  /// the value transformers multiplies by).
  static RmsNorm load(const Checkpoint& ckpt, const std::string& name, size_t n, double eps, bool unit_offset = false);
  /// Normalises `rows` rows of width weight.size(); in place allowed.
  void operator()(const float* x, size_t rows, float* y) const;
};

/// Which dims of a head form a rotation pair.
enum class RopeLayout {
  kHalves,       ///< "rotate_half" (GPT-NeoX): dims i and i + head_dim/2 (Llama, Qwen3-MoE, OLMoE)
  kInterleaved,  ///< dims 2i and 2i+1, written back de-interleaved: out[i], out[i + head_dim/2]
                 ///< (DeepSeek-V3's apply_rotary_pos_emb_interleave, rope_interleave = true)
};

/// Rotary position embedding over `dim` dims (head_dim, or its rotated part under partial
/// rotary): pair i turns by angle pos * inv_freq[i]; cos and sin are multiplied by
/// attention_factor (1 for plain RoPE; YaRN's cos/sin scale, see
/// coordinator/models/rope_scaling.h).
class Rope {
 public:
  /// Rotates no dims (dim() 0): a placeholder until a real one is assigned.
  Rope() = default;
  /// Plain RoPE: inv_freq = theta^(-2i/dim), computed in f32.
  Rope(size_t dim, double theta, RopeLayout layout = RopeLayout::kHalves);
  /// Given inverse frequencies [dim / 2], cos/sin scale and layout.
  Rope(std::vector<float> inv_freq, float attention_factor, RopeLayout layout);
  /// Rotates x [rows, heads, head_width] in place; row r is at position pos0 + r. Only
  /// dims [0, dim()) of each head turn (the layout pairs them among themselves), the rest
  /// pass unchanged, as transformers' apply_rotary_pos_emb with partial_rotary_factor
  /// does. head_width 0 means dim(). REQUIRES head_width == 0 or head_width >= dim().
  void apply(float* x, size_t rows, size_t heads, size_t pos0, size_t head_width = 0) const;
  /// The rotated dims per head.
  size_t dim() const { return head_dim_; }

 private:
  size_t head_dim_ = 0;  // the rotated dims
  std::vector<float> inv_freq_;
  float attention_factor_ = 1.0f;
  RopeLayout layout_ = RopeLayout::kHalves;
};

/// Causal scaled-dot-product attention with grouped KV heads over the cache of `layer`.
/// q [rows, num_heads, head_dim] f32 for positions pos0..pos0+rows-1 (keys/values for
/// those positions must already be in the cache); out [rows, num_heads * head_dim] f32.
/// The tiled online-softmax kernel of common/attention.h (FlashAttention-2, Dao 2023),
/// under its bit contract: row r's output depends only on its q and cache rows
/// 0..pos0+r (pos0+r-sliding_window+1..pos0+r when sliding_window > 0; only those are
/// read), whatever rows, pos0, the chunking or the thread count. `sinks` [num_heads]:
/// GptOssAttention's per-head sink logits (AttentionShape::sinks), or nullptr. Throws
/// Error(kInvalidInput) when num_kv_heads does not divide num_heads.
void causal_gqa_attention(const float* q, size_t rows, size_t pos0, const KvCache& cache, size_t layer,
                          size_t num_heads, size_t num_kv_heads, size_t head_dim, float* out,
                          size_t sliding_window = 0, const float* sinks = nullptr);

/// Where a GQA attention block RMS-normalises q and k, after their projections and
/// before RoPE.
enum class QkNorm {
  kNone,     ///< no q/k norm (MixtralAttention, Qwen2MoeAttention)
  kPerHead,  ///< each head over head_dim, one weight for all heads (Qwen3MoeAttention)
  kWhole,    ///< the whole projection, num_heads * head_dim wide (OlmoeAttention)
};

/// The family's choices in a RoPE GQA attention block.
struct GqaOptions {
  bool qkv_bias = false;         ///< biases on q_proj, k_proj and v_proj
  bool o_bias = false;           ///< a bias on o_proj
  QkNorm qk_norm = QkNorm::kNone;
  double norm_eps = 1e-6;        ///< of q_norm and k_norm
  double clip_qkv = 0;           ///< when > 0, q, k and v are clamped to [-clip, clip] after the norms
  /// When > 0, each query attends only the last sliding_window positions, itself included
  /// (MixtralAttention, Qwen2MoeAttention and GptOssAttention on "sliding_attention" layers).
  size_t sliding_window = 0;
  bool sinks = false;            ///< learned per-head sink logits "<prefix>.sinks" (GptOssAttention)
  bool norm_unit_offset = false; ///< q_norm / k_norm scale by 1 + weight (Qwen3NextRMSNorm)
  /// q_proj also projects a gate: per head [head_dim query | head_dim gate], and the
  /// attention output is multiplied by sigmoid(gate) before o_proj (Qwen3NextAttention).
  bool output_gate = false;
};

/// The RoPE GQA attention block of the Llama-style families: q/k/v projections, the
/// family's q/k norm (GqaOptions::qk_norm) and clamp, then RoPE attention. Weights
/// "<prefix>.{q,k,v,o}_proj.weight" (+ ".bias" as the options say) and, with a q/k
/// norm, "<prefix>.{q,k}_norm.weight"; with sinks, "<prefix>.sinks" [num_heads]. After
/// the norms it rotates q and k, stores k and v in the cache, attends causally
/// (causal_gqa_attention, within the options' sliding window) and projects with o_proj.
struct RopeGqaAttention {
  Linear q_proj, k_proj, v_proj, o_proj;
  RmsNorm q_norm, k_norm;  ///< empty unless options.qk_norm
  std::vector<float> sinks;  ///< [num_heads] when options.sinks, else empty
  size_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  GqaOptions options;
  static RopeGqaAttention load(const Checkpoint& ckpt, const std::string& prefix, size_t hidden, size_t num_heads,
                               size_t num_kv_heads, size_t head_dim, const GqaOptions& options);
  /// out [rows, hidden] for x [rows, hidden] (normed), the rows of the sequences `batch`
  /// lays out: projections over all rows, then per sequence RoPE at its positions, its
  /// K/V stored in `layer` of its cache, causal attention over that cache.
  void operator()(const Rope& rope, const float* x, size_t rows, std::span<const SequenceRows> batch, size_t layer,
                  float* out) const;

 private:
  /// Applies the q/k norm and the clamp to q [rows, num_heads * head_dim], k and v
  /// [rows, num_kv_heads * head_dim], in place.
  void normalise_qkv(float* q, float* k, float* v, size_t rows) const;
  /// With options.output_gate: q [rows, num_heads, 2 * head_dim] becomes the queries
  /// [rows, num_heads * head_dim], their gates go to `gate` (same shape).
  void split_query_gate(std::vector<float>& q, size_t rows, std::vector<float>& gate) const;
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
  /// logits [rows, vocab] of hidden rows [rows, hidden]; `embed` [vocab, hidden] is used
  /// when tied. Each row's logits are the same whatever the other rows.
  void operator()(const float* hidden, size_t rows, const StoredMatrix& embed, float* logits) const;
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

/// Sets order (size n) to 0..n-1 with its first `k` the indices of the k largest of
/// value[0..n), in descending order, ties to the lower index (torch.topk's order on the
/// routers' fixtures). The one ordering rule every router uses.
void top_k_by(std::vector<uint32_t>& order, size_t k, const std::vector<float>& value);

/// The router of a MoE block: which experts each position goes to, with what weights.
class Router {
 public:
  virtual ~Router() = default;
  /// The decisions for normed rows x [rows, hidden()].
  virtual Routing route(const float* x, size_t rows) const = 0;
  /// The width of the rows it routes.
  virtual size_t hidden() const = 0;
  /// The batch-union (ascending) of the experts it picks for x [rows, hidden()].
  std::vector<uint32_t> predict(const float* x, size_t rows) const;
};

/// The routed-expert step of one MoE layer while it is in flight: the constructor sends
/// x [rows, hidden]'s assignments through `dispatcher` (begin_layer) and returns, so the
/// caller can run a shared expert meanwhile; finish() waits and writes out[r] = sum over
/// ranks k of weights[r,k] * expert_k(x[r]), each product one f32 multiply, summed
/// exactly in fixed point (common/fixed_point.h) by the dispatcher and rounded once to
/// f32 here, so it is the same whatever the placement. `x` must stay unchanged and the
/// dispatcher must see no other layer until finish() returns. Errors as
/// ExpertDispatcher::begin_layer / finish_layer, and Error(kInvalidInput) for a top_k
/// over kMaxTermsPerRow.
class RoutedExpertsCall {
 public:
  RoutedExpertsCall(ExpertDispatcher& dispatcher, uint32_t layer, const float* x, size_t rows, size_t hidden,
                    Routing routing);
  // The dispatcher holds the addresses of assignments_ and sums_ until finish():
  // the call must not move.
  RoutedExpertsCall(const RoutedExpertsCall&) = delete;
  RoutedExpertsCall& operator=(const RoutedExpertsCall&) = delete;
  /// out [rows, hidden] f32: the weighted sum (NaN where a term was not finite).
  void finish(float* out);

 private:
  ExpertDispatcher& dispatcher_;
  size_t rows_;
  size_t hidden_;
  Routing routing_;
  std::vector<ExpertAssignment> assignments_;
  std::vector<int64_t> sums_;  // [rows, hidden] fixed point, filled by the dispatcher
};

/// Softmax top-k routing (Qwen3MoeTopKRouter, OlmoeTopKRouter, MixtralTopKRouter,
/// Qwen2MoeSparseMoeBlock's gate): router "<prefix>.gate" [num_experts, hidden] with no
/// bias, then softmax_topk.
struct SoftmaxTopkRouter final : Router {
  Linear router;
  size_t top_k = 0;
  bool norm_topk_prob = false;
  /// Loads "<prefix>.gate.weight" [num_experts, hidden].
  static SoftmaxTopkRouter load(const Checkpoint& ckpt, const std::string& prefix, size_t hidden, size_t num_experts,
                                size_t top_k, bool norm_topk_prob);
  Routing route(const float* x, size_t rows) const override;
  size_t hidden() const override { return router.in(); }
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
                         const Router& next_router, const float* hidden, size_t rows);

/// The next MoE layer a block's prefetch hint is about, and the state it predicts from.
struct NextMoeLayer {
  uint32_t layer = 0;
  const RmsNorm* norm = nullptr;      ///< its post_attention_layernorm
  const Router* router = nullptr;     ///< its router
  const float* hidden = nullptr;      ///< this layer's residual stream [rows, hidden_size]
};

/// A MoE block's call while its routed experts are out (MoeBlock::begin): the routed
/// step in flight and the shared expert's output, computed meanwhile. Move-only; the
/// dispatcher holds addresses inside it (the routed call is on the heap, so moving the
/// MoeCall moves nothing it points at).
class MoeCall {
 public:
  /// out [rows, hidden] = routed + shared (RoutedExpertsCall::finish, then the shared
  /// output added). Call once. Errors as RoutedExpertsCall::finish.
  void finish(float* out);

 private:
  friend struct MoeBlock;
  std::unique_ptr<RoutedExpertsCall> routed_;
  std::vector<float> shared_;  // [rows, hidden]; empty without a shared expert
};

/// The MoE block of every family (Qwen3MoeSparseMoeBlock, OlmoeSparseMoeBlock,
/// MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock, DeepseekV3MoE): routed experts through
/// the dispatcher, plus, where the family has one, a shared expert that runs here while
/// the routed experts are in flight.
struct MoeBlock {
  std::unique_ptr<const Router> router;  ///< null on a family's dense layers
  /// out [rows, hidden] = the shared expert of x [rows, hidden]; empty when there is none
  /// (Qwen2-MoE: GatedSharedExpert; DeepSeek-V3: a DenseMlp of the shared experts).
  std::function<void(const float* x, size_t rows, float* out)> shared_expert;

  /// Starts the block for normed rows x [rows, hidden] of `layer`: the prefetch hint for
  /// `next` (when not null; read here only), which travels with this layer's work, then
  /// the routed experts, then, while they run, the shared expert. `x` must stay unchanged
  /// until the call's finish.
  /// Errors as RoutedExpertsCall.
  MoeCall begin(ExpertDispatcher& dispatcher, uint32_t layer, const float* x, size_t rows,
                const NextMoeLayer* next) const;

  /// out [rows, hidden] = routed(x) + shared_expert(x): begin, then finish at once.
  void operator()(ExpertDispatcher& dispatcher, uint32_t layer, const float* x, size_t rows, const NextMoeLayer* next,
                  float* out) const {
    begin(dispatcher, layer, x, rows, next).finish(out);
  }
};

}  // namespace charm
