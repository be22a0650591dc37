// Tests for common/checkpoint: config files, single-file and sharded checkpoints, the
// three routed-expert layouts, and malformed directories and indexes.
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>

#include "common/checkpoint.h"
#include "common/error.h"
#include "coordinator/models/families.h"
#include "tests/support/expect_error.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"

using namespace charm;
using charm::test::expect_error;
using charm::test::TempDir;
using charm::testing::TensorSpec;

namespace {

constexpr int64_t kH = 4;  // hidden_size
constexpr int64_t kI = 3;  // moe_intermediate_size
constexpr int64_t kE = 3;  // experts
constexpr int kLayer = 1;

/// A value that identifies (expert, projection, row, col) so any mix-up of slices shows.
/// Projections: 0 gate, 1 up, 2 down. Values are multiples of 1/4 below 32, so they need
/// at most 7 significant bits and are exact in bf16; each (e, proj, r, c) gets its own.
float expert_value(int64_t e, int proj, int64_t r, int64_t c) {
  return static_cast<float>(e * 10 + proj * 3 + r) + 0.25f * static_cast<float>(c);
}

std::vector<float> matrix(int64_t e, int proj, int64_t rows, int64_t cols) {
  std::vector<float> m;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) m.push_back(expert_value(e, proj, r, c));
  }
  return m;
}

/// The dense tensors every test checkpoint carries, plus a config.json.
std::vector<TensorSpec> dense_tensors() {
  return {TensorSpec{"model.embed_tokens.weight", DType::kBF16, {5, kH}, charm::testing::ramp(5 * kH, -1.0f)},
          TensorSpec{"model.norm.weight", DType::kF32, {kH}, {1.0f, 2.0f, 3.0f, 4.0f}}};
}

void write_config(const TempDir& dir) {
  charm::testing::write_bytes(dir / "config.json",
                              R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 4, "num_experts": 3})");
}

enum class Layout { kPerExpert, kFused, kSeparate3d, kSeparate3dWeight };

/// Expert tensors of layer kLayer in `layout`, dtype `dtype`.
std::vector<TensorSpec> expert_tensors(Layout layout, DType dtype) {
  const std::string p = "model.layers." + std::to_string(kLayer) + ".mlp.experts";
  std::vector<TensorSpec> out;
  if (layout == Layout::kPerExpert) {
    for (int64_t e = 0; e < kE; ++e) {
      const std::string pe = p + "." + std::to_string(e) + ".";
      out.push_back({pe + "gate_proj.weight", dtype, {kI, kH}, matrix(e, 0, kI, kH)});
      out.push_back({pe + "up_proj.weight", dtype, {kI, kH}, matrix(e, 1, kI, kH)});
      out.push_back({pe + "down_proj.weight", dtype, {kH, kI}, matrix(e, 2, kH, kI)});
    }
    return out;
  }
  std::vector<float> gate_up, gate, up, down;
  for (int64_t e = 0; e < kE; ++e) {
    const auto g = matrix(e, 0, kI, kH), u = matrix(e, 1, kI, kH), d = matrix(e, 2, kH, kI);
    gate_up.insert(gate_up.end(), g.begin(), g.end());  // gate rows first ...
    gate_up.insert(gate_up.end(), u.begin(), u.end());  // ... then up, per expert
    gate.insert(gate.end(), g.begin(), g.end());
    up.insert(up.end(), u.begin(), u.end());
    down.insert(down.end(), d.begin(), d.end());
  }
  if (layout == Layout::kFused) {
    out.push_back({p + ".gate_up_proj", dtype, {kE, 2 * kI, kH}, gate_up});
    out.push_back({p + ".down_proj", dtype, {kE, kH, kI}, down});
    return out;
  }
  const std::string suffix = layout == Layout::kSeparate3dWeight ? ".weight" : "";
  out.push_back({p + ".gate_proj" + suffix, dtype, {kE, kI, kH}, gate});
  out.push_back({p + ".up_proj" + suffix, dtype, {kE, kI, kH}, up});
  out.push_back({p + ".down_proj" + suffix, dtype, {kE, kH, kI}, down});
  return out;
}

/// Writes `tensors` either as one model.safetensors or as two shards plus an index.
void write_checkpoint(const TempDir& dir, const std::vector<TensorSpec>& tensors, bool sharded) {
  write_config(dir);
  if (!sharded) {
    charm::testing::write_safetensors(dir / "model.safetensors", tensors);
    return;
  }
  std::vector<TensorSpec> first, second;
  nlohmann::json map = nlohmann::json::object();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const bool in_first = i % 2 == 0;
    (in_first ? first : second).push_back(tensors[i]);
    map[tensors[i].name] = in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  charm::testing::write_safetensors(dir / "model-00001-of-00002.safetensors", first);
  charm::testing::write_safetensors(dir / "model-00002-of-00002.safetensors", second);
  const nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", map}};
  charm::testing::write_bytes(dir / "model.safetensors.index.json", index.dump(2));
}

