// Qwen2-MoE (Qwen2MoeForCausalLM), following transformers'
// models/qwen2_moe/modeling_qwen2_moe.py: pre-norm decoder layers with GQA attention
// whose q, k and v projections carry biases (qkv_bias; no q/k norm), RoPE, and either a
// dense SwiGLU MLP (mlp_only_layers, decoder_sparse_step) or Qwen2MoeSparseMoeBlock:
// softmax top-k routed experts plus a shared expert scaled by sigmoid(shared_expert_gate).
// The shared expert runs here while the workers compute the routed experts. Layers whose
// layer_types entry is "sliding_attention" attend only the last sliding_window positions.
#include <string>
#include <vector>

#include "common/config_fields.h"
#include "coordinator/models/blocks.h"
#include "coordinator/models/families.h"
#include "coordinator/models/model.h"
#include "coordinator/models/routers.h"

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
                                               GqaOptions{.qkv_bias = config.qkv_bias,
                                                          .sliding_window = config.attention_window(l)});
      if (config.is_moe_layer(l)) {
        layer.sparse_moe = load_gated_shared_moe(ckpt, p + ".mlp", config);
      } else {
        layer.mlp = DenseMlp::load(ckpt, p + ".mlp", h, config.intermediate_size);
      }
      layers_.push_back(std::move(layer));
    }
  }
};

/// Qwen2MoeConfig's own fields (transformers models/qwen2_moe/configuration_qwen2_moe.py):
/// the experts' width and dense layers as Qwen3-MoE spells them, the gated shared
/// expert's width, qkv_bias (default true), and the sliding window as
/// Qwen2MoeConfig.__post_init__ resolves it: sliding_window (default 4096) only when
/// use_sliding_window, else 0; layer_types, when absent, "sliding_attention" for the even
/// layers (i + 1 odd) below max_window_layers (default 28) when use_sliding_window.
void read_qwen2_moe_config(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  hf::read_moe_intermediate_size(j, source, c);
  hf::read_sparse_layers(j, source, c);
  c.shared_expert_intermediate_size = hf::get_int(j, source, "shared_expert_intermediate_size", std::nullopt);
  hf::require_positive(source, "shared_expert_intermediate_size", c.shared_expert_intermediate_size);
  c.qkv_bias = hf::get_bool(j, source, "qkv_bias", true);
  const bool use_window = hf::get_bool(j, source, "use_sliding_window", false);
  const bool absent = !j.contains("sliding_window");
  const int64_t window = !use_window ? 0 : absent ? 4096 : hf::get_int(j, source, "sliding_window", 0);
  const int64_t max_window_layers = hf::get_int(j, source, "max_window_layers", 28);
  std::vector<bool> sliding(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    sliding[static_cast<size_t>(i)] = (i + 1) % 2 != 0 && i < max_window_layers && use_window;
  }
  hf::set_sliding_window(source, "sliding_window", window, sliding, c);
}

}  // namespace

const ModelFamily& qwen2_moe_family() {
  static const ModelFamily family{
      .checkpoint = {.architectures = {"Qwen2MoeForCausalLM"},
                     .num_experts_keys = {"num_experts"},  // Qwen2MoeConfig has no alias
                     .sliding_window = true,
                     .read_fields = read_qwen2_moe_config,
                     .expert_tensors = ExpertTensorNames{}},  // the hub default names
      .build = build_model<Qwen2Moe>,
  };
  return family;
}

}  // namespace charm
