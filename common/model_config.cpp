#include "common/model_config.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "common/error.h"

namespace charm {
namespace {

using nlohmann::json;

/// j[key] when present and not null, else nullptr (transformers reads null as "unset").
const json* member(const json& j, const std::string& key) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

/// A field transformers reads under more than one key (an attribute_map alias, a renamed
/// field, a value moved into rope_parameters): the value found and the key it was under.
struct Spelled {
  const json* value = nullptr;
  std::string key;  ///< the key `value` came from; else every spelling, for messages
};

/// Looks up every (label, value) candidate; the present ones must agree. Throws
/// Error(kInvalidInput) naming `source` and both keys when two present values differ
/// (numbers compare by value: 16 and 16.0 agree).
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

/// The top-level spellings `keys` of one field of `j`.
Spelled spelled(const json& j, const std::string& source, const std::vector<std::string>& keys) {
  std::vector<std::pair<std::string, const json*>> candidates;
  for (const auto& key : keys) candidates.emplace_back(key, member(j, key));
  return spelled(source, candidates);
}

/// An integer field; throws naming source and key when absent (if required) or not an integer.
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

/// An id field that may be an integer or a list of integers (eos_token_id).
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

// --- Qwen2-MoE and Mixtral -------------------------------------------------------------

/// Qwen2MoeConfig's own fields (transformers models/qwen2_moe/configuration_qwen2_moe.py):
/// the gated shared expert's width, qkv_bias (default true), and the sliding window,
/// which charm does not implement: use_sliding_window true is refused.
void parse_qwen2_moe_fields(const json& j, const std::string& source, ModelConfig& c) {
  c.shared_expert_intermediate_size = get_int(j, source, "shared_expert_intermediate_size", std::nullopt);
  require_positive(source, "shared_expert_intermediate_size", c.shared_expert_intermediate_size);
  c.qkv_bias = get_bool(j, source, "qkv_bias", true);
  if (get_bool(j, source, "use_sliding_window", false)) {
    fail_unsupported(source + ": field 'use_sliding_window' is true; sliding-window attention is not "
                     "implemented for Qwen2MoeForCausalLM");
  }
}

/// Refuses a sliding window that can bite: charm runs full attention, which equals a
/// window of at least max_position_embeddings (the context charm allows). `window` 0
/// means none.
void refuse_biting_window(const std::string& source, const std::string& key, int64_t window, const ModelConfig& c) {
  if (window != 0 && window < c.max_position_embeddings) {
    fail_unsupported(source + ": field '" + key + "' is " + std::to_string(window) + ", below max_position_embeddings (" +
                     std::to_string(c.max_position_embeddings) + "); sliding-window attention is not implemented for " +
                     c.architecture);
  }
}

/// The attention window, per family as its transformers config and attention read it:
/// Qwen3MoeConfig keeps sliding_window (default 4096) only when use_sliding_window is
/// true; MixtralAttention and OlmoeAttention pass config.sliding_window when set;
/// Qwen2-MoE windows the layers transformers 5 lists as "sliding_attention" in
/// layer_types (4.x: when use_sliding_window, refused by parse_qwen2_moe_fields).
/// transformers 5 writes layer_types; any layer type but full_attention is refused.
void parse_attention_window(const json& j, const std::string& source, ModelConfig& c) {
  if (const json* types = member(j, "layer_types")) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != c.num_hidden_layers) {
      fail_invalid(source + ": field 'layer_types' must be a list of num_hidden_layers (" +
                   std::to_string(c.num_hidden_layers) + ") strings, got " + types->dump());
    }
    for (size_t i = 0; i < types->size(); ++i) {
      if ((*types)[i] != "full_attention") {
        fail_unsupported(source + ": layer_types[" + std::to_string(i) + "] is " + (*types)[i].dump() +
                         "; only full_attention is implemented for " + c.architecture);
      }
    }
  }
  if (c.architecture == "Qwen3MoeForCausalLM") {
    if (!get_bool(j, source, "use_sliding_window", false)) return;
    const bool absent = !j.contains("sliding_window");
    refuse_biting_window(source, "sliding_window", absent ? 4096 : get_int(j, source, "sliding_window", 0), c);
  } else if (c.architecture == "MixtralForCausalLM" || c.architecture == "OlmoeForCausalLM") {
    refuse_biting_window(source, "sliding_window", get_int(j, source, "sliding_window", 0), c);
  }
}

