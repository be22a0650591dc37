// config.json parsing (common/model_config.h): defaults, the MoE-layer rule, and errors
// that name the file and the field.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/model_config.h"
#include "coordinator/models/checkpoint_families.h"
#include "tests/support/expect_error.h"

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

// what() of the Error that parsing `j` throws; the test case fails when it parses.
std::string error_of(const json& j) {
  return test::expect_throw<Error>([&] { ModelConfig::parse(j, "model/config.json", checkpoint_families()); }).what();
}
}  // namespace

TEST_CASE("a Qwen3-MoE config parses with defaults") {
  const ModelConfig c = ModelConfig::parse(qwen3(), "config.json", checkpoint_families());
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
  const ModelConfig c = ModelConfig::parse(j, "config.json", checkpoint_families());
  CHECK_FALSE(c.is_moe_layer(0));
  CHECK(c.is_moe_layer(1));
  CHECK(c.is_moe_layer(3));
}

TEST_CASE("OLMoE uses intermediate_size for its experts") {
  json j = qwen3();
  j["architectures"] = {"OlmoeForCausalLM"};
  j.erase("moe_intermediate_size");
  const ModelConfig c = ModelConfig::parse(j, "config.json", checkpoint_families());
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
  CHECK(error_of(j).find("rope_scaling.rope_type 'yarn' is not supported") != std::string::npos);
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
  const ModelConfig c = ModelConfig::parse(qwen2_moe(), "config.json", checkpoint_families());
  CHECK(c.shared_expert_intermediate_size == 24);
  CHECK(c.qkv_bias);  // Qwen2MoeConfig's default; hub configs do not spell it out
  CHECK(c.moe_intermediate_size == 8);
  CHECK_FALSE(c.is_moe_layer(1));

  json no_bias = qwen2_moe();
  no_bias["qkv_bias"] = false;
  CHECK_FALSE(ModelConfig::parse(no_bias, "config.json", checkpoint_families()).qkv_bias);
}

TEST_CASE("a Mixtral config: num_local_experts of width intermediate_size, every layer routed, renormalised") {
  const ModelConfig c = ModelConfig::parse(mixtral(), "config.json", checkpoint_families());
  CHECK(c.num_experts == 8);
  CHECK(c.moe_intermediate_size == 12);
  CHECK(c.norm_topk_prob);
  CHECK(c.moe_layer_ids() == std::vector<int64_t>{0, 1});
  CHECK(c.shared_expert_intermediate_size == 0);

  json wide_window = mixtral();
  wide_window["sliding_window"] = 32768;  // never bites within max_position_embeddings
  CHECK(ModelConfig::parse(wide_window, "config.json", checkpoint_families()).num_experts == 8);
}

