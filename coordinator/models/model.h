// A decoder-only MoE model as the coordinator runs it: the dense part (embeddings,
// attention, norms, routers, dense MLPs, lm_head) is resident here; routed experts are
// reached through an ExpertDispatcher. One implementation per family, one file each,
// listed in coordinator/models/families.h (which also loads them: load_model).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/checkpoint.h"
#include "common/model_config.h"
#include "coordinator/dispatch/expert_dispatch.h"
#include "coordinator/models/blocks.h"
#include "coordinator/models/kv_cache.h"

namespace charm {

/// One sequence's part of a step's batch: tokens[0..n) at positions cache->length() ..
/// +n (a prompt chunk, or n == 1 to decode). `logits` [vocab_size] f32 receives the
/// logits of the last of them; null when the step needs none (a prompt chunk before the
/// last).
struct SequenceStep {
  const int32_t* tokens = nullptr;
  size_t n = 0;
  KvCache* cache = nullptr;
  float* logits = nullptr;
};

class Model {
 public:
  virtual ~Model() = default;

  /// Runs a ragged batch, every sequence with its own positions and cache, as one pass
  /// (DESIGN.md, "The serving engine"): dense projections over all rows, attention per
  /// sequence, one batch-union per MoE layer. Appends each sequence's K/V to its cache,
  /// whose capacity must already hold the new positions (KvCache::reserve). A sequence's
  /// logits do not depend, bit for bit, on the other sequences of the batch or on how its
  /// prompt was split into steps. Throws Error(kInvalidInput) for a token id outside the
  /// vocabulary, an empty part or a cache without room (before anything is written), and
  /// what the expert dispatcher throws.
  virtual void forward_batch(std::span<const SequenceStep> batch) = 0;

  /// forward_batch of one sequence: tokens[0..n) at positions cache.length() .. +n.
  void forward(const int32_t* tokens, size_t n, KvCache& cache, float* logits) {
    const SequenceStep step{tokens, n, &cache, logits};
    forward_batch({&step, 1});
  }

  /// The shape of this model's cache rows.
  virtual KvLayout kv_layout() const = 0;

  /// A cache with its own blocks for up to `max_tokens` positions (tests, one-off runs).
  KvCache new_cache(size_t max_tokens) const { return KvCache(kv_layout(), max_tokens); }

  virtual const ModelConfig& config() const = 0;

  /// How many micro-batches a step's sequences are split into (ping-pong: 1 or 2;
  /// 0 = automatic: 2 when the experts run remotely, else 1). Never changes an output.
  void set_micro_batches(size_t n) { micro_batches_ = n; }

 protected:
  size_t micro_batches_ = 0;
};

/// `batch` as `parts` micro-batches of whole sequences (parts 1 or fewer than two
/// sequences: the batch itself; else two, the first with about half the rows).
std::vector<std::span<const SequenceStep>> split_micro_batches(std::span<const SequenceStep> batch, size_t parts);

/// What every decoder family here has besides its layers: the config, the expert
/// dispatcher, RoPE, the token embeddings and the output head, and a GQA KV cache.
/// Families derive from it and implement forward() and their own layer type.
class DecoderModel : public Model {
 public:
  /// Loads "model.embed_tokens.weight" [vocab, hidden] and the output head.
  DecoderModel(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher);
  KvLayout kv_layout() const override;
  const ModelConfig& config() const override { return config_; }

  /// The pre-norm decoder stack every family here shares (the *DecoderLayer of each HF
  /// modeling file): per layer, hidden += attention(input_norm(hidden)), then
  /// hidden += feed_forward(post_attention_norm(hidden)); then the output head. The
  /// feed-forward block is the layer's MoE block (blocks.h: MoeBlock, with the next MoE
  /// layer's prefetch hint) or, on dense layers, its dense MLP. With two micro-batches
  /// (set_micro_batches) the layers of the two halves interleave, each half's MoE layer
  /// finishing just before its next attention.
  void forward_batch(std::span<const SequenceStep> batch) final;

 protected:
  /// The family's layer parts, for layer < num_layers(). Activations are f32 [n, hidden].
  virtual size_t num_layers() const = 0;
  virtual const RmsNorm& input_norm(size_t layer) const = 0;
  virtual const RmsNorm& post_attention_norm(size_t layer) const = 0;
  /// out [rows, hidden] = the attention block for normed rows x [rows, hidden] of the
  /// sequences `batch` lays out; appends their keys/values (or latents) to their caches.
  virtual void attention(size_t layer, const float* x, size_t rows, std::span<const SequenceRows> batch,
                         float* out) = 0;
  /// The MoE block of `layer`, or nullptr when the layer is dense.
  virtual const MoeBlock* moe_block(size_t layer) const = 0;
  /// The dense MLP of a layer without a MoE block.
  virtual const DenseMlp& dense_mlp(size_t layer) const = 0;
  /// Called at the start of every forward_batch, after its checks: a family that keeps
  /// state across the layers of one step (GLM-5's shared selections) drops what a forward
  /// that threw left behind.
  virtual void begin_step() {}

  ModelConfig config_;
  ExpertDispatcher& dispatcher_;
  Rope rope_;
  StoredMatrix embed_;  // [vocab, hidden] at the checkpoint's precision
  OutputHead head_;

 private:
  struct MicroBatch;
  /// Throws Error(kInvalidInput) for a part of `batch` that forward_batch refuses.
  void check_batch(std::span<const SequenceStep> batch) const;
  /// Marks the positions of every part of `batch` stored in its cache; returns where each
  /// sequence's rows are and writes their embeddings to hidden [rows, hidden_size].
  std::vector<SequenceRows> begin_forward(std::span<const SequenceStep> batch, float* hidden) const;
  /// The MoE block (begun, left in flight in m.moe) or dense MLP (added to m.hidden) of
  /// `layer` for m's normed rows m.x; the hint predicts from m.hidden.
  void feed_forward(size_t layer, MicroBatch& m);
  /// Finishes m's MoE layer in flight, if any, and adds it to m.hidden.
  void finish_moe(MicroBatch& m);
  /// The first MoE layer after `layer`, which the hint of `layer` is about; nullopt when none.
  std::optional<NextMoeLayer> next_moe_layer(size_t layer, const float* hidden) const;
  /// The logits [vocab] of each part's last row that asks for them, in every micro-batch
  /// (final norm + lm_head over all those rows at once).
  void end_forward(std::span<const MicroBatch> micro) const;
};

/// A DecoderModel whose layers are a vector of the family's `Layer` struct, with the HF
/// names: RmsNorm `input_layernorm` and `post_attention_layernorm`, an attention block
/// `self_attn` called as (rope, x, rows, batch, layer, out), a MoeBlock `sparse_moe`
/// (router null on dense layers) and a DenseMlp `mlp` (dense layers only).
template <typename Layer>
class LayerStack : public DecoderModel {
 public:
  using DecoderModel::DecoderModel;

 protected:
  size_t num_layers() const override { return layers_.size(); }
  const RmsNorm& input_norm(size_t l) const override { return layers_[l].input_layernorm; }
  const RmsNorm& post_attention_norm(size_t l) const override { return layers_[l].post_attention_layernorm; }
  void attention(size_t l, const float* x, size_t rows, std::span<const SequenceRows> batch, float* out) override {
    layers_[l].self_attn(rope_, x, rows, batch, l, out);
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
