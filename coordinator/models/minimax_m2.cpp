// MiniMax-M2 (MiniMaxM2ForCausalLM: MiniMax-M2, M2.1), following transformers'
// models/minimax_m2/modeling_minimax_m2.py: pre-norm decoder layers with GQA attention (no
// biases) whose q_norm / k_norm are RMSNorms over the WHOLE projection (num_heads *
// head_dim, resp. num_key_value_heads * head_dim, before the split into heads:
// qk_norm_type "per_layer"), RoPE on the first rotary_dim dims of each head (rotate_half
// within them, the rest passes), and a sparse MoE block in every layer (hub name
// `block_sparse_moe`): MiniMaxM2TopKRouter's sigmoid scores, top-k by score +
// e_score_correction_bias, weights the unbiased scores renormalised over the k (DeepSeek-V3's
// router with one group and no scaling: coordinator/models/routers.h), no shared expert.
// The bias sits beside the gate (`block_sparse_moe.e_score_correction_bias`); the routed
// experts are `block_sparse_moe.experts.{e}.w1/w3/w2` (gate/up/down), as Mixtral's.
#include <cmath>
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

struct MiniMaxM2Layer {
  RmsNorm input_layernorm, post_attention_layernorm;
  RopeGqaAttention self_attn;  // MiniMaxM2Attention
  MoeBlock sparse_moe;         // MiniMaxM2SparseMoeBlock, in every layer
  DenseMlp mlp;                // unused: MiniMax-M2 has no dense layers
};

class MiniMaxM2 final : public LayerStack<MiniMaxM2Layer> {
 public:
  MiniMaxM2(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher)
      : LayerStack(ckpt, config, dispatcher) {
    const size_t h = config.hidden_size;
    const double eps = config.rms_norm_eps;
    // MiniMaxM2Attention: no biases; q_norm / k_norm span every head (use rms_norm_eps).
    const GqaOptions attention{.qk_norm = QkNorm::kWhole, .norm_eps = eps};
    // MiniMaxM2TopKRouter: one group, renormalised top-k, no routed scaling.
    const GroupLimitedTopk routing{.top_k = static_cast<size_t>(config.num_experts_per_tok),
                                   .n_group = 1, .topk_group = 1, .norm_topk_prob = true,
                                   .routed_scaling_factor = 1.0f};
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      MiniMaxM2Layer layer;
      layer.input_layernorm = RmsNorm::load(ckpt, p + ".input_layernorm", h, eps);
      layer.post_attention_layernorm = RmsNorm::load(ckpt, p + ".post_attention_layernorm", h, eps);
      layer.self_attn = RopeGqaAttention::load(ckpt, p + ".self_attn", h, config.num_attention_heads,
                                               config.num_key_value_heads, config.head_dim, attention);
      const std::string moe = p + ".block_sparse_moe";
      layer.sparse_moe.router = std::make_unique<GroupLimitedRouter>(GroupLimitedRouter::load(
          ckpt, moe + ".gate", h, config.num_experts, routing, moe + ".e_score_correction_bias"));
      layers_.push_back(std::move(layer));
    }
  }
};

/// True when a partial_rotary_factor is spelled anywhere transformers reads one (top level,
/// rope_parameters, rope_scaling).
bool spells_partial_rotary_factor(const nlohmann::json& j) {
  if (hf::member(j, "partial_rotary_factor") != nullptr) return true;
  for (const char* dict : {"rope_parameters", "rope_scaling"}) {
    const nlohmann::json* d = hf::member(j, dict);
    if (d != nullptr && d->is_object() && hf::member(*d, "partial_rotary_factor") != nullptr) return true;
  }
  return false;
}