TEST_CASE("a gpt-oss config: GptOssConfig's defaults for the window, layer types, YaRN, biases and the SwiGLU clamp") {
  const json minimal = {{"architectures", {"GptOssForCausalLM"}}, {"vocab_size", 100}, {"hidden_size", 16},
                        {"intermediate_size", 12}, {"num_hidden_layers", 3}, {"num_attention_heads", 4},
                        {"num_key_value_heads", 2}, {"head_dim", 8}, {"num_local_experts", 8},
                        {"num_experts_per_tok", 2}};
  const ModelConfig c = ModelConfig::parse(minimal, "config.json", checkpoint_families());
  CHECK(c.moe_intermediate_size == 12);
  CHECK(c.attention_bias);  // GptOssConfig's default
  CHECK(c.rope_theta == 150000.0);
  CHECK(c.rms_norm_eps == 1e-5);
  CHECK(c.sliding_window == 128);
  CHECK(c.sliding_layers == std::vector<bool>{true, false, true});  // even layers slide
  REQUIRE(c.yarn.has_value());
  CHECK(c.yarn->factor == 32.0);
  CHECK(c.yarn->original_max_position_embeddings == 4096);
  CHECK_FALSE(c.yarn->truncate);
  CHECK(c.expert_activation.kind == ExpertActivation::Kind::kClampedSwiglu);
  CHECK(c.expert_activation.alpha == 1.702f);
  CHECK(c.expert_activation.limit == 7.0f);
  CHECK(c.expert_tensors.gpt_oss_layout);

  json j = minimal;
  j["swiglu_limit"] = 0;
  CHECK(error_of(j).find("field 'swiglu_limit' must be positive") != std::string::npos);
  j = minimal;
  j["quantization_config"] = {{"quant_method", "mxfp4"}};  // the hub's checkpoints: experts read from *_blocks
  CHECK(ModelConfig::parse(j, "config.json", checkpoint_families()).expert_tensors.gpt_oss_layout);
  j = minimal;
  j["layer_types"] = {"full_attention", "full_attention", "full_attention"};
  CHECK(ModelConfig::parse(j, "config.json", checkpoint_families()).attention_window(0) == 0);
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

TEST_CASE("Qwen2-MoE sliding windows as Qwen2MoeConfig resolves them: even layers below max_window_layers") {
  json qwen2 = qwen2_moe();
  CHECK(ModelConfig::parse(qwen2, "config.json", checkpoint_families()).attention_window(0) == 0);  // off
  qwen2["use_sliding_window"] = true;
  qwen2["max_window_layers"] = 3;
  qwen2["sliding_window"] = 5;
  ModelConfig c = ModelConfig::parse(qwen2, "config.json", checkpoint_families());
  CHECK(c.sliding_window == 5);
  CHECK(c.sliding_layers == std::vector<bool>{true, false, true, false});
  CHECK(c.attention_window(0) == 5);
  CHECK(c.attention_window(1) == 0);
  CHECK(c.attention_window(3) == 0);  // odd, and not below max_window_layers either
  qwen2.erase("max_window_layers");   // default 28: every even layer
  qwen2.erase("sliding_window");      // default 4096
  c = ModelConfig::parse(qwen2, "config.json", checkpoint_families());
  CHECK(c.sliding_window == 4096);
  CHECK(c.sliding_layers == std::vector<bool>{true, false, true, false});
  // transformers 5's layer_types win over the rule.
  qwen2["layer_types"] = {"full_attention", "sliding_attention", "full_attention", "full_attention"};
  c = ModelConfig::parse(qwen2, "config.json", checkpoint_families());
  CHECK(c.sliding_layers == std::vector<bool>{false, true, false, false});
  // Sliding layers without a window (use_sliding_window false makes it 0) are invalid.
  qwen2["use_sliding_window"] = false;
  CHECK(error_of(qwen2).find("field 'sliding_window' is 0 but layer_types names sliding_attention layers") !=
        std::string::npos);
  qwen2["layer_types"] = {"full_attention", "chunked_attention", "full_attention", "full_attention"};
  CHECK(error_of(qwen2).find("layer_types[1] is \"chunked_attention\"; only full_attention and "
                             "sliding_attention are implemented") != std::string::npos);
}

TEST_CASE("a Mixtral sliding_window applies to every layer; null means none") {
  json narrow = mixtral();
  CHECK(ModelConfig::parse(narrow, "config.json", checkpoint_families()).sliding_layers.empty());
  narrow["sliding_window"] = 4096;
  const ModelConfig c = ModelConfig::parse(narrow, "config.json", checkpoint_families());
  CHECK(c.attention_window(0) == 4096);
  CHECK(c.attention_window(1) == 4096);
  narrow["sliding_window"] = -1;
  CHECK(error_of(narrow).find("field 'sliding_window' must be positive or null, got -1") != std::string::npos);
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
  const ModelConfig c = ModelConfig::parse(deepseek_v3(), "config.json", checkpoint_families());
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
  j.erase("rope_theta");  // transformers 5 moves it into rope_parameters
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 5000.0}};
  j["rope_interleave"] = false;
  const ModelConfig c = ModelConfig::parse(j, "config.json", checkpoint_families());
  CHECK(c.q_lora_rank == 0);
  CHECK_FALSE(c.rope_interleave);
  CHECK(c.rope_theta == 5000.0);
  REQUIRE(c.yarn.has_value());
  CHECK(c.yarn->original_max_position_embeddings == 163840);  // max_position_embeddings by default
  CHECK(c.yarn->beta_fast == 32);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  CHECK_FALSE(ModelConfig::parse(j, "config.json", checkpoint_families()).yarn.has_value());
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

