// GGUF -> Hugging Face names and config (see gguf_model.h). The tensor table is the
// reverse of gguf-py's TensorNameMap for the tensors charm's families load; the config is
// the reverse of convert_hf_to_gguf.py's set_gguf_parameters for each architecture.
#include "common/gguf_model.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>

#include "common/error.h"

namespace charm {
namespace {

using json = nlohmann::json;

/// A per-layer GGUF tensor one architecture names its own way: GGUF base name (after
/// "blk.N.") -> HF suffix under model.layers.N., with the GGUF ".weight"/".bias" suffix
/// kept, or dropped where the HF tensor has none (gpt-oss's self_attn.sinks).
struct LayerNameRule {
  const char* gguf;
  const char* hf;
  bool keep_suffix = true;
};

/// The HF architecture of one GGUF architecture, and what its HF checkpoints call things.
struct ArchSpec {
  const char* hf_architecture;
  const char* model_type;
  const char* router;         ///< HF module of the router, under model.layers.N.
  const char* experts;        ///< HF module of the routed experts
  const char* expert_gate;    ///< names of the three projections in `experts`
  const char* expert_up;
  const char* expert_down;
  const char* shared_expert;  ///< HF module of the shared expert(s), or ""
  bool default_norm_topk;     ///< what llama.cpp's graph does without expert_weights_norm
  /// HF name (under model.layers.N.) of exp_probs_b, the sigmoid routers' selection bias.
  const char* score_bias = "mlp.gate.e_score_correction_bias";
  std::vector<LayerNameRule> layer_names = {};  ///< checked before shared_layer_names()
};

/// The lightning indexer of DeepSeek Sparse Attention (GLM-5, DeepSeek-V3.2) under
/// llama.cpp's names: blk.N.indexer.{k_norm, proj, attn_k, attn_q_b}.
const std::vector<LayerNameRule>& dsa_indexer_names() {
  static const std::vector<LayerNameRule> names = {{"indexer.k_norm", "self_attn.indexer.k_norm"},
                                                   {"indexer.proj", "self_attn.indexer.weights_proj"},
                                                   {"indexer.attn_k", "self_attn.indexer.wk"},
                                                   {"indexer.attn_q_b", "self_attn.indexer.wq_b"}};
  return names;
}

/// Qwen3-Next's and Qwen3.5-MoE's gated DeltaNet layers under llama.cpp's names (ssm_*),
/// and `projections`, their input projections (the one place the two files differ).
std::vector<LayerNameRule> deltanet_names(std::vector<LayerNameRule> projections) {
  for (LayerNameRule rule : std::initializer_list<LayerNameRule>{{"post_attention_norm", "post_attention_layernorm"},
                                                                 {"ssm_conv1d", "linear_attn.conv1d"},
                                                                 {"ssm_a", "linear_attn.A"},
                                                                 {"ssm_dt", "linear_attn.dt_bias", false},
                                                                 {"ssm_norm", "linear_attn.norm"},
                                                                 {"ssm_out", "linear_attn.out_proj"}}) {
    projections.push_back(rule);
  }
  return projections;
}

const std::map<std::string, ArchSpec, std::less<>>& arch_specs() {
  static const std::map<std::string, ArchSpec, std::less<>> specs = {
      {"qwen2moe", {"Qwen2MoeForCausalLM", "qwen2_moe", "mlp.gate", "mlp.experts", "gate_proj", "up_proj",
                    "down_proj", "mlp.shared_expert", false}},
      {"qwen3moe", {"Qwen3MoeForCausalLM", "qwen3_moe", "mlp.gate", "mlp.experts", "gate_proj", "up_proj",
                    "down_proj", "", true}},
      {"olmoe", {"OlmoeForCausalLM", "olmoe", "mlp.gate", "mlp.experts", "gate_proj", "up_proj", "down_proj", "",
                 false}},
      {"llama", {"MixtralForCausalLM", "mixtral", "block_sparse_moe.gate", "block_sparse_moe.experts", "w1", "w3",
                 "w2", "", true}},
      {"deepseek2", {"DeepseekV3ForCausalLM", "deepseek_v3", "mlp.gate", "mlp.experts", "gate_proj", "up_proj",
                     "down_proj", "mlp.shared_experts", false}},
      // DeepSeek-V3's tensors and keys, and the indexer's (attention.indexer.*).
      {"glm-dsa", {"GlmMoeDsaForCausalLM", "glm_moe_dsa", "mlp.gate", "mlp.experts", "gate_proj", "up_proj",
                   "down_proj", "mlp.shared_experts", false, "mlp.gate.e_score_correction_bias", dsa_indexer_names()}},
      {"deepseek32", {"DeepseekV32ForCausalLM", "deepseek_v32", "mlp.gate", "mlp.experts", "gate_proj", "up_proj",
                      "down_proj", "mlp.shared_experts", false, "mlp.gate.e_score_correction_bias",
                      dsa_indexer_names()}},
      // gpt-oss's experts keep the converter's names, gate_proj / up_proj / down_proj
      // .weight and .bias ([E, I, H], [E, I, H], [E, H, I]; gate_up_proj.weight / .bias
      // [E, 2I, H] / [E, 2I] when fused), which the expert reader tells apart from the
      // hub's interleaved gate_up_proj by their suffixes (common/checkpoint.h).
      {"gpt-oss", {"GptOssForCausalLM", "gpt_oss", "mlp.router", "mlp.experts", "gate_proj", "up_proj", "down_proj",
                   "", false, "", {{"post_attention_norm", "post_attention_layernorm"},
                                   {"attn_sinks", "self_attn.sinks", false}}}},
      {"glm4moe", {"Glm4MoeForCausalLM", "glm4_moe", "mlp.gate", "mlp.experts", "gate_proj", "up_proj", "down_proj",
                   "mlp.shared_experts", false, "mlp.gate.e_score_correction_bias",
                   {{"post_attention_norm", "post_attention_layernorm"}}}},
      // Qwen3-Next: the DeltaNet layers' tensors by llama.cpp's names (ssm_*), q, k, v and z
      // either fused as the hub's in_proj_qkvz (ssm_in, older files) or apart (attn_qkv [q
      // of every key head | k | v], attn_gate = z: Qwen3NextModel.modify_tensors today),
      // which the family reads as Qwen3.5-MoE's in_proj_qkv / in_proj_z. ssm_a is A =
      // -exp(A_log) as the converter computed it, read as such (linear_attn.A).
      {"qwen3next", {"Qwen3NextForCausalLM", "qwen3_next", "mlp.gate", "mlp.experts", "gate_proj", "up_proj",
                     "down_proj", "mlp.shared_expert", true, "",
                     deltanet_names({{"ssm_in", "linear_attn.in_proj_qkvz"},
                                     {"attn_qkv", "linear_attn.in_proj_qkv"},
                                     {"attn_gate", "linear_attn.in_proj_z"},
                                     {"ssm_ba", "linear_attn.in_proj_ba"}})}},
      // Qwen3.5-MoE's text model: Qwen3-Next's layers with q, k, v, z, b and a apart
      // (attn_qkv, attn_gate, ssm_beta, ssm_alpha) and the value heads tiled (see
      // read_linear_attention_config).
      {"qwen35moe", {"Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", "mlp.gate", "mlp.experts", "gate_proj", "up_proj",
                     "down_proj", "mlp.shared_expert", true, "",
                     deltanet_names({{"attn_qkv", "linear_attn.in_proj_qkv"},
                                     {"attn_gate", "linear_attn.in_proj_z"},
                                     {"ssm_beta", "linear_attn.in_proj_b"},
                                     {"ssm_alpha", "linear_attn.in_proj_a"}})}},
      {"minimax-m2", {"MiniMaxM2ForCausalLM", "minimax_m2", "block_sparse_moe.gate", "block_sparse_moe.experts", "w1",
                      "w3", "w2", "", true, "block_sparse_moe.e_score_correction_bias"}},
  };
  return specs;
}

/// Reads typed metadata of one architecture ("{arch}.key"), naming the file in errors.
class Meta {
 public:
  Meta(const GgufModelFiles& files, std::string arch) : files_(files), arch_(std::move(arch)) {}
  const std::string& arch() const { return arch_; }
  std::string where() const { return files_.files().front()->path().string(); }
  const GgufValue* find(const std::string& key) const { return files_.find(key); }
  const GgufValue* arch_key(const std::string& key) const { return find(arch_ + "." + key); }

