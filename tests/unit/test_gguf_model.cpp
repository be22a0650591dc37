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
#include <set>

#include <nlohmann/json.hpp>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/gguf.h"
#include "common/gguf_model.h"
#include "common/ggml_quantize.h"
#include "common/model_config.h"
#include "common/topology.h"
#include "coordinator/dispatch/dispatcher_factory.h"
#include "coordinator/models/families.h"
#include "coordinator/text/model_text.h"
#include "tests/support/expect_error.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/temp_dir.h"

namespace {

using namespace charm;
using charm::test::TempDir;
using charm::test::expect_error;

const std::filesystem::path kModels = std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/models";
const std::filesystem::path kGguf = std::filesystem::path(CHARM_BINARY_DIR) / "gguf-fixtures";

/// The first-step logits of `prompt` on `dir_or_file` (single node).
std::vector<float> first_logits(const std::filesystem::path& model, const std::vector<int32_t>& prompt,
                                ModelConfig* config_out = nullptr, std::optional<GgmlType> quant_dense = {}) {
  const auto ckpt = Checkpoint::open(model);
  ckpt->set_dense_quant(quant_dense);
  const ModelConfig config = ModelConfig::parse(ckpt->config_json(), ckpt->config_origin(), checkpoint_families());
  Topology topology;
  topology.model = model;
  topology.single_node = true;
  LocalExperts local;
  auto dispatcher = make_dispatcher(topology, *ckpt, config, local);
  auto net = load_model(*ckpt, config, *dispatcher);
  KvCache cache = net->new_cache(prompt.size() + 1);
  std::vector<float> logits(static_cast<size_t>(config.vocab_size));
  net->forward(prompt.data(), prompt.size(), cache, logits.data());
  if (config_out) *config_out = config;
  return logits;
}

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
  }
}

const char* const kFixtures[] = {"qwen2-moe-tiny", "qwen3-moe-tiny", "olmoe-tiny", "mixtral-tiny", "deepseek-v3-tiny"};

TEST_CASE("a BF16 GGUF of every fixture gives the safetensors logits bit for bit") {
  for (const char* name : kFixtures) check_same_logits(name, "bf16");
}

TEST_CASE("an F32 GGUF (weights widened) gives the same logits too") {
  for (const char* name : {"qwen3-moe-tiny", "mixtral-tiny", "deepseek-v3-tiny"}) check_same_logits(name, "f32");
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
               ErrorCategory::kInvalidInput, {"model.layers.9.self_attn.q_proj.weight", "not found"});
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