// ---- Spellings of transformers 4.x and 5.x (issue 12, item 10) -----------------------------

namespace {
namespace fs = std::filesystem;
const fs::path kFixtures = fs::path(CHARM_SOURCE_DIR) / "tests" / "fixtures";

json read_json_file(const fs::path& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in, path.string());
  return json::parse(in);
}

/// Every config.json spelling scripts/gen_config_spellings.py saved for `fixture` with
/// transformers 4.x and 5.x parses to the same ModelConfig as the fixture's own
/// (hub-layout) config.json; both major versions must be there. `saved_model_type`, when
/// set, is the model_type the saved copies carry instead of the hub's (Kimi K2's kimi_k2
/// is saved by DeepseekV3Config as deepseek_v3); every other field must still agree.
/// `with_tf4` false: transformers 4 has no such model type (MiniMax-M2), so no 4.x copy.
void check_spellings(const std::string& fixture, const std::string& saved_model_type = "", bool with_tf4 = true) {
  const fs::path hub = kFixtures / "models" / fixture / "config.json";
  const ModelConfig want = ModelConfig::parse(read_json_file(hub), hub.string(), checkpoint_families());
  CHECK(want.dtype == "bfloat16");
  std::set<char> majors;
  for (const auto& entry : fs::directory_iterator(kFixtures / "configs" / fixture)) {
    const std::string name = entry.path().filename().string();  // transformers-<version>.json
    if (name.rfind("transformers-", 0) != 0) continue;
    majors.insert(name[std::string("transformers-").size()]);
    CAPTURE(name);
    ModelConfig got;
    try {
      got = ModelConfig::parse(read_json_file(entry.path()), entry.path().string(), checkpoint_families());
    } catch (const Error& e) {
      FAIL(std::string(e.what()));
    }
    // Field by field first, so a mismatch names the field; then the whole struct, so a
    // field added later cannot be forgotten here.
    CHECK(got.architecture == want.architecture);
    CHECK(got.dtype == want.dtype);
    CHECK(got.num_experts == want.num_experts);
    CHECK(got.num_experts_per_tok == want.num_experts_per_tok);
    CHECK(got.rope_theta == want.rope_theta);
    CHECK(got.yarn == want.yarn);
    CHECK(got.rms_norm_eps == want.rms_norm_eps);
    CHECK(got.head_dim == want.head_dim);
    CHECK(got.max_position_embeddings == want.max_position_embeddings);
    CHECK(got.eos_token_ids == want.eos_token_ids);
    CHECK(got.bos_token_id == want.bos_token_id);
    if (!saved_model_type.empty()) {
      CHECK(got.model_type == saved_model_type);
      got.model_type = want.model_type;
    }
    CHECK(got == want);
  }
  CHECK_MESSAGE(majors.count('4') == (with_tf4 ? 1u : 0u), "transformers 4.x config for " << fixture);
  CHECK_MESSAGE(majors.count('5'), "no transformers 5.x config for " << fixture);
}
}  // namespace