  /// A scalar integer; a per-layer array is accepted when all its values are equal.
  std::optional<int64_t> integer(const std::string& key) const {
    const GgufValue* v = arch_key(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_array()) return v->as_i64();
    const std::vector<int64_t> values = v->as_i64_array();
    for (int64_t x : values) {
      if (x != values.front()) {
        fail_unsupported(where() + ": " + v->name() + " differs between layers; charm needs one value");
      }
    }
    if (values.empty()) fail_invalid(where() + ": " + v->name() + " is an empty array");
    return values.front();
  }
  int64_t required(const std::string& key) const {
    const auto v = integer(key);
    if (!v) fail_invalid(where() + ": metadata key '" + arch_ + "." + key + "' is missing");
    return *v;
  }
  /// required(), and above zero (a size or count), else Error(kInvalidInput) naming the key.
  int64_t positive(const std::string& key) const {
    const int64_t v = required(key);
    if (v <= 0) fail_invalid(where() + ": " + arch_ + "." + key + " must be positive, got " + std::to_string(v));
    return v;
  }
  /// A scalar number, f32 read as the decimal it was written from (gguf_f32_as_decimal);
  /// a per-layer array is accepted when all its values are equal.
  std::optional<double> number(const std::string& key, int exponent10 = 0) const {
    const GgufValue* v = arch_key(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_array()) return scalar_number(*v, exponent10);
    if (v->size() == 0) fail_invalid(where() + ": " + v->name() + " is an empty array");
    const double first = scalar_number(v->at(0), 0);
    for (uint64_t i = 1; i < v->size(); ++i) {
      if (scalar_number(v->at(i), 0) != first) {
        fail_unsupported(where() + ": " + v->name() + " differs between layers; charm needs one value");
      }
    }
    return scalar_number(v->at(0), exponent10);
  }
  std::optional<bool> boolean(const std::string& key) const {
    const GgufValue* v = arch_key(key);
    return v ? std::optional<bool>(v->as_bool()) : std::nullopt;
  }
  /// A boolean per served layer: an array of block_count entries (llama.cpp's
  /// get_key_or_arr wants that many; a file's trailing multi-token-prediction blocks are
  /// not served), of the `layers` served ones, or one boolean for every layer (as
  /// get_key_or_arr too); nullopt when the key is absent. Throws Error(kInvalidInput)
  /// naming the key for an array of any other length.
  std::optional<std::vector<bool>> per_layer_flags(const std::string& key, int64_t layers) const {
    const GgufValue* v = arch_key(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_array()) return std::vector<bool>(static_cast<size_t>(layers), v->as_bool());
    const int64_t blocks = required("block_count");
    if (v->size() != static_cast<uint64_t>(layers) && v->size() != static_cast<uint64_t>(blocks)) {
      const std::string counts = blocks == layers ? std::to_string(layers) + " layers"
                                                  : std::to_string(layers) + " layers (or all " +
                                                        std::to_string(blocks) + " blocks)";
      fail_invalid(where() + ": " + v->name() + " must list every one of the " + counts + ", it lists " +
                   std::to_string(v->size()));
    }
    std::vector<bool> flags;
    for (int64_t l = 0; l < layers; ++l) flags.push_back(v->at(static_cast<uint64_t>(l)).as_bool());
    return flags;
  }
  std::optional<std::string> string(const std::string& key) const {
    const GgufValue* v = arch_key(key);
    return v ? std::optional<std::string>(v->as_string()) : std::nullopt;
  }