void check_expert(const ExpertWeights& w, int64_t e) {
  CHECK(w.gate == matrix(e, 0, kI, kH));
  CHECK(w.up == matrix(e, 1, kI, kH));
  CHECK(w.down == matrix(e, 2, kH, kI));
}

}  // namespace

TEST_CASE("a single-file checkpoint gives configs, names and f32 tensors with shape checks") {
  TempDir dir("ckpt");
  auto tensors = dense_tensors();
  write_checkpoint(dir, tensors, false);
  charm::testing::write_bytes(dir / "generation_config.json", R"({"eos_token_id": [1, 2], "temperature": 0.7})");
  const auto ck = Checkpoint::open(dir.path());

  CHECK(ck->config_json()["hidden_size"] == 4);
  CHECK(ck->generation_config_json()["temperature"] == 0.7);
  CHECK(ck->tensor_names() == std::vector<std::string>{"model.embed_tokens.weight", "model.norm.weight"});
  REQUIRE(ck->find("model.norm.weight") != nullptr);
  CHECK(ck->find("model.norm.weight")->file == dir / "model.safetensors");
  CHECK(ck->find("absent") == nullptr);
  CHECK(ck->load_f32("model.norm.weight", {kH}) == std::vector<float>{1, 2, 3, 4});
  CHECK(ck->load_f32("model.embed_tokens.weight", {5, kH}) == charm::testing::ramp(5 * kH, -1.0f));

  expect_error([&] { ck->load_f32("model.norm.weight", {2, 2}); }, ErrorCategory::kInvalidInput,
               {"'model.norm.weight'", "[4]", "[2, 2]", "model.safetensors"});
  expect_error([&] { ck->load_f32("model.nope", {1}); }, ErrorCategory::kInvalidInput, {"'model.nope'"});
}

TEST_CASE("generation_config.json is optional") {
  TempDir dir("ckpt");
  write_checkpoint(dir, dense_tensors(), false);
  const auto ck = Checkpoint::open(dir.path());
  CHECK(ck->generation_config_json().is_object());
  CHECK(ck->generation_config_json().empty());
}

TEST_CASE("load_expert reads every expert layout, sharded or not, in bf16 and f32") {
  const std::pair<Layout, const char*> layouts[] = {{Layout::kPerExpert, "per-expert"},
                                                    {Layout::kFused, "fused gate_up"},
                                                    {Layout::kSeparate3d, "separate 3-D"},
                                                    {Layout::kSeparate3dWeight, "separate 3-D .weight"}};
  for (const auto& [layout, label] : layouts) {
    for (bool sharded : {false, true}) {
      for (DType dtype : {DType::kBF16, DType::kF32}) {
        CAPTURE(label);
        CAPTURE(sharded);
        CAPTURE(dtype_name(dtype));
        TempDir dir("ckpt");
        auto tensors = dense_tensors();
        for (auto& t : expert_tensors(layout, dtype)) tensors.push_back(t);
        write_checkpoint(dir, tensors, sharded);
        const auto ck = Checkpoint::open(dir.path());
        for (int64_t e = 0; e < kE; ++e) check_expert(ck->load_expert({}, kLayer, static_cast<int>(e), kH, kI), e);
        CHECK(ck->load_f32("model.norm.weight", {kH}) == std::vector<float>{1, 2, 3, 4});

        // Wrong sizes, experts past the end and absent layers are errors naming a tensor.
        expect_error([&] { ck->load_expert({}, kLayer, 0, kH + 1, kI); }, ErrorCategory::kInvalidInput,
                     {"model.layers.1.mlp.experts", "shape"});
        if (layout != Layout::kPerExpert) {
          expect_error([&] { ck->load_expert({}, kLayer, kE, kH, kI); }, ErrorCategory::kInvalidInput,
                       {"model.layers.1.mlp.experts", "holds 3 experts, expert 3 requested"});
        }
        expect_error([&] { ck->load_expert({}, 0, 0, kH, kI); }, ErrorCategory::kInvalidInput,
                     {"model.layers.0.mlp.experts.0.gate_proj.weight", "gate_up_proj", dir.path().string()});
      }
    }
  }
}

TEST_CASE("load_expert honours custom tensor names") {
  TempDir dir("ckpt");
  std::vector<TensorSpec> tensors;
  for (int64_t e = 0; e < kE; ++e) {
    const std::string pe = "model.layers.2.block_sparse_moe.experts." + std::to_string(e) + ".";
    tensors.push_back({pe + "w1.weight", DType::kF32, {kI, kH}, matrix(e, 0, kI, kH)});
    tensors.push_back({pe + "w3.weight", DType::kF32, {kI, kH}, matrix(e, 1, kI, kH)});
    tensors.push_back({pe + "w2.weight", DType::kF32, {kH, kI}, matrix(e, 2, kH, kI)});
  }
  write_checkpoint(dir, tensors, false);
  const auto ck = Checkpoint::open(dir.path());
  ExpertTensorNames mixtral;
  mixtral.prefix = "model.layers.{}.block_sparse_moe.experts";
  mixtral.gate = "w1";
  mixtral.up = "w3";
  mixtral.down = "w2";
  check_expert(ck->load_expert(mixtral, 2, 1, kH, kI), 1);
  // The names charm picks for a MixtralForCausalLM checkpoint read the same tensors.
  check_expert(ck->load_expert(model_family("MixtralForCausalLM").checkpoint.expert_tensors, 2, 1, kH, kI), 1);
  const ExpertTensorNames qwen2 = model_family("Qwen2MoeForCausalLM").checkpoint.expert_tensors;
  CHECK(qwen2.prefix == "model.layers.{}.mlp.experts");
  CHECK(qwen2.gate == "gate_proj");
}

