// A decoder-only MoE model as the coordinator runs it: the dense part (embeddings,
// attention, norms, routers, dense MLPs, lm_head) is resident here; routed experts are
// reached through an ExpertDispatcher. One implementation per family, one file each.
#pragma once

#include <cstdint>
#include <memory>

#include "common/checkpoint.h"
#include "common/model_config.h"
#include "coordinator/blocks.h"
#include "coordinator/expert_dispatch.h"
#include "coordinator/kv_cache.h"

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

 protected:
  /// Checks `tokens`, reserves n positions in `cache` (returns the first one) and writes
  /// their embeddings to hidden [n, hidden_size].
  size_t begin_forward(const int32_t* tokens, size_t n, KvCache& cache, float* hidden) const;
  /// logits [vocab] of the last of n hidden rows (final norm + lm_head).
  void end_forward(const float* hidden, size_t n, float* logits) const;

  ModelConfig config_;
  ExpertDispatcher& dispatcher_;
  Rope rope_;
  std::vector<float> embed_;
  OutputHead head_;
};

/// Loads the family `config.architecture` names. Resident weights are read from
/// `checkpoint` into f32; routed experts stay with `dispatcher`, which must outlive the
/// model. Throws Error(kUnsupported) for an architecture without a family file.
std::unique_ptr<Model> load_model(const Checkpoint& checkpoint, const ModelConfig& config,
                                  ExpertDispatcher& dispatcher);

/// Family constructors (coordinator/<family>.cpp).
std::unique_ptr<Model> load_qwen3_moe(const Checkpoint& checkpoint, const ModelConfig& config,
                                      ExpertDispatcher& dispatcher);
std::unique_ptr<Model> load_olmoe(const Checkpoint& checkpoint, const ModelConfig& config,
                                  ExpertDispatcher& dispatcher);
std::unique_ptr<Model> load_qwen2_moe(const Checkpoint& checkpoint, const ModelConfig& config,
                                      ExpertDispatcher& dispatcher);
std::unique_ptr<Model> load_mixtral(const Checkpoint& checkpoint, const ModelConfig& config,
                                    ExpertDispatcher& dispatcher);

/// DeepSeek-V3 family (coordinator/deepseek_v3.cpp).
std::unique_ptr<Model> load_deepseek_v3(const Checkpoint& checkpoint, const ModelConfig& config,
                                        ExpertDispatcher& dispatcher);

/// Checks every token id of tokens[0..n) is in [0, vocab_size); throws Error(kInvalidInput).
void check_token_ids(const int32_t* tokens, size_t n, int64_t vocab_size);


}  // namespace charm
