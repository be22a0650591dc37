// Qwen3-Next (Qwen3NextForCausalLM) and Qwen3.5-MoE's text model (Qwen3_5MoeForCausalLM),
// following transformers' models/qwen3_next/modeling_qwen3_next.py and
// models/qwen3_5_moe/modeling_qwen3_5_moe.py: a hybrid stack of gated DeltaNet linear-attention layers
// (coordinator/models/gated_deltanet.h, a fixed-size state per sequence) and gated full
// attention (Qwen3NextAttention: GQA whose q_proj also projects a per-head output gate,
// per-head q/k RMSNorm, partial rotary RoPE), every few layers (layer_types, or
// full_attention_interval, default 4); Qwen2-MoE's MoE block (softmax top-k router,
// sigmoid-gated shared expert) on the sparse layers. Every Qwen3NextRMSNorm (the layer
// norms, q/k norms, the final norm) scales by 1 + weight; the DeltaNet's gated norm by
// weight. The KV cache holds rows only for the full-attention layers; the linear layers'
// states make the prefix cache unusable for this family (KvLayout::state_floats).
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "common/config_fields.h"
#include "common/error.h"
#include "coordinator/models/blocks.h"
#include "coordinator/models/families.h"
#include "coordinator/models/gated_deltanet.h"
#include "coordinator/models/model.h"
#include "coordinator/models/routers.h"

namespace charm {
namespace {

struct Qwen3NextLayer {
  RmsNorm input_layernorm, post_attention_layernorm;
  RopeGqaAttention self_attn;                // Qwen3NextAttention, on full-attention layers
  std::optional<GatedDeltaNet> linear_attn;  // Qwen3NextGatedDeltaNet, on linear-attention layers
  size_t kv_layer = 0;                       // self_attn's layer of the KV cache (full layers only)
  MoeBlock sparse_moe;                       // Qwen3NextSparseMoeBlock; no router on dense layers
  DenseMlp mlp;                              // dense layers only (mlp_only_layers)
};

class Qwen3Next final : public LayerStack<Qwen3NextLayer> {
 public:
  Qwen3Next(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher)
      : LayerStack(ckpt, config, dispatcher) {
    const size_t h = config.hidden_size;
    const double eps = config.rms_norm_eps;
    const bool offset = !config.norm_weights_include_unit_offset;  // a GGUF stores 1 + w
    if (offset) {
      for (float& w : head_.norm.weight) w = 1.0f + w;  // model.norm is a Qwen3NextRMSNorm too
    }
    const GqaOptions attention{.qkv_bias = config.attention_bias, .o_bias = config.attention_bias,
                               .qk_norm = QkNorm::kPerHead, .norm_eps = eps, .norm_unit_offset = offset,
                               .output_gate = true};
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      Qwen3NextLayer layer;
      layer.input_layernorm = RmsNorm::load(ckpt, p + ".input_layernorm", h, eps, offset);
      layer.post_attention_layernorm = RmsNorm::load(ckpt, p + ".post_attention_layernorm", h, eps, offset);
      if (config.linear_attention_layers[l]) {
        layer.linear_attn = GatedDeltaNet::load(ckpt, p + ".linear_attn", config, state_floats_);
        state_floats_ += GatedDeltaNet::state_floats(config);
      } else {
        layer.self_attn = RopeGqaAttention::load(ckpt, p + ".self_attn", h, config.num_attention_heads,
                                                 config.num_key_value_heads, config.head_dim, attention);
        layer.kv_layer = kv_layers_++;
      }
      if (config.is_moe_layer(l)) {
        layer.sparse_moe = load_gated_shared_moe(ckpt, p + ".mlp", config);
      } else {
        layer.mlp = DenseMlp::load(ckpt, p + ".mlp", h, config.intermediate_size);
      }
      layers_.push_back(std::move(layer));
    }
  }

  /// GQA rows for the full-attention layers only, and the linear layers' states.
  KvLayout kv_layout() const override {
    const auto kv_dim = static_cast<size_t>(config_.num_key_value_heads * config_.head_dim);
    return KvLayout{kv_layers_, kv_dim, kv_dim, state_floats_};
  }

 protected:
  void attention(size_t l, const float* x, size_t rows, std::span<const SequenceRows> batch, float* out) override {
    const Qwen3NextLayer& layer = layers_[l];
    if (layer.linear_attn) {
      (*layer.linear_attn)(x, rows, batch, out);
    } else {
      layer.self_attn(rope_, x, rows, batch, layer.kv_layer, out);
    }
  }