 private:
  static double scalar_number(const GgufValue& v, int exponent10) {
    if (v.type() == GgufValueType::kF32) return gguf_f32_as_decimal(v.as_f32(), exponent10);
    if (v.is_float()) return v.as_f64() * std::pow(10.0, exponent10);
    return static_cast<double>(v.as_i64()) * std::pow(10.0, exponent10);
  }

  const GgufModelFiles& files_;
  std::string arch_;
};

/// HF suffix under model.layers.N. of a GGUF per-layer tensor name (after "blk.N."),
/// for the tensors every architecture shares; the MoE ones come from the ArchSpec.
const std::map<std::string, std::string, std::less<>>& shared_layer_names() {
  static const std::map<std::string, std::string, std::less<>> names = {
      {"attn_norm", "input_layernorm"},
      {"ffn_norm", "post_attention_layernorm"},
      {"attn_q", "self_attn.q_proj"},
      {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},
      {"attn_output", "self_attn.o_proj"},
      {"attn_q_norm", "self_attn.q_norm"},
      {"attn_k_norm", "self_attn.k_norm"},
      {"attn_q_a", "self_attn.q_a_proj"},
      {"attn_q_a_norm", "self_attn.q_a_layernorm"},
      {"attn_q_b", "self_attn.q_b_proj"},
      {"attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"},
      {"attn_kv_a_norm", "self_attn.kv_a_layernorm"},
      {"attn_kv_b", "self_attn.kv_b_proj"},
      {"ffn_gate", "mlp.gate_proj"},
      {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},
  };
  return names;
}

/// "blk.12.attn_q.weight" -> {12, "attn_q", "weight"}; nullopt for a non-layer name.
struct LayerName {
  int64_t layer;
  std::string base;
  std::string suffix;  ///< "weight", "bias" or "" (e.g. exp_probs_b.bias's "bias")
};
std::optional<LayerName> split_layer_name(std::string_view name) {
  if (!name.starts_with("blk.")) return std::nullopt;
  name.remove_prefix(4);
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  int64_t layer = -1;
  const auto [ptr, ec] = std::from_chars(name.data(), name.data() + dot, layer);
  if (ec != std::errc() || ptr != name.data() + dot || layer < 0) return std::nullopt;
  std::string_view rest = name.substr(dot + 1);
  const size_t last = rest.rfind('.');
  if (last == std::string_view::npos) return LayerName{layer, std::string(rest), ""};
  return LayerName{layer, std::string(rest.substr(0, last)), std::string(rest.substr(last + 1))};
}

/// The HF name of GGUF tensor `info` under `spec`, or "" when no family reads it.
std::string hf_name_of(const ArchSpec& spec, std::string_view name) {
  if (name == "token_embd.weight") return "model.embed_tokens.weight";
  if (name == "output_norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  const auto parts = split_layer_name(name);
  if (!parts) return "";
  const std::string layer = "model.layers." + std::to_string(parts->layer) + ".";
  const std::string& base = parts->base;
  const std::string suffix = parts->suffix.empty() ? "" : "." + parts->suffix;
  for (const LayerNameRule& rule : spec.layer_names) {
    if (base == rule.gguf) return layer + rule.hf + (rule.keep_suffix ? suffix : "");
  }
  if (const auto it = shared_layer_names().find(base); it != shared_layer_names().end()) {
    return layer + it->second + suffix;
  }
  const std::string experts = layer + spec.experts + ".";
  if (base == "ffn_gate_inp") return layer + spec.router + suffix;
  if (base == "ffn_gate_exps") return experts + spec.expert_gate + suffix;
  if (base == "ffn_up_exps") return experts + spec.expert_up + suffix;
  if (base == "ffn_down_exps") return experts + spec.expert_down + suffix;
  // --fuse-gate-up-exps: [E, 2I, H], gate rows first, as the hub's fused gate_up_proj
  if (base == "ffn_gate_up_exps") return experts + "gate_up_proj" + suffix;
  if (base == "exp_probs_b") return *spec.score_bias != '\0' ? layer + spec.score_bias : "";
  if (*spec.shared_expert != '\0') {
    const std::string shared = layer + spec.shared_expert + ".";
    if (base == "ffn_gate_shexp") return shared + "gate_proj" + suffix;
    if (base == "ffn_up_shexp") return shared + "up_proj" + suffix;
    if (base == "ffn_down_shexp") return shared + "down_proj" + suffix;
    if (base == "ffn_gate_inp_shexp") return layer + spec.shared_expert + "_gate" + suffix;
  }
  return "";
}

/// Layers holding a router: the MoE layers (the others are dense).
std::set<int64_t> moe_layers(const GgufModelFiles& files) {
  std::set<int64_t> layers;
  for (const GgufTensorInfo* t : files.tensors()) {
    const auto parts = split_layer_name(t->name);
    if (parts && parts->base == "ffn_gate_inp") layers.insert(parts->layer);
  }
  return layers;
}

/// tokenizer.ggml ids as HF's generation_config.json / config.json carry them.
void read_special_ids(const GgufModelFiles& files, json& config, json& generation) {
  json eos = json::array();
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    if (const GgufValue* v = files.find(key)) {
      const int64_t id = v->as_i64();
      if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
    }
  }
  if (!eos.empty()) {
    config["eos_token_id"] = eos.front();
    generation["eos_token_id"] = eos.size() == 1 ? eos.front() : eos;
  }
  if (const GgufValue* v = files.find("tokenizer.ggml.bos_token_id")) {
    config["bos_token_id"] = v->as_i64();
    generation["bos_token_id"] = v->as_i64();
  }
}

/// The fields every architecture shares (LlamaConfig's names). block_count counts the
/// multi-token-prediction layers a file may end with (nextn_predict_layers; GLM-4.5's
/// converter writes them): those are not decoder layers.
void read_common_config(const Meta& m, const GgufModelFiles& files, json& c) {
  const int64_t blocks = m.required("block_count");
  const int64_t nextn = m.integer("nextn_predict_layers").value_or(0);
  if (nextn < 0 || nextn >= blocks) {
    fail_invalid(m.where() + ": " + m.arch() + ".nextn_predict_layers (" + std::to_string(nextn) +
                 ") must be below " + m.arch() + ".block_count (" + std::to_string(blocks) + ")");
  }
  c["num_hidden_layers"] = blocks - nextn;
  c["hidden_size"] = m.required("embedding_length");
  if (const auto ff = m.integer("feed_forward_length")) c["intermediate_size"] = *ff;
  c["num_attention_heads"] = m.required("attention.head_count");
  c["num_key_value_heads"] = m.integer("attention.head_count_kv").value_or(c["num_attention_heads"].get<int64_t>());
  if (const auto ctx = m.integer("context_length")) c["max_position_embeddings"] = *ctx;
  c["rms_norm_eps"] = m.number("attention.layer_norm_rms_epsilon").value_or(1e-6);
  c["rope_theta"] = m.number("rope.freq_base").value_or(10000.0);
  c["hidden_act"] = "silu";
  const GgufTensorInfo& embed = files.tensor("token_embd.weight");
  c["vocab_size"] = m.integer("vocab_size").value_or(embed.shape().front());
  c["tie_word_embeddings"] = files.find_tensor("output.weight") == nullptr;
  c["num_experts_per_tok"] = m.integer("expert_used_count").value_or(0);  // checked with expert_count
  if (const auto ff = m.integer("expert_feed_forward_length")) c["moe_intermediate_size"] = *ff;
  c["attention_bias"] = files.find_tensor("blk.0.attn_q.bias") != nullptr;
}

/// Qwen2-MoE / Qwen3-MoE / OLMoE: dense layers are those without a router.
void read_sparse_layout(const GgufModelFiles& files, json& c) {
  const std::set<int64_t> moe = moe_layers(files);
  json dense = json::array();
  for (int64_t l = 0; l < c["num_hidden_layers"].get<int64_t>(); ++l) {
    if (!moe.contains(l)) dense.push_back(l);
  }
  c["mlp_only_layers"] = dense;
  c["decoder_sparse_step"] = 1;
}

/// HF's yarn rope_scaling from rope.scaling.* (TextModel.set_gguf_parameters writes
/// factor, original_context_length and, where the config has them, the betas), or null
/// for a file without scaling; throws Error(kUnsupported) naming any other scaling type.
json read_yarn(const Meta& m) {
  const auto type = m.string("rope.scaling.type");
  if (!type || *type == "none") return nullptr;
  if (*type != "yarn") {
    fail_unsupported(m.where() + ": " + m.arch() + ".rope.scaling.type '" + *type + "' is not supported");
  }
  return {{"type", "yarn"},
          {"factor", m.number("rope.scaling.factor").value_or(1.0)},
          {"original_max_position_embeddings", m.required("rope.scaling.original_context_length")},
          {"beta_fast", m.number("rope.scaling.yarn_beta_fast").value_or(32.0)},
          {"beta_slow", m.number("rope.scaling.yarn_beta_slow").value_or(1.0)}};
}

/// For the architectures that take RoPE unscaled: throws Error(kUnsupported) naming a
/// rope.scaling.type other than none.
void refuse_rope_scaling(const Meta& m) {
  const auto type = m.string("rope.scaling.type");
  if (type && *type != "none") {
    fail_unsupported(m.where() + ": " + m.arch() + ".rope.scaling.type '" + *type + "' is not supported for " +
                     m.arch() + " (unscaled RoPE only)");
  }
}

void read_deepseek2_config(const Meta& m, json& c) {
  const int64_t rope = m.required("rope.dimension_count");
  // Files since llama.cpp's MLA rework carry key_length_mla (nope + rope); older ones key_length.
  const int64_t qk = m.integer("attention.key_length_mla").value_or(m.required("attention.key_length"));
  c["n_routed_experts"] = c["num_experts"];
  c["qk_rope_head_dim"] = rope;
  c["qk_nope_head_dim"] = qk - rope;
  c["v_head_dim"] = m.integer("attention.value_length_mla").value_or(m.required("attention.value_length"));
  c["kv_lora_rank"] = m.required("attention.kv_lora_rank");
  const auto q_lora = m.integer("attention.q_lora_rank");
  c["q_lora_rank"] = q_lora ? json(*q_lora) : json(nullptr);
  c["num_key_value_heads"] = c["num_attention_heads"];  // the converter writes 1 (MLA as MQA)
  c["first_k_dense_replace"] = m.integer("leading_dense_block_count").value_or(0);
  c["moe_layer_freq"] = 1;
  c["n_shared_experts"] = m.integer("expert_shared_count").value_or(0);
  c["routed_scaling_factor"] = m.number("expert_weights_scale").value_or(1.0);
  c["n_group"] = m.integer("expert_group_count").value_or(1);
  c["topk_group"] = m.integer("expert_group_used_count").value_or(1);
  // LLAMA_EXPERT_GATING_FUNC_TYPE. Without the key llama.cpp takes deepseek2 as softmax and
  // glm-dsa as sigmoid (and refuses deepseek32); both DSA families only route by sigmoid.
  const int64_t gating = m.integer("expert_gating_func").value_or(m.arch() == "deepseek2" ? 1 : 2);
  if (gating != 2) {
    fail_unsupported(m.where() + ": " + m.arch() + ".expert_gating_func " + std::to_string(gating) +
                     " is not supported (1 is softmax routing, DeepSeek-V2's); charm serves the sigmoid-routed "
                     "DeepSeek-V3 form (" + m.arch() + ".expert_gating_func 2)");
  }
  c["scoring_func"] = "sigmoid";
  c["topk_method"] = "noaux_tc";
  c["rope_interleave"] = true;
  if (json rs = read_yarn(m); !rs.is_null()) {
    // HF's DeepSeek config has mscale (the rotary cos/sin factor) and mscale_all_dim (the
    // softmax scale's); GGUF keeps only the latter (yarn_log_multiplier = 0.1 *
    // mscale_all_dim), and llama.cpp computes as if the two were equal, as they are in
    // DeepSeek-V3, R1 and Kimi K2's configs. So mscale = mscale_all_dim here.
    const double mscale_all_dim = m.number("rope.scaling.yarn_log_multiplier", 1).value_or(0.0);
    rs["mscale"] = mscale_all_dim;
    rs["mscale_all_dim"] = mscale_all_dim;
    c["rope_scaling"] = rs;
  }
}

/// DeepSeek Sparse Attention's indexer (GlmMoeDsaModel / DeepseekV32Model.
/// set_gguf_parameters): attention.indexer.{head_count, key_length, top_k} and, for GLM-5,
/// attention.indexer.types (true = a layer with its own indexer, false = one that shares the
/// previous layer's selection). A GLM-5 file without types gets llama.cpp's: every layer
/// full below a 1 Mi-token context (GLM-5, 5.1), else GLM-5.2's pattern (layers 0 and 1,
/// then every 4th from layer 2, full). DeepSeek-V3.2 has an indexer on every layer.
void read_dsa_indexer_config(const Meta& m, json& c) {
  c["index_n_heads"] = m.positive("attention.indexer.head_count");
  c["index_head_dim"] = m.positive("attention.indexer.key_length");
  c["index_topk"] = m.positive("attention.indexer.top_k");
  if (m.arch() != "glm-dsa") return;
  const int64_t layers = c["num_hidden_layers"].get<int64_t>();
  json types = json::array();
  if (const auto full = m.per_layer_flags("attention.indexer.types", layers)) {
    for (bool f : *full) types.push_back(f ? "full" : "shared");
  } else {
    const bool glm_5_2 = m.integer("context_length").value_or(0) >= 1048576;
    for (int64_t l = 0; l < layers; ++l) types.push_back(!glm_5_2 || l < 2 || (l - 2) % 4 == 0 ? "full" : "shared");
  }
  c["indexer_types"] = types;
}

/// gpt-oss (GptOssModel.set_gguf_parameters; llama.cpp's LLM_ARCH_OPENAI_MOE graph). The
/// experts are expert_feed_forward_length wide; attention.sliding_window applies to the
/// even layers (llama.cpp hard-codes set_swa_pattern(2), as GptOssConfig's default
/// layer_types); YaRN never truncates its correction range (every gpt-oss config says
/// truncate false; GGUF has no key for it). The experts' SwiGLU clamp is 7.0, which
/// llama.cpp's graph hard-codes, unless the file carries {arch}.swiglu_clamp_exp (llama.cpp's
/// key for an expert SwiGLU clamp, one value per layer), so a gpt-oss with another clamp can
/// be described; swiglu_alpha stays GptOssConfig's 1.702, which llama.cpp hard-codes too.
void read_gpt_oss_config(const Meta& m, json& c) {
  c["num_local_experts"] = c["num_experts"];
  c["intermediate_size"] = m.required("expert_feed_forward_length");
  c["sliding_window"] = m.required("attention.sliding_window");
  json types = json::array();
  for (int64_t l = 0; l < c["num_hidden_layers"].get<int64_t>(); ++l) {
    types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  }
  c["layer_types"] = types;
  c["swiglu_limit"] = m.number("swiglu_clamp_exp").value_or(7.0);
  json rs = read_yarn(m);
  if (!rs.is_null()) {
    rs["truncate"] = false;
    if (const auto attn = m.number("rope.scaling.yarn_attn_factor")) rs["attention_factor"] = *attn;
  }
  c["rope_scaling"] = rs;  // null: the file asks for unscaled RoPE
}

/// The routers of GLM-4.5 and MiniMax-M2 score with a sigmoid (llama.cpp's GLM4_MOE loader
/// takes a missing expert_gating_func as sigmoid); any other gating is another model.
void require_sigmoid_gating(const Meta& m) {
  const int64_t gating = m.integer("expert_gating_func").value_or(2);  // LLAMA_EXPERT_GATING_FUNC_TYPE
  if (gating != 2 && gating != 0) {
    fail_unsupported(m.where() + ": " + m.arch() + ".expert_gating_func " + std::to_string(gating) +
                     " is not supported; " + m.arch() + " routes with a sigmoid (2)");
  }
}

/// Partial RoPE: rope.dimension_count of each head's head_dim dims turn (llama.cpp's n_rot,
/// head_dim without the key).
double rotary_fraction(const Meta& m, const json& c) {
  const int64_t head_dim = c["head_dim"].get<int64_t>();
  const int64_t rotary = m.integer("rope.dimension_count").value_or(head_dim);
  if (rotary < 2 || rotary > head_dim || rotary % 2 != 0) {
    fail_invalid(m.where() + ": " + m.arch() + ".rope.dimension_count (" + std::to_string(rotary) +
                 ") must be even and within head_dim (" + std::to_string(head_dim) + ")");
  }
  return static_cast<double>(rotary) / static_cast<double>(head_dim);
}

/// GLM-4.5 (Glm4MoeModel.set_gguf_parameters; llama.cpp's GLM4_MOE): DeepSeek-V3's MoE
/// fields under their GGUF keys, q/k norms where the file has attn_q_norm, partial RoPE
/// (rope.dimension_count of head_dim), no rope scaling. llama.cpp's defaults where a key is
/// absent: no leading dense layers, no shared expert, scale 1, one group, no renormalisation.
void read_glm4_moe_config(const Meta& m, const GgufModelFiles& files, json& c) {
  require_sigmoid_gating(m);
  refuse_rope_scaling(m);
  c["n_routed_experts"] = c["num_experts"];
  c["n_shared_experts"] = m.integer("expert_shared_count").value_or(0);
  c["first_k_dense_replace"] = m.integer("leading_dense_block_count").value_or(0);
  c["routed_scaling_factor"] = m.number("expert_weights_scale").value_or(1.0);
  c["n_group"] = m.integer("expert_group_count").value_or(1);
  c["topk_group"] = m.integer("expert_group_used_count").value_or(1);
  c["num_nextn_predict_layers"] = m.integer("nextn_predict_layers").value_or(0);
  c["use_qk_norm"] = files.find_tensor("blk.0.attn_q_norm.weight") != nullptr;
  c["partial_rotary_factor"] = rotary_fraction(m, c);
}

/// MiniMax-M2 (MiniMaxM2Model.set_gguf_parameters; llama.cpp's MINIMAX_M2): experts
/// expert_feed_forward_length wide, RoPE on rope.dimension_count dims of each head (the
/// hub's rotary_dim), sigmoid routing with exp_probs_b; q/k norms over every head, as the
/// hub's qk_norm_type per_layer (the family reads attn_q_norm's width).
void read_minimax_m2_config(const Meta& m, json& c) {
  require_sigmoid_gating(m);
  refuse_rope_scaling(m);
  c["num_local_experts"] = c["num_experts"];
  c["intermediate_size"] = m.required("expert_feed_forward_length");
  c["rotary_dim"] = m.integer("rope.dimension_count").value_or(c["head_dim"].get<int64_t>());
  c["scoring_func"] = "sigmoid";
}

/// Qwen3-Next and Qwen3.5-MoE (Qwen3NextModel.set_gguf_parameters; llama.cpp's QWEN3NEXT,
/// QWEN35MOE): the DeltaNet's sizes from ssm.* (state_size = linear_key_head_dim,
/// group_count = linear_num_key_heads, time_step_rank = linear_num_value_heads, inner_size
/// = value heads x linear_value_head_dim), the layer kinds from attention.recurrent_layers
/// (else full attention on every full_attention_interval-th layer, default 4, as
/// llama.cpp), partial RoPE (Qwen3.5's multimodal sections turn a text token as plain
/// RoPE does); the MoE layers are those with a router. The file's norms hold 1 + w (see
/// ModelConfig::norm_weights_include_unit_offset); Qwen3.5's converter tiles the value
/// heads where there are more of them than key heads (linear_value_heads_tiled).
/// llama.cpp's graphs always renormalise the top-k.
void read_linear_attention_config(const Meta& m, const GgufModelFiles& files, json& c) {
  refuse_rope_scaling(m);
  read_sparse_layout(files, c);
  const GgufTensorInfo* shexp = files.find_tensor("blk.0.ffn_gate_shexp.weight");
  if (const auto width = m.integer("expert_shared_feed_forward_length")) {
    c["shared_expert_intermediate_size"] = *width;
  } else if (shexp != nullptr) {
    c["shared_expert_intermediate_size"] = shexp->shape().front();
  }
  c["linear_conv_kernel_dim"] = m.positive("ssm.conv_kernel");
  c["linear_key_head_dim"] = m.positive("ssm.state_size");
  c["linear_num_key_heads"] = m.positive("ssm.group_count");
  const int64_t v_heads = m.positive("ssm.time_step_rank");
  const int64_t inner = m.positive("ssm.inner_size");
  if (inner % v_heads != 0) {
    fail_invalid(m.where() + ": " + m.arch() + ".ssm.inner_size (" + std::to_string(inner) +
                 ") is not a multiple of " + m.arch() + ".ssm.time_step_rank (" + std::to_string(v_heads) + ")");
  }
  c["linear_num_value_heads"] = v_heads;
  c["linear_value_head_dim"] = inner / v_heads;
  const int64_t layers = c["num_hidden_layers"].get<int64_t>();
  json types = json::array();
  if (const auto recurrent = m.per_layer_flags("attention.recurrent_layers", layers)) {
    for (bool r : *recurrent) types.push_back(r ? "linear_attention" : "full_attention");
  } else {
    const int64_t interval = m.integer("full_attention_interval").value_or(4);
    if (interval <= 0) fail_invalid(m.where() + ": " + m.arch() + ".full_attention_interval must be positive");
    for (int64_t l = 0; l < layers; ++l) types.push_back((l + 1) % interval != 0 ? "linear_attention" : "full_attention");
  }
  c["layer_types"] = types;
  c["partial_rotary_factor"] = rotary_fraction(m, c);
  c["norm_weights_include_unit_offset"] = true;
  c["linear_value_heads_tiled"] = m.arch() == "qwen35moe" && v_heads != c["linear_num_key_heads"].get<int64_t>();
  for (int64_t l = 0; l < layers && !c["attention_bias"].get<bool>(); ++l) {  // layer 0 is linear
    c["attention_bias"] = files.find_tensor("blk." + std::to_string(l) + ".attn_q.bias") != nullptr;
  }
}

json read_config(const Meta& m, const ArchSpec& spec, const GgufModelFiles& files) {
  json c = json::object();
  c["architectures"] = json::array({spec.hf_architecture});
  c["model_type"] = spec.model_type;
  const int64_t experts = m.integer("expert_count").value_or(0);
  if (experts <= 0) {
    fail_unsupported(m.where() + ": architecture '" + m.arch() + "' without experts (" + m.arch() +
                     ".expert_count) is a dense model; charm serves mixture-of-experts models");
  }
  m.required("expert_used_count");
  read_common_config(m, files, c);
  c["num_experts"] = experts;
  c["norm_topk_prob"] = m.boolean("expert_weights_norm").value_or(spec.default_norm_topk);
  const bool mla = m.arch() == "deepseek2" || m.arch() == "glm-dsa" || m.arch() == "deepseek32";
  if (const auto head_dim = m.integer("attention.key_length"); head_dim && !mla) {
    c["head_dim"] = *head_dim;
  }
  if (m.arch() == "qwen2moe") {
    read_sparse_layout(files, c);
    c["qkv_bias"] = c["attention_bias"];
    c.erase("attention_bias");  // Qwen2MoeConfig's name for it is qkv_bias
    const GgufTensorInfo* shexp = files.find_tensor("blk.0.ffn_gate_shexp.weight");
    c["shared_expert_intermediate_size"] =
        m.integer("expert_shared_feed_forward_length").value_or(shexp ? shexp->shape().front() : 0);
    c["use_sliding_window"] = false;
  } else if (m.arch() == "qwen3moe" || m.arch() == "olmoe") {
    read_sparse_layout(files, c);
    if (m.arch() == "olmoe") {
      const auto clip = m.number("attention.clamp_kqv");
      c["clip_qkv"] = clip ? json(*clip) : json(nullptr);
    }
  } else if (m.arch() == "llama") {
    c["num_local_experts"] = experts;
    c["sliding_window"] = nullptr;
  } else if (m.arch() == "deepseek2") {
    read_deepseek2_config(m, c);
  } else if (m.arch() == "glm-dsa" || m.arch() == "deepseek32") {
    read_deepseek2_config(m, c);
    read_dsa_indexer_config(m, c);
  } else if (m.arch() == "gpt-oss") {
    read_gpt_oss_config(m, c);
  } else if (m.arch() == "glm4moe") {
    read_glm4_moe_config(m, files, c);
  } else if (m.arch() == "minimax-m2") {
    read_minimax_m2_config(m, c);
  } else if (m.arch() == "qwen3next" || m.arch() == "qwen35moe") {
    read_linear_attention_config(m, files, c);
  }
  return c;
}

/// Checks a mapped tensor's shape against the config where the family would not (the
/// family checks the rest when it loads).
GgufHfTensor mapped_tensor(const std::string& hf_name, const GgufTensorInfo& t, const ArchSpec& spec,
                           const json& c) {
  GgufHfTensor out{hf_name, &t, t.shape(), 0};
  const std::string base = split_layer_name(t.name) ? split_layer_name(t.name)->base : "";
  if (base.ends_with("_exps") && t.name.ends_with(".weight") && out.shape.size() != 3) {
    fail_invalid(t.name + ": a routed-expert tensor must be 3-D [experts, rows, cols], got " +
                 std::to_string(out.shape.size()) + "-D");
  }
  if (base == "ffn_gate_inp_shexp" && out.shape.size() == 1) out.shape = {1, out.shape[0]};  // HF's Linear(h, 1)
  if (base == "ssm_conv1d" && out.shape.size() == 2) out.shape = {out.shape[0], 1, out.shape[1]};  // squeezed
  if (std::string(spec.model_type) == "mixtral" && (base == "attn_q" || base == "attn_k") && t.name.ends_with(".weight")) {
    out.unpermute_heads = c[base == "attn_q" ? "num_attention_heads" : "num_key_value_heads"].get<int64_t>();
    const int64_t rows = out.shape.front();
    if (out.unpermute_heads <= 0 || rows % (2 * out.unpermute_heads) != 0) {
      fail_invalid(t.name + ": " + std::to_string(rows) + " rows do not split into " +
                   std::to_string(out.unpermute_heads) + " rotary heads");
    }
  }
  return out;
}

}  // namespace

double gguf_f32_as_decimal(float value, int exponent10) {
  char text[64];
  const auto [end, ec] = std::to_chars(text, text + sizeof text - 8, value);  // shortest round trip
  if (ec != std::errc()) return static_cast<double>(value);
  std::string s(text, end);
  if (exponent10 != 0) s += "e" + std::to_string(exponent10);  // "0.08" * 10 -> "0.08e1" = 0.8 exactly
  return std::strtod(s.c_str(), nullptr);
}

GgufHfModel map_gguf_to_hf(const GgufModelFiles& files) {
  const std::string where = files.files().front()->path().string();
  const std::string arch = files.get("general.architecture").as_string();
  const auto spec_it = arch_specs().find(arch);
  if (spec_it == arch_specs().end()) {
    std::string known;
    for (const auto& [name, spec] : arch_specs()) known += (known.empty() ? "" : ", ") + name;
    fail_unsupported(where + ": GGUF architecture '" + arch + "' is not supported (supported: " + known + ")");
  }
  const ArchSpec& spec = spec_it->second;
  const Meta meta(files, arch);
  GgufHfModel model;
  model.generation_config = json::object();
  model.config = read_config(meta, spec, files);
  read_special_ids(files, model.config, model.generation_config);

  std::map<int64_t, GgufKvB> kv_b;
  const int64_t layers = model.config["num_hidden_layers"].get<int64_t>();
  const int64_t blocks = meta.required("block_count");
  for (const GgufTensorInfo* t : files.tensors()) {
    const auto parts = split_layer_name(t->name);
    if (parts && parts->layer >= blocks) {  // a shorter model than the file holds: refuse, never truncate
      fail_invalid(where + ": tensor '" + t->name + "' is of block " + std::to_string(parts->layer) + ", but " +
                   arch + ".block_count is " + std::to_string(blocks));
    }
    if (parts && parts->layer >= layers) {  // a multi-token-prediction block
      model.ignored.push_back(t->name);
      continue;
    }
    if (parts && (parts->base == "attn_k_b" || parts->base == "attn_v_b")) {
      GgufKvB& entry = kv_b[parts->layer];
      (parts->base == "attn_k_b" ? entry.k_b : entry.v_b) = t;
      continue;
    }
    const std::string hf = hf_name_of(spec, t->name);
    if (hf.empty()) {
      model.ignored.push_back(t->name);
      continue;
    }
    model.tensors.push_back(mapped_tensor(hf, *t, spec, model.config));
  }
  for (auto& [layer, entry] : kv_b) {
    const std::string name = "model.layers." + std::to_string(layer) + ".self_attn.kv_b_proj.weight";
    if (entry.k_b == nullptr || entry.v_b == nullptr) {
      fail_invalid(where + ": layer " + std::to_string(layer) + " has only one of attn_k_b and attn_v_b");
    }
    entry.hf_name = name;
    entry.heads = model.config["num_attention_heads"].get<int64_t>();
    entry.nope = model.config["qk_nope_head_dim"].get<int64_t>();
    entry.v = model.config["v_head_dim"].get<int64_t>();
    entry.kv_lora_rank = model.config["kv_lora_rank"].get<int64_t>();
    const std::vector<int64_t> k_shape{entry.heads, entry.kv_lora_rank, entry.nope};
    const std::vector<int64_t> v_shape{entry.heads, entry.v, entry.kv_lora_rank};
    if (entry.k_b->shape() != k_shape || entry.v_b->shape() != v_shape) {
      fail_invalid(where + ": " + entry.k_b->name + " / " + entry.v_b->name +
                   " do not have the shapes [heads, kv_lora_rank, qk_nope_head_dim] / [heads, v_head_dim, "
                   "kv_lora_rank] the metadata gives");
    }
    model.kv_b.push_back(entry);
  }
  return model;
}

}  // namespace charm