/// MixtralConfig's own rule: every layer is a sparse MoE block (norm_topk_prob is
/// implied: MixtralTopKRouter always renormalises the top-k), no shared expert.
void parse_mixtral_fields(ModelConfig& c) {
  c.norm_topk_prob = true;
  c.mlp_only_layers.clear();
  c.decoder_sparse_step = 1;
}

// ---- DeepSeek-V3 ----------------------------------------------------------------------

/// A config's RoPE settings with both spellings merged: the hub's and transformers 4's
/// top-level rope_theta plus rope_scaling {type | rope_type, factor, ...}, and transformers
/// 5's rope_parameters {rope_type, rope_theta, ...} (its standardize_rope_params moves
/// rope_theta and partial_rotary_factor inside and keeps 'type' beside 'rope_type').
struct RopeFields {
  json params = json::object();             ///< the union of both dicts
  std::map<std::string, std::string> dict;  ///< key of `params` -> the dict it came from
  std::string where;                        ///< "<source> <first dict present>", for messages

  /// The rope-dict key `key` as a spelling candidate, labelled "<dict>.<key>".
  std::pair<std::string, const json*> candidate(const std::string& key) const {
    const auto it = dict.find(key);
    return {(it == dict.end() ? std::string("rope_parameters") : it->second) + "." + key, member(params, key)};
  }
};

/// One rope dict, flat; transformers 5 may nest it by layer type, which charm reads only
/// as {"full_attention": {...}} (the one layer type the supported families have).
const json& flat_rope(const json& d, const std::string& source, const std::string& key) {
  const json* full = nullptr;
  for (const auto& [k, v] : d.items()) {
    if (!v.is_object()) continue;
    if (k != "full_attention") {
      fail_unsupported(source + ": field '" + key + "' holds per-layer-type RoPE ('" + k + "'), which is not supported");
    }
    full = &v;
  }
  if (full == nullptr) return d;
  if (d.size() != 1) fail_invalid(source + ": field '" + key + "' mixes flat RoPE keys with a nested 'full_attention'");
  return *full;
}

/// Merges rope_scaling and rope_parameters; throws naming both keys where they disagree
/// (transformers 5 would silently take rope_scaling's), and naming the field when one is
/// not an object.
RopeFields read_rope_fields(const json& j, const std::string& source) {
  RopeFields r;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* d = member(j, key);
    if (d == nullptr) continue;
    if (!d->is_object()) fail_invalid(source + ": field '" + key + "' must be a JSON object or null, got " + d->dump());
    if (r.where.empty()) r.where = source + " " + key;
    for (const auto& [k, v] : flat_rope(*d, source, key).items()) {
      if (v.is_null()) continue;
      spelled(source, {r.candidate(k), {std::string(key) + "." + k, &v}});  // throws if they disagree
      r.params[k] = v;
      r.dict.emplace(k, key);
    }
  }
  if (r.where.empty()) r.where = source + " rope_parameters";
  return r;
}

/// Reads the "yarn" or "default" rope scaling of a DeepSeek-V3 config as
/// _compute_yarn_parameters and standardize_rope_params do: original_max_position_embeddings
/// from the top level or the rope dict (they must agree), else max_position_embeddings;
/// beta_fast/beta_slow default (also when 0) to 32/1.
std::optional<YarnRopeScaling> parse_yarn(const json& j, const std::string& source, const RopeFields& rope,
                                          const std::string& type, int64_t max_position_embeddings) {
  if (type == "default") return std::nullopt;
  const std::string& where = rope.where;
  if (type != "yarn") fail_unsupported(where + ": rope type '" + type + "' is not supported (supported: yarn, default)");
  const json& r = rope.params;
  if (!member(r, "factor") || !r["factor"].is_number()) fail_invalid(where + ": missing required field 'factor'");
  YarnRopeScaling y;
  y.factor = get_number(r, where, "factor", 1.0);
  y.original_max_position_embeddings =
      int_of(spelled(source, {{"original_max_position_embeddings", member(j, "original_max_position_embeddings")},
                              rope.candidate("original_max_position_embeddings")}),
             source, max_position_embeddings);
  y.beta_fast = get_number(r, where, "beta_fast", 0.0);
  y.beta_slow = get_number(r, where, "beta_slow", 0.0);
  if (y.beta_fast == 0.0) y.beta_fast = 32.0;  // Python's `or 32`
  if (y.beta_slow == 0.0) y.beta_slow = 1.0;
  y.mscale = get_number(r, where, "mscale", 0.0);
  y.mscale_all_dim = get_number(r, where, "mscale_all_dim", 0.0);
  if (member(r, "attention_factor")) y.attention_factor = get_number(r, where, "attention_factor", 1.0);
  y.truncate = get_bool(r, where, "truncate", true);
  if (y.factor <= 0) fail_invalid(where + ": field 'factor' must be positive");
  require_positive(where, "original_max_position_embeddings", y.original_max_position_embeddings);
  return y;
}

