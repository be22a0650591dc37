// GLM-4.5 MoE (Glm4MoeForCausalLM: GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.7), following
// transformers' models/glm4_moe/modeling_glm4_moe.py: pre-norm decoder layers with GQA
// attention (q/k/v biases when attention_bias, none on o_proj; per-head q/k RMSNorm when
// use_qk_norm) whose RoPE turns only the first partial_rotary_factor of each head
// (rotate_half within that part, the rest passes), a dense SwiGLU MLP in the first
// first_k_dense_replace layers and, after them, Glm4MoeMoE: DeepSeek-V3's group-limited
// sigmoid router with e_score_correction_bias and the shared experts
// (coordinator/models/routers.h: load_group_limited_moe). The multi-token-prediction layer
// (num_nextn_predict_layers; model.layers.<num_hidden_layers>.*) is not read: plain
// decoding does not use it.
#include <string>
#include <vector>

#include "common/config_fields.h"
#include "coordinator/models/blocks.h"
#include "coordinator/models/families.h"
#include "coordinator/models/model.h"
#include "coordinator/models/routers.h"

namespace charm {
namespace {

struct Glm4MoeLayer {
  RmsNorm input_layernorm, post_attention_layernorm;
  RopeGqaAttention self_attn;  // Glm4MoeAttention
  MoeBlock sparse_moe;         // Glm4MoeMoE; no router in the first first_k_dense_replace layers
  DenseMlp mlp;                // dense layers only
};

class Glm4Moe final : public LayerStack<Glm4MoeLayer> {
 public:
  Glm4Moe(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher)
      : LayerStack(ckpt, config, dispatcher) {
    const size_t h = config.hidden_size;
    const double eps = config.rms_norm_eps;
    // Glm4MoeAttention: o_proj never has a bias; q_norm / k_norm (per head) use rms_norm_eps.
    const GqaOptions attention{.qkv_bias = config.attention_bias, .o_bias = false,
                               .qk_norm = config.use_qk_norm ? QkNorm::kPerHead : QkNorm::kNone, .norm_eps = eps};
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      Glm4MoeLayer layer;
      layer.input_layernorm = RmsNorm::load(ckpt, p + ".input_layernorm", h, eps);
      layer.post_attention_layernorm = RmsNorm::load(ckpt, p + ".post_attention_layernorm", h, eps);
      layer.self_attn = RopeGqaAttention::load(ckpt, p + ".self_attn", h, config.num_attention_heads,
                                               config.num_key_value_heads, config.head_dim, attention);
      if (config.is_moe_layer(l)) {
        layer.sparse_moe = load_group_limited_moe(ckpt, p + ".mlp", config);
      } else {
        layer.mlp = DenseMlp::load(ckpt, p + ".mlp", h, config.intermediate_size);
      }
      layers_.push_back(std::move(layer));
    }
  }
};

/// Glm4MoeConfig's own fields: the experts' width, use_qk_norm (default false), the
/// DeepSeek-V3-style MoE fields (hf::read_group_limited_moe) and the router's fixed
/// choices, which Glm4MoeConfig does not spell (sigmoid scores, noaux_tc) but a config
/// written for DeepSeek's code may: only those values are accepted.
void read_glm4_moe_config(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  hf::read_moe_intermediate_size(j, source, c);
  hf::read_group_limited_moe(j, source, c);
  c.use_qk_norm = hf::get_bool(j, source, "use_qk_norm", false);
  hf::require_value(j, source, "scoring_func", "sigmoid");
  hf::require_value(j, source, "topk_method", "noaux_tc");
}

}  // namespace

const ModelFamily& glm4_moe_family() {
  static const ModelFamily family{
      .checkpoint = {.architectures = {"Glm4MoeForCausalLM"},
                     .num_experts_keys = {"n_routed_experts", "num_local_experts"},  // field, attribute_map alias
                     .default_rms_norm_eps = 1e-5,                                 // Glm4MoeConfig's
                     .partial_rotary = true,
                     .default_partial_rotary_factor = 0.5,  // Glm4MoeConfig's
                     .read_fields = read_glm4_moe_config,
                     .expert_tensors = ExpertTensorNames{}},  // the hub default names
      .build = build_model<Glm4Moe>,
  };
  return family;
}

}  // namespace charm
