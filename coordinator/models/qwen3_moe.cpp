// Qwen3-MoE (Qwen3MoeForCausalLM), following transformers'
// models/qwen3_moe/modeling_qwen3_moe.py: pre-norm decoder layers with GQA attention whose
// q and k are RMS-normalised per head before RoPE, and either a dense SwiGLU MLP
// (mlp_only_layers, decoder_sparse_step) or a softmax top-k routed MoE block.
#include <string>
#include <vector>

#include "common/config_fields.h"
#include "coordinator/models/blocks.h"
#include "coordinator/models/families.h"
#include "coordinator/models/model.h"

namespace charm {
namespace {

struct Qwen3MoeLayer {
  RmsNorm input_layernorm, post_attention_layernorm;
  RopeGqaAttention self_attn;  // Qwen3MoeAttention: per-head q/k RMSNorm
  MoeBlock sparse_moe;         // Qwen3MoeSparseMoeBlock; no router on dense layers
  DenseMlp mlp;                // dense layers only
};

class Qwen3Moe final : public LayerStack<Qwen3MoeLayer> {
 public:
  Qwen3Moe(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher)
      : LayerStack(ckpt, config, dispatcher) {
    const size_t h = config.hidden_size;
    const double eps = config.rms_norm_eps;
    const GqaOptions attention{.qkv_bias = config.attention_bias, .o_bias = config.attention_bias,
                               .qk_norm = QkNorm::kPerHead, .norm_eps = eps};
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      Qwen3MoeLayer layer;
      layer.input_layernorm = RmsNorm::load(ckpt, p + ".input_layernorm", h, eps);
      layer.post_attention_layernorm = RmsNorm::load(ckpt, p + ".post_attention_layernorm", h, eps);
      layer.self_attn = RopeGqaAttention::load(ckpt, p + ".self_attn", h, config.num_attention_heads,
                                               config.num_key_value_heads, config.head_dim, attention);
      if (config.is_moe_layer(l)) {
        layer.sparse_moe.router = std::make_unique<SoftmaxTopkRouter>(SoftmaxTopkRouter::load(
            ckpt, p + ".mlp", h, config.num_experts, config.num_experts_per_tok, config.norm_topk_prob));
      } else {
        layer.mlp = DenseMlp::load(ckpt, p + ".mlp", h, config.intermediate_size);
      }
      layers_.push_back(std::move(layer));
    }
  }
};

/// Qwen3MoeConfig's own fields: the experts' width, the dense layers, and the sliding
/// window, which Qwen3MoeConfig keeps (default 4096) only when use_sliding_window is true.
void read_qwen3_moe_config(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  hf::read_moe_intermediate_size(j, source, c);
  hf::read_sparse_layers(j, source, c);
  if (!hf::get_bool(j, source, "use_sliding_window", false)) return;
  const bool absent = !j.contains("sliding_window");
  hf::refuse_biting_window(source, "sliding_window", absent ? 4096 : hf::get_int(j, source, "sliding_window", 0), c);
}

}  // namespace

const ModelFamily& qwen3_moe_family() {
  static const ModelFamily family{
      .checkpoint = {.architectures = {"Qwen3MoeForCausalLM"},
                     .num_experts_keys = {"num_experts", "num_local_experts"},  // 5.x writes the alias
                     .read_fields = read_qwen3_moe_config,
                     .expert_tensors = ExpertTensorNames{}},  // the hub default names
      .build = build_model<Qwen3Moe>,
  };
  return family;
}

}  // namespace charm