/// Reads theta, type and partial_rotary_factor (each under any of its spellings) into
/// `c`; only full-width RoPE is implemented, and scaled RoPE only for DeepSeek-V3 (YaRN):
/// anything else would silently change the model, so it is refused by name.
void parse_rope(const json& j, const std::string& source, double default_theta, ModelConfig& c) {
  const RopeFields rope = read_rope_fields(j, source);
  c.rope_theta = number_of(spelled(source, {{"rope_theta", member(j, "rope_theta")}, rope.candidate("rope_theta")}),
                           source, default_theta);
  if (c.rope_theta <= 0) fail_invalid(source + ": field 'rope_theta' must be positive");
  const Spelled partial =
      spelled(source, {{"partial_rotary_factor", member(j, "partial_rotary_factor")},
                       rope.candidate("partial_rotary_factor")});
  if (number_of(partial, source, 1.0) != 1.0) {
    fail_unsupported(source + ": " + partial.key + " " + partial.value->dump() +
                     " is not supported (RoPE over the whole head only)");
  }
  const Spelled type_field = spelled(source, {rope.candidate("rope_type"), rope.candidate("type")});
  const std::string type = string_of(type_field, source, "default");
  if (c.architecture == "DeepseekV3ForCausalLM") {
    c.yarn = parse_yarn(j, source, rope, type, c.max_position_embeddings);
  } else if (type != "default") {
    fail_unsupported(source + ": " + type_field.key + " '" + type + "' is not supported (supported: default)");
  }
}

/// Requires string field `key`, when present, to be `want`; throws kUnsupported naming
/// field and value otherwise (transformers implements only that value).
void require_value(const json& j, const std::string& source, const char* key, const std::string& want) {
  if (!j.contains(key) || j[key].is_null()) return;
  if (!j[key].is_string()) fail_invalid(source + ": field '" + key + "' must be a string, got " + j[key].dump());
  const std::string value = j[key].get<std::string>();
  if (value != want) {
    fail_unsupported(source + ": " + key + " '" + value + "' is not supported (supported: " + want + ")");
  }
}