TEST_CASE("Qwen3-MoE configs saved by transformers 4 and 5 parse to the hub config's model") {
  check_spellings("qwen3-moe-tiny");
}
TEST_CASE("OLMoE configs saved by transformers 4 and 5 parse to the hub config's model") {
  check_spellings("olmoe-tiny");
}
TEST_CASE("Qwen2-MoE configs saved by transformers 4 and 5 parse to the hub config's model") {
  check_spellings("qwen2-moe-tiny");
}
TEST_CASE("Mixtral configs saved by transformers 4 and 5 parse to the hub config's model") {
  check_spellings("mixtral-tiny");
}
TEST_CASE("DeepSeek-V3 configs (bf16 and fp8) saved by transformers 4 and 5 parse to the hub config's model") {
  check_spellings("deepseek-v3-tiny");
  check_spellings("deepseek-v3-tiny-fp8");
}
TEST_CASE("gpt-oss and the sliding-window configs saved by transformers 4 and 5 parse to the hub config's model") {
  check_spellings("gpt-oss-tiny");
  check_spellings("mixtral-swa-tiny");
  check_spellings("qwen2-moe-swa-tiny");
}
TEST_CASE("GLM-4.5 and Kimi K2 configs saved by transformers 4 and 5 parse to the hub config's model") {
  check_spellings("glm4-moe-tiny");
  check_spellings("kimi-k2-tiny", "deepseek_v3");
}
TEST_CASE("GLM-5 and DeepSeek-V3.2 configs saved by transformers 5 (layer_types indexed_attention, mlp_layer_types, rope_parameters) parse to the hub config's model") {
  check_spellings("glm-moe-dsa-tiny", "", false);
  check_spellings("deepseek-v32-tiny", "", false);  // DeepSeek-V3.2: transformers 4 has neither
}
TEST_CASE("Qwen3-Next and Qwen3.5-MoE configs saved by transformers (full_attention_interval or layer_types) parse to the hub config's model") {
  check_spellings("qwen3-next-tiny");
  check_spellings("qwen3.5-moe-tiny", "", false);  // transformers 4 has no Qwen3.5-MoE
}
TEST_CASE("Qwen3-Next: layer_types with linear_attention, the interval default, and bad linear-attention fields") {
  const fs::path hub = kFixtures / "models" / "qwen3-next-tiny" / "config.json";
  json j = read_json_file(hub);
  CHECK(ModelConfig::parse(j, "config.json", checkpoint_families()).linear_attention_layers ==
        std::vector<bool>{true, true, true, false});
  j["full_attention_interval"] = 2;
  CHECK(ModelConfig::parse(j, "config.json", checkpoint_families()).linear_attention_layers ==
        std::vector<bool>{true, false, true, false});
  j["layer_types"] = {"full_attention", "linear_attention", "linear_attention", "linear_attention"};
  CHECK(ModelConfig::parse(j, "config.json", checkpoint_families()).linear_attention_layers ==
        std::vector<bool>{false, true, true, true});
  j["layer_types"] = {"full_attention", "sliding_attention", "linear_attention", "linear_attention"};
  CHECK(error_of(j).find("layer_types[1] is \"sliding_attention\"; only full_attention and linear_attention are") !=
        std::string::npos);
  j = read_json_file(hub);
  j["linear_num_value_heads"] = 3;
  CHECK(error_of(j).find("linear_num_value_heads 3 is not a multiple of linear_num_key_heads 2") != std::string::npos);
  j = read_json_file(hub);
  j["linear_conv_kernel_dim"] = 0;
  CHECK(error_of(j).find("linear_conv_kernel_dim") != std::string::npos);
  j = read_json_file(hub);
  j["full_attention_interval"] = 5;  // 4 layers: none full
  CHECK(error_of(j).find("every layer is linear attention") != std::string::npos);
  j = read_json_file(hub);
  j.erase("norm_topk_prob");  // Qwen3NextConfig's default is true
  CHECK(ModelConfig::parse(j, "config.json", checkpoint_families()).norm_topk_prob);
  // Qwen3_5MoeTextConfig has no norm_topk_prob: its router always renormalises.
  json qwen35 = read_json_file(kFixtures / "models" / "qwen3.5-moe-tiny" / "config.json");
  qwen35["norm_topk_prob"] = false;
  CHECK(ModelConfig::parse(qwen35, "config.json", checkpoint_families()).norm_topk_prob);
}
TEST_CASE("MiniMax-M2 configs saved by transformers 5 (rotary_dim beside rope_parameters) parse to the hub config's model") {
  check_spellings("minimax-m2-tiny", "", false);
}

