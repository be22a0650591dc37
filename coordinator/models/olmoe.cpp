// OLMoE (OlmoeForCausalLM), following transformers' models/olmoe/modeling_olmoe.py:
// pre-norm decoder layers whose attention RMS-normalises the whole q and k projections
// (not per head), optionally clamps q, k and v to [-clip_qkv, clip_qkv], applies RoPE,
// and a softmax top-k routed MoE block in every layer.
#include <string>
#include <vector>

#include "common/config_fields.h"
#include "coordinator/models/blocks.h"
#include "coordinator/models/families.h"
#include "coordinator/models/model.h"

namespace charm {
namespace {

struct OlmoeLayer {
  RmsNorm input_layernorm, post_attention_layernorm;
  RopeGqaAttention self_attn;  // OlmoeAttention: q/k RMSNorm over the whole projection, clip_qkv
  MoeBlock sparse_moe;         // OlmoeSparseMoeBlock, in every layer
  DenseMlp mlp;                // unused: OLMoE has no dense layers
};

class Olmoe final : public LayerStack<OlmoeLayer> {
 public:
  Olmoe(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher)
      : LayerStack(ckpt, config, dispatcher) {
    const size_t h = config.hidden_size;
    const double eps = config.rms_norm_eps;
    const GqaOptions attention{.qkv_bias = config.attention_bias, .o_bias = config.attention_bias,
                               .qk_norm = QkNorm::kWhole, .norm_eps = eps, .clip_qkv = config.clip_qkv};
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      OlmoeLayer layer;
      layer.input_layernorm = RmsNorm::load(ckpt, p + ".input_layernorm", h, eps);
      layer.post_attention_layernorm = RmsNorm::load(ckpt, p + ".post_attention_layernorm", h, eps);
      layer.self_attn = RopeGqaAttention::load(ckpt, p + ".self_attn", h, config.num_attention_heads,
                                               config.num_key_value_heads, config.head_dim, attention);
      layer.sparse_moe.router = std::make_unique<SoftmaxTopkRouter>(SoftmaxTopkRouter::load(
          ckpt, p + ".mlp", h, config.num_experts, config.num_experts_per_tok, config.norm_topk_prob));
      layers_.push_back(std::move(layer));
    }
  }
};

/// OlmoeConfig's own fields: clip_qkv, and the sliding window OlmoeAttention passes when
/// set (refused when it would bite). Its experts are intermediate_size wide and every
/// layer is sparse (no moe_intermediate_size, decoder_sparse_step or mlp_only_layers).
void read_olmoe_config(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  c.moe_intermediate_size = c.intermediate_size;
  c.clip_qkv = hf::get_number(j, source, "clip_qkv", 0.0);
  hf::refuse_biting_window(source, "sliding_window", hf::get_int(j, source, "sliding_window", 0), c);
}

}  // namespace

const ModelFamily& olmoe_family() {
  static const ModelFamily family{
      .checkpoint = {.architectures = {"OlmoeForCausalLM"},
                     .num_experts_keys = {"num_experts", "num_local_experts"},
                     .default_rms_norm_eps = 1e-5,  // OlmoeConfig's
                     .read_fields = read_olmoe_config,
                     .expert_tensors = ExpertTensorNames{}},  // the hub default names
      .build = build_model<Olmoe>,
  };
  return family;
}

}  // namespace charm
