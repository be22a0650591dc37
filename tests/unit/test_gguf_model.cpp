// GGUF models against their safetensors originals: each tiny fixture written as GGUF the
// way llama.cpp's converter lays its family out (scripts/gen_gguf_fixtures.py, run by the
// ctest fixture `gguf_fixtures` into <build>/gguf-fixtures) must give the same config,
// the same tensors and bit-identical logits as the safetensors checkpoint, BF16 and F32
// alike; the GGUF tokenizer must encode as tokenizer.json does.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>

#include <nlohmann/json.hpp>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/gguf.h"
#include "common/gguf_model.h"
#include "common/ggml_quantize.h"
#include "common/gguf_split.h"
#include "common/model_config.h"
#include "common/topology.h"
#include "coordinator/dispatch/dispatcher_factory.h"
#include "coordinator/models/families.h"
#include "coordinator/text/model_text.h"
#include "tests/support/expect_error.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/single_node_logits.h"
#include "tests/support/temp_dir.h"

namespace {

using namespace charm;
using charm::test::TempDir;
using charm::test::expect_error;
using charm::test::first_logits;

const std::filesystem::path kModels = std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/models";
const std::filesystem::path kGguf = std::filesystem::path(CHARM_BINARY_DIR) / "gguf-fixtures";

/// The reference prompts of fixture `name`.
std::vector<std::vector<int32_t>> prompts_of(const std::string& name) {
  std::ifstream in(kModels / name / "reference.json");
  const auto reference = nlohmann::json::parse(in);
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : reference["prompts"]) out.push_back(p["prompt_ids"].get<std::vector<int32_t>>());
  return out;
}

/// `name`'s safetensors directory, with config.json's yarn mscale set to mscale_all_dim
/// when they differ: GGUF keeps only one of the two (common/gguf_model.h), so the
/// DeepSeek fixture (mscale 1.0, mscale_all_dim 0.8 on purpose) is compared with the
/// model GGUF can describe.
std::filesystem::path safetensors_twin(const std::string& name, TempDir& tmp) {
  const auto src = kModels / name;
  std::ifstream in(src / "config.json");
  auto config = nlohmann::json::parse(in);
  if (!config.contains("rope_scaling") || !config["rope_scaling"].is_object() ||
      config["rope_scaling"].value("mscale", 0.0) == config["rope_scaling"].value("mscale_all_dim", 0.0)) {
    return src;
  }
  config["rope_scaling"]["mscale"] = config["rope_scaling"]["mscale_all_dim"];
  const auto dir = tmp.path() / name;
  std::filesystem::create_directories(dir);
  for (const auto& entry : std::filesystem::directory_iterator(src)) {
    if (entry.path().filename() != "config.json") std::filesystem::create_symlink(entry.path(), dir / entry.path().filename());
  }
  std::ofstream(dir / "config.json") << config.dump(2);
  return dir;
}

void check_same_logits(const std::string& name, const std::string& outtype) {
  CAPTURE(name);
  CAPTURE(outtype);
  const auto gguf = kGguf / (name + "." + outtype + ".gguf");
  REQUIRE_MESSAGE(std::filesystem::exists(gguf), "run the ctest fixture gguf_fixtures (scripts/gen_gguf_fixtures.py)");
  TempDir tmp;
  const auto safetensors = safetensors_twin(name, tmp);
  for (const auto& prompt : prompts_of(name)) {
    ModelConfig from_gguf, from_st;
    const auto a = first_logits(gguf, prompt, &from_gguf);
    const auto b = first_logits(safetensors, prompt, &from_st);
    REQUIRE(a.size() == b.size());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    CHECK(from_gguf.num_experts == from_st.num_experts);
    CHECK(from_gguf.rms_norm_eps == from_st.rms_norm_eps);
    // The whole config, but for config.json's dtype, which GGUF does not carry (the
    // tensors carry theirs), and the EOS ids, which come from the tokenizer metadata (eos
    // and eot, all in generation_config: GLM's config.json lists both, Qwen3's one).
    from_gguf.dtype = from_st.dtype;
    from_gguf.eos_token_ids = from_st.eos_token_ids;
    // And for Qwen3-Next, that the file's norms hold 1 + w (the hub's do not).
    CHECK(from_gguf.norm_weights_include_unit_offset == (from_gguf.linear_num_key_heads > 0));
    from_gguf.norm_weights_include_unit_offset = from_st.norm_weights_include_unit_offset;
    CHECK(from_gguf == from_st);
  }
}

const char* const kFixtures[] = {"qwen2-moe-tiny",   "qwen3-moe-tiny", "olmoe-tiny",      "mixtral-tiny",
                                 "deepseek-v3-tiny", "gpt-oss-tiny",   "glm4-moe-tiny",   "minimax-m2-tiny",
                                 "qwen3-next-tiny",  "glm-moe-dsa-tiny", "deepseek-v32-tiny"};

TEST_CASE("a BF16 GGUF of every fixture gives the safetensors logits bit for bit") {
  for (const char* name : kFixtures) check_same_logits(name, "bf16");
}

TEST_CASE("a GGUF converted with --fuse-gate-up-exps (ffn_gate_up_exps) gives the same logits too") {
  // gpt-oss's biases fused the same way ([E, 2I], gate first); Qwen3-MoE's experts read
  // as the hub's fused gate_up_proj.
  for (const char* name : {"gpt-oss-tiny", "qwen3-moe-tiny"}) {
    const auto ckpt = Checkpoint::open(kGguf / (std::string(name) + ".bf16-fused.gguf"));
    CHECK(ckpt->find("model.layers.0.mlp.experts.gate_up_proj.weight") != nullptr);
    CHECK(ckpt->find("model.layers.0.mlp.experts.gate_proj.weight") == nullptr);
    check_same_logits(name, "bf16-fused");
  }
}

