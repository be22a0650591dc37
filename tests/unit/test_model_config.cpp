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
