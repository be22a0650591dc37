// A decoder-only MoE model as the coordinator runs it: the dense part (embeddings,
// attention, norms, routers, dense MLPs, lm_head) is resident here; routed experts are
// reached through an ExpertDispatcher. One implementation per family, one file each,
// listed in coordinator/models/families.h (which also loads them: load_model).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "common/checkpoint.h"
#include "common/model_config.h"
#include "coordinator/dispatch/expert_dispatch.h"
#include "coordinator/models/blocks.h"
#include "coordinator/models/kv_cache.h"

namespace charm {

class Model {
 public:
  virtual ~Model() = default;

  /// Runs tokens[0..n) at positions cache.length() .. +n (prefill when n > 1, decode when
  /// n == 1) as one batch, appends their K/V to `cache`, and writes the logits of the last
  /// position to `logits` [vocab_size] f32. Throws Error(kInvalidInput) for a token id
  /// outside the vocabulary or a sequence past the cache's capacity.
  virtual void forward(const int32_t* tokens, size_t n, KvCache& cache, float* logits) = 0;

  /// An empty cache shaped for this model, holding up to `max_tokens` positions.
  virtual KvCache new_cache(size_t max_tokens) const = 0;

  virtual const ModelConfig& config() const = 0;
};

/// What every decoder family here has besides its layers: the config, the expert
/// dispatcher, RoPE, the token embeddings and the output head, and a GQA KV cache.
/// Families derive from it and implement forward() and their own layer type.
class DecoderModel : public Model {
 public:
  /// Loads "model.embed_tokens.weight" [vocab, hidden] and the output head.
  DecoderModel(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher);
  KvCache new_cache(size_t max_tokens) const override;
  const ModelConfig& config() const override { return config_; }

  /// The pre-norm decoder stack every family here shares (the *DecoderLayer of each HF
  /// modeling file): per layer, hidden += attention(input_norm(hidden)), then
  /// hidden += feed_forward(post_attention_norm(hidden)); then the output head. The
  /// feed-forward block is the layer's MoE block (blocks.h: MoeBlock, with the next MoE
  /// layer's prefetch hint) or, on dense layers, its dense MLP.
  void forward(const int32_t* tokens, size_t n, KvCache& cache, float* logits) final;

 protected:
  /// The family's layer parts, for layer < num_layers(). Activations are f32 [n, hidden].
  virtual size_t num_layers() const = 0;
  virtual const RmsNorm& input_norm(size_t layer) const = 0;
  virtual const RmsNorm& post_attention_norm(size_t layer) const = 0;
  /// out = the attention block for normed rows x at positions pos0..pos0+n-1; appends
  /// their keys/values (or latents) to `cache`.
  virtual void attention(size_t layer, const float* x, size_t n, size_t pos0, KvCache& cache, float* out) = 0;
  /// The MoE block of `layer`, or nullptr when the layer is dense.
  virtual const MoeBlock* moe_block(size_t layer) const = 0;
  /// The dense MLP of a layer without a MoE block.
  virtual const DenseMlp& dense_mlp(size_t layer) const = 0;

  ModelConfig config_;
  ExpertDispatcher& dispatcher_;
  Rope rope_;
  StoredMatrix embed_;  // [vocab, hidden] at the checkpoint's precision
  OutputHead head_;

 private:
  /// Checks `tokens`, reserves n positions in `cache` (returns the first one) and writes
  /// their embeddings to hidden [n, hidden_size].
  size_t begin_forward(const int32_t* tokens, size_t n, KvCache& cache, float* hidden) const;
  /// out = the MoE block or dense MLP of `layer` for normed rows x; `hidden` is the
  /// residual stream the rows were normed from (what the prefetch hint predicts from).
  void feed_forward(size_t layer, const float* x, const float* hidden, size_t n, float* out);
  /// The first MoE layer after `layer`, which the hint of `layer` is about; nullopt when none.
  std::optional<NextMoeLayer> next_moe_layer(size_t layer, const float* hidden) const;
  /// logits [vocab] of the last of n hidden rows (final norm + lm_head).
  void end_forward(const float* hidden, size_t n, float* logits) const;
};

/// A DecoderModel whose layers are a vector of the family's `Layer` struct, with the HF
/// names: RmsNorm `input_layernorm` and `post_attention_layernorm`, an attention block
/// `self_attn` called as (rope, x, n, pos0, cache, layer, out), a MoeBlock `sparse_moe`
/// (router null on dense layers) and a DenseMlp `mlp` (dense layers only).
template <typename Layer>
class LayerStack : public DecoderModel {
 public:
  using DecoderModel::DecoderModel;

 protected:
  size_t num_layers() const override { return layers_.size(); }
  const RmsNorm& input_norm(size_t l) const override { return layers_[l].input_layernorm; }
  const RmsNorm& post_attention_norm(size_t l) const override { return layers_[l].post_attention_layernorm; }
  void attention(size_t l, const float* x, size_t n, size_t pos0, KvCache& cache, float* out) override {
    layers_[l].self_attn(rope_, x, n, pos0, cache, l, out);
  }
  const MoeBlock* moe_block(size_t l) const override {
    return layers_[l].sparse_moe.router ? &layers_[l].sparse_moe : nullptr;
  }
  const DenseMlp& dense_mlp(size_t l) const override { return layers_[l].mlp; }

  std::vector<Layer> layers_;
};

/// Checks every token id of tokens[0..n) is in [0, vocab_size); throws Error(kInvalidInput).
void check_token_ids(const int32_t* tokens, size_t n, int64_t vocab_size);

}  // namespace charm