TEST_CASE("a Qwen3-Next GGUF reads the converter's forms: q, k, v, z fused (ssm_in) or apart, A as -exp(A_log)") {
  // The bf16 file of the test above has attn_qkv / attn_gate (today's converter); older
  // files have the hub's fused in_proj_qkvz as ssm_in. Both give the safetensors' logits.
  check_same_logits("qwen3-next-tiny", "bf16-ssm-in");
  const auto split = Checkpoint::open(kGguf / "qwen3-next-tiny.bf16.gguf");
  const auto fused = Checkpoint::open(kGguf / "qwen3-next-tiny.bf16-ssm-in.gguf");
  const auto hub = Checkpoint::open(kModels / "qwen3-next-tiny");
  const std::string p = "model.layers.0.linear_attn.";
  CHECK(split->find(p + "in_proj_qkv.weight") != nullptr);
  CHECK(split->find(p + "in_proj_z.weight") != nullptr);
  CHECK(split->find(p + "in_proj_qkvz.weight") == nullptr);
  CHECK(fused->find(p + "in_proj_qkvz.weight") != nullptr);
  // ssm_a holds -exp(A_log), read as stored; the norms 1 + w (in f32, as the converter).
  const auto a = split->load_f32(p + "A", {4});
  const auto a_log = hub->load_f32(p + "A_log", {4});
  for (size_t h = 0; h < a.size(); ++h) CHECK(a[h] == -std::exp(a_log[h]));
  const auto norm = split->load_f32("model.norm.weight", {32});
  const auto w = hub->load_f32("model.norm.weight", {32});
  for (size_t i = 0; i < norm.size(); ++i) CHECK(norm[i] == 1.0f + w[i]);
}

/// A directory with fixture `name`'s files linked and `extra` written beside them as one
/// more shard.
std::filesystem::path fixture_with(const std::string& name, const std::vector<testing::TensorSpec>& extra,
                                   TempDir& tmp) {
  const auto dir = tmp.path() / "with-extra";
  std::filesystem::create_directories(dir);
  for (const auto& entry : std::filesystem::directory_iterator(kModels / name)) {
    std::filesystem::create_symlink(entry.path(), dir / entry.path().filename());
  }
  testing::write_safetensors(dir / "extra.safetensors", extra);
  return dir;
}

TEST_CASE("a Qwen3-Next checkpoint with a projection fused and apart, or an ssm_a above zero, is refused") {
  const auto hub = Checkpoint::open(kModels / "qwen3-next-tiny");
  const std::string p = "model.layers.0.linear_attn.";
  const auto tensor = [&](const std::string& name, const std::string& like) {
    const TensorInfo* info = hub->find(p + like);
    REQUIRE(info != nullptr);
    return testing::TensorSpec{p + name, DType::kF32, info->shape, std::vector<float>(info->numel(), 0.5f)};
  };
  // The hub's checkpoint fuses q, k, v, z and b, a and stores A_log; the other form of
  // each beside it is the same projection twice.
  const std::pair<const char*, const char*> twice[] = {
      {"in_proj_qkv.weight", "in_proj_qkvz.weight"}, {"in_proj_z.weight", "in_proj_qkvz.weight"},
      {"in_proj_a.weight", "in_proj_ba.weight"}, {"A", "A_log"}};
  for (const auto& [apart, fused] : twice) {
    CAPTURE(apart);
    TempDir tmp;
    const auto dir = fixture_with("qwen3-next-tiny", {tensor(apart, fused)}, tmp);
    const auto both = apart == std::string("A") ? std::pair{p + "A", p + "A_log"} : std::pair{p + fused, p + apart};
    expect_error([&] { first_logits(dir, prompts_of("qwen3-next-tiny").front()); }, ErrorCategory::kInvalidInput,
                 {both.first, both.second, (dir / "extra.safetensors").string(), "two forms of the same weights"});
  }

  // ssm_a is -exp(A_log): a value above zero cannot come from a converter.
  TempDir tmp;
  const auto bad = tmp.path() / "qwen3-next-tiny.gguf";
  std::filesystem::copy_file(kGguf / "qwen3-next-tiny.bf16.gguf", bad);
  uint64_t at = 0;
  {
    const auto gguf = GgufFile::open(bad);
    const GgufTensorInfo* a = gguf->find_tensor("blk.0.ssm_a");
    REQUIRE(a != nullptr);
    REQUIRE(a->type == GgmlType::kF32);
    at = a->data_begin + 4;  // value head 1
  }
  std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
  const float above = 0.25f;
  f.seekp(static_cast<std::streamoff>(at));
  f.write(reinterpret_cast<const char*>(&above), 4);
  f.close();
  expect_error([&] { first_logits(bad, prompts_of("qwen3-next-tiny").front()); }, ErrorCategory::kInvalidInput,
               {bad.string(), "tensor 'blk.0.ssm_a' holds 0.25 at value head 1", "never above zero"});
}

TEST_CASE("a Qwen3.5-MoE GGUF (value heads tiled by its converter) gives the safetensors logits to rounding") {
  // Every value-head-indexed row, channel and column is stored tiled; charm reads them so
  // (linear_value_heads_tiled), and only out_proj's sum runs over its columns in the
  // file's order: 8.4e-7 relative on "The capital of France is", greedy tokens the same.
  const std::string name = "qwen3.5-moe-tiny";
  const auto gguf = kGguf / (name + ".bf16.gguf");
  REQUIRE_MESSAGE(std::filesystem::exists(gguf), "run the ctest fixture gguf_fixtures");
  for (const auto& prompt : prompts_of(name)) {
    ModelConfig from_gguf, from_st;
    const auto a = first_logits(gguf, prompt, &from_gguf);
    const auto b = first_logits(kModels / name, prompt, &from_st);
    REQUIRE(a.size() == b.size());
    float diff = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff = std::max(diff, std::fabs(a[i] - b[i]));
      scale = std::max(scale, std::fabs(b[i]));
    }
    MESSAGE(name << " " << prompt.size() << " tokens: max |gguf - safetensors| / max |safetensors| = " << diff / scale);
    CHECK(diff / scale < 1e-5);
    CHECK(std::max_element(a.begin(), a.end()) - a.begin() == std::max_element(b.begin(), b.end()) - b.begin());
    CHECK(from_gguf.linear_value_heads_tiled);
    CHECK(from_gguf.norm_weights_include_unit_offset);
    from_gguf.linear_value_heads_tiled = from_st.linear_value_heads_tiled;
    from_gguf.norm_weights_include_unit_offset = from_st.norm_weights_include_unit_offset;
    from_gguf.dtype = from_st.dtype;
    from_gguf.eos_token_ids = from_st.eos_token_ids;
    CHECK(from_gguf == from_st);
  }
}

