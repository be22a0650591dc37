// DeepSeek-V3 (DeepseekV3ForCausalLM), following transformers'
// models/deepseek_v3/modeling_deepseek_v3.py: pre-norm decoder layers with multi-head
// latent attention over a compressed KV cache (coordinator/models/mla_attention.h, YaRN RoPE in
// the interleaved layout), a dense SwiGLU MLP in the first first_k_dense_replace layers
// and, after them, DeepseekV3MoE: the group-limited sigmoid router
// (coordinator/models/routers.h), the routed experts through the ExpertDispatcher, plus the
// shared experts computed here on the coordinator while the routed requests are out.
#include <string>
#include <vector>

#include "common/config_fields.h"
#include "common/error.h"
#include "coordinator/models/blocks.h"
#include "coordinator/models/families.h"
#include "coordinator/models/mla_attention.h"
#include "coordinator/models/model.h"
#include "coordinator/models/routers.h"

namespace charm {
namespace {

struct DeepseekV3Layer {
  RmsNorm input_layernorm, post_attention_layernorm;
  MlaAttention self_attn;
  MoeBlock sparse_moe;  // DeepseekV3MoE; no router in the first first_k_dense_replace layers
  DenseMlp mlp;         // dense layers only
};

class DeepseekV3 final : public LayerStack<DeepseekV3Layer> {
 public:
  DeepseekV3(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher)
      : LayerStack(ckpt, config, dispatcher) {
    const size_t h = config.hidden_size;
    const double eps = config.rms_norm_eps;
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      DeepseekV3Layer layer;
      layer.input_layernorm = RmsNorm::load(ckpt, p + ".input_layernorm", h, eps);
      layer.post_attention_layernorm = RmsNorm::load(ckpt, p + ".post_attention_layernorm", h, eps);
      layer.self_attn = MlaAttention::load(ckpt, p + ".self_attn", config);
      if (config.is_moe_layer(l)) {
        layer.sparse_moe = load_group_limited_moe(ckpt, p + ".mlp", config);
      } else {
        layer.mlp = DenseMlp::load(ckpt, p + ".mlp", h, config.intermediate_size);
      }
      layers_.push_back(std::move(layer));
    }
  }

  /// The compressed MLA cache: one [kv_lora_rank | qk_rope_head_dim] row per layer and token.
  KvLayout kv_layout() const override {
    return KvLayout{static_cast<size_t>(config_.num_hidden_layers), MlaAttention::cache_row_dim(config_), 0};
  }
};

using nlohmann::json;
using namespace hf;

/// The DeepseekV3Config fields besides MLA's: group-limited sigmoid routing, shared
/// experts, dense first layers, the RoPE layout, and the router choices transformers fixes.
void read_deepseek_v3_fields(const json& j, const std::string& source, ModelConfig& c) {
  read_mla_fields(j, source, c);
  read_group_limited_moe(j, source, c);
  c.rope_interleave = get_bool(j, source, "rope_interleave", true);
  // Fields transformers does not read; only the value it implements is accepted.
  require_value(j, source, "scoring_func", "sigmoid");
  require_value(j, source, "topk_method", "noaux_tc");
  if (j.contains("moe_layer_freq") && get_int(j, source, "moe_layer_freq", 1) != 1) {
    fail_unsupported(source + ": moe_layer_freq " + j["moe_layer_freq"].dump() + " is not supported (supported: 1)");
  }
}

/// DeepseekV3Config's fields on top of the generic ones: the experts' width and the
/// dense-layer rule as Qwen3-MoE spells them, then read_deepseek_v3_fields.
void read_deepseek_v3_config(const json& j, const std::string& source, ModelConfig& c) {
  read_moe_intermediate_size(j, source, c);
  read_sparse_layers(j, source, c);
  read_deepseek_v3_fields(j, source, c);
}

}  // namespace

const ModelFamily& deepseek_v3_family() {
  static const ModelFamily family{
      .checkpoint = {.architectures = {"DeepseekV3ForCausalLM"},
                     .num_experts_keys = {"n_routed_experts", "num_local_experts"},
                     .yarn_rope = true,
                     .read_fields = read_deepseek_v3_config,
                     .expert_tensors = ExpertTensorNames{}},  // the hub default names
      .build = build_model<DeepseekV3>,
  };
  return family;
}

}  // namespace charm