/// The hub's legacy rotary_dim, as MiniMaxM2Config.convert_rope_params_to_dict reads it:
/// partial_rotary_factor = rotary_dim / head_dim unless a partial_rotary_factor is spelled
/// (which transformers keeps; charm requires the two to agree).
void read_rotary_dim(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  if (hf::member(j, "rotary_dim") == nullptr) return;
  const int64_t rotary_dim = hf::get_int(j, source, "rotary_dim", std::nullopt);
  if (rotary_dim < 2 || rotary_dim > c.head_dim || rotary_dim % 2 != 0) {
    fail_invalid(source + ": rotary_dim " + std::to_string(rotary_dim) + " must be even, at least 2 and at most head_dim " +
                 std::to_string(c.head_dim));
  }
  const double factor = static_cast<double>(rotary_dim) / static_cast<double>(c.head_dim);
  if (spells_partial_rotary_factor(j) && c.partial_rotary_factor != factor) {
    fail_invalid(source + ": fields 'rotary_dim' (" + std::to_string(rotary_dim) + ") and 'partial_rotary_factor' (" +
                 std::to_string(c.partial_rotary_factor) + ") disagree for head_dim " + std::to_string(c.head_dim));
  }
  c.partial_rotary_factor = factor;
}

/// The fields of MiniMax-M2's hub config that MiniMaxM2Config does not declare but that
/// describe what transformers' code always does; any other value would be another model.
void require_minimax_m2_choices(const nlohmann::json& j, const std::string& source, const ModelConfig& c) {
  hf::require_value(j, source, "scoring_func", "sigmoid");
  hf::require_value(j, source, "qk_norm_type", "per_layer");
  for (const char* key : {"use_qk_norm", "use_routing_bias"}) {
    if (!hf::get_bool(j, source, key, true)) {
      fail_unsupported(source + ": " + key + " false is not supported (MiniMaxM2ForCausalLM always has it)");
    }
  }
  if (hf::get_int(j, source, "shared_intermediate_size", 0) != 0) {
    fail_unsupported(source + ": shared_intermediate_size other than 0 is not supported (MiniMax-M2 has no shared expert)");
  }
  if (const nlohmann::json* types = hf::member(j, "attn_type_list")) {
    // MiniMax-01's 0 is lightning (linear) attention; M2 is 1 (softmax attention) throughout.
    if (!types->is_array() || static_cast<int64_t>(types->size()) != c.num_hidden_layers) {
      fail_invalid(source + ": field 'attn_type_list' must be a list of num_hidden_layers (" +
                   std::to_string(c.num_hidden_layers) + ") integers, got " + types->dump());
    }
    for (size_t i = 0; i < types->size(); ++i) {
      if ((*types)[i] != 1) {
        fail_unsupported(source + ": attn_type_list[" + std::to_string(i) + "] is " + (*types)[i].dump() +
                         "; only 1 (softmax attention) is implemented for " + c.architecture);
      }
    }
  }
  hf::refuse_biting_window(source, "sliding_window", hf::get_int(j, source, "sliding_window", 0), c);
}

/// MiniMaxM2Config's own rules: experts intermediate_size wide, every layer MoE, the
/// router's fixed choices (one group, renormalised, unscaled), rotary_dim, and the hub's
/// descriptive fields (require_minimax_m2_choices).
void read_minimax_m2_config(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  c.moe_intermediate_size = c.intermediate_size;
  c.norm_topk_prob = true;
  read_rotary_dim(j, source, c);
  require_minimax_m2_choices(j, source, c);
}

}  // namespace

const ModelFamily& minimax_m2_family() {
  static const ModelFamily family{
      .checkpoint = {.architectures = {"MiniMaxM2ForCausalLM"},
                     .num_experts_keys = {"num_local_experts", "num_experts"},  // field, attribute_map alias
                     .default_rms_norm_eps = 1e-6,                            // MiniMaxM2Config's
                     .default_rope_theta = 5e6,
                     .partial_rotary = true,
                     .default_partial_rotary_factor = 1.0,  // without rotary_dim: the whole head
                     .read_fields = read_minimax_m2_config,
                     .expert_tensors = {.prefix = "model.layers.{}.block_sparse_moe.experts",
                                        .gate = "w1",
                                        .up = "w3",
                                        .down = "w2"}},
      .build = build_model<MiniMaxM2>,
  };
  return family;
}

}  // namespace charm