TEST_CASE("an F32 GGUF (weights widened) gives the same logits too") {
  for (const char* name : {"qwen3-moe-tiny", "mixtral-tiny", "deepseek-v3-tiny", "qwen3-next-tiny"}) check_same_logits(name, "f32");
}

/// A quantised GGUF against gguf-py's dequantisation of it (the same tensors in F32): the
/// GGML blocks stay in block form and are widened row by row in the kernels, so the
/// logits must be the same bits. Also reports how far quantisation moved them from bf16.
void check_quantised(const std::string& name, const std::string& type) {
  CAPTURE(name);
  CAPTURE(type);
  const auto quantised = kGguf / (name + "." + type + ".gguf");
  const auto dequantised = kGguf / (name + "." + type + "-dequantised.f32.gguf");
  REQUIRE_MESSAGE(std::filesystem::exists(quantised), "run the ctest fixture gguf_fixtures_quantised");
  const auto ckpt = Checkpoint::open(quantised);
  bool any_block = false;
  for (const auto& tensor : ckpt->tensor_names()) any_block |= ckpt->find(tensor)->block_type.has_value();
  CHECK(any_block);
  for (const auto& prompt : prompts_of(name)) {
    const auto a = first_logits(quantised, prompt);
    const auto b = first_logits(dequantised, prompt);
    REQUIRE(a.size() == b.size());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    const auto bf16 = first_logits(kModels / name, prompt);
    float diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(a[i] - bf16[i]));
    MESSAGE(name << " " << type << ": max |logit - bf16 logit| = " << diff);
  }
}

TEST_CASE("quantised GGUFs compute exactly what their dequantised weights do") {
  for (const char* type : {"q8_0", "q4_0", "q5_1", "mxfp4"}) {
    check_quantised("qwen3-moe-tiny", type);
  }
  check_quantised("deepseek-v3-tiny", "q8_0");
  check_quantised("qwen3-next-tiny", "q8_0");  // the DeltaNet's projections as Q8_0 blocks too
}

TEST_CASE("gpt-oss's MXFP4 GGUF keeps its experts as MXFP4 blocks and computes what their dequantised weights do") {
  // As llama.cpp's converter writes gpt-oss: the routed experts' gate and up MXFP4 (down's
  // 24-wide rows are not whole 32-value blocks at the fixture's size: bf16), the rest bf16.
  const auto ckpt = Checkpoint::open(kGguf / "gpt-oss-tiny.mxfp4.gguf");
  for (const char* proj : {"gate_proj", "up_proj"}) {
    const TensorInfo* t = ckpt->find(std::string("model.layers.0.mlp.experts.") + proj + ".weight");
    REQUIRE(t != nullptr);
    CHECK(t->block_type == GgmlType::kMXFP4);
  }
  CHECK_FALSE(ckpt->find("model.layers.0.self_attn.q_proj.weight")->block_type.has_value());
  check_quantised("gpt-oss-tiny", "mxfp4");
}

TEST_CASE("quant_dense quantises as gguf-py: a safetensors fixture under it gives its dense-quantised GGUF's logits") {
  // <name>.<type>-dense.gguf (gen_gguf_fixtures.py --dense-only): gguf-py's Q8_0 / Q4_0 of
  // every matrix quant_dense quantises (projections, embeddings, lm_head), the routed
  // experts and routers as stored. The same blocks, so the same bits.
  for (const char* type : {"q8_0", "q4_0"}) {
    for (const char* name : {"qwen3-moe-tiny", "mixtral-tiny", "deepseek-v3-tiny"}) {
      CAPTURE(name);
      CAPTURE(type);
      const auto gguf = kGguf / (std::string(name) + "." + type + "-dense.gguf");
      REQUIRE_MESSAGE(std::filesystem::exists(gguf), "run the ctest fixture gguf_fixtures_dense_" << type);
      TempDir tmp;
      const auto safetensors = safetensors_twin(name, tmp);
      const auto quant = parse_dense_quant(type, "quant_dense");
      for (const auto& prompt : prompts_of(name)) {
        const auto a = first_logits(safetensors, prompt, nullptr, quant);
        const auto b = first_logits(gguf, prompt);
        REQUIRE(a.size() == b.size());
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
        const auto exact = first_logits(safetensors, prompt);
        float diff = 0;
        for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(a[i] - exact[i]));
        CHECK(diff > 0);  // it did quantise
        MESSAGE(std::string(name) << " quant_dense " << std::string(type) << ": max |logit - exact logit| = " << diff);
      }
    }
  }
}

