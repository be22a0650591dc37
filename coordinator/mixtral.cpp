// Mixtral (MixtralForCausalLM), following transformers' models/mixtral/modeling_mixtral.py:
// pre-norm decoder layers with plain GQA attention (no biases, no q/k norm), RoPE, and a
// sparse MoE block in every layer (hub name `block_sparse_moe`): softmax top-k routing
// renormalised over the chosen experts, no shared expert. Routed experts are stored as
// `block_sparse_moe.experts.{e}.w1/w3/w2` (gate/up/down; see expert_tensor_names).
// A sliding window is accepted only when it cannot bite (ModelConfig::parse).
#include <string>
#include <vector>

#include "coordinator/blocks.h"
#include "coordinator/model.h"

namespace charm {
namespace {

struct MixtralLayer {
  RmsNorm input_layernorm, post_attention_layernorm;
  RopeGqaAttention self_attn;  // MixtralAttention: no biases
  SoftmaxTopkMoe sparse_moe;
};

class Mixtral final : public DecoderModel {
 public:
  Mixtral(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher)
      : DecoderModel(ckpt, config, dispatcher) {
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

  void forward(const int32_t* tokens, size_t n, KvCache& cache, float* logits) override {
    const size_t h = config_.hidden_size;
    std::vector<float> hidden(n * h), x(n * h), delta(n * h);
    const size_t pos0 = begin_forward(tokens, n, cache, hidden.data());
    for (size_t l = 0; l < layers_.size(); ++l) {
      const MixtralLayer& layer = layers_[l];
      layer.input_layernorm(hidden.data(), n, x.data());
      layer.self_attn(rope_, x.data(), n, pos0, cache, l, delta.data());
      add_residual(hidden.data(), delta.data(), n * h);
      // MixtralSparseMoeBlock: every layer is routed.
      layer.post_attention_layernorm(hidden.data(), n, x.data());
      layer.sparse_moe(dispatcher_, static_cast<uint32_t>(l), x.data(), n, delta.data());
      add_residual(hidden.data(), delta.data(), n * h);
    }
    end_forward(hidden.data(), n, logits);
  }

 private:
  std::vector<MixtralLayer> layers_;
};

}  // namespace

std::unique_ptr<Model> load_mixtral(const Checkpoint& checkpoint, const ModelConfig& config,
                                    ExpertDispatcher& dispatcher) {
  return std::make_unique<Mixtral>(checkpoint, config, dispatcher);
}

}  // namespace charm