TEST_CASE("load_expert names the missing partner tensor of an incomplete expert") {
  TempDir dir("ckpt");
  auto tensors = expert_tensors(Layout::kFused, DType::kF32);
  tensors.pop_back();  // drop down_proj
  write_checkpoint(dir, tensors, false);
  const auto ck = Checkpoint::open(dir.path());
  expect_error([&] { ck->load_expert({}, kLayer, 0, kH, kI); }, ErrorCategory::kInvalidInput,
               {"model.layers.1.mlp.experts.down_proj", "not found"});

  TempDir dir2("ckpt");
  auto per = expert_tensors(Layout::kPerExpert, DType::kF32);
  per.erase(per.begin() + 1);  // expert 0's up_proj
  write_checkpoint(dir2, per, false);
  const auto ck2 = Checkpoint::open(dir2.path());
  expect_error([&] { ck2->load_expert({}, kLayer, 0, kH, kI); }, ErrorCategory::kInvalidInput,
               {"model.layers.1.mlp.experts.0.up_proj.weight"});
  check_expert(ck2->load_expert({}, kLayer, 1, kH, kI), 1);
}

TEST_CASE("open rejects a directory without config.json or with bad JSON") {
  TempDir dir("ckpt");
  charm::testing::write_safetensors(dir / "model.safetensors", dense_tensors());
  expect_error([&] { Checkpoint::open(dir.path()); }, ErrorCategory::kInvalidInput,
               {(dir / "config.json").string(), "missing"});

  charm::testing::write_bytes(dir / "config.json", "{\"hidden_size\": 4,");
  expect_error([&] { Checkpoint::open(dir.path()); }, ErrorCategory::kInvalidInput,
               {(dir / "config.json").string(), "not valid JSON"});
  charm::testing::write_bytes(dir / "config.json", "[4]");
  expect_error([&] { Checkpoint::open(dir.path()); }, ErrorCategory::kInvalidInput,
               {(dir / "config.json").string(), "not an object"});

  write_config(dir);
  charm::testing::write_bytes(dir / "generation_config.json", "{oops}");
  expect_error([&] { Checkpoint::open(dir.path()); }, ErrorCategory::kInvalidInput,
               {(dir / "generation_config.json").string(), "not valid JSON"});

  expect_error([&] { Checkpoint::open(dir / "nowhere"); }, ErrorCategory::kInvalidInput, {"nowhere"});
}

TEST_CASE("open rejects a directory with no weights and passes on safetensors errors") {
  TempDir dir("ckpt");
  write_config(dir);
  expect_error([&] { Checkpoint::open(dir.path()); }, ErrorCategory::kInvalidInput,
               {dir.path().string(), "no model.safetensors.index.json"});
  charm::testing::write_raw_safetensors(dir / "model.safetensors", "not json", "");
  expect_error([&] { Checkpoint::open(dir.path()); }, ErrorCategory::kInvalidInput,
               {(dir / "model.safetensors").string(), "not valid JSON"});
}

