// config.json parsing (common/model_config.h): defaults, the MoE-layer rule, and errors
// that name the file and the field.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/model_config.h"

using namespace charm;
using nlohmann::json;

namespace {
json qwen3() {
  return json{{"architectures", {"Qwen3MoeForCausalLM"}}, {"vocab_size", 100}, {"hidden_size", 16},
              {"intermediate_size", 32}, {"moe_intermediate_size", 8}, {"num_hidden_layers", 4},
              {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"num_experts", 8},
              {"num_experts_per_tok", 2}, {"mlp_only_layers", {1}}, {"decoder_sparse_step", 1},
              {"eos_token_id", 7}};
}

std::string error_of(const json& j) {
  try {
    ModelConfig::parse(j, "model/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a Qwen3-MoE config parses with defaults") {
  const ModelConfig c = ModelConfig::parse(qwen3(), "config.json");
  CHECK(c.head_dim == 4);
  CHECK(c.moe_intermediate_size == 8);
  CHECK(c.eos_token_ids == std::vector<int64_t>{7});
  CHECK(c.is_moe_layer(0));
  CHECK_FALSE(c.is_moe_layer(1));
  CHECK(c.is_moe_layer(2));
}

TEST_CASE("decoder_sparse_step 2 makes every second layer sparse") {
  json j = qwen3();
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = json::array();
  const ModelConfig c = ModelConfig::parse(j, "config.json");
  CHECK_FALSE(c.is_moe_layer(0));
  CHECK(c.is_moe_layer(1));
  CHECK(c.is_moe_layer(3));
}

TEST_CASE("OLMoE uses intermediate_size for its experts") {
  json j = qwen3();
  j["architectures"] = {"OlmoeForCausalLM"};
  j.erase("moe_intermediate_size");
  const ModelConfig c = ModelConfig::parse(j, "config.json");
  CHECK(c.moe_intermediate_size == 32);
  CHECK(c.is_moe_layer(1));
}

TEST_CASE("bad configs name the file and the field") {
  json missing = qwen3();
  missing.erase("hidden_size");
  CHECK(error_of(missing).find("model/config.json: missing required field 'hidden_size'") != std::string::npos);

  json wrong_type = qwen3();
  wrong_type["num_experts"] = "eight";
  CHECK(error_of(wrong_type).find("'num_experts' must be an integer") != std::string::npos);

  json too_many = qwen3();
  too_many["num_experts_per_tok"] = 9;
  CHECK(error_of(too_many).find("num_experts_per_tok") != std::string::npos);

  json negative = qwen3();
  negative["num_hidden_layers"] = -1;
  CHECK(error_of(negative).find("'num_hidden_layers' must be positive") != std::string::npos);

  json arch = qwen3();
  arch["architectures"] = {"LlamaForCausalLM"};
  CHECK(error_of(arch).find("architecture 'LlamaForCausalLM' is not supported") != std::string::npos);

  CHECK(error_of(json::array()).find("must be a JSON object") != std::string::npos);
}

TEST_CASE("a scaled RoPE variant is refused rather than run wrongly") {
  json j = qwen3();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  CHECK(error_of(j).find("rope_scaling type 'yarn' is not supported") != std::string::npos);
}

// --- Qwen2-MoE and Mixtral (issue 4) ---------------------------------------------------

namespace {
json qwen2_moe() {
  json j = qwen3();
  j["architectures"] = {"Qwen2MoeForCausalLM"};
  j["shared_expert_intermediate_size"] = 24;
  j["use_sliding_window"] = false;
  j["sliding_window"] = 32768;
  return j;
}

json mixtral() {
  return json{{"architectures", {"MixtralForCausalLM"}}, {"vocab_size", 100}, {"hidden_size", 16},
              {"intermediate_size", 12}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
              {"num_key_value_heads", 2}, {"num_local_experts", 8}, {"num_experts_per_tok", 2},
              {"max_position_embeddings", 32768}, {"sliding_window", nullptr}, {"eos_token_id", 2}};
}
}  // namespace

TEST_CASE("a Qwen2-MoE config: shared expert width, q/k/v biases by default, sliding window off") {
  const ModelConfig c = ModelConfig::parse(qwen2_moe(), "config.json");
  CHECK(c.shared_expert_intermediate_size == 24);
  CHECK(c.qkv_bias);  // Qwen2MoeConfig's default; hub configs do not spell it out
  CHECK(c.moe_intermediate_size == 8);
  CHECK_FALSE(c.is_moe_layer(1));

  json no_bias = qwen2_moe();
  no_bias["qkv_bias"] = false;
  CHECK_FALSE(ModelConfig::parse(no_bias, "config.json").qkv_bias);
}

TEST_CASE("a Mixtral config: num_local_experts of width intermediate_size, every layer routed, renormalised") {
  const ModelConfig c = ModelConfig::parse(mixtral(), "config.json");
  CHECK(c.num_experts == 8);
  CHECK(c.moe_intermediate_size == 12);
  CHECK(c.norm_topk_prob);
  CHECK(c.moe_layer_ids() == std::vector<int64_t>{0, 1});
  CHECK(c.shared_expert_intermediate_size == 0);

  json wide_window = mixtral();
  wide_window["sliding_window"] = 32768;  // never bites within max_position_embeddings
  CHECK(ModelConfig::parse(wide_window, "config.json").num_experts == 8);
}

TEST_CASE("Qwen2-MoE and Mixtral configs missing a field name the field and the file") {
  json no_shared = qwen2_moe();
  no_shared.erase("shared_expert_intermediate_size");
  CHECK(error_of(no_shared).find("model/config.json: missing required field 'shared_expert_intermediate_size'") !=
        std::string::npos);

  json no_experts = mixtral();
  no_experts.erase("num_local_experts");
  CHECK(error_of(no_experts).find("model/config.json: missing required field 'num_local_experts'") !=
        std::string::npos);

  json too_many = mixtral();
  too_many["num_experts_per_tok"] = 9;
  CHECK(error_of(too_many).find("exceeds num_local_experts (8)") != std::string::npos);
}

TEST_CASE("sliding-window attention that would bite is refused, naming the field") {
  json qwen2 = qwen2_moe();
  qwen2["use_sliding_window"] = true;
  CHECK(error_of(qwen2).find("model/config.json: field 'use_sliding_window' is true") != std::string::npos);

  json narrow = mixtral();
  narrow["sliding_window"] = 4096;
  const std::string message = error_of(narrow);
  CHECK(message.find("model/config.json: field 'sliding_window' is 4096") != std::string::npos);
  CHECK(message.find("MixtralForCausalLM") != std::string::npos);
}

TEST_CASE("an unsupported architecture is named with the supported list") {
  json arch = mixtral();
  arch["architectures"] = {"DbrxForCausalLM"};
  const std::string message = error_of(arch);
  CHECK(message.find("model/config.json: architecture 'DbrxForCausalLM' is not supported") != std::string::npos);
  CHECK(message.find("Qwen2MoeForCausalLM") != std::string::npos);
  CHECK(message.find("MixtralForCausalLM") != std::string::npos);
}

// ---- DeepSeek-V3 --------------------------------------------------------------------------

namespace {
/// The hub config of deepseek-ai/DeepSeek-V3 (config.json), minus fields charm ignores.
json deepseek_v3() {
  return json{{"architectures", {"DeepseekV3ForCausalLM"}}, {"vocab_size", 129280}, {"hidden_size", 7168},
              {"intermediate_size", 18432}, {"moe_intermediate_size", 2048}, {"num_hidden_layers", 61},
              {"num_attention_heads", 128}, {"num_key_value_heads", 128}, {"n_routed_experts", 256},
              {"n_shared_experts", 1}, {"num_experts_per_tok", 8}, {"first_k_dense_replace", 3},
              {"moe_layer_freq", 1}, {"n_group", 8}, {"topk_group", 4}, {"routed_scaling_factor", 2.5},
              {"norm_topk_prob", true}, {"topk_method", "noaux_tc"}, {"scoring_func", "sigmoid"},
              {"q_lora_rank", 1536}, {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64},
              {"v_head_dim", 128}, {"max_position_embeddings", 163840}, {"rope_theta", 10000},
              {"rope_scaling",
               {{"beta_fast", 32}, {"beta_slow", 1}, {"factor", 40}, {"mscale", 1.0}, {"mscale_all_dim", 1.0},
                {"original_max_position_embeddings", 4096}, {"type", "yarn"}}},
              {"eos_token_id", 1}, {"bos_token_id", 0}};
}
}  // namespace

TEST_CASE("a DeepSeek-V3 hub config parses: MLA dims, routing, dense first layers, YaRN") {
  const ModelConfig c = ModelConfig::parse(deepseek_v3(), "config.json");
  CHECK(c.num_experts == 256);
  CHECK(c.head_dim == 64);  // qk_rope_head_dim, as DeepseekV3Config sets it
  CHECK(c.q_lora_rank == 1536);
  CHECK(c.kv_lora_rank == 512);
  CHECK(c.n_group == 8);
  CHECK(c.topk_group == 4);
  CHECK(c.routed_scaling_factor == 2.5);
  CHECK(c.rope_interleave);  // DeepseekV3Config's default
  REQUIRE(c.yarn.has_value());
  CHECK(c.yarn->factor == 40);
  CHECK(c.yarn->original_max_position_embeddings == 4096);
  CHECK(c.yarn->mscale_all_dim == 1.0);
  CHECK_FALSE(c.yarn->attention_factor.has_value());
  CHECK_FALSE(c.is_moe_layer(2));
  CHECK(c.is_moe_layer(3));
  CHECK(c.moe_layer_ids().size() == 58);
}

TEST_CASE("DeepSeek-V3: null q_lora_rank means q_proj; transformers 5's rope_parameters spelling is read too") {
  json j = deepseek_v3();
  j["q_lora_rank"] = nullptr;
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 5000.0}};
  j["rope_interleave"] = false;
  const ModelConfig c = ModelConfig::parse(j, "config.json");
  CHECK(c.q_lora_rank == 0);
  CHECK_FALSE(c.rope_interleave);
  CHECK(c.rope_theta == 5000.0);
  REQUIRE(c.yarn.has_value());
  CHECK(c.yarn->original_max_position_embeddings == 163840);  // max_position_embeddings by default
  CHECK(c.yarn->beta_fast == 32);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  CHECK_FALSE(ModelConfig::parse(j, "config.json").yarn.has_value());
}

TEST_CASE("DeepSeek-V3: missing fields are named") {
  for (const char* key : {"kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
                          "n_shared_experts", "first_k_dense_replace", "n_group", "topk_group",
                          "routed_scaling_factor", "q_lora_rank"}) {
    CAPTURE(key);
    json j = deepseek_v3();
    j.erase(key);
    CHECK(error_of(j).find(std::string("missing required field '") + key + "'") != std::string::npos);
  }
  json j = deepseek_v3();
  j["rope_scaling"].erase("factor");
  CHECK(error_of(j).find("rope_scaling: missing required field 'factor'") != std::string::npos);
}

TEST_CASE("DeepSeek-V3: unsupported values are named with the field") {
  auto with = [](const char* key, json value) {
    json j = deepseek_v3();
    j[key] = std::move(value);
    return error_of(j);
  };
  CHECK(with("scoring_func", "softmax").find("scoring_func 'softmax' is not supported") != std::string::npos);
  CHECK(with("topk_method", "greedy").find("topk_method 'greedy' is not supported") != std::string::npos);
  CHECK(with("moe_layer_freq", 2).find("moe_layer_freq 2 is not supported") != std::string::npos);
  CHECK(with("num_key_value_heads", 64).find("num_key_value_heads 64") != std::string::npos);
  CHECK(with("rope_scaling", json{{"type", "dynamic"}, {"factor", 2.0}}).find("rope type 'dynamic' is not supported") !=
        std::string::npos);
  CHECK(with("n_group", 3).find("n_routed_experts (256) must be n_group (3) groups") != std::string::npos);
  CHECK(with("topk_group", 9).find("topk_group exceeds n_group") != std::string::npos);
  CHECK(with("num_experts_per_tok", 129).find("num_experts_per_tok (129) exceeds") != std::string::npos);
  CHECK(with("first_k_dense_replace", 62).find("'first_k_dense_replace' must be in [0, num_hidden_layers]") !=
        std::string::npos);
  CHECK(with("routed_scaling_factor", 0).find("'routed_scaling_factor' must be positive") != std::string::npos);
}
