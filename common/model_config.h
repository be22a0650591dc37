// The fields of a Hugging Face config.json that charm's MoE families read, with the
// names transformers uses. Parsed once; families read only what they need. Which
// families exist, and which fields each reads, is the families table's business
// (coordinator/models/families.h); this header lists none.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/expert_activation.h"
#include "common/expert_tensor_names.h"
#include "common/model_family.h"

namespace charm {

/// YaRN RoPE scaling as transformers' modeling_rope_utils._compute_yarn_parameters reads
/// it from rope_scaling / rope_parameters (type "yarn"), with its defaults applied.
struct YarnRopeScaling {
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;                     ///< 0 when absent
  double mscale_all_dim = 0.0;             ///< 0 when absent
  std::optional<double> attention_factor;  ///< explicit cos/sin scale; else derived
  bool truncate = true;                    ///< floor/ceil the correction range

  bool operator==(const YarnRopeScaling&) const = default;
};

/// config.json of a supported MoE checkpoint, fields under their transformers names (the
/// family-specific ones say which family reads them).
struct ModelConfig {
  std::string architecture;        ///< architectures[0], e.g. "Qwen3MoeForCausalLM"
  std::string model_type;          ///< "qwen3_moe", "olmoe"
  /// dtype (transformers >= 4.56) or torch_dtype: the precision transformers loads the
  /// weights in, e.g. "bfloat16"; "" when absent. charm keeps each tensor's stored dtype,
  /// so this only describes the checkpoint (logged at load).
  std::string dtype;
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
  /// The share of each head that RoPE rotates: dims [0, rotary_dim()) (GLM-4.5: 0.5); 1
  /// for the families without partial rotary (CheckpointFamily::partial_rotary).
  double partial_rotary_factor = 1.0;
  int64_t max_position_embeddings = 4096;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  double clip_qkv = 0.0;               ///< OLMoE: clamp q/k/v to [-clip, clip] when > 0
  std::vector<int64_t> eos_token_ids;  ///< from config.json; generation_config adds more
  int64_t bos_token_id = -1;

  // --- Qwen2-MoE (coordinator/models/qwen2_moe.cpp) ---
  /// Qwen2-MoE: width of the gated shared expert (`mlp.shared_expert`); 0 for families
  /// without one.
  int64_t shared_expert_intermediate_size = 0;
  /// Qwen2-MoE: biases on q_proj, k_proj and v_proj (not o_proj); transformers' default
  /// is true, and the hub configs (Qwen1.5-MoE, Qwen2-57B-A14B) do not spell it out.
  bool qkv_bias = false;

  // ---- DeepSeek-V3 (DeepseekV3Config, transformers' configuration_deepseek_v3.py). ----
  // num_experts holds n_routed_experts and head_dim holds qk_rope_head_dim (as
  // DeepseekV3Config sets it). Zero / empty for the other families.
  int64_t q_lora_rank = 0;             ///< 0 when null: a plain q_proj instead of q_a/q_b
  int64_t kv_lora_rank = 0;            ///< width of the compressed KV latent
  int64_t qk_nope_head_dim = 0;        ///< per-head query/key part without RoPE
  int64_t qk_rope_head_dim = 0;        ///< per-head query/key part with RoPE (key shared by heads)
  int64_t v_head_dim = 0;
  int64_t n_shared_experts = 0;        ///< shared expert width = n_shared_experts * moe_intermediate_size
  int64_t first_k_dense_replace = 0;   ///< layers [0, k) use the dense MLP
  int64_t n_group = 1;                 ///< expert groups of the group-limited top-k
  int64_t topk_group = 1;              ///< groups kept per token
  double routed_scaling_factor = 1.0;  ///< multiplies the routed weights
  bool rope_interleave = false;        ///< RoPE pairs (2i, 2i+1) instead of (i, i + d/2)
  std::optional<YarnRopeScaling> yarn; ///< set when rope scaling type is "yarn"

  // ---- GLM-5 and DeepSeek-V3.2 (GlmMoeDsaConfig, DeepseekV32Config; coordinator/models/
  // glm_moe_dsa.cpp): DeepSeek Sparse Attention on top of the DeepSeek-V3 MLA and MoE
  // fields above. ----
  int64_t index_topk = 0;              ///< keys per query the lightning indexer keeps; 0: none (dense MLA)
  int64_t index_head_dim = 0;          ///< the indexer's query/key width (its first qk_rope_head_dim rotate)
  int64_t index_n_heads = 0;           ///< the indexer's query heads
  /// The indexer's RoPE pairs: interleaved (GLM-5, as its MLA) or halves (DeepSeek-V3.2's
  /// apply_rotary_pos_emb, while its MLA turns interleaved pairs).
  bool index_rope_interleave = true;
  /// [num_hidden_layers] when index_topk > 0: true for an indexer_types "shared" layer,
  /// which reuses the previous layer's selection and has no indexer of its own.
  std::vector<bool> indexer_shared;

