// Qwen2-MoE (Qwen2MoeForCausalLM), following transformers'
// models/qwen2_moe/modeling_qwen2_moe.py: pre-norm decoder layers with GQA attention
// whose q, k and v projections carry biases (qkv_bias; no q/k norm), RoPE, and either a
// dense SwiGLU MLP (mlp_only_layers, decoder_sparse_step) or Qwen2MoeSparseMoeBlock:
// softmax top-k routed experts plus a shared expert scaled by sigmoid(shared_expert_gate).
// The shared expert runs here while the workers compute the routed experts.
#include <string>
#include <vector>

#include "common/config_fields.h"
#include "common/error.h"
#include "coordinator/models/blocks.h"
#include "coordinator/models/families.h"
#include "coordinator/models/model.h"

namespace charm {
namespace {

struct Qwen2MoeLayer {
  RmsNorm input_layernorm, post_attention_layernorm;
  RopeGqaAttention self_attn;  // Qwen2MoeAttention: biased q/k/v (qkv_bias)
  MoeBlock sparse_moe;         // routed + gated shared expert; no router on dense layers
  DenseMlp mlp;                // dense layers only
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
                                               config.num_key_value_heads, config.head_dim,
                                               GqaOptions{.qkv_bias = config.qkv_bias});
      if (config.is_moe_layer(l)) {
        layer.sparse_moe.router = std::make_unique<SoftmaxTopkRouter>(SoftmaxTopkRouter::load(
            ckpt, p + ".mlp", h, config.num_experts, config.num_experts_per_tok, config.norm_topk_prob));
        layer.sparse_moe.shared_expert =
            GatedSharedExpert::load(ckpt, p + ".mlp", h, config.shared_expert_intermediate_size);
      } else {
        layer.mlp = DenseMlp::load(ckpt, p + ".mlp", h, config.intermediate_size);
      }
      layers_.push_back(std::move(layer));
    }
  }
};

/// Qwen2MoeConfig's own fields (transformers models/qwen2_moe/configuration_qwen2_moe.py):
/// the experts' width and dense layers as Qwen3-MoE spells them, the gated shared
/// expert's width, qkv_bias (default true), and the sliding window, which charm does not
/// implement: use_sliding_window true is refused (transformers 5's layer_types are
/// checked by ModelConfig::parse).
void read_qwen2_moe_config(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  hf::read_moe_intermediate_size(j, source, c);
  hf::read_sparse_layers(j, source, c);
  c.shared_expert_intermediate_size = hf::get_int(j, source, "shared_expert_intermediate_size", std::nullopt);
  hf::require_positive(source, "shared_expert_intermediate_size", c.shared_expert_intermediate_size);
  c.qkv_bias = hf::get_bool(j, source, "qkv_bias", true);
  if (hf::get_bool(j, source, "use_sliding_window", false)) {
    fail_unsupported(source + ": field 'use_sliding_window' is true; sliding-window attention is not "
                     "implemented for Qwen2MoeForCausalLM");
  }
}

}  // namespace

const ModelFamily& qwen2_moe_family() {
  static const ModelFamily family{
      .checkpoint = {.architectures = {"Qwen2MoeForCausalLM"},
                     .num_experts_keys = {"num_experts"},  // Qwen2MoeConfig has no alias
                     .read_fields = read_qwen2_moe_config,
                     .expert_tensors = ExpertTensorNames{}},  // the hub default names
      .build = build_model<Qwen2Moe>,
  };
  return family;
}

}  // namespace charm
