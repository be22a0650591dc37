// The fields of a Hugging Face config.json that charm's MoE families read, with the
// names transformers uses. Parsed once; families read only what they need.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace charm {

/// config.json of a supported MoE checkpoint (Qwen3MoeConfig, OlmoeConfig field names).
struct ModelConfig {
  std::string architecture;        ///< architectures[0], e.g. "Qwen3MoeForCausalLM"
  std::string model_type;          ///< "qwen3_moe", "olmoe"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;       ///< dense MLP width (mlp_only_layers)
  int64_t moe_intermediate_size = 0;   ///< routed expert width (OLMoE: intermediate_size)
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;                ///< defaults to hidden_size / num_attention_heads
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;     ///< top_k
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 4096;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  double clip_qkv = 0.0;               ///< OLMoE: clamp q/k/v to [-clip, clip] when > 0
  std::vector<int64_t> eos_token_ids;  ///< from config.json; generation_config adds more
  int64_t bos_token_id = -1;

  // --- Qwen2-MoE and Mixtral (coordinator/qwen2_moe.cpp, coordinator/mixtral.cpp) ---
  /// Qwen2-MoE: width of the gated shared expert (`mlp.shared_expert`); 0 for families
  /// without one.
  int64_t shared_expert_intermediate_size = 0;
  /// Qwen2-MoE: biases on q_proj, k_proj and v_proj (not o_proj); transformers' default
  /// is true, and the hub configs (Qwen1.5-MoE, Qwen2-57B-A14B) do not spell it out.
  bool qkv_bias = false;

  /// True when layer `layer` runs routed experts (Qwen3MoeDecoderLayer's rule:
  /// not in mlp_only_layers, num_experts > 0, (layer + 1) % decoder_sparse_step == 0).
  bool is_moe_layer(int64_t layer) const;

  /// The ids of every MoE layer, ascending.
  std::vector<int64_t> moe_layer_ids() const;

  /// Parses `config` (the contents of `source`, used in messages). Supported
  /// architectures: Qwen3MoeForCausalLM, OlmoeForCausalLM, Qwen2MoeForCausalLM,
  /// MixtralForCausalLM (routed experts: `num_local_experts` of width
  /// `intermediate_size`). Throws
  /// Error(kInvalidInput) naming `source` and the field for a missing required field or
  /// a field of the wrong JSON type or out of range; Error(kUnsupported) naming the
  /// architecture when it is not one charm implements, and naming the field for a
  /// feature charm does not implement (scaled RoPE, a sliding window that would bite).
  static ModelConfig parse(const nlohmann::json& config, const std::string& source);
};

}  // namespace charm
