// Mixtral (MixtralForCausalLM), following transformers' models/mixtral/modeling_mixtral.py:
// pre-norm decoder layers with plain GQA attention (no biases, no q/k norm), RoPE, and a
// sparse MoE block in every layer (hub name `block_sparse_moe`): softmax top-k routing
// renormalised over the chosen experts, no shared expert. Routed experts are stored as
// `block_sparse_moe.experts.{e}.w1/w3/w2` (gate/up/down; the family's expert_tensors).
// With sliding_window set, every layer attends only the last sliding_window positions
// (MixtralModel then builds create_sliding_window_causal_mask for all layers).
#include <string>
#include <vector>

#include "common/config_fields.h"
#include "common/error.h"
#include "coordinator/models/blocks.h"
#include "coordinator/models/families.h"
#include "coordinator/models/model.h"

namespace charm {
namespace {

struct MixtralLayer {
  RmsNorm input_layernorm, post_attention_layernorm;
  RopeGqaAttention self_attn;  // MixtralAttention: no biases, no q/k norm
  MoeBlock sparse_moe;         // MixtralSparseMoeBlock, in every layer
  DenseMlp mlp;                // unused: Mixtral has no dense layers
};

class Mixtral final : public LayerStack<MixtralLayer> {
 public:
  Mixtral(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher)
      : LayerStack(ckpt, config, dispatcher) {
    const size_t h = config.hidden_size;
    const double eps = config.rms_norm_eps;
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      MixtralLayer layer;
      layer.input_layernorm = RmsNorm::load(ckpt, p + ".input_layernorm", h, eps);
      layer.post_attention_layernorm = RmsNorm::load(ckpt, p + ".post_attention_layernorm", h, eps);
      layer.self_attn = RopeGqaAttention::load(ckpt, p + ".self_attn", h, config.num_attention_heads,
                                               config.num_key_value_heads, config.head_dim,
                                               GqaOptions{.sliding_window = config.attention_window(l)});
      // MixtralTopKRouter always renormalises the top-k (read_mixtral_config sets norm_topk_prob).
      layer.sparse_moe.router = std::make_unique<SoftmaxTopkRouter>(SoftmaxTopkRouter::load(
          ckpt, p + ".block_sparse_moe", h, config.num_experts, config.num_experts_per_tok, config.norm_topk_prob));
      layers_.push_back(std::move(layer));
    }
  }
};

/// MixtralConfig's own rules: the experts are intermediate_size wide, every layer is a
/// sparse MoE block with norm_topk_prob implied (MixtralTopKRouter always renormalises
/// the top-k), and sliding_window (default null: none), which when set applies to every
/// layer (MixtralConfig has no layer_types).
void read_mixtral_config(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  c.moe_intermediate_size = c.intermediate_size;
  const int64_t window = hf::get_int(j, source, "sliding_window", 0);
  if (window < 0) fail_invalid(source + ": field 'sliding_window' must be positive or null, got " + std::to_string(window));
  hf::set_sliding_window(source, "sliding_window", window,
                         std::vector<bool>(static_cast<size_t>(c.num_hidden_layers), window > 0), c);
  c.norm_topk_prob = true;
}

}  // namespace

const ModelFamily& mixtral_family() {
  static const ModelFamily family{
      .checkpoint = {.architectures = {"MixtralForCausalLM"},
                     .num_experts_keys = {"num_local_experts", "num_experts"},
                     .default_rms_norm_eps = 1e-5,  // MixtralConfig's
                     .default_rope_theta = 1e6,
                     .sliding_window = true,
                     .read_fields = read_mixtral_config,
                     .expert_tensors = {.prefix = "model.layers.{}.block_sparse_moe.experts",
                                        .gate = "w1",
                                        .up = "w3",
                                        .down = "w2"}},
      .build = build_model<Mixtral>,
  };
  return family;
}

}  // namespace charm
