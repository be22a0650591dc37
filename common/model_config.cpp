#include "common/model_config.h"

#include <algorithm>

#include "common/error.h"

namespace charm {
namespace {

using nlohmann::json;

/// Reads integer field `key`; throws naming source and key when absent (if required) or
/// not an integer.
int64_t get_int(const json& j, const std::string& source, const char* key, std::optional<int64_t> fallback) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback) return *fallback;
    fail_invalid(source + ": missing required field '" + key + "'");
  }
  const json& v = j[key];
  if (!v.is_number_integer()) fail_invalid(source + ": field '" + key + "' must be an integer, got " + v.dump());
  return v.get<int64_t>();
}

double get_number(const json& j, const std::string& source, const char* key, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const json& v = j[key];
  if (!v.is_number()) fail_invalid(source + ": field '" + key + "' must be a number, got " + v.dump());
  return v.get<double>();
}

bool get_bool(const json& j, const std::string& source, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const json& v = j[key];
  if (!v.is_boolean()) fail_invalid(source + ": field '" + key + "' must be true or false, got " + v.dump());
  return v.get<bool>();
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

/// MixtralConfig's own rule: every layer is a sparse MoE block (norm_topk_prob is
/// implied: MixtralTopKRouter always renormalises the top-k), no shared expert, and a
/// sliding window that charm accepts only when it can never bite, i.e. when it is null
/// or at least max_position_embeddings (the context charm allows).
void parse_mixtral_fields(const json& j, const std::string& source, ModelConfig& c) {
  c.norm_topk_prob = true;
  c.mlp_only_layers.clear();
  c.decoder_sparse_step = 1;
  const int64_t window = get_int(j, source, "sliding_window", 0);
  if (window != 0 && window < c.max_position_embeddings) {
    fail_unsupported(source + ": field 'sliding_window' is " + std::to_string(window) +
                     ", below max_position_embeddings (" + std::to_string(c.max_position_embeddings) +
                     "); sliding-window attention is not implemented for MixtralForCausalLM");
  }
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (num_experts <= 0) return false;
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
      c.architecture != "Qwen2MoeForCausalLM" && c.architecture != "MixtralForCausalLM") {
    fail_unsupported(source + ": architecture '" + c.architecture +
                     "' is not supported (supported: Qwen3MoeForCausalLM, OlmoeForCausalLM, "
                     "Qwen2MoeForCausalLM, MixtralForCausalLM)");
  }
  const bool olmoe = c.architecture == "OlmoeForCausalLM";
  const bool mixtral = c.architecture == "MixtralForCausalLM";
  // MixtralConfig names the routed-expert count num_local_experts (attribute_map).
  const char* num_experts_key = mixtral ? "num_local_experts" : "num_experts";
  if (j.contains("model_type") && j["model_type"].is_string()) c.model_type = j["model_type"].get<std::string>();

  c.vocab_size = get_int(j, source, "vocab_size", std::nullopt);
  c.hidden_size = get_int(j, source, "hidden_size", std::nullopt);
  c.intermediate_size = get_int(j, source, "intermediate_size", std::nullopt);
  c.num_hidden_layers = get_int(j, source, "num_hidden_layers", std::nullopt);
  c.num_attention_heads = get_int(j, source, "num_attention_heads", std::nullopt);
  c.num_key_value_heads = get_int(j, source, "num_key_value_heads", c.num_attention_heads);
  c.num_experts = get_int(j, source, num_experts_key, std::nullopt);
  c.num_experts_per_tok = get_int(j, source, "num_experts_per_tok", std::nullopt);
  for (auto [key, value] : {std::pair{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                            {"intermediate_size", c.intermediate_size}, {"num_hidden_layers", c.num_hidden_layers},
                            {"num_attention_heads", c.num_attention_heads},
                            {"num_key_value_heads", c.num_key_value_heads}, {num_experts_key, c.num_experts},
                            {"num_experts_per_tok", c.num_experts_per_tok}}) {
    require_positive(source, key, value);
  }
  c.head_dim = get_int(j, source, "head_dim", c.hidden_size / c.num_attention_heads);
  require_positive(source, "head_dim", c.head_dim);
  if (c.num_experts_per_tok > c.num_experts) {
    fail_invalid(source + ": num_experts_per_tok (" + std::to_string(c.num_experts_per_tok) + ") exceeds " +
                 num_experts_key + " (" + std::to_string(c.num_experts) + ")");
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
  c.rms_norm_eps = get_number(j, source, "rms_norm_eps", 1e-6);
  c.rope_theta = get_number(j, source, "rope_theta", 10000.0);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {  // transformers >= 5 spelling
    c.rope_theta = get_number(j["rope_parameters"], source + " rope_parameters", "rope_theta", c.rope_theta);
  }
  // Only plain RoPE is implemented; a scaled variant would silently change the model.
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (j.contains(key) && j[key].is_object()) {
      const json& r = j[key];
      const std::string type = r.value("rope_type", r.value("type", std::string("default")));
      if (type != "default") fail_unsupported(source + ": " + key + " type '" + type + "' is not supported");
    }
  }
  c.max_position_embeddings = get_int(j, source, "max_position_embeddings", 4096);
  c.tie_word_embeddings = get_bool(j, source, "tie_word_embeddings", false);
  c.attention_bias = get_bool(j, source, "attention_bias", false);
  c.clip_qkv = olmoe ? get_number(j, source, "clip_qkv", 0.0) : 0.0;
  c.eos_token_ids = get_id_list(j, source, "eos_token_id");
  auto bos = get_id_list(j, source, "bos_token_id");
  c.bos_token_id = bos.empty() ? -1 : bos.front();
  if (c.rms_norm_eps <= 0) fail_invalid(source + ": field 'rms_norm_eps' must be positive");
  if (c.rope_theta <= 0) fail_invalid(source + ": field 'rope_theta' must be positive");
  if (c.architecture == "Qwen2MoeForCausalLM") parse_qwen2_moe_fields(j, source, c);
  if (mixtral) parse_mixtral_fields(j, source, c);
  return c;
}

}  // namespace charm