TEST_CASE("llama-quantize's Q4_K_M and Q5_K_M files compute exactly what their dequantised weights do") {
  // tests/fixtures/gguf_models (scripts/gen_gguf_kquant_fixture.py): Q4_K, Q5_K, Q6_K and
  // Q8_0 tensors as llama.cpp's quantiser mixes them.
  const std::vector<int32_t> prompt{1, 5, 17, 300, 42, 7, 511, 0, 256};
  for (const char* kind : {"q4_k_m", "q5_k_m"}) {
    CAPTURE(kind);
    const std::string stem = std::string("qwen3moe-k256.") + kind;
    const auto quantised = std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/gguf_models" / (stem + ".gguf");
    const auto dequantised = kGguf / (stem + "-dequantised.f32.gguf");
    REQUIRE_MESSAGE(std::filesystem::exists(dequantised), "run the ctest fixture gguf_fixtures_kquant");
    const auto ckpt = Checkpoint::open(quantised);
    std::set<std::string> types;
    for (const auto& name : ckpt->tensor_names()) {
      if (const auto& t = ckpt->find(name)->block_type) types.insert(ggml_traits(*t).name);
    }
    CHECK(types.contains(std::string(kind) == "q4_k_m" ? "Q4_K" : "Q5_K"));
    CHECK(types.contains("Q6_K"));
    const auto a = first_logits(quantised, prompt);
    const auto b = first_logits(dequantised, prompt);
    REQUIRE(a.size() == b.size());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("the GGUF's tokenizer encodes as the fixture's tokenizer.json, and its template is the same") {
  const auto ckpt = Checkpoint::open(kGguf / "qwen3-moe-tiny.bf16.gguf");
  const ModelText gguf_text = load_model_text(*ckpt);
  const auto st = Checkpoint::open(kModels / "qwen3-moe-tiny");
  const ModelText st_text = load_model_text(*st);
  for (const char* text : {"Hello, world!", "  two  spaces\n\nand lines", "<|im_start|>user\nhi<|im_end|>",
                           "数字 12345 and émoji 🚀", "don't 'RE we'll"}) {
    CAPTURE(text);
    CHECK(gguf_text.tokenizer->encode(text) == st_text.tokenizer->encode(text));
  }
  REQUIRE(gguf_text.chat_template != nullptr);
  REQUIRE(st_text.chat_template != nullptr);
  const std::vector<ChatMessage> chat{{"system", "Be brief."}, {"user", "Hi"}};
  CHECK(gguf_text.chat_template->render(chat, true) == st_text.chat_template->render(chat, true));
}

TEST_CASE("a GGUF of an architecture charm does not serve is refused by name") {
  // The fixture's qwen3moe file with general.architecture rewritten in place ("qwen3moe" ->
  // "gemma3x"): same length, so every offset stays valid.
  TempDir tmp;
  const auto path = tmp.path() / "other.gguf";
  std::filesystem::copy_file(kGguf / "qwen3-moe-tiny.bf16.gguf", path);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  std::string head(4096, '\0');
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  const size_t at = head.find("qwen3moe");
  REQUIRE(at != std::string::npos);
  f.seekp(static_cast<std::streamoff>(at));
  f.write("gemma3x_", 8);
  f.close();
  expect_error([&] { Checkpoint::open(path); }, ErrorCategory::kUnsupported, {"gemma3x_", "not supported", "qwen3moe"});
}

TEST_CASE("a truncated GGUF and a missing tensor are refused naming the file") {
  TempDir tmp;
  const auto src = kGguf / "qwen3-moe-tiny.bf16.gguf";
  const auto cut = tmp.path() / "cut.gguf";
  std::filesystem::copy_file(src, cut);
  std::filesystem::resize_file(cut, std::filesystem::file_size(src) - 1000);
  expect_error([&] { Checkpoint::open(cut); }, ErrorCategory::kInvalidInput, {cut.string()});
  // A layer whose router is there but whose q projection is not: the family names it.
  const auto ckpt = Checkpoint::open(src);
  // Messages name the tensor as the file does.
  expect_error([&] { ckpt->load_matrix("model.layers.0.self_attn.q_proj.weight", 64, 63); },
               ErrorCategory::kInvalidInput, {"blk.0.attn_q.weight", "[64, 64]", "[64, 63]"});
  expect_error([&] { ckpt->load_f32("model.layers.9.self_attn.q_proj.weight", {64, 64}); },
               ErrorCategory::kInvalidInput,
               {src.string(), "no tensor of this GGUF maps to 'model.layers.9.self_attn.q_proj.weight'"});
}

TEST_CASE("a dense llama GGUF is refused as dense; a GGUF is known by its magic whatever its name") {
  TempDir tmp;
  charm::testing::GgufBuilder dense;  // a Llama-3-like file: no expert_count
  dense.kv("general.architecture", charm::testing::gguf::str("llama"))
      .kv("llama.block_count", charm::testing::gguf::u32(1))
      .kv("llama.embedding_length", charm::testing::gguf::u32(32))
      .kv("llama.attention.head_count", charm::testing::gguf::u32(4));
  dense.write(tmp.path() / "dense.gguf");
  expect_error([&] { Checkpoint::open(tmp.path() / "dense.gguf"); }, ErrorCategory::kUnsupported,
               {"dense.gguf", "without experts", "dense model"});
  // Ollama's blobs have no extension: the magic decides.
  const auto blob = tmp.path() / "sha256-0123abcd";
  std::filesystem::copy_file(kGguf / "qwen3-moe-tiny.bf16.gguf", blob);
  CHECK(Checkpoint::open(blob)->gguf() != nullptr);
  expect_error([&] { Checkpoint::open(tmp.path() / "missing.gguf"); }, ErrorCategory::kInvalidInput,
               {"GGUF file", "missing.gguf", "does not exist"});
  // A folder of GGUF files (as LM Studio keeps them) says which file to name.
  std::filesystem::create_directories(tmp.path() / "folder");
  std::filesystem::copy_file(kGguf / "qwen3-moe-tiny.bf16.gguf", tmp.path() / "folder" / "m.gguf");
  expect_error([&] { Checkpoint::open(tmp.path() / "folder"); }, ErrorCategory::kInvalidInput,
               {"config.json", "point model: at one of them", "m.gguf"});
}

TEST_CASE("GLM-4.5's multi-token-prediction layer is not a decoder layer: its tensors are left out") {
  const auto files = GgufModelFiles::open(kGguf / "glm4-moe-tiny.bf16.gguf");
  const GgufHfModel model = map_gguf_to_hf(*files);
  CHECK(files->get("glm4moe.block_count").as_i64() == 5);
  CHECK(model.config["num_hidden_layers"] == 4);
  CHECK(model.config["num_nextn_predict_layers"] == 1);
  for (const char* name : {"blk.4.nextn.eh_proj.weight", "blk.4.nextn.enorm.weight", "blk.4.attn_q.weight",
                           "blk.4.ffn_gate_exps.weight"}) {
    CAPTURE(name);
    CHECK(std::find(model.ignored.begin(), model.ignored.end(), name) != model.ignored.end());
  }
  for (const GgufHfTensor& t : model.tensors) CHECK_FALSE(t.hf_name.starts_with("model.layers.4."));
}

namespace gg = charm::testing::gguf;
using Keys = std::vector<std::pair<std::string, gg::Value>>;

/// `keys` with `key` set to `value` (replaced, or added).
Keys with(Keys keys, const std::string& key, const gg::Value& value) {
  for (auto& [k, v] : keys) {
    if (k == key) {
      v = value;
      return keys;
    }
  }
  keys.emplace_back(key, value);
  return keys;
}

/// `keys` without `key`.
Keys without(Keys keys, const std::string& key) {
  std::erase_if(keys, [&](const auto& kv) { return kv.first == key; });
  return keys;
}

/// The HF config of a GGUF of `arch` holding `keys` (each under "<arch>.") and a [8, 32]
/// token_embd: all map_gguf_to_hf reads before any weight.
nlohmann::json config_of(const std::string& arch, const Keys& keys) {
  TempDir tmp;
  charm::testing::GgufBuilder b;
  b.kv("general.architecture", gg::str(arch));
  for (const auto& [key, value] : keys) b.kv(arch + "." + key, value);
  b.tensor("token_embd.weight", 0, {32, 8}, charm::testing::f32_bytes(std::vector<float>(256, 0.0f)));
  b.write(tmp.path() / "m.gguf");
  return map_gguf_to_hf(*GgufModelFiles::open(tmp.path() / "m.gguf")).config;
}

/// What every architecture's converter writes, at small sizes.
Keys common_keys() {
  return {{"block_count", gg::u32(2)},        {"embedding_length", gg::u32(32)},
          {"feed_forward_length", gg::u32(64)}, {"attention.head_count", gg::u32(4)},
          {"attention.head_count_kv", gg::u32(2)}, {"attention.key_length", gg::u32(16)},
          {"expert_count", gg::u32(8)},        {"expert_used_count", gg::u32(2)},
          {"expert_feed_forward_length", gg::u32(16)}};
}

/// gpt-oss's keys as GptOssModel writes them.
Keys gpt_oss_keys() {
  Keys k = common_keys();
  for (auto& kv : Keys{{"attention.sliding_window", gg::u32(8)}, {"rope.freq_base", gg::f32(150000.0f)},
                       {"rope.scaling.type", gg::str("yarn")}, {"rope.scaling.factor", gg::f32(32.0f)},
                       {"rope.scaling.original_context_length", gg::u32(4096)}}) {
    k.push_back(kv);
  }
  return k;
}

/// GLM-4.5's keys as Glm4MoeModel writes them, with one MTP block (block_count 3).
Keys glm4_moe_keys() {
  Keys k = with(common_keys(), "block_count", gg::u32(3));
  for (auto& kv : Keys{{"nextn_predict_layers", gg::u32(1)}, {"expert_shared_count", gg::u32(1)},
                       {"leading_dense_block_count", gg::u32(1)}, {"expert_weights_scale", gg::f32(2.5f)},
                       {"expert_weights_norm", gg::boolean(true)}, {"expert_group_count", gg::u32(4)},
                       {"expert_group_used_count", gg::u32(2)}, {"expert_gating_func", gg::u32(2)},
                       {"rope.dimension_count", gg::u32(8)}}) {
    k.push_back(kv);
  }
  return k;
}

/// MiniMax-M2's keys as MiniMaxM2Model writes them.
Keys minimax_m2_keys() {
  Keys k = common_keys();
  k.emplace_back("rope.dimension_count", gg::u32(8));
  k.emplace_back("expert_gating_func", gg::u32(2));
  return k;
}

Keys qwen3_next_keys() {
  Keys k = with(common_keys(), "block_count", gg::u32(4));
  for (auto& kv : Keys{{"ssm.conv_kernel", gg::u32(4)}, {"ssm.state_size", gg::u32(8)},
                       {"ssm.group_count", gg::u32(2)}, {"ssm.time_step_rank", gg::u32(4)},
                       {"ssm.inner_size", gg::u32(24)}, {"rope.dimension_count", gg::u32(4)},
                       {"full_attention_interval", gg::u32(2)}}) {
    k.push_back(kv);
  }
  return k;
}
/// A GLM-5 (glm-dsa) file's keys as GlmMoeDsaModel writes them: DeepSeek-V3's MLA and MoE
/// keys and the indexer's; no gating function (llama.cpp then takes sigmoid).
Keys glm_dsa_keys() {
  Keys k = with(common_keys(), "block_count", gg::u32(4));
  for (auto& kv : Keys{{"attention.head_count_kv", gg::u32(1)}, {"attention.key_length", gg::u32(40)},
                       {"attention.value_length", gg::u32(32)}, {"attention.key_length_mla", gg::u32(24)},
                       {"attention.value_length_mla", gg::u32(16)}, {"attention.q_lora_rank", gg::u32(24)},
                       {"attention.kv_lora_rank", gg::u32(32)}, {"rope.dimension_count", gg::u32(8)},
                       {"leading_dense_block_count", gg::u32(1)}, {"expert_shared_count", gg::u32(1)},
                       {"expert_weights_norm", gg::boolean(true)}, {"context_length", gg::u32(2048)},
                       {"attention.indexer.head_count", gg::u32(8)}, {"attention.indexer.key_length", gg::u32(16)},
                       {"attention.indexer.top_k", gg::u32(5)}}) {
    k = with(k, kv.first, kv.second);
  }
  return k;
}
ModelConfig parsed(const nlohmann::json& config) { return ModelConfig::parse(config, "m.gguf", checkpoint_families()); }

TEST_CASE("gpt-oss GGUF metadata: what llama.cpp hard-codes becomes GptOssConfig's fields") {
  const ModelConfig c = parsed(config_of("gpt-oss", gpt_oss_keys()));
  CHECK(c.architecture == "GptOssForCausalLM");
  CHECK(c.moe_intermediate_size == 16);
  CHECK(c.sliding_layers == std::vector<bool>{true, false});  // llama.cpp's set_swa_pattern(2)
  CHECK(c.sliding_window == 8);
  CHECK(c.expert_activation.kind == ExpertActivation::Kind::kClampedSwiglu);
  CHECK(c.expert_activation.limit == 7.0f);  // llama.cpp's hard-coded clamp
  CHECK(c.expert_activation.alpha == 1.702f);
  REQUIRE(c.yarn.has_value());
  CHECK(c.yarn->factor == 32.0);
  CHECK(c.yarn->original_max_position_embeddings == 4096);
  CHECK(c.yarn->beta_fast == 32.0);
  CHECK(c.yarn->beta_slow == 1.0);
  CHECK_FALSE(c.yarn->truncate);
  CHECK(c.rope_theta == 150000.0);
  // A clamp the file states, per layer (llama.cpp's swiglu_clamp_exp), wins.
  const auto clamp = gg::array(6, {gg::f32(2.5f), gg::f32(2.5f)});
  CHECK(parsed(config_of("gpt-oss", with(gpt_oss_keys(), "swiglu_clamp_exp", clamp))).expert_activation.limit == 2.5f);
  // Without rope scaling keys the file asks for plain RoPE.
  CHECK_FALSE(parsed(config_of("gpt-oss", without(gpt_oss_keys(), "rope.scaling.type"))).yarn.has_value());
}

TEST_CASE("a gpt-oss GGUF lacking a key its config needs, or with one charm cannot run, is refused naming the key") {
  for (const char* key : {"expert_feed_forward_length", "attention.sliding_window",
                          "rope.scaling.original_context_length", "attention.head_count"}) {
    CAPTURE(key);
    expect_error([&] { config_of("gpt-oss", without(gpt_oss_keys(), key)); }, ErrorCategory::kInvalidInput,
                 {std::string("gpt-oss.") + key, "missing"});
  }
  const auto uneven = gg::array(6, {gg::f32(7.0f), gg::f32(3.0f)});
  expect_error([&] { config_of("gpt-oss", with(gpt_oss_keys(), "swiglu_clamp_exp", uneven)); },
               ErrorCategory::kUnsupported, {"gpt-oss.swiglu_clamp_exp", "differs between layers"});
  expect_error([&] { config_of("gpt-oss", with(gpt_oss_keys(), "rope.scaling.type", gg::str("linear"))); },
               ErrorCategory::kUnsupported, {"gpt-oss.rope.scaling.type", "linear"});
}

TEST_CASE("a gpt-oss GGUF missing an expert tensor is refused naming it") {
  // The fixture's blk.1.ffn_up_exps.bias renamed in place (same length): layer 1's experts
  // then lack their up bias.
  TempDir tmp;
  const auto path = tmp.path() / "gpt-oss.gguf";
  std::filesystem::copy_file(kGguf / "gpt-oss-tiny.bf16.gguf", path);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t at = bytes.find("blk.1.ffn_up_exps.bias");
  REQUIRE(at != std::string::npos);
  f.seekp(static_cast<std::streamoff>(at));
  f.write("blk.1.ffn_up_exps.bia_", 22);
  f.close();
  const auto ckpt = Checkpoint::open(path);
  const ModelConfig c = ModelConfig::parse(ckpt->config_json(), ckpt->config_origin(), checkpoint_families());
  CHECK_NOTHROW(ckpt->locate_expert(c.expert_tensors, 0, 3, c.hidden_size, c.moe_intermediate_size));
  expect_error([&] { ckpt->locate_expert(c.expert_tensors, 1, 3, c.hidden_size, c.moe_intermediate_size); },
               ErrorCategory::kInvalidInput, {"no tensor of this GGUF maps to", "model.layers.1.mlp.experts.up_proj.bias"});
  // An expert the tensors do not hold is named with the tensor as the file calls it.
  expect_error([&] { ckpt->locate_expert(c.expert_tensors, 0, 8, c.hidden_size, c.moe_intermediate_size); },
               ErrorCategory::kInvalidInput, {"blk.0.ffn_gate_exps.weight", "holds 8 experts, expert 8"});
}

TEST_CASE("GLM-4.5 GGUF metadata maps to Glm4MoeConfig; a malformed or foreign one is refused naming the key") {
  const ModelConfig c = parsed(config_of("glm4moe", glm4_moe_keys()));
  CHECK(c.architecture == "Glm4MoeForCausalLM");
  CHECK(c.num_hidden_layers == 2);  // block_count 3 less the MTP block
  CHECK(c.first_k_dense_replace == 1);
  CHECK(c.n_shared_experts == 1);
  CHECK(c.routed_scaling_factor == 2.5);
  CHECK(c.n_group == 4);
  CHECK(c.topk_group == 2);
  CHECK(c.norm_topk_prob);
  CHECK(c.partial_rotary_factor == 0.5);  // rope.dimension_count 8 of head_dim 16
  CHECK(c.moe_intermediate_size == 16);
  CHECK(c.intermediate_size == 64);
  CHECK_FALSE(c.use_qk_norm);  // no attn_q_norm tensor in this file
  // llama.cpp's defaults without the optional keys: no renormalisation, one group, scale 1.
  Keys bare = glm4_moe_keys();
  for (const char* key :
       {"expert_weights_norm", "expert_group_count", "expert_group_used_count", "expert_weights_scale"}) {
    bare = without(bare, key);
  }
  const ModelConfig d = parsed(config_of("glm4moe", bare));
  CHECK_FALSE(d.norm_topk_prob);
  CHECK(d.n_group == 1);
  CHECK(d.routed_scaling_factor == 1.0);

  expect_error([&] { config_of("glm4moe", with(glm4_moe_keys(), "nextn_predict_layers", gg::u32(3))); },
               ErrorCategory::kInvalidInput, {"glm4moe.nextn_predict_layers", "glm4moe.block_count"});
  expect_error([&] { config_of("glm4moe", with(glm4_moe_keys(), "expert_gating_func", gg::u32(1))); },
               ErrorCategory::kUnsupported, {"glm4moe.expert_gating_func", "sigmoid"});
  expect_error([&] { config_of("glm4moe", with(glm4_moe_keys(), "rope.dimension_count", gg::u32(7))); },
               ErrorCategory::kInvalidInput, {"glm4moe.rope.dimension_count", "head_dim (16)"});
  expect_error([&] { config_of("glm4moe", with(glm4_moe_keys(), "rope.scaling.type", gg::str("yarn"))); },
               ErrorCategory::kUnsupported, {"glm4moe.rope.scaling.type", "yarn"});
}

TEST_CASE("MiniMax-M2 GGUF metadata maps to MiniMaxM2Config; a malformed or foreign one is refused naming the key") {
  const ModelConfig c = parsed(config_of("minimax-m2", minimax_m2_keys()));
  CHECK(c.architecture == "MiniMaxM2ForCausalLM");
  CHECK(c.moe_intermediate_size == 16);  // expert_feed_forward_length
  CHECK(c.rotary_dim() == 8);
  CHECK(c.norm_topk_prob);
  expect_error([&] { config_of("minimax-m2", without(minimax_m2_keys(), "expert_feed_forward_length")); },
               ErrorCategory::kInvalidInput, {"minimax-m2.expert_feed_forward_length", "missing"});
  expect_error([&] { config_of("minimax-m2", with(minimax_m2_keys(), "expert_gating_func", gg::u32(1))); },
               ErrorCategory::kUnsupported, {"minimax-m2.expert_gating_func"});
}

TEST_CASE("Qwen3-Next GGUF metadata maps to Qwen3NextConfig; a malformed one is refused naming the key") {
  const ModelConfig c = parsed(config_of("qwen3next", qwen3_next_keys()));
  CHECK(c.architecture == "Qwen3NextForCausalLM");
  CHECK(c.linear_conv_kernel_dim == 4);
  CHECK(c.linear_key_head_dim == 8);
  CHECK(c.linear_num_key_heads == 2);
  CHECK(c.linear_num_value_heads == 4);
  CHECK(c.linear_value_head_dim == 6);  // inner_size 24 over 4 value heads
  CHECK(c.linear_attention_layers == std::vector<bool>{true, false, true, false});  // interval 2
  CHECK(c.partial_rotary_factor == 0.25);  // rope.dimension_count 4 of head_dim 16
  CHECK(c.norm_topk_prob);                  // llama.cpp's graph always renormalises
  CHECK(c.norm_weights_include_unit_offset);
  // attention.recurrent_layers (today's converter) wins over the interval; without either,
  // llama.cpp's default interval 4.
  const auto recurrent = gg::array(7, {gg::boolean(false), gg::boolean(true), gg::boolean(true), gg::boolean(true)});
  CHECK(parsed(config_of("qwen3next", with(qwen3_next_keys(), "attention.recurrent_layers", recurrent)))
            .linear_attention_layers == std::vector<bool>{false, true, true, true});
  CHECK(parsed(config_of("qwen3next", without(qwen3_next_keys(), "full_attention_interval")))
            .linear_attention_layers == std::vector<bool>{true, true, true, false});

  for (const char* key : {"ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank",
                          "ssm.inner_size"}) {
    CAPTURE(key);
    expect_error([&] { config_of("qwen3next", without(qwen3_next_keys(), key)); }, ErrorCategory::kInvalidInput,
                 {std::string("qwen3next.") + key, "missing"});
  }
  expect_error([&] { config_of("qwen3next", with(qwen3_next_keys(), "ssm.inner_size", gg::u32(0))); },
               ErrorCategory::kInvalidInput, {"qwen3next.ssm.inner_size must be positive, got 0"});
  expect_error([&] { config_of("qwen3next", with(qwen3_next_keys(), "ssm.inner_size", gg::u32(25))); },
               ErrorCategory::kInvalidInput, {"qwen3next.ssm.inner_size (25)", "qwen3next.ssm.time_step_rank (4)"});
  const auto short_list = gg::array(7, {gg::boolean(true), gg::boolean(false)});
  expect_error([&] { config_of("qwen3next", with(qwen3_next_keys(), "attention.recurrent_layers", short_list)); },
               ErrorCategory::kInvalidInput,
               {"qwen3next.attention.recurrent_layers", "every one of the 4 layers, it lists 2"});
  const auto long_list = gg::array(7, std::vector<gg::Value>(5, gg::boolean(true)));
  expect_error([&] { config_of("qwen3next", with(qwen3_next_keys(), "attention.recurrent_layers", long_list)); },
               ErrorCategory::kInvalidInput,
               {"qwen3next.attention.recurrent_layers", "every one of the 4 layers, it lists 5"});
  // A file ending with a multi-token-prediction block lists it too (llama.cpp reads
  // block_count entries); one boolean stands for every layer, as in llama.cpp.
  const auto with_mtp = gg::array(7, {gg::boolean(true), gg::boolean(false), gg::boolean(true), gg::boolean(true),
                                      gg::boolean(false)});
  CHECK(parsed(config_of("qwen3next", with(with(with(qwen3_next_keys(), "block_count", gg::u32(5)),
                                                "nextn_predict_layers", gg::u32(1)),
                                           "attention.recurrent_layers", with_mtp)))
            .linear_attention_layers == std::vector<bool>{true, false, true, true});
  expect_error([&] {
    config_of("qwen3next", with(with(with(qwen3_next_keys(), "block_count", gg::u32(6)), "nextn_predict_layers",
                                     gg::u32(2)),
                                "attention.recurrent_layers", with_mtp));
  },
               ErrorCategory::kInvalidInput,
               {"qwen3next.attention.recurrent_layers", "every one of the 4 layers (or all 6 blocks), it lists 5"});
  // One bool for every layer (the interval would make layers 0 and 2 linear).
  CHECK(parsed(config_of("qwen3next", with(qwen3_next_keys(), "attention.recurrent_layers", gg::boolean(false))))
            .linear_attention_layers == std::vector<bool>(4, false));
  expect_error([&] { config_of("qwen3next", with(qwen3_next_keys(), "attention.recurrent_layers", gg::u32(1))); },
               ErrorCategory::kInvalidInput, {"qwen3next.attention.recurrent_layers", "a bool"});
  expect_error([&] { config_of("qwen3next", with(qwen3_next_keys(), "full_attention_interval", gg::u32(0))); },
               ErrorCategory::kInvalidInput, {"qwen3next.full_attention_interval", "positive"});
  expect_error([&] { config_of("qwen3next", with(qwen3_next_keys(), "rope.scaling.type", gg::str("yarn"))); },
               ErrorCategory::kUnsupported, {"qwen3next.rope.scaling.type", "yarn"});
  CHECK_FALSE(c.linear_value_heads_tiled);  // Qwen3-Next's converter keeps the hub's order

  // Qwen3.5-MoE: the same keys; its converter tiles the value heads when there are more of
  // them than key heads.
  const ModelConfig q35 = parsed(config_of("qwen35moe", qwen3_next_keys()));
  CHECK(q35.architecture == "Qwen3_5MoeForCausalLM");
  CHECK(q35.linear_value_heads_tiled);
  CHECK(q35.linear_num_value_heads == 4);
  CHECK_FALSE(parsed(config_of("qwen35moe", with(qwen3_next_keys(), "ssm.group_count", gg::u32(4))))
                  .linear_value_heads_tiled);
}

TEST_CASE("GLM-5 and DeepSeek-V3.2 GGUF metadata: the indexer's keys and types; a malformed one is refused") {
  const ModelConfig c = parsed(config_of("glm-dsa", glm_dsa_keys()));
  CHECK(c.architecture == "GlmMoeDsaForCausalLM");
  CHECK(c.index_n_heads == 8);
  CHECK(c.index_head_dim == 16);
  CHECK(c.index_topk == 5);
  CHECK(c.index_rope_interleave);
  CHECK(c.indexer_shared == std::vector<bool>(4, false));  // no types, context below 1 Mi: all full
  CHECK(c.qk_nope_head_dim == 16);
  CHECK(c.first_k_dense_replace == 1);
  // The file's types (true = full); without them past a 1 Mi context, GLM-5.2's pattern
  // as llama.cpp assumes it: layers 0 and 1, then every 4th from 2.
  const auto types = gg::array(7, {gg::boolean(true), gg::boolean(false), gg::boolean(true), gg::boolean(false)});
  CHECK(parsed(config_of("glm-dsa", with(glm_dsa_keys(), "attention.indexer.types", types))).indexer_shared ==
        std::vector<bool>{false, true, false, true});
  Keys long_context = with(with(glm_dsa_keys(), "context_length", gg::u32(1048576)), "block_count", gg::u32(8));
  CHECK(parsed(config_of("glm-dsa", long_context)).indexer_shared ==
        std::vector<bool>{false, false, false, true, true, true, false, true});
  // DeepSeek-V3.2: an indexer on every layer, whose RoPE turns halves.
  const ModelConfig v32 = parsed(config_of("deepseek32", with(glm_dsa_keys(), "expert_gating_func", gg::u32(2))));
  CHECK(v32.architecture == "DeepseekV32ForCausalLM");
  CHECK(v32.indexer_shared == std::vector<bool>(4, false));
  CHECK_FALSE(v32.index_rope_interleave);

  for (const char* key : {"attention.indexer.head_count", "attention.indexer.key_length", "attention.indexer.top_k"}) {
    CAPTURE(key);
    expect_error([&] { config_of("glm-dsa", without(glm_dsa_keys(), key)); }, ErrorCategory::kInvalidInput,
                 {std::string("glm-dsa.") + key, "missing"});
  }
  expect_error([&] { config_of("glm-dsa", with(glm_dsa_keys(), "attention.indexer.top_k", gg::u32(0))); },
               ErrorCategory::kInvalidInput, {"glm-dsa.attention.indexer.top_k must be positive, got 0"});
  const auto short_types = gg::array(7, {gg::boolean(true), gg::boolean(true)});
  expect_error([&] { config_of("glm-dsa", with(glm_dsa_keys(), "attention.indexer.types", short_types)); },
               ErrorCategory::kInvalidInput, {"glm-dsa.attention.indexer.types", "every one of the 4 layers"});
  expect_error([&] { config_of("deepseek32", with(glm_dsa_keys(), "expert_gating_func", gg::u32(1))); },
               ErrorCategory::kUnsupported, {"deepseek32.expert_gating_func 1", "softmax", "expert_gating_func 2"});
}

TEST_CASE("a GGUF with tensors past block_count is refused, not served as a shorter model") {
  TempDir tmp;
  charm::testing::GgufBuilder b;
  b.kv("general.architecture", gg::str("qwen3moe"));
  for (const auto& [key, value] : common_keys()) b.kv("qwen3moe." + key, value);  // block_count 2
  b.tensor("token_embd.weight", 0, {32, 8}, charm::testing::f32_bytes(std::vector<float>(256, 0.0f)));
  b.tensor("blk.2.attn_norm.weight", 0, {32}, charm::testing::f32_bytes(std::vector<float>(32, 1.0f)));
  b.write(tmp.path() / "m.gguf");
  expect_error([&] { map_gguf_to_hf(*GgufModelFiles::open(tmp.path() / "m.gguf")); }, ErrorCategory::kInvalidInput,
               {"m.gguf", "tensor 'blk.2.attn_norm.weight' is of block 2", "qwen3moe.block_count is 2"});
}

TEST_CASE("f32 metadata reads back as the decimal it was written from") {
  CHECK(gguf_f32_as_decimal(1e-6f) == 1e-6);
  CHECK(gguf_f32_as_decimal(1e-5f) == 1e-5);
  CHECK(gguf_f32_as_decimal(0.08f, 1) == 0.8);
  CHECK(gguf_f32_as_decimal(2.5f) == 2.5);
}

}  // namespace

TEST_CASE("a GGUF block with a NaN or Inf scale is refused naming the tensor and the element, expert and resident") {
  // find_non_finite reads only the blocks' f16 scales; the element it names must be the
  // first that dequantises to NaN / Inf (here every value of a poisoned Q4_K row does).
  const auto src = std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/gguf_models/qwen3moe-k256.q4_k_m.gguf";
  const struct {
    const char* tensor;
    uint64_t row;       // the row of the tensor's flattened [rows, 256] (one Q4_K block each)
    int scale_offset;   // d at 0, dmin at 2
    const char* bits;   // the f16, little-endian
    const char* at;     // the element the message names (the value there: NaN, or +-Inf or NaN by the quants)
  } cases[] = {
      {"blk.0.ffn_gate_exps.weight", 3 * 256 + 5, 0, "\x01\x7e", "NaN at [3, 5, 0]"},
      {"blk.1.ffn_up_exps.weight", 7 * 256 + 255, 2, "\x00\x7c", " at [7, 255, 0]"},
      {"blk.0.attn_q.weight", 17, 0, "\x00\xfc", " at [17, 0]"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.tensor);
    TempDir tmp;
    const auto bad = tmp.path() / "bad.gguf";
    std::filesystem::copy_file(src, bad);
    {
      const auto f = GgufFile::open(bad);
      const GgufTensorInfo& t = *f->find_tensor(c.tensor);
      REQUIRE(t.type == GgmlType::kQ4_K);
      REQUIRE(t.row_elements() == 256);
      std::fstream out(bad, std::ios::in | std::ios::out | std::ios::binary);
      out.seekp(static_cast<std::streamoff>(t.data_begin + c.row * t.row_bytes() + c.scale_offset));
      out.write(c.bits, 2);
    }
    const auto ckpt = Checkpoint::open(bad);
    const std::vector<std::string> message{std::string("tensor '") + c.tensor + "'", c.at, "refuses non-finite weights"};
    if (std::string(c.tensor).find("exps") != std::string::npos) {
      const int layer = c.tensor[4] - '0';
      const int expert = static_cast<int>(c.row / 256);
      expect_error([&] { ckpt->load_expert({}, layer, expert, 256, 256); }, ErrorCategory::kInvalidInput, message);
      CHECK_NOTHROW(ckpt->load_expert({}, layer, expert == 0 ? 1 : 0, 256, 256));  // its neighbours are fine
    } else {
      expect_error([&] { ckpt->load_matrix("model.layers.0.self_attn.q_proj.weight", 256, 256); },
                   ErrorCategory::kInvalidInput, message);
    }
  }
}
