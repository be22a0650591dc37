// gpt-oss's MXFP4 experts as the hub ships them: the decoder against transformers' own
// dequantisation (tests/fixtures/mxfp4/cases.json, scripts/gen_mxfp4_cases.py), and the
// expert reader: an MXFP4 checkpoint gives byte for byte the expert blob of the bf16
// checkpoint holding transformers' dequantised weights (GptOssExperts' [E, H, 2I] and
// [E, I, H] layout), so everything downstream computes the same bits. Malformed packed
// tensors are refused, naming the tensor.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/model_config.h"
#include "common/mxfp4.h"
#include "coordinator/models/checkpoint_families.h"
#include "tests/support/expect_error.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"
#include "worker/experts/expert_source.h"

namespace fs = std::filesystem;
using namespace charm;
using charm::testing::TensorSpec;
using nlohmann::json;

namespace {

std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

constexpr int64_t kE = 2, kH = 64, kI = 32;  // experts; hidden and intermediate sizes (multiples of 32)

/// Random MXFP4 bytes [E, rows, in / 32, 16] and scales [E, rows, in / 32] near 2^0.
struct Packed {
  std::vector<float> blocks, scales;  // byte values, as the test writer takes them
  Packed(int64_t rows, int64_t in, uint32_t seed) {
    std::mt19937 rng(seed);
    blocks.resize(static_cast<size_t>(kE * rows * in / 2));
    scales.resize(static_cast<size_t>(kE * rows * in / 32));
    for (float& b : blocks) b = static_cast<float>(rng() % 256);
    for (float& s : scales) s = static_cast<float>(120 + rng() % 12);
  }
  /// Expert e's rows decoded: [rows, in] f32.
  std::vector<float> decoded(int64_t e, int64_t rows, int64_t in) const {
    std::vector<uint8_t> b(blocks.begin() + e * rows * in / 2, blocks.begin() + (e + 1) * rows * in / 2);
    std::vector<uint8_t> s(scales.begin() + e * rows * in / 32, scales.begin() + (e + 1) * rows * in / 32);
    std::vector<float> out(static_cast<size_t>(rows * in));
    decode_mxfp4_rows(b.data(), s.data(), static_cast<size_t>(rows), static_cast<size_t>(in / 32), out.data());
    return out;
  }
};

struct Pair {
  test::TempDir mx{"charm-mxfp4"}, bf16{"charm-mxfp4-bf16"};
  Packed gate_up{2 * kI, kH, 1}, down{kH, kI, 2};
  std::vector<float> gate_up_bias, down_bias;

