// Readers of single Hugging Face config.json fields, shared by ModelConfig::parse (the
// fields every family reads) and the families' own readers (coordinator/models/
// <family>.cpp, CheckpointFamily::read_fields). Every error names the file (`source`) and
// the field; transformers reads a null field as unset, and so do these.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/model_config.h"

namespace charm::hf {

/// j[key] when present and not null, else nullptr.
const nlohmann::json* member(const nlohmann::json& j, const std::string& key);

/// A field transformers reads under more than one key (an attribute_map alias, a renamed
/// field, a value moved into rope_parameters): the value found and the key it was under.
struct Spelled {
  const nlohmann::json* value = nullptr;
  std::string key;  ///< the key `value` came from; else every spelling, for messages
};

/// Looks up every (label, value) candidate; the present ones must agree. Throws
/// Error(kInvalidInput) naming `source` and both keys when two present values differ
/// (numbers compare by value: 16 and 16.0 agree).
Spelled spelled(const std::string& source,
                const std::vector<std::pair<std::string, const nlohmann::json*>>& candidates);
/// The top-level spellings `keys` of one field of `j`.
Spelled spelled(const nlohmann::json& j, const std::string& source, const std::vector<std::string>& keys);

/// The value of a field, else `fallback` when absent. Throw Error(kInvalidInput) naming
/// `source` and the key for a value of the wrong JSON type, and (int_of without a
/// fallback) for a missing field.
int64_t int_of(const Spelled& f, const std::string& source, std::optional<int64_t> fallback);
double number_of(const Spelled& f, const std::string& source, double fallback);
bool bool_of(const Spelled& f, const std::string& source, bool fallback);
std::string string_of(const Spelled& f, const std::string& source, const std::string& fallback);

/// The same for a field with one spelling, `key`.
int64_t get_int(const nlohmann::json& j, const std::string& source, const char* key, std::optional<int64_t> fallback);
double get_number(const nlohmann::json& j, const std::string& source, const char* key, double fallback);
bool get_bool(const nlohmann::json& j, const std::string& source, const char* key, bool fallback);

/// An id field that may be an integer or a list of integers (eos_token_id); empty when
/// absent. Throws Error(kInvalidInput) naming the field for anything else.
std::vector<int64_t> get_id_list(const nlohmann::json& j, const std::string& source, const char* key);

/// Throws Error(kInvalidInput) naming `source` and `key` unless value > 0.
void require_positive(const std::string& source, const char* key, int64_t value);

/// Requires string field `key`, when present, to be `want`; throws kUnsupported naming
/// field and value otherwise (transformers implements only that value).
void require_value(const nlohmann::json& j, const std::string& source, const char* key, const std::string& want);

/// Refuses a sliding window that can bite: charm runs full attention, which equals a
/// window of at least max_position_embeddings (the context charm allows). `window` 0
/// means none. Throws Error(kUnsupported) naming `key`, its value and c.architecture.
void refuse_biting_window(const std::string& source, const std::string& key, int64_t window, const ModelConfig& c);

/// Sets c.sliding_window to `window` for the sliding layers of c.sliding_layers (filled
/// with `default_sliding` when layer_types was absent). With no sliding layer the window
/// is not used; with one, `window` must be positive (Error(kInvalidInput) naming `key`).
void set_sliding_window(const std::string& source, const std::string& key, int64_t window,
                        const std::vector<bool>& default_sliding, ModelConfig& c);

/// The routed experts' width under its own key, moe_intermediate_size (for families
/// whose experts are not intermediate_size wide); required and positive.
void read_moe_intermediate_size(const nlohmann::json& j, const std::string& source, ModelConfig& c);

/// Which layers are dense, as Qwen3MoeConfig spells it: decoder_sparse_step (default 1,
/// positive) and mlp_only_layers (default none). See ModelConfig::is_moe_layer.
void read_sparse_layers(const nlohmann::json& j, const std::string& source, ModelConfig& c);

/// The fields of the DeepSeek-V3-style MoE (DeepseekV3Config, Glm4MoeConfig): the
/// shared experts (n_shared_experts), the dense first layers (first_k_dense_replace),
/// the group-limited sigmoid router (n_group, topk_group, routed_scaling_factor, all
/// required; norm_topk_prob, default true), checked for consistency with num_experts and
/// num_experts_per_tok (equal groups of at least 2 experts, topk_group <= n_group, top-k
/// within the kept groups). Throws Error(kInvalidInput) naming `source` and the field.
void read_group_limited_moe(const nlohmann::json& j, const std::string& source, ModelConfig& c);

}  // namespace charm::hf
