#include "common/model_config.h"

#include <algorithm>
#include <map>

#include "common/config_fields.h"
#include "common/error.h"

namespace charm {
namespace {

using nlohmann::json;
using namespace hf;

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

/// Reads the "yarn" or "default" rope scaling of a family with yarn_rope as
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
/// `c`; partial RoPE only for the families that implement it
/// (CheckpointFamily::partial_rotary), and scaled RoPE only YaRN for the families
/// that implement it (CheckpointFamily::yarn_rope): anything else would silently change
/// the model, so it is refused by name.
void parse_rope(const json& j, const std::string& source, const CheckpointFamily& family, ModelConfig& c) {
  const RopeFields rope = read_rope_fields(j, source);
  c.rope_theta = number_of(spelled(source, {{"rope_theta", member(j, "rope_theta")}, rope.candidate("rope_theta")}),
                           source, family.default_rope_theta);
  if (c.rope_theta <= 0) fail_invalid(source + ": field 'rope_theta' must be positive");
  const Spelled partial =
      spelled(source, {{"partial_rotary_factor", member(j, "partial_rotary_factor")},
                       rope.candidate("partial_rotary_factor")});
  c.partial_rotary_factor = number_of(partial, source, family.default_partial_rotary_factor);
  if (!family.partial_rotary && c.partial_rotary_factor != 1.0) {
    fail_unsupported(source + ": " + partial.key + " " + partial.value->dump() +
                     " is not supported (RoPE over the whole head only)");
  }
  const bool bad_part = !(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1) || c.rotary_dim() < 2 ||
                        c.rotary_dim() % 2 != 0;
  if (family.partial_rotary && bad_part) {
    fail_invalid(source + ": " + partial.key + " " + std::to_string(c.partial_rotary_factor) +
                 " must be in (0, 1] and rotate an even number of dims of head_dim " + std::to_string(c.head_dim));
  }
  const Spelled type_field = spelled(source, {rope.candidate("rope_type"), rope.candidate("type")});
  const std::string type = string_of(type_field, source, "default");
  if (family.yarn_rope) {
    c.yarn = parse_yarn(j, source, rope, type, c.max_position_embeddings);
  } else if (type != "default") {
    fail_unsupported(source + ": " + type_field.key + " '" + type + "' is not supported (supported: default)");
  }
}

/// Reads architectures[0] into c.architecture and finds its family in `families`;
/// throws Error(kUnsupported) naming it and every supported architecture when none serves it.
const CheckpointFamily& family_of(const json& j, const std::string& source, CheckpointFamilies families,
                                  ModelConfig& c) {
  if (!j.contains("architectures") || !j["architectures"].is_array() || j["architectures"].empty() ||
      !j["architectures"][0].is_string()) {
    fail_invalid(source + ": field 'architectures' must be a non-empty list of strings");
  }
  c.architecture = j["architectures"][0].get<std::string>();
  std::string supported;
  for (const CheckpointFamily* family : families) {
    for (const std::string& architecture : family->architectures) {
      if (architecture == c.architecture) {
        c.expert_tensors = family->expert_tensors;
        return *family;
      }
      supported += (supported.empty() ? "" : ", ") + architecture;
    }
  }
  fail_unsupported(source + ": architecture '" + c.architecture + "' is not supported (supported: " + supported + ")");
}

/// model_type, dtype and the sizes every family has, checked for range and consistency.
void read_sizes(const json& j, const std::string& source, const CheckpointFamily& family, ModelConfig& c) {
  const Spelled num_experts = spelled(j, source, family.num_experts_keys);
  if (j.contains("model_type") && j["model_type"].is_string()) c.model_type = j["model_type"].get<std::string>();
  // transformers >= 4.56 writes dtype, older versions torch_dtype; 5.x reads both.
  c.dtype = string_of(spelled(j, source, {"dtype", "torch_dtype"}), source, "");

  c.vocab_size = get_int(j, source, "vocab_size", std::nullopt);
  c.hidden_size = get_int(j, source, "hidden_size", std::nullopt);
  c.intermediate_size = get_int(j, source, "intermediate_size", family.dense_mlp ? std::optional<int64_t>() : 0);
  c.num_hidden_layers = get_int(j, source, "num_hidden_layers", std::nullopt);
  c.num_attention_heads = get_int(j, source, "num_attention_heads", std::nullopt);
  c.num_key_value_heads = get_int(j, source, "num_key_value_heads", c.num_attention_heads);
  c.num_experts = int_of(num_experts, source, std::nullopt);
  c.num_experts_per_tok = get_int(j, source, "num_experts_per_tok", std::nullopt);
  if (family.dense_mlp) require_positive(source, "intermediate_size", c.intermediate_size);
  for (auto [key, value] : {std::pair{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                            {"num_hidden_layers", c.num_hidden_layers},
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
}

/// transformers 5 writes layer_types. A family with sliding windows may have
/// "sliding_attention" layers (their flags go to c.sliding_layers); any other layer type
/// is refused (each family's reader refuses its own spelling of a sliding window).
void read_layer_types(const json& j, const std::string& source, const CheckpointFamily& family, ModelConfig& c) {
  const json* types = member(j, "layer_types");
  if (types == nullptr) return;
  if (!types->is_array() || static_cast<int64_t>(types->size()) != c.num_hidden_layers) {
    fail_invalid(source + ": field 'layer_types' must be a list of num_hidden_layers (" +
                 std::to_string(c.num_hidden_layers) + ") strings, got " + types->dump());
  }
  std::vector<bool> sliding(types->size(), false), linear(types->size(), false);
  const std::string also = family.sliding_window     ? " and sliding_attention are"
                           : family.linear_attention ? " and linear_attention are"
                                                     : " is";
  for (size_t i = 0; i < types->size(); ++i) {
    sliding[i] = family.sliding_window && (*types)[i] == "sliding_attention";
    linear[i] = family.linear_attention && (*types)[i] == "linear_attention";
    if ((*types)[i] != family.full_layer_type && !sliding[i] && !linear[i]) {
      fail_unsupported(source + ": layer_types[" + std::to_string(i) + "] is " + (*types)[i].dump() + "; only " +
                       family.full_layer_type + also + " implemented for " + c.architecture);
    }
  }
  if (family.sliding_window) c.sliding_layers = std::move(sliding);
  if (family.linear_attention) c.linear_attention_layers = std::move(linear);
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

ModelConfig ModelConfig::parse(const json& j, const std::string& source, CheckpointFamilies families) {
  if (!j.is_object()) fail_invalid(source + ": config must be a JSON object");
  ModelConfig c;
  const CheckpointFamily& family = family_of(j, source, families, c);
  read_sizes(j, source, family, c);
  c.norm_topk_prob = get_bool(j, source, "norm_topk_prob", false);
  c.rms_norm_eps = get_number(j, source, "rms_norm_eps", family.default_rms_norm_eps);
  c.max_position_embeddings = get_int(j, source, "max_position_embeddings", 4096);
  parse_rope(j, source, family, c);
  c.tie_word_embeddings = get_bool(j, source, "tie_word_embeddings", false);
  c.attention_bias = get_bool(j, source, "attention_bias", false);
  c.eos_token_ids = get_id_list(j, source, "eos_token_id");
  auto bos = get_id_list(j, source, "bos_token_id");
  c.bos_token_id = bos.empty() ? -1 : bos.front();
  if (c.rms_norm_eps <= 0) fail_invalid(source + ": field 'rms_norm_eps' must be positive");
  read_layer_types(j, source, family, c);
  family.read_fields(j, source, c);
  return c;
}

}  // namespace charm
