// What the checkpoint readers (ModelConfig::parse, the expert library) know of one model
// family: the architectures it serves, how its config.json reads, where its routed
// experts are stored. Each family's file (coordinator/models/<family>.cpp) defines its
// record and coordinator/models/families.cpp lists them in one table; common/ lists no
// family, so whoever parses a config passes that table down.
#pragma once

#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/expert_tensor_names.h"

namespace charm {

struct ModelConfig;

/// One family as its checkpoints read. Defaults are those most families share.
struct CheckpointFamily {
  /// The config.json architectures[0] values it serves, e.g. "Qwen3MoeForCausalLM".
  std::vector<std::string> architectures;
  /// The keys transformers 4 and 5 read the routed-expert count under: the config
  /// class's field first, then its attribute_map alias (each version writes one).
  std::vector<std::string> num_experts_keys = {"num_experts", "num_local_experts"};
  /// The config class's defaults of fields every family reads.
  double default_rms_norm_eps = 1e-6;
  double default_rope_theta = 1e4;
  /// True when the family implements YaRN rope scaling; else only unscaled RoPE is accepted.
  bool yarn_rope = false;
  /// True when the family rotates only the first partial_rotary_factor of each head
  /// (Glm4MoeConfig); else a factor other than 1 is refused. The config class's default
  /// factor applies when the field is absent.
  bool partial_rotary = false;
  double default_partial_rotary_factor = 1.0;
  /// True when the family runs sliding-window attention: layer_types may name
  /// "sliding_attention" (read into ModelConfig::sliding_layers, for read_fields to finish
  /// with the family's defaults and window); else any layer type but full_attention is refused.
  bool sliding_window = false;
  /// The layer_types value of its layers that do not slide: transformers writes
  /// "full_attention", GlmMoeDsaConfig "indexed_attention" (every layer DSA).
  std::string full_layer_type = "full_attention";
  /// True when the family has linear-attention layers: layer_types may name
  /// "linear_attention" (read into ModelConfig::linear_attention_layers, for read_fields
  /// to fill from the family's default pattern when layer_types is absent).
  bool linear_attention = false;
  /// False when every layer is MoE and the config class has no intermediate_size
  /// (Qwen3_5MoeTextConfig): the field is then optional (0 when absent).
  bool dense_mlp = true;
  /// Reads the family's own fields of `config` (by their HF names) into `c`, after
  /// ModelConfig::parse has read the generic ones. Throws as ModelConfig::parse documents,
  /// naming `source` and the field.
  void (*read_fields)(const nlohmann::json& config, const std::string& source, ModelConfig& c) = nullptr;
  /// Where its checkpoints store the routed experts.
  ExpertTensorNames expert_tensors;
};

/// The families a program reads, in one list (charm's: checkpoint_families() in
/// coordinator/models/checkpoint_families.h). Pointers into records that outlive every parse.
using CheckpointFamilies = std::span<const CheckpointFamily* const>;

}  // namespace charm