TEST_CASE("open rejects malformed indexes, naming the index, tensor and file") {
  const std::string index_name = "model.safetensors.index.json";
  auto sharded = [] {
    auto dir = std::make_unique<TempDir>("ckpt");
    write_checkpoint(*dir, dense_tensors(), true);  // embed -> shard 1, norm -> shard 2
    return dir;
  };

  SUBCASE("bad JSON") {
    auto dir = sharded();
    charm::testing::write_bytes(*dir / index_name, "{\"weight_map\": ");
    expect_error([&] { Checkpoint::open(dir->path()); }, ErrorCategory::kInvalidInput,
                 {(*dir / index_name).string(), "not valid JSON"});
  }
  SUBCASE("missing weight_map") {
    auto dir = sharded();
    charm::testing::write_bytes(*dir / index_name, R"({"metadata": {}})");
    expect_error([&] { Checkpoint::open(dir->path()); }, ErrorCategory::kInvalidInput,
                 {(*dir / index_name).string(), "missing 'weight_map'"});
  }
  SUBCASE("weight_map of the wrong type") {
    auto dir = sharded();
    charm::testing::write_bytes(*dir / index_name, R"({"weight_map": ["a"]})");
    expect_error([&] { Checkpoint::open(dir->path()); }, ErrorCategory::kInvalidInput,
                 {(*dir / index_name).string(), "'weight_map'"});
    charm::testing::write_bytes(*dir / index_name, R"({"weight_map": {"model.norm.weight": 2}})");
    expect_error([&] { Checkpoint::open(dir->path()); }, ErrorCategory::kInvalidInput,
                 {(*dir / index_name).string(), "'model.norm.weight'"});
  }
  SUBCASE("shard file missing") {
    auto dir = sharded();
    std::filesystem::remove(*dir / "model-00002-of-00002.safetensors");
    expect_error([&] { Checkpoint::open(dir->path()); }, ErrorCategory::kInvalidInput,
                 {(*dir / index_name).string(), "'model.norm.weight'", "model-00002-of-00002.safetensors",
                  "does not exist"});
  }
  SUBCASE("shard name leaving the directory") {
    auto dir = sharded();
    charm::testing::write_bytes(*dir / index_name, R"({"weight_map": {"model.norm.weight": "../x.safetensors"}})");
    expect_error([&] { Checkpoint::open(dir->path()); }, ErrorCategory::kInvalidInput,
                 {(*dir / index_name).string(), "'model.norm.weight'", "../x.safetensors"});
  }
  SUBCASE("tensor named in the index but absent from its file") {
    auto dir = sharded();
    const nlohmann::json index = {{"weight_map",
                                   {{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
                                    {"model.norm.weight", "model-00002-of-00002.safetensors"},
                                    {"lm_head.weight", "model-00002-of-00002.safetensors"}}}};
    charm::testing::write_bytes(*dir / index_name, index.dump());
    expect_error([&] { Checkpoint::open(dir->path()); }, ErrorCategory::kInvalidInput,
                 {(*dir / index_name).string(), "'lm_head.weight'", "model-00002-of-00002.safetensors",
                  "does not hold it"});
  }
  SUBCASE("tensor mapped to the wrong shard") {
    auto dir = sharded();
    const nlohmann::json index = {{"weight_map",
                                   {{"model.embed_tokens.weight", "model-00002-of-00002.safetensors"},
                                    {"model.norm.weight", "model-00002-of-00002.safetensors"}}}};
    charm::testing::write_bytes(*dir / index_name, index.dump());
    // Only shard 2 is named, so shard 1's tensor is missing from it.
    expect_error([&] { Checkpoint::open(dir->path()); }, ErrorCategory::kInvalidInput,
                 {"'model.embed_tokens.weight'", "does not hold it"});
  }
  SUBCASE("tensor present in two files") {
    auto dir = sharded();
    charm::testing::write_safetensors(*dir / "model-00002-of-00002.safetensors",
                                      {dense_tensors()[1], dense_tensors()[0]});  // embed again
    expect_error([&] { Checkpoint::open(dir->path()); }, ErrorCategory::kInvalidInput,
                 {"'model.embed_tokens.weight'", "model-00001-of-00002.safetensors",
                  "model-00002-of-00002.safetensors", "both"});
  }
  SUBCASE("corrupt shard") {
    auto dir = sharded();
    charm::testing::write_bytes(*dir / "model-00001-of-00002.safetensors", "xy");
    expect_error([&] { Checkpoint::open(dir->path()); }, ErrorCategory::kInvalidInput,
                 {"model-00001-of-00002.safetensors", "shorter than"});
  }
}

TEST_CASE("duplicate tensors across unindexed safetensors files are rejected") {
  TempDir dir("ckpt");
  write_config(dir);
  charm::testing::write_safetensors(dir / "a.safetensors", dense_tensors());
  charm::testing::write_safetensors(dir / "b.safetensors", {dense_tensors()[1]});
  expect_error([&] { Checkpoint::open(dir.path()); }, ErrorCategory::kInvalidInput,
               {"'model.norm.weight'", "a.safetensors", "b.safetensors"});
}

// ---- fp8 (DeepSeek-V3): F8_E4M3 weights with "<name>_scale_inv" block scales ------------

namespace {

constexpr int64_t kBlock = 2;  // weight_block_size [2, 2]: [3, 5] weights have partial blocks

/// Values exact in float8_e4m3fn (3 mantissa bits), distinct per (e, proj, r, c) pattern.
std::vector<float> fp8_matrix(int64_t e, int proj, int64_t rows, int64_t cols) {
  std::vector<float> m;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float mantissa = 1.0f + static_cast<float>((e * 5 + proj * 3 + r * 2 + c) % 8) / 8.0f;
      m.push_back(std::ldexp(mantissa, static_cast<int>((r + c) % 3) - 1) * ((r + c) % 2 ? -1.0f : 1.0f));
    }
  }
  return m;
}

/// Block scales [ceil(rows/2), ceil(cols/2)], not all powers of two.
std::vector<float> fp8_scales(int64_t rows, int64_t cols, float base) {
  std::vector<float> s;
  for (int64_t i = 0; i < ((rows + 1) / 2) * ((cols + 1) / 2); ++i) s.push_back(base * (0.75f + 0.5f * static_cast<float>(i)));
  return s;
}

/// weight * scale of its [2, 2] block, in f32: what dequantisation must give.
std::vector<float> dequantised(const std::vector<float>& w, const std::vector<float>& s, int64_t rows, int64_t cols) {
  std::vector<float> out(w.size());
  const int64_t scols = (cols + 1) / 2;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = w[r * cols + c] * s[(r / kBlock) * scols + c / kBlock];
  }
  return out;
}