TEST_CASE("two spellings of one field with different values are an error naming both keys") {
  auto expect_conflict = [](json j, const std::string& a, const std::string& b) {
    const std::string message = error_of(j);
    CAPTURE(message);
    CHECK(message.find("model/config.json: fields '" + a + "'") != std::string::npos);
    CHECK(message.find("'" + b + "'") != std::string::npos);
    CHECK(message.find("disagree") != std::string::npos);
  };
  json experts = qwen3();
  experts["num_local_experts"] = 16;  // num_experts is 8
  expect_conflict(experts, "num_experts", "num_local_experts");
  json mix = mixtral();
  mix["num_experts"] = 4;
  expect_conflict(mix, "num_local_experts", "num_experts");
  json ds = deepseek_v3();
  ds["num_local_experts"] = 128;
  expect_conflict(ds, "n_routed_experts", "num_local_experts");

  json dtype = qwen3();
  dtype["dtype"] = "bfloat16";
  dtype["torch_dtype"] = "float16";
  expect_conflict(dtype, "dtype", "torch_dtype");

  json theta = qwen3();
  theta["rope_theta"] = 1e6;
  theta["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e4}};
  expect_conflict(theta, "rope_theta", "rope_parameters.rope_theta");

  json both = deepseek_v3();
  both["rope_parameters"] = both["rope_scaling"];
  both["rope_parameters"]["factor"] = 8;
  expect_conflict(both, "rope_scaling.factor", "rope_parameters.factor");

  json type = deepseek_v3();
  type["rope_scaling"]["rope_type"] = "default";  // beside "type": "yarn"
  expect_conflict(type, "rope_scaling.rope_type", "rope_scaling.type");

  json original = deepseek_v3();
  original["original_max_position_embeddings"] = 8192;  // rope_scaling says 4096
  expect_conflict(original, "original_max_position_embeddings", "rope_scaling.original_max_position_embeddings");

  // The same value under both spellings is one setting, as transformers reads it.
  json same = qwen3();
  same["num_local_experts"] = 8.0;
  same["dtype"] = same["torch_dtype"] = "bfloat16";
  same["rope_theta"] = 1e6;
  same["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000}};
  const ModelConfig c = ModelConfig::parse(same, "config.json", checkpoint_families());
  CHECK(c.num_experts == 8);
  CHECK(c.rope_theta == 1e6);
  CHECK(c.dtype == "bfloat16");
}

TEST_CASE("a wrong spelling or a missing field names every key it may be under") {
  json none = qwen3();
  none.erase("num_experts");
  CHECK(error_of(none).find("missing required field 'num_experts' or 'num_local_experts'") != std::string::npos);
  json qwen2 = qwen2_moe();  // Qwen2MoeConfig has no num_local_experts alias
  qwen2.erase("num_experts");
  qwen2["num_local_experts"] = 8;
  CHECK(error_of(qwen2).find("missing required field 'num_experts'") != std::string::npos);
  json rope = qwen3();
  rope["rope_parameters"] = "default";
  CHECK(error_of(rope).find("field 'rope_parameters' must be a JSON object or null") != std::string::npos);
  json dtype = qwen3();
  dtype["dtype"] = 16;
  CHECK(error_of(dtype).find("field 'dtype' must be a string") != std::string::npos);
}

TEST_CASE("DeepSeek-V3's derived head_dim and qk_head_dim must agree with their sources") {
  json ok = deepseek_v3();
  ok["head_dim"] = 64;
  ok["qk_head_dim"] = 192;
  CHECK(ModelConfig::parse(ok, "config.json", checkpoint_families()).head_dim == 64);
  json head = deepseek_v3();
  head["head_dim"] = 128;
  CHECK(error_of(head).find("field 'head_dim' is 128 but qk_rope_head_dim is 64") != std::string::npos);
  json qk = deepseek_v3();
  qk["qk_head_dim"] = 128;
  CHECK(error_of(qk).find("field 'qk_head_dim' is 128 but qk_nope_head_dim + qk_rope_head_dim is 192") !=
        std::string::npos);
}

TEST_CASE("transformers 5's RoPE and layer settings that change the model are refused by name") {
  json partial = qwen3();
  partial["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e4}, {"partial_rotary_factor", 0.5}};
  CHECK(error_of(partial).find("rope_parameters.partial_rotary_factor 0.5 is not supported") != std::string::npos);
  json top_partial = mixtral();
  top_partial["partial_rotary_factor"] = 0.25;
  CHECK(error_of(top_partial).find("partial_rotary_factor 0.25 is not supported") != std::string::npos);

  json nested = qwen3();
  nested["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 5e5}}}};
  CHECK(ModelConfig::parse(nested, "config.json", checkpoint_families()).rope_theta == 5e5);
  nested["rope_parameters"]["sliding_attention"] = {{"rope_type", "default"}, {"rope_theta", 1e4}};
  CHECK(error_of(nested).find("per-layer-type RoPE ('sliding_attention')") != std::string::npos);

  json types = qwen3();  // Qwen3-MoE: no sliding windows in charm yet
  types["layer_types"] = {"full_attention", "sliding_attention", "full_attention", "full_attention"};
  CHECK(error_of(types).find("layer_types[1] is \"sliding_attention\"; only full_attention is") !=
        std::string::npos);
  types["layer_types"] = {"full_attention"};
  CHECK(error_of(types).find("'layer_types' must be a list of num_hidden_layers (4)") != std::string::npos);

  json qwen3_window = qwen3();
  qwen3_window["use_sliding_window"] = true;  // sliding_window absent: Qwen3MoeConfig's 4096
  qwen3_window["max_position_embeddings"] = 32768;
  CHECK(error_of(qwen3_window).find("field 'sliding_window' is 4096") != std::string::npos);
  qwen3_window["sliding_window"] = nullptr;  // null: no window
  CHECK(ModelConfig::parse(qwen3_window, "config.json", checkpoint_families()).num_experts == 8);
  qwen3_window["use_sliding_window"] = false;
  qwen3_window["sliding_window"] = 128;  // kept only with use_sliding_window
  CHECK(ModelConfig::parse(qwen3_window, "config.json", checkpoint_families()).num_experts == 8);

  json olmoe = qwen3();
  olmoe["architectures"] = {"OlmoeForCausalLM"};
  olmoe["sliding_window"] = 256;  // OlmoeAttention passes it when set
  CHECK(error_of(olmoe).find("field 'sliding_window' is 256") != std::string::npos);
}

TEST_CASE("absent generic fields take the family's config-class default") {
  json olmoe = qwen3();
  olmoe["architectures"] = {"OlmoeForCausalLM"};
  CHECK(ModelConfig::parse(olmoe, "config.json", checkpoint_families()).rms_norm_eps == 1e-5);
  CHECK(ModelConfig::parse(qwen3(), "config.json", checkpoint_families()).rms_norm_eps == 1e-6);
  const ModelConfig mix = ModelConfig::parse(mixtral(), "config.json", checkpoint_families());
  CHECK(mix.rms_norm_eps == 1e-5);
  CHECK(mix.rope_theta == 1e6);
  CHECK(ModelConfig::parse(qwen2_moe(), "config.json", checkpoint_families()).rope_theta == 1e4);
}

// ---- GLM-4.5 MoE (issue 16) ------------------------------------------------------------------

namespace {
/// The hub config of zai-org/GLM-4.5 (config.json) as we know it, minus fields charm ignores.
json glm4_moe() {
  return json{{"architectures", {"Glm4MoeForCausalLM"}}, {"vocab_size", 151552}, {"hidden_size", 5120},
              {"intermediate_size", 12288}, {"moe_intermediate_size", 1536}, {"num_hidden_layers", 92},
              {"num_attention_heads", 96}, {"num_key_value_heads", 8}, {"head_dim", 128},
              {"partial_rotary_factor", 0.5}, {"attention_bias", true}, {"use_qk_norm", true},
              {"n_routed_experts", 160}, {"n_shared_experts", 1}, {"num_experts_per_tok", 8},
              {"first_k_dense_replace", 3}, {"n_group", 1}, {"topk_group", 1}, {"routed_scaling_factor", 2.5},
              {"norm_topk_prob", true}, {"num_nextn_predict_layers", 1}, {"max_position_embeddings", 131072},
              {"rope_theta", 1000000}, {"rms_norm_eps", 1e-5}, {"eos_token_id", {151329, 151336, 151338}}};
}
}  // namespace

TEST_CASE("a GLM-4.5 hub config parses: partial rotary, q/k norm, group-limited routing, dense first layers") {
  const ModelConfig c = ModelConfig::parse(glm4_moe(), "config.json", checkpoint_families());
  CHECK(c.num_experts == 160);
  CHECK(c.head_dim == 128);
  CHECK(c.partial_rotary_factor == 0.5);
  CHECK(c.rotary_dim() == 64);
  CHECK(c.use_qk_norm);
  CHECK(c.attention_bias);
  CHECK(c.n_shared_experts == 1);
  CHECK(c.routed_scaling_factor == 2.5);
  CHECK_FALSE(c.yarn.has_value());
  CHECK_FALSE(c.is_moe_layer(2));
  CHECK(c.is_moe_layer(3));
  CHECK(c.moe_layer_ids().size() == 89);  // the MTP layer (index 92) is not among them
  CHECK(c.eos_token_ids == std::vector<int64_t>{151329, 151336, 151338});
}

TEST_CASE("GLM-4.5: Glm4MoeConfig's defaults, transformers 5's rope_parameters spelling, bad values named") {
  json j = glm4_moe();
  j.erase("partial_rotary_factor");
  j.erase("use_qk_norm");
  j.erase("rms_norm_eps");
  ModelConfig c = ModelConfig::parse(j, "config.json", checkpoint_families());
  CHECK(c.partial_rotary_factor == 0.5);  // Glm4MoeConfig's default, not 1
  CHECK_FALSE(c.use_qk_norm);
  CHECK(c.rms_norm_eps == 1e-5);
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}, {"partial_rotary_factor", 0.25}};
  c = ModelConfig::parse(j, "config.json", checkpoint_families());
  CHECK(c.rotary_dim() == 32);
  CHECK(c.rope_theta == 1e6);
  j["partial_rotary_factor"] = 0.5;  // disagrees with rope_parameters'
  CHECK(error_of(j).find("disagree") != std::string::npos);
  json bad = glm4_moe();
  bad["partial_rotary_factor"] = 1.5;
  CHECK(error_of(bad).find("partial_rotary_factor 1.500000 must be in (0, 1]") != std::string::npos);
  bad["partial_rotary_factor"] = 0.01;  // int(128 * 0.01) = 1 dim: nothing to pair
  CHECK(error_of(bad).find("rotate an even number of dims of head_dim 128") != std::string::npos);
  for (const char* key : {"n_routed_experts", "n_shared_experts", "first_k_dense_replace", "n_group", "topk_group",
                          "routed_scaling_factor", "moe_intermediate_size"}) {
    CAPTURE(key);
    json missing = glm4_moe();
    missing.erase(key);
    CHECK(error_of(missing).find(key) != std::string::npos);
  }
  json groups = glm4_moe();
  groups["n_group"] = 3;
  CHECK(error_of(groups).find("n_routed_experts (160) must be n_group (3) groups") != std::string::npos);
  json scoring = glm4_moe();
  scoring["scoring_func"] = "softmax";
  CHECK(error_of(scoring).find("scoring_func 'softmax' is not supported") != std::string::npos);
  json yarn = glm4_moe();
  yarn["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  CHECK(error_of(yarn).find("'yarn' is not supported") != std::string::npos);
}

// ---- MiniMax-M2 (issue 16) -------------------------------------------------------------------

namespace {
/// The hub config of MiniMaxAI/MiniMax-M2 (config.json) as we know it, minus fields charm
/// ignores (auto_map, quantization_config) and with attn_type_list shortened to the layers.
json minimax_m2() {
  return json{{"architectures", {"MiniMaxM2ForCausalLM"}}, {"vocab_size", 200064}, {"hidden_size", 3072},
              {"intermediate_size", 1536}, {"num_hidden_layers", 62}, {"num_attention_heads", 48},
              {"num_key_value_heads", 8}, {"head_dim", 128}, {"rotary_dim", 64}, {"num_local_experts", 256},
              {"num_experts_per_tok", 8}, {"max_position_embeddings", 196608}, {"rope_theta", 5000000},
              {"rms_norm_eps", 1e-6}, {"qk_norm_type", "per_layer"}, {"scoring_func", "sigmoid"},
              {"shared_intermediate_size", 0}, {"use_qk_norm", true}, {"use_routing_bias", true},
              {"use_mtp", true}, {"num_mtp_modules", 3}, {"mtp_transformer_layers", 1},
              {"tie_word_embeddings", false}, {"attn_type_list", std::vector<int>(62, 1)},
              {"model_type", "minimax_m2"}};
}
}  // namespace

TEST_CASE("a MiniMax-M2 hub config parses: rotary_dim as partial rotary, every layer MoE, renormalised top-k") {
  const ModelConfig c = ModelConfig::parse(minimax_m2(), "config.json", checkpoint_families());
  CHECK(c.num_experts == 256);
  CHECK(c.moe_intermediate_size == 1536);
  CHECK(c.partial_rotary_factor == 0.5);
  CHECK(c.rotary_dim() == 64);
  CHECK(c.rope_theta == 5e6);
  CHECK(c.norm_topk_prob);
  CHECK(c.n_group == 1);
  CHECK(c.routed_scaling_factor == 1.0);
  CHECK(c.n_shared_experts == 0);
  CHECK(c.moe_layer_ids().size() == 62);
  CHECK_FALSE(c.tie_word_embeddings);
  CHECK(c.expert_tensors.prefix == "model.layers.{}.block_sparse_moe.experts");
  json whole = minimax_m2();
  whole.erase("rotary_dim");
  CHECK(ModelConfig::parse(whole, "config.json", checkpoint_families()).rotary_dim() == 128);  // MiniMaxM2Config's default
}

TEST_CASE("MiniMax-M2: rotary_dim against partial_rotary_factor, and the values transformers does not implement, named") {
  json j = minimax_m2();
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5000000}, {"partial_rotary_factor", 0.5}};
  j.erase("rope_theta");
  CHECK(ModelConfig::parse(j, "config.json", checkpoint_families()).rotary_dim() == 64);  // 5.x writes both
  j["rope_parameters"]["partial_rotary_factor"] = 0.25;
  CHECK(error_of(j).find("fields 'rotary_dim' (64) and 'partial_rotary_factor' (0.250000) disagree") != std::string::npos);
  for (int64_t bad : {0, 63, 130}) {
    CAPTURE(bad);
    json odd = minimax_m2();
    odd["rotary_dim"] = bad;
    CHECK(error_of(odd).find("rotary_dim " + std::to_string(bad) + " must be even") != std::string::npos);
  }
  const std::vector<std::pair<std::string, json>> refused = {
      {"scoring_func", "softmax"}, {"qk_norm_type", "per_head"}, {"use_qk_norm", false},
      {"use_routing_bias", false}, {"shared_intermediate_size", 1536}, {"sliding_window", 4096}};
  for (const auto& [key, value] : refused) {
    CAPTURE(key);
    json other = minimax_m2();
    other[key] = value;
    CHECK(error_of(other).find(key) != std::string::npos);
  }
  json lightning = minimax_m2();
  lightning["attn_type_list"][7] = 0;  // MiniMax-01's linear attention
  CHECK(error_of(lightning).find("attn_type_list[7] is 0") != std::string::npos);
  json short_list = minimax_m2();
  short_list["attn_type_list"] = {1, 1};
  CHECK(error_of(short_list).find("'attn_type_list' must be a list of num_hidden_layers (62)") != std::string::npos);
}