  Pair() {
    for (int64_t i = 0; i < kE * 2 * kI; ++i) gate_up_bias.push_back(0.125f * static_cast<float>(i % 7) - 0.25f);
    for (int64_t i = 0; i < kE * kH; ++i) down_bias.push_back(0.0625f * static_cast<float>(i % 5));
    write(mx, true);
    write(bf16, false);
  }
  void write(const test::TempDir& dir, bool mxfp4) const {
    json config = {{"architectures", {"GptOssForCausalLM"}}, {"model_type", "gpt_oss"}, {"hidden_size", kH},
                   {"intermediate_size", kI}, {"num_hidden_layers", 1}, {"num_attention_heads", 2},
                   {"num_key_value_heads", 1}, {"head_dim", 32}, {"num_local_experts", kE},
                   {"num_experts_per_tok", 1}, {"vocab_size", 8}, {"max_position_embeddings", 64},
                   {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0}, {"tie_word_embeddings", true}};
    if (mxfp4) config["quantization_config"] = {{"quant_method", "mxfp4"}};
    charm::testing::write_bytes(dir.path() / "config.json", config.dump());
    const std::string p = "model.layers.0.mlp.experts.";
    std::vector<TensorSpec> t = {{p + "gate_up_proj_bias", DType::kF32, {kE, 2 * kI}, gate_up_bias},
                                 {p + "down_proj_bias", DType::kF32, {kE, kH}, down_bias}};
    if (mxfp4) {
      t.push_back({p + "gate_up_proj_blocks", DType::kU8, {kE, 2 * kI, kH / 32, 16}, gate_up.blocks});
      t.push_back({p + "gate_up_proj_scales", DType::kU8, {kE, 2 * kI, kH / 32}, gate_up.scales});
      t.push_back({p + "down_proj_blocks", DType::kU8, {kE, kH, kI / 32, 16}, down.blocks});
      t.push_back({p + "down_proj_scales", DType::kU8, {kE, kH, kI / 32}, down.scales});
    } else {
      // transformers' convert_moe_packed_tensors: decoded [E, out, in] transposed to [E, in, out].
      std::vector<float> gu(kE * kH * 2 * kI), d(kE * kI * kH);
      for (int64_t e = 0; e < kE; ++e) {
        const std::vector<float> a = gate_up.decoded(e, 2 * kI, kH), b = down.decoded(e, kH, kI);
        for (int64_t r = 0; r < 2 * kI; ++r)
          for (int64_t c = 0; c < kH; ++c) gu[(e * kH + c) * 2 * kI + r] = a[r * kH + c];
        for (int64_t r = 0; r < kH; ++r)
          for (int64_t c = 0; c < kI; ++c) d[(e * kI + c) * kH + r] = b[r * kI + c];
      }
      t.push_back({p + "gate_up_proj", DType::kBF16, {kE, kH, 2 * kI}, gu});
      t.push_back({p + "down_proj", DType::kBF16, {kE, kI, kH}, d});
    }
    charm::testing::write_safetensors(dir.path() / "model.safetensors", t);
  }
};

/// Expert `e` of layer 0 of the checkpoint at `dir` as the store reads it: its blob bytes.
std::vector<uint8_t> blob(const fs::path& dir, int e) {
  const auto ck = Checkpoint::open(dir);
  const ModelConfig c = ModelConfig::parse(ck->config_json(), "config.json", checkpoint_families());
  const ExpertSlices slices = ck->locate_expert(c.expert_tensors, 0, e, kH, kI);
  const ExpertLayout layout = layout_of(slices);
  AlignedBuffer buf(layout.bytes);
  std::memset(buf.data(), 0, buf.size());
  read_checkpoint_expert(*ck, slices, layout, buf.data());
  return std::vector<uint8_t>(buf.data(), buf.data() + layout.bytes);
}

}  // namespace

TEST_CASE("decode_mxfp4_rows gives transformers' convert_moe_packed_tensors bit for bit") {
  std::ifstream in(fs::path(CHARM_SOURCE_DIR) / "tests/fixtures/mxfp4/cases.json");
  REQUIRE(in);
  const json j = json::parse(in);
  const auto E = j["experts"].get<size_t>(), R = j["rows"].get<size_t>(), G = j["groups"].get<size_t>();
  const std::vector<uint8_t> blocks = from_hex(j["blocks_hex"]), scales = from_hex(j["scales_hex"]);
  const std::vector<uint8_t> want_bytes = from_hex(j["dequantized_f32_hex"]);
  REQUIRE(want_bytes.size() == E * G * 32 * R * 4);
  std::vector<float> want(want_bytes.size() / 4);
  std::memcpy(want.data(), want_bytes.data(), want_bytes.size());
  size_t differ = 0, subnormal = 0;
  for (size_t e = 0; e < E; ++e) {
    std::vector<float> got(R * G * 32);
    decode_mxfp4_rows(blocks.data() + e * R * G * 16, scales.data() + e * R * G, R, G, got.data());
    for (size_t r = 0; r < R; ++r) {
      for (size_t c = 0; c < G * 32; ++c) {
        const float w = want[(e * G * 32 + c) * R + r];  // transformers' [E, in, out]
        differ += std::memcmp(&w, &got[r * G * 32 + c], 4) != 0;
        subnormal += w != 0 && std::fpclassify(w) == FP_SUBNORMAL;
      }
    }
  }
  CHECK(differ == 0);
  CHECK(subnormal > 0);  // the fixture's scale 0 and 1 groups: 2^-127 and 2^-126 scales
}