void write_fp8_config(const TempDir& dir, const std::string& quantization) {
  charm::testing::write_bytes(dir / "config.json", R"({"architectures": ["DeepseekV3ForCausalLM"], "quantization_config": )" +
                                                       quantization + "}");
}

const char* kFp8Quantization =
    R"({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [2, 2]})";
// MiniMax-M2's spelling of the same format (its hub config.json), with the modules it leaves
// unquantised.
const char* kMiniMaxFp8Quantization =
    R"({"activation_scheme": "dynamic", "fmt": "float8_e4m3fn", "quant_method": "fp8", "weight_block_size": [2, 2],)"
    R"( "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]})";

/// An fp8 checkpoint: per-expert F8 tensors of layer kLayer ([3, 4] / [4, 3]) and one
/// resident F8 Linear [3, 5], each with its scale; `drop` / `reshape` break one scale.
std::vector<TensorSpec> fp8_tensors(const std::string& drop = "", const std::string& reshape = "") {
  std::vector<TensorSpec> out = dense_tensors();
  auto add = [&](const std::string& name, int64_t rows, int64_t cols, std::vector<float> w, float base) {
    out.push_back({name, DType::kF8E4M3, {rows, cols}, std::move(w)});
    const std::string scale = name + "_scale_inv";
    if (scale == drop) return;
    std::vector<int64_t> shape{(rows + 1) / 2, (cols + 1) / 2};
    std::vector<float> values = fp8_scales(rows, cols, base);
    if (scale == reshape) {  // one block row too many
      shape[0] += 1;
      values.resize(static_cast<size_t>(shape[0] * shape[1]), 1.0f);
    }
    out.push_back({scale, DType::kF32, shape, values});
  };
  const std::string p = "model.layers." + std::to_string(kLayer) + ".mlp.experts.";
  for (int64_t e = 0; e < kE; ++e) {
    const std::string pe = p + std::to_string(e) + ".";
    add(pe + "gate_proj.weight", kI, kH, fp8_matrix(e, 0, kI, kH), 0.5f);
    add(pe + "up_proj.weight", kI, kH, fp8_matrix(e, 1, kI, kH), 2.0f);
    add(pe + "down_proj.weight", kH, kI, fp8_matrix(e, 2, kH, kI), 0.1f);
  }
  add("model.layers.0.self_attn.o_proj.weight", 3, 5, fp8_matrix(9, 0, 3, 5), 1.5f);
  return out;
}

}  // namespace

TEST_CASE("fp8 weights are dequantised per [b0, b1] block, resident and expert, partial blocks included") {
  for (bool sharded : {false, true}) {
    CAPTURE(sharded);
    TempDir dir("ckpt");
    write_checkpoint(dir, fp8_tensors(), sharded);
    write_fp8_config(dir, sharded ? kMiniMaxFp8Quantization : kFp8Quantization);
    const auto ck = Checkpoint::open(dir.path());
    CHECK(ck->load_f32("model.layers.0.self_attn.o_proj.weight", {3, 5}) ==
          dequantised(fp8_matrix(9, 0, 3, 5), fp8_scales(3, 5, 1.5f), 3, 5));
    for (int64_t e = 0; e < kE; ++e) {
      const ExpertWeights w = ck->load_expert({}, kLayer, static_cast<int>(e), kH, kI);
      CHECK(w.gate == dequantised(fp8_matrix(e, 0, kI, kH), fp8_scales(kI, kH, 0.5f), kI, kH));
      CHECK(w.up == dequantised(fp8_matrix(e, 1, kI, kH), fp8_scales(kI, kH, 2.0f), kI, kH));
      CHECK(w.down == dequantised(fp8_matrix(e, 2, kH, kI), fp8_scales(kH, kI, 0.1f), kH, kI));
    }
  }
}

TEST_CASE("malformed fp8: a missing or mis-shaped scale, or no block size, is an error naming the tensor") {
  const std::string o = "model.layers.0.self_attn.o_proj.weight";
  const std::string gate = "model.layers.1.mlp.experts.2.gate_proj.weight";
  {
    TempDir dir("ckpt");
    write_checkpoint(dir, fp8_tensors(o + "_scale_inv", gate + "_scale_inv"), false);
    write_fp8_config(dir, kFp8Quantization);
    const auto ck = Checkpoint::open(dir.path());
    expect_error([&] { ck->load_f32(o, {3, 5}); }, ErrorCategory::kInvalidInput,
                 {"F8_E4M3 tensor '" + o + "'", "no scale tensor '" + o + "_scale_inv'"});
    expect_error([&] { ck->load_expert({}, kLayer, 2, kH, kI); }, ErrorCategory::kInvalidInput,
                 {"scale tensor '" + gate + "_scale_inv' has shape [3, 2], expected [2, 2]"});
  }
  {
    TempDir dir("ckpt");
    write_checkpoint(dir, fp8_tensors("", o + "_scale_inv"), false);
    write_fp8_config(dir, kFp8Quantization);
    expect_error([&] { Checkpoint::open(dir.path())->load_f32(o, {3, 5}); }, ErrorCategory::kInvalidInput,
                 {"scale tensor '" + o + "_scale_inv' has shape [3, 3], expected [2, 3]", "[3, 5]"});
  }
  {
    TempDir dir("ckpt");
    write_checkpoint(dir, fp8_tensors(), false);  // config.json without quantization_config
    expect_error([&] { Checkpoint::open(dir.path())->load_f32(o, {3, 5}); }, ErrorCategory::kInvalidInput,
                 {"F8_E4M3 tensor '" + o + "'", "quantization_config.weight_block_size"});
  }
}

