// Tests for common/ggml_quantize.h (quant_dense's quantisers) and common/dtype.h's
// f32_to_f16: Q8_0 and Q4_0 blocks bit for bit as gguf-py's gguf.quants.quantize writes
// them (tests/fixtures/ggml_quants/<TYPE>.quantize.*, scripts/gen_ggml_quant_cases.py:
// ties, first-of-equal maxima, d near f16's largest and subnormal, seeded normals, bf16
// values), what quantize_dense keeps as it is, and the errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/ggml_quantize.h"
#include "common/weight_format.h"
#include "tests/support/expect_error.h"
#include "tests/support/safetensors_writer.h"

using namespace charm;
using charm::test::expect_error;

namespace {

std::vector<uint8_t> read_fixture(const std::string& name) {
  const auto path = std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/ggml_quants" / name;
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<float> as_floats(const std::vector<uint8_t>& bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

/// An f32 StoredMatrix [rows, cols] of seeded normals.
StoredMatrix random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (float& v : values) v = normal(rng);
  return StoredMatrix::from_f32(values, rows, cols);
}

}  // namespace

TEST_CASE("f32_to_f16 rounds to nearest even, as the test-side reference conversion") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> values = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 6.1035156e-5f, 5.9604645e-8f,
                               2.9802322e-8f, 2.9802326e-8f, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048,
                               std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  std::uniform_int_distribution<uint32_t> exponent(90, 150);  // 2^-37 .. 2^23: f16's range and around it
  for (int i = 0; i < 200000; ++i) {
    float v;
    const uint32_t b = (bits(rng) & 0x807FFFFFu) | exponent(rng) << 23;
    std::memcpy(&v, &b, 4);
    values.push_back(v);
  }
  for (float v : values) {
    CAPTURE(v);
    CHECK(f32_to_f16(v) == testing::f32_to_f16_bits(v));
  }
  CHECK((f32_to_f16(std::numeric_limits<float>::quiet_NaN()) & 0x7C00u) == 0x7C00u);
  CHECK((f32_to_f16(std::numeric_limits<float>::quiet_NaN()) & 0x03FFu) != 0);
}

TEST_CASE("Q8_0 and Q4_0 blocks are gguf-py's, bit for bit") {
  for (const GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    const std::string name = ggml_traits(type).name;
    CAPTURE(name);
    const std::vector<float> x = as_floats(read_fixture(name + ".quantize.f32"));
    const std::vector<uint8_t> expected = read_fixture(name + ".quantize.blocks");
    const int64_t blocks = static_cast<int64_t>(x.size()) / 32;
    REQUIRE(blocks > 8);
    REQUIRE(expected.size() == static_cast<size_t>(blocks * ggml_traits(type).block_bytes));
    std::vector<uint8_t> got(expected.size());
    CHECK(quantize_ggml(type, x.data(), static_cast<int64_t>(x.size()), got.data()));
    for (int64_t b = 0; b < blocks; ++b) {
      const size_t bytes = static_cast<size_t>(ggml_traits(type).block_bytes);
      CAPTURE(b);
      CHECK(std::memcmp(got.data() + b * bytes, expected.data() + b * bytes, bytes) == 0);
    }
    // And what the blocks hold comes back through dequantize_row within half a step, plus
    // the f16 rounding of d times the largest quant (coarse where d is an f16 subnormal),
    // plus for Q4_0 one step (it clips a value of the max's opposite sign and magnitude).
    std::vector<float> back(x.size());
    dequantize_row(type, got.data(), back.data(), static_cast<int64_t>(x.size()));
    for (int64_t b = 8; b < blocks; ++b) {  // the seeded normals
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
      const float step = amax / (type == GgmlType::kQ8_0 ? 127.0f : 8.0f);
      uint16_t d16;
      std::memcpy(&d16, got.data() + b * ggml_traits(type).block_bytes, 2);
      const float d_error = 128.0f * std::fabs(std::fabs(f16_to_f32(d16)) - step);
      const float bound = (type == GgmlType::kQ8_0 ? 0.5f : 1.5f) * step + d_error + 1e-6f * amax;
      for (int j = 0; j < 32; ++j) REQUIRE(std::fabs(back[b * 32 + j] - x[b * 32 + j]) <= bound);
    }
  }
}