TEST_CASE("an MXFP4 gpt-oss checkpoint gives the expert blobs of its bf16 dequantisation") {
  const Pair pair;
  for (int e = 0; e < kE; ++e) {
    CAPTURE(e);
    const std::vector<uint8_t> a = blob(pair.mx.path(), e), b = blob(pair.bf16.path(), e);
    REQUIRE(a.size() == b.size());
    CHECK(std::memcmp(a.data(), b.data(), a.size()) == 0);
  }
  CHECK(blob(pair.mx.path(), 0) != blob(pair.mx.path(), 1));
}

TEST_CASE("malformed MXFP4 expert tensors are refused, naming the tensor") {
  const Pair pair;
  const std::string p = "model.layers.0.mlp.experts.";
  const auto rewrite = [&](std::vector<TensorSpec> extra, const std::string& drop) {
    std::vector<TensorSpec> t = {{p + "gate_up_proj_bias", DType::kF32, {kE, 2 * kI}, pair.gate_up_bias},
                                 {p + "down_proj_bias", DType::kF32, {kE, kH}, pair.down_bias},
                                 {p + "gate_up_proj_blocks", DType::kU8, {kE, 2 * kI, kH / 32, 16}, pair.gate_up.blocks},
                                 {p + "gate_up_proj_scales", DType::kU8, {kE, 2 * kI, kH / 32}, pair.gate_up.scales},
                                 {p + "down_proj_blocks", DType::kU8, {kE, kH, kI / 32, 16}, pair.down.blocks},
                                 {p + "down_proj_scales", DType::kU8, {kE, kH, kI / 32}, pair.down.scales}};
    std::erase_if(t, [&](const TensorSpec& s) { return s.name == p + drop; });
    for (auto& x : extra) t.push_back(std::move(x));
    charm::testing::write_safetensors(pair.mx.path() / "model.safetensors", t);
  };
  rewrite({}, "down_proj_scales");
  test::expect_error([&] { blob(pair.mx.path(), 0); }, ErrorCategory::kInvalidInput, {"down_proj_scales", "not found"});
  std::vector<float> half(pair.down.scales.begin(), pair.down.scales.begin() + pair.down.scales.size() / 2);
  rewrite({{p + "down_proj_scales", DType::kU8, {kE / 2, kH, kI / 32}, half}}, "down_proj_scales");
  test::expect_error([&] { blob(pair.mx.path(), 1); }, ErrorCategory::kInvalidInput, {"down_proj_scales", "expert 1"});
  rewrite({{p + "down_proj_scales", DType::kU8, {kE, kH, kI / 16}, pair.gate_up.scales}}, "down_proj_scales");
  test::expect_error([&] { blob(pair.mx.path(), 0); }, ErrorCategory::kInvalidInput, {"down_proj_scales", "shape"});
  std::vector<float> wide(pair.down.scales.size(), 1.0f);
  rewrite({{p + "down_proj_scales", DType::kBF16, {kE, kH, kI / 32}, wide}}, "down_proj_scales");
  test::expect_error([&] { blob(pair.mx.path(), 0); }, ErrorCategory::kInvalidInput, {"down_proj_scales", "U8"});
  std::vector<float> nan_scale = pair.down.scales;
  nan_scale[3] = 255;  // E8M0's NaN
  rewrite({{p + "down_proj_scales", DType::kU8, {kE, kH, kI / 32}, nan_scale}}, "down_proj_scales");
  test::expect_error([&] { blob(pair.mx.path(), 0); }, ErrorCategory::kInvalidInput, {"down_proj_scales", "E8M0 255"});
  // U8 data is never widened to floats as if it were weights.
  test::expect_error([&] { Checkpoint::open(pair.mx.path())->load_f32(p + "down_proj_blocks", {kE, kH, kI / 32, 16}); },
                     ErrorCategory::kUnsupported, {"U8"});
}