TEST_CASE("quantization_config: other methods, formats and bad block sizes are refused at open") {
  struct Case {
    std::string quantization, message;
    ErrorCategory category;
  };
  const Case cases[] = {
      {R"({"quant_method": "awq"})", "quant_method 'awq' is not supported", ErrorCategory::kUnsupported},
      {R"({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [2, 2]})", "fmt \"e5m2\" is not supported",
       ErrorCategory::kUnsupported},
      {R"({"quant_method": "fp8", "weight_block_size": [0, 2]})", "weight_block_size must be two positive integers",
       ErrorCategory::kInvalidInput},
      {R"({"quant_method": "fp8"})", "weight_block_size must be two positive integers", ErrorCategory::kInvalidInput},
      {R"([1])", "'quantization_config' is not a JSON object", ErrorCategory::kInvalidInput}};
  for (const auto& c : cases) {
    CAPTURE(c.quantization);
    TempDir dir("ckpt");
    write_checkpoint(dir, dense_tensors(), false);
    write_fp8_config(dir, c.quantization);
    expect_error([&] { Checkpoint::open(dir.path()); }, c.category, {"config.json", c.message});
  }
}

TEST_CASE("fused 3-D fp8 expert tensors are refused by name") {
  TempDir dir("ckpt");
  auto tensors = dense_tensors();
  for (auto t : expert_tensors(Layout::kFused, DType::kF32)) {
    t.dtype = DType::kF8E4M3;
    for (float& v : t.values) v = 1.0f;
    tensors.push_back(t);
  }
  write_checkpoint(dir, tensors, false);
  write_fp8_config(dir, kFp8Quantization);
  expect_error([&] { Checkpoint::open(dir.path())->load_expert({}, kLayer, 0, kH, kI); }, ErrorCategory::kUnsupported,
               {"model.layers.1.mlp.experts.gate_up_proj", "fused 3-D F8_E4M3"});
}

// ---- Silent bad checkpoints (issue 12, item 7) -------------------------------------------

TEST_CASE("a key given twice in config.json, generation_config.json or the index's weight_map is refused") {
  TempDir dir("ckpt");
  write_checkpoint(dir, dense_tensors(), true);
  charm::testing::write_bytes(dir / "config.json", R"({"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 3,
                                                      "hidden_size": 4, "num_experts": 8})");
  expect_error([&] { Checkpoint::open(dir.path()); }, ErrorCategory::kInvalidInput,
               {(dir / "config.json").string(), "key 'num_experts' appears twice at the top level"});
  write_config(dir);
  charm::testing::write_bytes(dir / "generation_config.json", R"({"eos_token_id": 1, "eos_token_id": 2})");
  expect_error([&] { Checkpoint::open(dir.path()); }, ErrorCategory::kInvalidInput,
               {(dir / "generation_config.json").string(), "key 'eos_token_id' appears twice"});
  std::filesystem::remove(dir / "generation_config.json");
  // The same tensor mapped twice (here to two different shards: which one would load?).
  charm::testing::write_bytes(dir / "model.safetensors.index.json",
                              R"({"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                                                 "model.norm.weight": "model-00002-of-00002.safetensors",
                                                 "model.embed_tokens.weight": "model-00002-of-00002.safetensors"}})");
  expect_error([&] { Checkpoint::open(dir.path()); }, ErrorCategory::kInvalidInput,
               {(dir / "model.safetensors.index.json").string(),
                "key 'model.embed_tokens.weight' appears twice in 'weight_map'"});
}

TEST_CASE("a tensor given twice in one shard's header is refused through Checkpoint::open, naming file and tensor") {
  TempDir dir("ckpt");
  write_config(dir);
  const std::string w = R"("model.norm.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})";
  const std::string w2 = R"("model.norm.weight": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]})";
  charm::testing::write_raw_safetensors(dir / "model.safetensors", "{" + w + ", " + w2 + "}", std::string(8, '\0'));
  expect_error([&] { Checkpoint::open(dir.path()); }, ErrorCategory::kInvalidInput,
               {(dir / "model.safetensors").string(), "tensor 'model.norm.weight' appears twice in the header"});
}

namespace {
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();
}  // namespace

