// gpt-oss (GptOssForCausalLM: gpt-oss-20b, gpt-oss-120b), following transformers'
// models/gpt_oss/modeling_gpt_oss.py: pre-norm decoder layers whose GQA attention has
// biases on q/k/v and o_proj (attention_bias), a learned sink logit per head that joins
// the softmax's denominator (GptOssAttention.sinks), and, on the layer_types
// "sliding_attention" layers, a sliding window of sliding_window positions; RoPE in
// rotate_half layout with YaRN; and a MoE block in every layer: GptOssTopKRouter (a biased
// linear, top-k over the logits, softmax over the k chosen) and experts with biases and
// the clamped SwiGLU (common/expert_activation.h), which the workers compute from the
// checkpoint's gate_up_proj [E, H, 2I] / down_proj [E, I, H] (ExpertTensorNames::
// gpt_oss_layout). No shared expert, no dense layers.
#include <string>
#include <vector>

#include "common/config_fields.h"
#include "common/error.h"
#include "coordinator/models/blocks.h"
#include "coordinator/models/families.h"
#include "coordinator/models/model.h"
#include "coordinator/models/routers.h"

namespace charm {
namespace {

struct GptOssLayer {
  RmsNorm input_layernorm, post_attention_layernorm;
  RopeGqaAttention self_attn;  // GptOssAttention: biases, sinks, a window on sliding layers
  MoeBlock sparse_moe;         // GptOssMLP: router + routed experts
  DenseMlp mlp;                // unused: gpt-oss has no dense layers
};

class GptOss final : public LayerStack<GptOssLayer> {
 public:
  GptOss(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher)
      : LayerStack(ckpt, config, dispatcher) {
    const size_t h = config.hidden_size;
    const double eps = config.rms_norm_eps;
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      GptOssLayer layer;
      layer.input_layernorm = RmsNorm::load(ckpt, p + ".input_layernorm", h, eps);
      layer.post_attention_layernorm = RmsNorm::load(ckpt, p + ".post_attention_layernorm", h, eps);
      const GqaOptions attention{.qkv_bias = config.attention_bias, .o_bias = config.attention_bias,
                                 .sliding_window = config.attention_window(l), .sinks = true};
      layer.self_attn = RopeGqaAttention::load(ckpt, p + ".self_attn", h, config.num_attention_heads,
                                               config.num_key_value_heads, config.head_dim, attention);
      layer.sparse_moe.router = std::make_unique<TopkSoftmaxRouter>(
          TopkSoftmaxRouter::load(ckpt, p + ".mlp.router", h, config.num_experts, config.num_experts_per_tok));
      layers_.push_back(std::move(layer));
    }
  }
};

/// GptOssConfig's own fields (transformers models/gpt_oss/configuration_gpt_oss.py): the
/// experts are intermediate_size wide; attention_bias defaults to true; swiglu_alpha
/// (1.702) and swiglu_limit (7.0) make the experts' clamped SwiGLU; sliding_window (128)
/// applies to the layer_types "sliding_attention" layers, by default the even ones; with
/// neither rope_scaling nor rope_parameters, GptOssConfig's YaRN (factor 32, beta 32/1,
/// original 4096, truncate false). MXFP4 checkpoints (quantization_config quant_method
/// "mxfp4", the hub's *_blocks / *_scales experts) are read too: the expert reader decodes
/// them losslessly into bf16 (common/mxfp4.h; 16 bits per weight in RAM instead of 4.25).
void read_gpt_oss_config(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  c.moe_intermediate_size = c.intermediate_size;
  c.attention_bias = hf::get_bool(j, source, "attention_bias", true);
  c.expert_activation = ExpertActivation{.kind = ExpertActivation::Kind::kClampedSwiglu,
                                         .alpha = static_cast<float>(hf::get_number(j, source, "swiglu_alpha", 1.702)),
                                         .limit = static_cast<float>(hf::get_number(j, source, "swiglu_limit", 7.0))};
  if (!(c.expert_activation.limit > 0)) fail_invalid(source + ": field 'swiglu_limit' must be positive");
  const bool absent = !j.contains("sliding_window");
  const int64_t window = absent ? 128 : hf::get_int(j, source, "sliding_window", 0);
  std::vector<bool> sliding(static_cast<size_t>(c.num_hidden_layers));
  for (size_t i = 0; i < sliding.size(); ++i) sliding[i] = (i + 1) % 2 != 0;
  hf::set_sliding_window(source, "sliding_window", window, sliding, c);
  if (!j.contains("rope_scaling") && !j.contains("rope_parameters")) {
    YarnRopeScaling yarn;  // the other fields keep their defaults (no mscale, no explicit attention_factor)
    yarn.factor = 32.0;
    yarn.original_max_position_embeddings = 4096;
    yarn.beta_fast = 32.0;
    yarn.beta_slow = 1.0;
    yarn.truncate = false;
    c.yarn = yarn;
  }
}

}  // namespace

const ModelFamily& gpt_oss_family() {
  static const ModelFamily family{
      .checkpoint = {.architectures = {"GptOssForCausalLM"},
                     .num_experts_keys = {"num_local_experts", "num_experts"},  // field, attribute_map alias
                     .default_rms_norm_eps = 1e-5,                            // GptOssConfig's
                     .default_rope_theta = 150000.0,
                     .yarn_rope = true,
                     .sliding_window = true,
                     .read_fields = read_gpt_oss_config,
                     .expert_tensors = ExpertTensorNames{.gpt_oss_layout = true}},
      .build = build_model<GptOss>,
  };
  return family;
}

}  // namespace charm
