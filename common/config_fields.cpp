#include "common/config_fields.h"

#include <algorithm>

#include "common/error.h"

namespace charm::hf {

using nlohmann::json;

const json* member(const json& j, const std::string& key) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

Spelled spelled(const std::string& source, const std::vector<std::pair<std::string, const json*>>& candidates) {
  Spelled out;
  for (const auto& [label, value] : candidates) {
    if (value == nullptr) continue;
    if (out.value != nullptr && *out.value != *value) {
      fail_invalid(source + ": fields '" + out.key + "' (" + out.value->dump() + ") and '" + label + "' (" +
                   value->dump() + ") disagree; they are two spellings of one setting");
    }
    if (out.value == nullptr) out = Spelled{value, label};
  }
  if (out.value == nullptr) {
    for (size_t i = 0; i < candidates.size(); ++i) out.key += (i ? "' or '" : "") + candidates[i].first;
  }
  return out;
}

Spelled spelled(const json& j, const std::string& source, const std::vector<std::string>& keys) {
  std::vector<std::pair<std::string, const json*>> candidates;
  for (const auto& key : keys) candidates.emplace_back(key, member(j, key));
  return spelled(source, candidates);
}

int64_t int_of(const Spelled& f, const std::string& source, std::optional<int64_t> fallback) {
  if (f.value == nullptr) {
    if (fallback) return *fallback;
    fail_invalid(source + ": missing required field '" + f.key + "'");
  }
  if (!f.value->is_number_integer()) {
    fail_invalid(source + ": field '" + f.key + "' must be an integer, got " + f.value->dump());
  }
  return f.value->get<int64_t>();
}

double number_of(const Spelled& f, const std::string& source, double fallback) {
  if (f.value == nullptr) return fallback;
  if (!f.value->is_number()) fail_invalid(source + ": field '" + f.key + "' must be a number, got " + f.value->dump());
  return f.value->get<double>();
}

bool bool_of(const Spelled& f, const std::string& source, bool fallback) {
  if (f.value == nullptr) return fallback;
  if (!f.value->is_boolean()) {
    fail_invalid(source + ": field '" + f.key + "' must be true or false, got " + f.value->dump());
  }
  return f.value->get<bool>();
}

std::string string_of(const Spelled& f, const std::string& source, const std::string& fallback) {
  if (f.value == nullptr) return fallback;
  if (!f.value->is_string()) fail_invalid(source + ": field '" + f.key + "' must be a string, got " + f.value->dump());
  return f.value->get<std::string>();
}

int64_t get_int(const json& j, const std::string& source, const char* key, std::optional<int64_t> fallback) {
  return int_of(Spelled{member(j, key), key}, source, fallback);
}

double get_number(const json& j, const std::string& source, const char* key, double fallback) {
  return number_of(Spelled{member(j, key), key}, source, fallback);
}

bool get_bool(const json& j, const std::string& source, const char* key, bool fallback) {
  return bool_of(Spelled{member(j, key), key}, source, fallback);
}

std::vector<int64_t> get_id_list(const json& j, const std::string& source, const char* key) {
  std::vector<int64_t> ids;
  if (!j.contains(key) || j[key].is_null()) return ids;
  const json& v = j[key];
  if (v.is_number_integer()) return {v.get<int64_t>()};
  if (!v.is_array()) fail_invalid(source + ": field '" + key + "' must be an integer or a list of integers");
  for (const json& e : v) {
    if (!e.is_number_integer()) fail_invalid(source + ": field '" + key + "' holds a non-integer: " + e.dump());
    ids.push_back(e.get<int64_t>());
  }
  return ids;
}

void require_positive(const std::string& source, const char* key, int64_t value) {
  if (value <= 0) fail_invalid(source + ": field '" + key + "' must be positive, got " + std::to_string(value));
}

void refuse_biting_window(const std::string& source, const std::string& key, int64_t window, const ModelConfig& c) {
  if (window != 0 && window < c.max_position_embeddings) {
    fail_unsupported(source + ": field '" + key + "' is " + std::to_string(window) + ", below max_position_embeddings (" +
                     std::to_string(c.max_position_embeddings) + "); sliding-window attention is not implemented for " +
                     c.architecture);
  }
}

void set_sliding_window(const std::string& source, const std::string& key, int64_t window,
                        const std::vector<bool>& default_sliding, ModelConfig& c) {
  if (c.sliding_layers.empty()) c.sliding_layers = default_sliding;
  if (std::find(c.sliding_layers.begin(), c.sliding_layers.end(), true) == c.sliding_layers.end()) {
    c.sliding_layers.clear();  // every layer attends in full
    c.sliding_window = 0;
    return;
  }
  if (window <= 0) {
    fail_invalid(source + ": field '" + key + "' is " + std::to_string(window) +
                 " but layer_types names sliding_attention layers (a window must be positive)");
  }
  c.sliding_window = window;
}

void require_value(const json& j, const std::string& source, const char* key, const std::string& want) {
  if (!j.contains(key) || j[key].is_null()) return;
  if (!j[key].is_string()) fail_invalid(source + ": field '" + key + "' must be a string, got " + j[key].dump());
  const std::string value = j[key].get<std::string>();
  if (value != want) {
    fail_unsupported(source + ": " + key + " '" + value + "' is not supported (supported: " + want + ")");
  }
}

void read_moe_intermediate_size(const json& j, const std::string& source, ModelConfig& c) {
  c.moe_intermediate_size = get_int(j, source, "moe_intermediate_size", std::nullopt);
  require_positive(source, "moe_intermediate_size", c.moe_intermediate_size);
}

void read_sparse_layers(const json& j, const std::string& source, ModelConfig& c) {
  c.decoder_sparse_step = get_int(j, source, "decoder_sparse_step", 1);
  require_positive(source, "decoder_sparse_step", c.decoder_sparse_step);
  c.mlp_only_layers = get_id_list(j, source, "mlp_only_layers");
}

void read_group_limited_moe(const json& j, const std::string& source, ModelConfig& c) {
  c.n_shared_experts = get_int(j, source, "n_shared_experts", std::nullopt);
  c.first_k_dense_replace = get_int(j, source, "first_k_dense_replace", std::nullopt);
  c.n_group = get_int(j, source, "n_group", std::nullopt);
  c.topk_group = get_int(j, source, "topk_group", std::nullopt);
  if (!j.contains("routed_scaling_factor")) fail_invalid(source + ": missing required field 'routed_scaling_factor'");
  c.routed_scaling_factor = get_number(j, source, "routed_scaling_factor", 1.0);
  c.norm_topk_prob = get_bool(j, source, "norm_topk_prob", true);  // both config classes' default
  require_positive(source, "n_group", c.n_group);
  require_positive(source, "topk_group", c.topk_group);
  if (c.n_shared_experts < 0) fail_invalid(source + ": field 'n_shared_experts' must not be negative");
  if (c.first_k_dense_replace < 0 || c.first_k_dense_replace > c.num_hidden_layers) {
    fail_invalid(source + ": field 'first_k_dense_replace' must be in [0, num_hidden_layers], got " +
                 std::to_string(c.first_k_dense_replace));
  }
  if (c.routed_scaling_factor <= 0) fail_invalid(source + ": field 'routed_scaling_factor' must be positive");
  // Group-limited top-k: groups of equal size, each scored by its top-2 experts.
  if (c.num_experts % c.n_group != 0 || c.num_experts / c.n_group < 2) {
    fail_invalid(source + ": n_routed_experts (" + std::to_string(c.num_experts) + ") must be n_group (" +
                 std::to_string(c.n_group) + ") groups of at least 2 experts");
  }
  if (c.topk_group > c.n_group) fail_invalid(source + ": topk_group exceeds n_group");
  if (c.num_experts_per_tok > c.topk_group * (c.num_experts / c.n_group)) {
    fail_invalid(source + ": num_experts_per_tok (" + std::to_string(c.num_experts_per_tok) +
                 ") exceeds the experts of topk_group groups");
  }
}

}  // namespace charm::hf