TEST_CASE("NaN or Inf in a resident weight is refused at load, naming the file, the tensor and the element") {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    CAPTURE(dtype_name(dtype));
    for (float bad : {kNaN, kInf, -kInf}) {
      CAPTURE(bad);
      auto tensors = dense_tensors();
      tensors[0].dtype = dtype;
      tensors[0].values[2 * kH + 1] = bad;  // embed [2, 1]
      tensors[1].values[3] = bad;           // norm [3], f32
      TempDir dir("ckpt");
      write_checkpoint(dir, tensors, false);
      const auto ck = Checkpoint::open(dir.path());
      const std::string what = bad != bad ? "NaN" : bad > 0 ? "+Inf" : "-Inf";
      expect_error([&] { ck->load_matrix("model.embed_tokens.weight", 5, kH); }, ErrorCategory::kInvalidInput,
                   {(dir / "model.safetensors").string(), "tensor 'model.embed_tokens.weight'", what + " at [2, 1]"});
      expect_error([&] { ck->load_f32("model.embed_tokens.weight", {5, kH}); }, ErrorCategory::kInvalidInput,
                   {"tensor 'model.embed_tokens.weight'", what + " at [2, 1]"});
      expect_error([&] { ck->load_f32("model.norm.weight", {kH}); }, ErrorCategory::kInvalidInput,
                   {"tensor 'model.norm.weight'", what + " at [3]"});
    }
  }
}

TEST_CASE("NaN or Inf in a routed expert is refused when it is read, in every layout, naming the element") {
  const std::string p = "model.layers." + std::to_string(kLayer) + ".mlp.experts";
  struct Case {
    Layout layout;
    std::string tensor;  ///< the tensor that gets the bad value
    size_t element;      ///< which of its elements
    std::string at;      ///< its index as the message gives it
  };
  const Case cases[] = {
      {Layout::kPerExpert, p + ".1.down_proj.weight", 2 * kI + 1, "[2, 1]"},
      {Layout::kFused, p + ".gate_up_proj", (1 * 2 * kI + kI + 2) * kH + 3, "[1, 5, 3]"},  // expert 1's up, row 2
      {Layout::kSeparate3d, p + ".down_proj", (1 * kH + 3) * kI + 0, "[1, 3, 0]"},
      {Layout::kSeparate3dWeight, p + ".gate_proj.weight", (1 * kI + 0) * kH + 2, "[1, 0, 2]"}};
  for (const Case& c : cases) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      CAPTURE(c.tensor);
      CAPTURE(dtype_name(dtype));
      auto tensors = dense_tensors();
      for (auto t : expert_tensors(c.layout, dtype)) {
        if (t.name == c.tensor) t.values[c.element] = kNaN;
        tensors.push_back(t);
      }
      TempDir dir("ckpt");
      write_checkpoint(dir, tensors, true);
      const auto ck = Checkpoint::open(dir.path());
      check_expert(ck->load_expert({}, kLayer, 0, kH, kI), 0);  // the other experts still load
      check_expert(ck->load_expert({}, kLayer, 2, kH, kI), 2);
      expect_error([&] { ck->load_expert({}, kLayer, 1, kH, kI); }, ErrorCategory::kInvalidInput,
                   {"tensor '" + c.tensor + "'", "NaN at " + c.at});
      // The raw read the worker's disk tier and charm convert use checks too.
      const ExpertSlices s = ck->locate_expert({}, kLayer, 1, kH, kI);
      std::vector<uint8_t> raw(std::max({s.gate.bytes, s.up.bytes, s.down.bytes}));
      expect_error(
          [&] {
            for (const ExpertSlice* slice : {&s.gate, &s.up, &s.down}) ck->read_slice(*slice, raw.data());
          },
          ErrorCategory::kInvalidInput, {c.tensor, "NaN at " + c.at});
    }
  }
}

TEST_CASE("fp8: a NaN code, a non-finite scale or one that overflows f32 is refused, resident and expert") {
  const std::string o = "model.layers.0.self_attn.o_proj.weight";
  const std::string gate = "model.layers.1.mlp.experts.2.gate_proj.weight";
  auto with = [&](const std::string& name, size_t element, float value) {
    auto tensors = fp8_tensors();
    for (auto& t : tensors) {
      if (t.name == name) t.values[element] = value;
    }
    auto dir = std::make_unique<TempDir>("ckpt");
    write_checkpoint(*dir, tensors, false);
    write_fp8_config(*dir, kFp8Quantization);
    return dir;
  };
  {
    const auto dir = with(o, 1 * 5 + 4, kNaN);  // the e4m3 NaN code at [1, 4]
    expect_error([&] { Checkpoint::open(dir->path())->load_f32(o, {3, 5}); }, ErrorCategory::kInvalidInput,
                 {"tensor '" + o + "'", "NaN at [1, 4]"});
  }
  for (float bad : {kNaN, kInf, 1e38f}) {
    CAPTURE(bad);
    const auto dir = with(o + "_scale_inv", 4, bad);  // scale grid [2, 3]: block [1, 1]
    const std::string what = bad != bad ? "NaN" : bad == kInf ? "+Inf" : "overflows f32";
    expect_error([&] { Checkpoint::open(dir->path())->load_f32(o, {3, 5}); }, ErrorCategory::kInvalidInput,
                 {"scale tensor '" + o + "_scale_inv'", what, "[1, 1]"});
    const auto expert_dir = with(gate + "_scale_inv", 1, bad);
    const auto ck = Checkpoint::open(expert_dir->path());
    expect_error([&] { ck->load_expert({}, kLayer, 2, kH, kI); }, ErrorCategory::kInvalidInput,
                 {"scale tensor '" + gate + "_scale_inv'", what, "[0, 1]"});
    const ExpertSlices s = ck->locate_expert({}, kLayer, 2, kH, kI);
    std::vector<float> scales(s.gate.scale->numel());
    expect_error([&] { ck->read_slice_scales(s.gate, scales.data()); }, ErrorCategory::kInvalidInput,
                 {"scale tensor '" + gate + "_scale_inv'", what});
  }
}