TEST_CASE("a block whose scale overflows f16 is reported, and quantize_dense names the tensor and row") {
  std::vector<float> x(64, 1.0f);
  x[40] = 1e7f;  // Q8_0: d = 1e7 / 127 > 65504
  std::vector<uint8_t> out(2 * 34);
  CHECK_FALSE(quantize_ggml(GgmlType::kQ8_0, x.data(), 64, out.data()));
  x[40] = 5e5f;  // fits Q8_0 (d 3937) but not Q4_0 (d 62500 fits; 6e5 / 8 = 75000 does not)
  CHECK(quantize_ggml(GgmlType::kQ8_0, x.data(), 64, out.data()));
  x[40] = 6e5f;
  CHECK_FALSE(quantize_ggml(GgmlType::kQ4_0, x.data(), 64, out.data()));

  std::vector<float> values(3 * 64, 0.25f);
  values[2 * 64 + 5] = 2e7f;
  const StoredMatrix m = StoredMatrix::from_f32(values, 3, 64);
  expect_error([&] { quantize_dense(m, GgmlType::kQ8_0, "model.layers.0.self_attn.q_proj.weight"); },
               ErrorCategory::kInvalidInput, {"model.layers.0.self_attn.q_proj.weight", "row 2", "Q8_0", "quant_dense"});
  expect_error([&] { quantize_ggml(GgmlType::kQ4_0, values.data(), 33, out.data()); }, ErrorCategory::kInvalidInput,
               {"33", "whole blocks"});
  expect_error([&] { quantize_ggml(GgmlType::kQ4_K, values.data(), 256, out.data()); }, ErrorCategory::kInvalidInput,
               {"Q4_K"});
}

TEST_CASE("quantize_dense quantises each row, and keeps GGML blocks and partial-block rows as they are") {
  const StoredMatrix m = random_matrix(5, 96, 3);
  const StoredMatrix q = quantize_dense(m, GgmlType::kQ4_0, "w");
  CHECK(q.shape.format == WeightFormat::kGgml);
  CHECK(q.shape.ggml_type == GgmlType::kQ4_0);
  CHECK(q.shape.rows == 5);
  CHECK(q.shape.cols == 96);
  REQUIRE(q.data.size() == 5 * 3 * 18);
  std::vector<uint8_t> row(3 * 18);
  for (int64_t r = 0; r < 5; ++r) {
    REQUIRE(quantize_ggml(GgmlType::kQ4_0, reinterpret_cast<const float*>(m.data.data()) + r * 96, 96, row.data()));
    CHECK(std::memcmp(row.data(), q.data.data() + r * 54, 54) == 0);
  }
  // Already GGML (a GGUF's own Q4_0): not quantised again.
  const StoredMatrix again = quantize_dense(q, GgmlType::kQ8_0, "w");
  CHECK(again.shape.ggml_type == GgmlType::kQ4_0);
  CHECK(again.data == q.data);
  // 40 columns are not whole blocks of 32: kept at the stored precision.
  const StoredMatrix partial = quantize_dense(random_matrix(2, 40, 4), GgmlType::kQ8_0, "w");
  CHECK(partial.shape.format == WeightFormat::kF32);
  CHECK(partial.shape.cols == 40);
}

TEST_CASE("parse_dense_quant takes q8_0, q4_0 and none, and names the key for anything else") {
  CHECK(parse_dense_quant("q8_0", "quant_dense") == GgmlType::kQ8_0);
  CHECK(parse_dense_quant("q4_0", "quant_dense") == GgmlType::kQ4_0);
  CHECK_FALSE(parse_dense_quant("none", "quant_dense").has_value());
  CHECK(dense_quant_name(GgmlType::kQ4_0) == "q4_0");
  CHECK(dense_quant_name(std::nullopt) == "none");
  expect_error([] { parse_dense_quant("Q8_0", "--quant-dense"); }, ErrorCategory::kInvalidInput,
               {"--quant-dense", "'Q8_0'", "q8_0, q4_0 or none"});
}