 private:
  size_t kv_layers_ = 0, state_floats_ = 0;
};

using nlohmann::json;
using namespace hf;

/// The fields Qwen3NextConfig and Qwen3_5MoeTextConfig share: the experts' width, the
/// gated shared expert's width (default 512), the DeltaNet's linear_* fields (defaults 16
/// key / 32 value heads of 128, conv kernel 4) and, when layer_types is absent, full
/// attention on every full_attention_interval-th layer (default 4).
void read_linear_attention_fields(const json& j, const std::string& source, ModelConfig& c) {
  read_moe_intermediate_size(j, source, c);
  c.shared_expert_intermediate_size = get_int(j, source, "shared_expert_intermediate_size", 512);
  c.linear_num_key_heads = get_int(j, source, "linear_num_key_heads", 16);
  c.linear_num_value_heads = get_int(j, source, "linear_num_value_heads", 32);
  c.linear_key_head_dim = get_int(j, source, "linear_key_head_dim", 128);
  c.linear_value_head_dim = get_int(j, source, "linear_value_head_dim", 128);
  c.linear_conv_kernel_dim = get_int(j, source, "linear_conv_kernel_dim", 4);
  c.linear_value_heads_tiled = get_bool(j, source, "linear_value_heads_tiled", false);
  c.norm_weights_include_unit_offset = get_bool(j, source, "norm_weights_include_unit_offset", false);
  for (auto [key, value] : {std::pair{"shared_expert_intermediate_size", c.shared_expert_intermediate_size},
                            {"linear_num_key_heads", c.linear_num_key_heads},
                            {"linear_num_value_heads", c.linear_num_value_heads},
                            {"linear_key_head_dim", c.linear_key_head_dim},
                            {"linear_value_head_dim", c.linear_value_head_dim},
                            {"linear_conv_kernel_dim", c.linear_conv_kernel_dim}}) {
    require_positive(source, key, value);
  }
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0) {
    fail_invalid(source + ": linear_num_value_heads " + std::to_string(c.linear_num_value_heads) +
                 " is not a multiple of linear_num_key_heads " + std::to_string(c.linear_num_key_heads));
  }
  if (c.linear_attention_layers.empty()) {
    const int64_t interval = get_int(j, source, "full_attention_interval", 4);
    require_positive(source, "full_attention_interval", interval);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) c.linear_attention_layers.push_back((i + 1) % interval != 0);
  }
  if (std::find(c.linear_attention_layers.begin(), c.linear_attention_layers.end(), false) ==
      c.linear_attention_layers.end()) {
    fail_unsupported(source + ": every layer is linear attention (layer_types, or full_attention_interval above "
                     "num_hidden_layers); charm needs at least one full-attention layer (its KV cache holds rows "
                     "only for those)");
  }
}

/// Qwen3NextConfig: the shared fields and the dense layers as Qwen3-MoE spells them
/// (decoder_sparse_step, mlp_only_layers).
void read_qwen3_next_config(const json& j, const std::string& source, ModelConfig& c) {
  read_linear_attention_fields(j, source, c);
  read_sparse_layers(j, source, c);
  c.norm_topk_prob = get_bool(j, source, "norm_topk_prob", true);  // Qwen3NextConfig's default
}

/// Qwen3_5MoeTextConfig: the shared fields; its router always renormalises the top-k
/// (Qwen3_5MoeTopKRouter; the config class drops norm_topk_prob), and every layer is MoE.
void read_qwen3_5_moe_config(const json& j, const std::string& source, ModelConfig& c) {
  read_linear_attention_fields(j, source, c);
  c.norm_topk_prob = true;
}

}  // namespace

const ModelFamily& qwen3_next_family() {
  static const ModelFamily family{
      .checkpoint = {.architectures = {"Qwen3NextForCausalLM"},
                     .num_experts_keys = {"num_experts"},
                     .partial_rotary = true,
                     .default_partial_rotary_factor = 0.25,  // Qwen3NextConfig's
                     .linear_attention = true,
                     .read_fields = read_qwen3_next_config,
                     .expert_tensors = ExpertTensorNames{}},  // the hub default names
      .build = build_model<Qwen3Next>,
  };
  return family;
}

/// Qwen3.5-MoE's text model (Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig): the same
/// layers (Qwen3_5MoeGatedDeltaNet's projections are separate, which GatedDeltaNet::load
/// finds by name), every layer MoE (Qwen3_5MoeDecoderLayer has no dense MLP). Its
/// multimodal RoPE gives a text token the same angle in all three sections, which is
/// plain partial rotary RoPE.
const ModelFamily& qwen3_5_moe_family() {
  static const ModelFamily family{
      .checkpoint = {.architectures = {"Qwen3_5MoeForCausalLM"},
                     .num_experts_keys = {"num_experts"},
                     .partial_rotary = true,
                     .default_partial_rotary_factor = 0.25,  // Qwen3_5MoeTextConfig's
                     .linear_attention = true,
                     .dense_mlp = false,
                     .read_fields = read_qwen3_5_moe_config,
                     .expert_tensors = ExpertTensorNames{}},  // the hub default names
      .build = build_model<Qwen3Next>,
  };
  return family;
}

}  // namespace charm