// ---- Paths in errors (issue 12, item 11) ---------------------------------------------------

TEST_CASE("a checkpoint path that is absent, not a directory, or lacks a file is named as resolved, with its origin") {
  TempDir dir("ckpt");
  const std::string base = dir.path().string();
  expect_error([&] { Checkpoint::open(UserPath::resolve("models/q", dir.path())); }, ErrorCategory::kInvalidInput,
               {"checkpoint directory " + (dir / "models/q").string() + " (resolved from 'models/q' against " + base +
                ") does not exist"});
  charm::testing::write_bytes(dir / "file", "x");
  expect_error([&] { Checkpoint::open(UserPath::resolve("file", dir.path())); }, ErrorCategory::kInvalidInput,
               {(dir / "file").string() + " (resolved from 'file' against " + base + ") is neither a checkpoint directory"});
  std::filesystem::create_directories(dir / "empty");
  expect_error([&] { Checkpoint::open(UserPath::resolve("./empty/", dir.path())); }, ErrorCategory::kInvalidInput,
               {(dir / "empty/config.json").string() + ": missing or unreadable (in " + (dir / "empty/").string() +
                ", resolved from './empty/' against " + base + ")"});
  // An absolute path is printed as it is, with nothing appended.
  expect_error([&] { Checkpoint::open(dir / "empty"); }, ErrorCategory::kInvalidInput,
               {(dir / "empty/config.json").string() + ": missing or unreadable"});
}

// gpt-oss's layout (ExpertTensorNames::gpt_oss_layout): the four tensors are located per
// expert; a missing bias, a mis-shaped block or an expert past E is named.
TEST_CASE("locate_expert in gpt-oss's layout: slices of the four tensors, and every malformed one named") {
  const std::string p = "model.layers.1.mlp.experts.";
  auto tensors = [&](std::vector<int64_t> gate_up_shape) {
    int64_t n = 1;
    for (int64_t d : gate_up_shape) n *= d;
    return std::vector<TensorSpec>{
        {p + "gate_up_proj", DType::kBF16, gate_up_shape, charm::testing::ramp(static_cast<size_t>(n))},
        {p + "gate_up_proj_bias", DType::kF32, {kE, 2 * kI}, charm::testing::ramp(kE * 2 * kI)},
        {p + "down_proj", DType::kBF16, {kE, kI, kH}, charm::testing::ramp(kE * kI * kH)},
        {p + "down_proj_bias", DType::kF32, {kE, kH}, charm::testing::ramp(kE * kH)}};
  };
  ExpertTensorNames names;
  names.gpt_oss_layout = true;
  {
    TempDir dir("ckpt");
    write_checkpoint(dir, tensors({kE, kH, 2 * kI}), false);
    const auto ck = Checkpoint::open(dir.path());
    const ExpertSlices s = ck->locate_expert(names, 1, 2, kH, kI);
    CHECK(s.transposed);
    CHECK(s.gate.rows == kH);
    CHECK(s.gate.cols == 2 * kI);
    CHECK(s.gate.offset == 2 * kH * 2 * kI * 2);  // bf16: expert 2's block
    CHECK(s.up.tensor == nullptr);
    CHECK(s.down.rows == kI);
    CHECK(s.down_bias.offset == 2 * kH * 4);
    expect_error([&] { ck->locate_expert(names, 1, kE, kH, kI); }, ErrorCategory::kInvalidInput,
                 {"gate_up_proj", "holds 3 experts, expert 3 requested"});
    expect_error([&] { ck->load_expert(names, 1, 0, kH, kI); }, ErrorCategory::kUnsupported,
                 {"transposed expert layout"});
  }
  {
    TempDir dir("ckpt");
    write_checkpoint(dir, tensors({kE, 2 * kI, kH}), false);  // Qwen's [E, 2I, H], not gpt-oss's
    const auto ck = Checkpoint::open(dir.path());
    expect_error([&] { ck->locate_expert(names, 1, 0, kH, kI); }, ErrorCategory::kInvalidInput,
                 {"gate_up_proj", "experts, hidden_size, 2 * intermediate_size"});
  }
  {
    TempDir dir("ckpt");
    auto no_bias = tensors({kE, kH, 2 * kI});
    no_bias.erase(no_bias.begin() + 3);
    write_checkpoint(dir, no_bias, false);
    const auto ck = Checkpoint::open(dir.path());
    expect_error([&] { ck->locate_expert(names, 1, 0, kH, kI); }, ErrorCategory::kInvalidInput,
                 {"down_proj_bias' not found"});
  }
}
