// Qwen2-MoE (Qwen2MoeForCausalLM), following transformers'
// models/qwen2_moe/modeling_qwen2_moe.py: pre-norm decoder layers with GQA attention
// whose q, k and v projections carry biases (qkv_bias; no q/k norm), RoPE, and either a
// dense SwiGLU MLP (mlp_only_layers, decoder_sparse_step) or Qwen2MoeSparseMoeBlock:
// softmax top-k routed experts plus a shared expert scaled by sigmoid(shared_expert_gate).
// The shared expert runs here while the workers compute the routed experts.
#include <string>
#include <vector>

#include "coordinator/models/blocks.h"
#include "coordinator/models/model.h"

namespace charm {
namespace {

struct Qwen2MoeLayer {
  RmsNorm input_layernorm, post_attention_layernorm;
  RopeGqaAttention self_attn;  // Qwen2MoeAttention: biased q/k/v (qkv_bias)
  bool moe = false;
  SoftmaxTopkMoe sparse_moe;       // when moe
  GatedSharedExpert shared_expert;  // when moe
  DenseMlp mlp;                     // when !moe
};

class Qwen2Moe final : public LayerStack<Qwen2MoeLayer> {
 public:
  Qwen2Moe(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher)
      : LayerStack(ckpt, config, dispatcher) {
    const size_t h = config.hidden_size;
    const double eps = config.rms_norm_eps;
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      Qwen2MoeLayer layer;
      layer.input_layernorm = RmsNorm::load(ckpt, p + ".input_layernorm", h, eps);
      layer.post_attention_layernorm = RmsNorm::load(ckpt, p + ".post_attention_layernorm", h, eps);
      layer.self_attn = RopeGqaAttention::load(ckpt, p + ".self_attn", h, config.num_attention_heads,
                                               config.num_key_value_heads, config.head_dim, config.qkv_bias);
      layer.moe = config.is_moe_layer(l);
      if (layer.moe) {
        layer.sparse_moe = SoftmaxTopkMoe::load(ckpt, p + ".mlp", h, config.num_experts, config.num_experts_per_tok,
                                                config.norm_topk_prob);
        layer.shared_expert = GatedSharedExpert::load(ckpt, p + ".mlp", h, config.shared_expert_intermediate_size);
      } else {
        layer.mlp = DenseMlp::load(ckpt, p + ".mlp", h, config.intermediate_size);
      }
      layers_.push_back(std::move(layer));
    }
  }

 protected:
  const SoftmaxTopkMoe* hint_router(size_t l) const override {
    return layers_[l].moe ? &layers_[l].sparse_moe : nullptr;
  }

  void attention(size_t l, const float* x, size_t n, size_t pos0, KvCache& cache, float* out) override {
    layers_[l].self_attn(rope_, x, n, pos0, cache, l, out);
  }

  /// Qwen2MoeSparseMoeBlock: routed experts go out first; the gated shared expert (and a
  /// prefetch hint) run here while they are in flight; the block's output is their sum.
  /// Dense SwiGLU on mlp_only layers.
  void feed_forward(size_t l, const float* x, const float* hidden, size_t n, float* out) override {
    const Qwen2MoeLayer& layer = layers_[l];
    if (!layer.moe) return layer.mlp(x, n, out);
    RoutedExpertsCall routed = layer.sparse_moe.begin(dispatcher_, static_cast<uint32_t>(l), x, n);
    hint_next(l, hidden, n);
    std::vector<float> shared(n * config_.hidden_size);
    layer.shared_expert(x, n, shared.data());
    routed.finish(out);
    add_residual(out, shared.data(), shared.size());
  }
};

}  // namespace

std::unique_ptr<Model> load_qwen2_moe(const Checkpoint& checkpoint, const ModelConfig& config,
                                      ExpertDispatcher& dispatcher) {
  return std::make_unique<Qwen2Moe>(checkpoint, config, dispatcher);
}

}  // namespace charm