  // ---- Qwen3-Next (Qwen3NextConfig; coordinator/models/qwen3_next.cpp): gated DeltaNet
  // linear attention beside gated full attention. ----
  int64_t linear_num_key_heads = 0;
  int64_t linear_num_value_heads = 0;  ///< a multiple of linear_num_key_heads
  int64_t linear_key_head_dim = 0;
  int64_t linear_value_head_dim = 0;
  int64_t linear_conv_kernel_dim = 0;  ///< the depthwise causal conv1d's kernel
  /// [num_hidden_layers] for a family with linear attention (CheckpointFamily::
  /// linear_attention): true for a "linear_attention" layer; empty otherwise.
  std::vector<bool> linear_attention_layers;
  /// True when the checkpoint stores every Qwen3NextRMSNorm weight (the layer norms, q/k
  /// norms and the final norm) as 1 + w already: a GGUF file, whose converter adds the 1
  /// (convert_hf_to_gguf.py, Qwen3NextModel.modify_tensors). The family then takes the
  /// weights as stored instead of adding 1. Config key norm_weights_include_unit_offset
  /// (charm's; common/gguf_model.cpp writes it); default false (the hub's zero-centred form).
  bool norm_weights_include_unit_offset = false;
  /// True when the value heads are in tiled order, value head h belonging to key head
  /// h % linear_num_key_heads, instead of the hub's grouped order (h / (value heads per
  /// key head)): a Qwen3.5 GGUF, whose converter reorders every value-head-indexed row,
  /// channel and column so (_LinearAttentionVReorderBase). Config key
  /// linear_value_heads_tiled (charm's; common/gguf_model.cpp writes it); default false.
  bool linear_value_heads_tiled = false;

  // ---- GLM-4.5 (Glm4MoeConfig; coordinator/models/glm4_moe.cpp). It also reads the
  // DeepSeek-V3 MoE fields above (n_shared_experts .. routed_scaling_factor) and
  // partial_rotary_factor. ----
  bool use_qk_norm = false;            ///< per-head RMSNorm of q and k before RoPE

  // ---- Sliding-window attention (CheckpointFamily::sliding_window: Mixtral, Qwen2-MoE,
  // gpt-oss). ----
  /// The window of the sliding layers: a query at position p attends p - W + 1 .. p.
  int64_t sliding_window = 0;
  /// [num_hidden_layers]: true for a "sliding_attention" layer; empty when every layer
  /// attends in full.
  std::vector<bool> sliding_layers;

  // ---- gpt-oss (GptOssConfig; coordinator/models/gpt_oss.cpp) ----
  /// The routed experts' activation: SwiGLU, or gpt-oss's clamped SwiGLU with
  /// swiglu_alpha and swiglu_limit. The workers compute it (worker/experts/swiglu_batch.h).
  ExpertActivation expert_activation;

  /// Where this checkpoint's routed experts are stored: its family's names
  /// (CheckpointFamily::expert_tensors), set by parse.
  ExpertTensorNames expert_tensors;

  /// Field by field (two spellings of one checkpoint's config compare equal).
  bool operator==(const ModelConfig&) const = default;

  /// True when layer `layer` runs routed experts (Qwen3MoeDecoderLayer's rule:
  /// not in mlp_only_layers, num_experts > 0, (layer + 1) % decoder_sparse_step == 0;
  /// DeepseekV3DecoderLayer's: layer >= first_k_dense_replace).
  bool is_moe_layer(int64_t layer) const;

  /// The rotated dims of a head: int(head_dim * partial_rotary_factor), as transformers'
  /// compute_default_rope_parameters truncates it.
  int64_t rotary_dim() const { return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor); }

  /// The attention window of `layer`: sliding_window on a sliding layer, else 0 (all of
  /// 0 .. p).
  size_t attention_window(int64_t layer) const {
    const bool sliding = !sliding_layers.empty() && sliding_layers[static_cast<size_t>(layer)];
    return sliding ? static_cast<size_t>(sliding_window) : 0;
  }

  /// The ids of every MoE layer, ascending.
  std::vector<int64_t> moe_layer_ids() const;

  /// Parses `config` (the contents of `source`, used in messages) as the checkpoint of
  /// the family in `families` that serves its architectures[0] (charm's table:
  /// coordinator/models/checkpoint_families.h): the generic fields here,
  /// then the family's own (CheckpointFamily::read_fields).
  ///
  /// Reads every spelling transformers 4.x and 5.x write and read for a field: the expert
  /// count under the family's key and its attribute_map alias
  /// (CheckpointFamily::num_experts_keys), dtype | torch_dtype, RoPE as top-level
  /// rope_theta + rope_scaling {type | rope_type, ...} or as rope_parameters {rope_type,
  /// rope_theta, ...} (or both), original_max_position_embeddings at the top level or in
  /// the rope dict, and transformers 5's layer_types. Absent fields take the family's
  /// config-class default where it is generic (rms_norm_eps, rope_theta, ...); sizes that
  /// belong to one model are required.
  ///
  /// Throws Error(kInvalidInput) naming `source` and the field for a missing required
  /// field, a field of the wrong JSON type or out of range, and naming both keys when two
  /// spellings of one field are present with different values (or DeepSeek-V3's derived
  /// head_dim / qk_head_dim disagree with their source). Throws Error(kUnsupported)
  /// naming the architecture and the supported ones when no family in `families` serves
  /// it, and naming the field (and value) for a feature charm does not implement: scaled
  /// RoPE (any but "yarn", and that only where the family implements it),
  /// partial_rotary_factor other than 1 (for a family without CheckpointFamily::partial_rotary;
  /// where it has it, a factor outside (0, 1] or an odd rotary_dim() is invalid), per-layer-type RoPE, a sliding window that would
  /// bite (families without CheckpointFamily::sliding_window), a layer type other than
  /// full_attention (or sliding_attention where the family has sliding windows), and the family's own (DeepSeek-V3:
  /// scoring_func other than "sigmoid", topk_method other than "noaux_tc", moe_layer_freq
  /// other than 1).
  static ModelConfig parse(const nlohmann::json& config, const std::string& source, CheckpointFamilies families);
};

}  // namespace charm
