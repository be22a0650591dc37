// Mixtral (MixtralForCausalLM), following transformers' models/mixtral/modeling_mixtral.py:
// pre-norm decoder layers with plain GQA attention (no biases, no q/k norm), RoPE, and a
// sparse MoE block in every layer (hub name `block_sparse_moe`): softmax top-k routing
// renormalised over the chosen experts, no shared expert. Routed experts are stored as
// `block_sparse_moe.experts.{e}.w1/w3/w2` (gate/up/down; see expert_tensor_names).
// A sliding window is accepted only when it cannot bite (ModelConfig::parse).
#include <string>
#include <vector>

#include "coordinator/models/blocks.h"
#include "coordinator/models/model.h"

namespace charm {
namespace {

struct MixtralLayer {
  RmsNorm input_layernorm, post_attention_layernorm;
  RopeGqaAttention self_attn;  // MixtralAttention: no biases
  SoftmaxTopkMoe sparse_moe;
};

class Mixtral final : public LayerStack<MixtralLayer> {
 public:
  Mixtral(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher)
      : LayerStack(ckpt, config, dispatcher) {
    const size_t h = config.hidden_size;
    const double eps = config.rms_norm_eps;
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      MixtralLayer layer;
      layer.input_layernorm = RmsNorm::load(ckpt, p + ".input_layernorm", h, eps);
      layer.post_attention_layernorm = RmsNorm::load(ckpt, p + ".post_attention_layernorm", h, eps);
      layer.self_attn = RopeGqaAttention::load(ckpt, p + ".self_attn", h, config.num_attention_heads,
                                               config.num_key_value_heads, config.head_dim, false);
      // MixtralTopKRouter always renormalises the top-k (ModelConfig sets norm_topk_prob).
      layer.sparse_moe = SoftmaxTopkMoe::load(ckpt, p + ".block_sparse_moe", h, config.num_experts,
                                              config.num_experts_per_tok, config.norm_topk_prob);
      layers_.push_back(std::move(layer));
    }
  }

 protected:
  const SoftmaxTopkMoe* hint_router(size_t l) const override { return &layers_[l].sparse_moe; }

  void attention(size_t l, const float* x, size_t n, size_t pos0, KvCache& cache, float* out) override {
    layers_[l].self_attn(rope_, x, n, pos0, cache, l, out);
  }

  /// MixtralSparseMoeBlock: every layer is routed; a prefetch hint goes out while it runs.
  void feed_forward(size_t l, const float* x, const float* hidden, size_t n, float* out) override {
    routed_moe(l, layers_[l].sparse_moe, x, hidden, n, out);
  }
};

}  // namespace

std::unique_ptr<Model> load_mixtral(const Checkpoint& checkpoint, const ModelConfig& config,
                                    ExpertDispatcher& dispatcher) {
  return std::make_unique<Mixtral>(checkpoint, config, dispatcher);
}

}  // namespace charm