/// The DeepseekV3Config fields (MLA attention, group-limited sigmoid routing, shared
/// experts, dense first layers, YaRN), checked for consistency.
void parse_deepseek_v3(const json& j, const std::string& source, ModelConfig& c) {
  // q_lora_rank may be null (a plain q_proj) but must be spelled out: transformers'
  // default (1536) belongs to the full-size model.
  if (!j.contains("q_lora_rank")) fail_invalid(source + ": missing required field 'q_lora_rank'");
  c.q_lora_rank = get_int(j, source, "q_lora_rank", 0);
  if (c.q_lora_rank < 0) fail_invalid(source + ": field 'q_lora_rank' must be positive or null");
  c.kv_lora_rank = get_int(j, source, "kv_lora_rank", std::nullopt);
  c.qk_nope_head_dim = get_int(j, source, "qk_nope_head_dim", std::nullopt);
  c.qk_rope_head_dim = get_int(j, source, "qk_rope_head_dim", std::nullopt);
  c.v_head_dim = get_int(j, source, "v_head_dim", std::nullopt);
  c.n_shared_experts = get_int(j, source, "n_shared_experts", std::nullopt);
  c.first_k_dense_replace = get_int(j, source, "first_k_dense_replace", std::nullopt);
  c.n_group = get_int(j, source, "n_group", std::nullopt);
  c.topk_group = get_int(j, source, "topk_group", std::nullopt);
  if (!j.contains("routed_scaling_factor")) fail_invalid(source + ": missing required field 'routed_scaling_factor'");
  c.routed_scaling_factor = get_number(j, source, "routed_scaling_factor", 1.0);
  c.norm_topk_prob = get_bool(j, source, "norm_topk_prob", true);  // DeepseekV3Config's default
  c.rope_interleave = get_bool(j, source, "rope_interleave", true);
  for (auto [key, value] : {std::pair{"kv_lora_rank", c.kv_lora_rank}, {"qk_nope_head_dim", c.qk_nope_head_dim},
                            {"qk_rope_head_dim", c.qk_rope_head_dim}, {"v_head_dim", c.v_head_dim},
                            {"n_group", c.n_group}, {"topk_group", c.topk_group}}) {
    require_positive(source, key, value);
  }
  if (c.qk_rope_head_dim % 2 != 0) fail_invalid(source + ": field 'qk_rope_head_dim' must be even");
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
  // MLA expands the latent to one key/value per query head; transformers' repeat_kv
  // would break for any other num_key_value_heads.
  if (c.num_key_value_heads != c.num_attention_heads) {
    fail_unsupported(source + ": num_key_value_heads " + std::to_string(c.num_key_value_heads) +
                     " differs from num_attention_heads " + std::to_string(c.num_attention_heads) +
                     " (MLA has one key per head)");
  }
  // Fields transformers does not read; only the value it implements is accepted.
  require_value(j, source, "scoring_func", "sigmoid");
  require_value(j, source, "topk_method", "noaux_tc");
  if (j.contains("moe_layer_freq") && get_int(j, source, "moe_layer_freq", 1) != 1) {
    fail_unsupported(source + ": moe_layer_freq " + j["moe_layer_freq"].dump() + " is not supported (supported: 1)");
  }
  // DeepseekV3Config.__post_init__ derives head_dim and qk_head_dim, and both versions of
  // transformers write them back; a saved value that disagrees is not this model.
  const int64_t qk_head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
  for (auto [key, derived, from] : {std::tuple{"head_dim", c.qk_rope_head_dim, "qk_rope_head_dim"},
                                    {"qk_head_dim", qk_head_dim, "qk_nope_head_dim + qk_rope_head_dim"}}) {
    const int64_t saved = get_int(j, source, key, derived);
    if (saved != derived) {
      fail_invalid(source + ": field '" + key + "' is " + std::to_string(saved) + " but " + from + " is " +
                   std::to_string(derived) + "; DeepseekV3Config derives one from the other");
    }
  }
  c.head_dim = c.qk_rope_head_dim;
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (num_experts <= 0) return false;
  if (layer < first_k_dense_replace) return false;  // DeepSeek-V3's dense first layers
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

std::vector<int64_t> ModelConfig::moe_layer_ids() const {
  std::vector<int64_t> layers;
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    if (is_moe_layer(l)) layers.push_back(l);
  }
  return layers;
}

