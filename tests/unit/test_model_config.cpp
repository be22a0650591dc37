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