ModelConfig ModelConfig::parse(const json& j, const std::string& source) {
  if (!j.is_object()) fail_invalid(source + ": config must be a JSON object");
  ModelConfig c;
  if (!j.contains("architectures") || !j["architectures"].is_array() || j["architectures"].empty() ||
      !j["architectures"][0].is_string()) {
    fail_invalid(source + ": field 'architectures' must be a non-empty list of strings");
  }
  c.architecture = j["architectures"][0].get<std::string>();
  if (c.architecture != "Qwen3MoeForCausalLM" && c.architecture != "OlmoeForCausalLM" &&
      c.architecture != "Qwen2MoeForCausalLM" && c.architecture != "MixtralForCausalLM" &&
      c.architecture != "DeepseekV3ForCausalLM") {
    fail_unsupported(source + ": architecture '" + c.architecture +
                     "' is not supported (supported: Qwen3MoeForCausalLM, OlmoeForCausalLM, "
                     "Qwen2MoeForCausalLM, MixtralForCausalLM, DeepseekV3ForCausalLM)");
  }
  const bool olmoe = c.architecture == "OlmoeForCausalLM";
  const bool mixtral = c.architecture == "MixtralForCausalLM";
  const bool deepseek = c.architecture == "DeepseekV3ForCausalLM";
  const bool qwen2 = c.architecture == "Qwen2MoeForCausalLM";
  // The routed-expert count under each key transformers 4 and 5 read for the family (the
  // field, then its attribute_map alias): Qwen3MoeConfig 5.x writes num_local_experts,
  // OlmoeConfig num_experts, MixtralConfig num_local_experts, DeepseekV3Config
  // n_routed_experts; Qwen2MoeConfig has no alias.
  const std::vector<std::string> num_experts_keys =
      mixtral    ? std::vector<std::string>{"num_local_experts", "num_experts"}
      : deepseek ? std::vector<std::string>{"n_routed_experts", "num_local_experts"}
      : qwen2    ? std::vector<std::string>{"num_experts"}
                 : std::vector<std::string>{"num_experts", "num_local_experts"};
  const Spelled num_experts = spelled(j, source, num_experts_keys);
  if (j.contains("model_type") && j["model_type"].is_string()) c.model_type = j["model_type"].get<std::string>();
  // transformers >= 4.56 writes dtype, older versions torch_dtype; 5.x reads both.
  c.dtype = string_of(spelled(j, source, {"dtype", "torch_dtype"}), source, "");

  c.vocab_size = get_int(j, source, "vocab_size", std::nullopt);
  c.hidden_size = get_int(j, source, "hidden_size", std::nullopt);
  c.intermediate_size = get_int(j, source, "intermediate_size", std::nullopt);
  c.num_hidden_layers = get_int(j, source, "num_hidden_layers", std::nullopt);
  c.num_attention_heads = get_int(j, source, "num_attention_heads", std::nullopt);
  c.num_key_value_heads = get_int(j, source, "num_key_value_heads", c.num_attention_heads);
  c.num_experts = int_of(num_experts, source, std::nullopt);
  c.num_experts_per_tok = get_int(j, source, "num_experts_per_tok", std::nullopt);
  for (auto [key, value] : {std::pair{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                            {"intermediate_size", c.intermediate_size}, {"num_hidden_layers", c.num_hidden_layers},
                            {"num_attention_heads", c.num_attention_heads},
                            {"num_key_value_heads", c.num_key_value_heads}, {num_experts.key.c_str(), c.num_experts},
                            {"num_experts_per_tok", c.num_experts_per_tok}}) {
    require_positive(source, key, value);
  }
  c.head_dim = get_int(j, source, "head_dim", c.hidden_size / c.num_attention_heads);
  require_positive(source, "head_dim", c.head_dim);
  if (c.num_experts_per_tok > c.num_experts) {
    fail_invalid(source + ": num_experts_per_tok (" + std::to_string(c.num_experts_per_tok) + ") exceeds " +
                 num_experts.key + " (" + std::to_string(c.num_experts) + ")");
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    fail_invalid(source + ": num_attention_heads must be a multiple of num_key_value_heads");
  }
  // OLMoE's and Mixtral's routed experts use intermediate_size and they have no dense layers.
  c.moe_intermediate_size = (olmoe || mixtral) ? c.intermediate_size
                                               : get_int(j, source, "moe_intermediate_size", std::nullopt);
  require_positive(source, "moe_intermediate_size", c.moe_intermediate_size);
  c.norm_topk_prob = get_bool(j, source, "norm_topk_prob", false);
  if (!olmoe && !mixtral) {
    c.decoder_sparse_step = get_int(j, source, "decoder_sparse_step", 1);
    require_positive(source, "decoder_sparse_step", c.decoder_sparse_step);
    c.mlp_only_layers = get_id_list(j, source, "mlp_only_layers");
  }
  // The config classes' defaults (transformers 4.57 and 5 agree): OlmoeConfig and
  // MixtralConfig rms_norm_eps 1e-5, MixtralConfig rope_theta 1e6.
  c.rms_norm_eps = get_number(j, source, "rms_norm_eps", olmoe || mixtral ? 1e-5 : 1e-6);
  c.max_position_embeddings = get_int(j, source, "max_position_embeddings", 4096);
  parse_rope(j, source, mixtral ? 1e6 : 1e4, c);
  c.tie_word_embeddings = get_bool(j, source, "tie_word_embeddings", false);
  c.attention_bias = get_bool(j, source, "attention_bias", false);
  c.clip_qkv = olmoe ? get_number(j, source, "clip_qkv", 0.0) : 0.0;
  c.eos_token_ids = get_id_list(j, source, "eos_token_id");
  auto bos = get_id_list(j, source, "bos_token_id");
  c.bos_token_id = bos.empty() ? -1 : bos.front();
  if (c.rms_norm_eps <= 0) fail_invalid(source + ": field 'rms_norm_eps' must be positive");
  parse_attention_window(j, source, c);
  if (qwen2) parse_qwen2_moe_fields(j, source, c);
  if (mixtral) parse_mixtral_fields(c);
  if (deepseek) parse_deepseek_v3(j, source, c);
  return c;
}

}  // namespace charm
