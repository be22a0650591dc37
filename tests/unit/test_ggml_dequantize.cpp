// Tests for dequantize_row (common/ggml_type.h, common/ggml_dequantize.cpp): every GGML
// type charm reads against gguf-py's gguf.quants.dequantize of the same blocks, bit for
// bit (tests/fixtures/ggml_quants/, written by scripts/gen_ggml_quant_cases.py: edge
// blocks, blocks from gguf.quants.quantize, random blocks), on the portable and the AVX2
// path, as one call over all blocks and as rows of several blocks; F32 / F16 / BF16 also
// against common/dtype.h's convert_to_f32; whole-block sizes are enforced.
#include <doctest/doctest.h>

#include <cstring>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/ggml_type.h"
#include "common/matmul.h"
#include "tests/support/expect_error.h"
#include "tests/support/kernel_paths.h"

using namespace charm;

namespace {

using charm::test::PathGuard;
using charm::test::paths_to_check;

const GgmlType kTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0, GgmlType::kQ4_1,
                           GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K,
                           GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kMXFP4};

std::vector<uint8_t> read_fixture(const std::string& name) {
  const auto path = std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/ggml_quants" / name;
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// One type's fixture: the blocks and gguf-py's values for them.
struct Case {
  GgmlTypeTraits traits;
  std::vector<uint8_t> blocks;
  std::vector<float> expected;
  int64_t block_count() const { return static_cast<int64_t>(blocks.size()) / traits.block_bytes; }
};

Case load_case(GgmlType type) {
  Case c{ggml_traits(type), read_fixture(std::string(ggml_traits(type).name) + ".blocks"), {}};
  const std::vector<uint8_t> f32 = read_fixture(std::string(c.traits.name) + ".f32");
  REQUIRE(c.blocks.size() % static_cast<size_t>(c.traits.block_bytes) == 0);
  REQUIRE(c.block_count() > 0);
  REQUIRE(f32.size() == static_cast<size_t>(c.block_count() * c.traits.block_elements) * sizeof(float));
  c.expected.resize(f32.size() / sizeof(float));
  std::memcpy(c.expected.data(), f32.data(), f32.size());
  return c;
}

std::string bits_of(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  std::ostringstream s;
  s << v << " (0x" << std::hex << u << ")";
  return s.str();
}

/// Fails with the first differing index and both values when `got` and `want` differ in
/// any bit.
void check_same_bits(const float* got, const float* want, size_t count, const std::string& what) {
  if (std::memcmp(got, want, count * sizeof(float)) == 0) return;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(got + i, want + i, sizeof(float)) != 0) {
      FAIL_CHECK(what << ": element " << i << " is " << bits_of(got[i]) << ", gguf-py gives " << bits_of(want[i]));
      return;
    }
  }
}

}  // namespace

TEST_CASE("dequantize_row equals gguf-py's gguf.quants.dequantize bit for bit, every type, both paths") {
  PathGuard guard;
  for (KernelPath path : paths_to_check()) {
    set_kernel_path(path);
    for (GgmlType type : kTypes) {
      const Case c = load_case(type);
      const std::string what = std::string(c.traits.name) + " on the " + kernel_path_name(path) + " path";
      CAPTURE(what);
      // NaN-filled, so an element the dequantiser skips cannot pass by chance.
      std::vector<float> got(c.expected.size(), std::numeric_limits<float>::quiet_NaN());
      dequantize_row(type, c.blocks.data(), got.data(), static_cast<int64_t>(got.size()));
      check_same_bits(got.data(), c.expected.data(), got.size(), what + ", all blocks in one call");
    }
  }
}

TEST_CASE("dequantize_row row by row: rows of several blocks, at odd source addresses") {
  PathGuard guard;
  for (KernelPath path : paths_to_check()) {
    set_kernel_path(path);
    for (GgmlType type : kTypes) {
      const Case c = load_case(type);
      for (int64_t row_blocks : {1, 3, 7}) {
        const std::string what = std::string(c.traits.name) + " on the " + kernel_path_name(path) + " path, rows of " +
                                 std::to_string(row_blocks) + " blocks";
        CAPTURE(what);
        const int64_t row_elements = row_blocks * c.traits.block_elements;
        const size_t row_bytes = static_cast<size_t>(row_blocks * c.traits.block_bytes);
        // One spare byte in front: the row starts at an odd address (GGUF rows need not be
        // aligned to anything).
        std::vector<uint8_t> unaligned(row_bytes + 1);
        std::vector<float> got(static_cast<size_t>(row_elements));
        for (int64_t r = 0; r + row_blocks <= c.block_count(); r += row_blocks) {
          std::memcpy(unaligned.data() + 1, c.blocks.data() + r * c.traits.block_bytes, row_bytes);
          std::fill(got.begin(), got.end(), std::numeric_limits<float>::quiet_NaN());
          dequantize_row(type, unaligned.data() + 1, got.data(), row_elements);
          check_same_bits(got.data(), c.expected.data() + r * c.traits.block_elements, got.size(),
                          what + ", row at block " + std::to_string(r));
        }
      }
    }
  }
}

TEST_CASE("F32, F16 and BF16 agree with common/dtype.h's convert_to_f32") {
  const std::pair<GgmlType, DType> pairs[] = {
      {GgmlType::kF32, DType::kF32}, {GgmlType::kF16, DType::kF16}, {GgmlType::kBF16, DType::kBF16}};
  for (const auto& [type, dtype] : pairs) {
    const Case c = load_case(type);
    std::vector<float> got(c.expected.size()), want(c.expected.size());
    dequantize_row(type, c.blocks.data(), got.data(), static_cast<int64_t>(got.size()));
    convert_to_f32(dtype, c.blocks.data(), want.data(), want.size());
    check_same_bits(got.data(), want.data(), got.size(), std::string(c.traits.name) + " against convert_to_f32");
  }
}

TEST_CASE("dequantize_row refuses a count that is not whole blocks, and zero elements write nothing") {
  const std::vector<uint8_t> block(256, 0);
  std::vector<float> out(512, 1.0f);
  test::expect_error([&] { dequantize_row(GgmlType::kQ4_K, block.data(), out.data(), 255); },
                     ErrorCategory::kInvalidInput, {"255", "Q4_K", "256"});
  test::expect_error([&] { dequantize_row(GgmlType::kQ8_0, block.data(), out.data(), 33); },
                     ErrorCategory::kInvalidInput, {"33", "Q8_0", "32"});
  dequantize_row(GgmlType::kQ4_0, block.data(), out.data(), 0);
  CHECK(out[0] == 1.0f);
}

TEST_CASE("the AVX2 path equals the portable one when a scale is Inf or NaN (not in gguf-py's fixtures)") {
  if (!cpu_supports_avx2()) {
    MESSAGE("this CPU lacks avx2/fma/f16c: the AVX2 path was NOT checked");
    return;
  }
  PathGuard guard;
  // Byte offsets of the f16 scales (ggml-common.h): Q8_0/Q4_0 d; Q2_K d, dmin; Q3_K d;
  // Q4_K/Q5_K d, dmin; Q6_K d.
  // (MXFP4's e8m0 scale has no Inf/NaN code in ggml's reading; F16 elements are in the
  // fixtures, NaNs included.)
  const std::pair<GgmlType, std::vector<int>> fields[] = {{GgmlType::kQ8_0, {0}},    {GgmlType::kQ4_0, {0}},
                                                          {GgmlType::kQ2_K, {80, 82}}, {GgmlType::kQ3_K, {108}},
                                                          {GgmlType::kQ4_K, {0, 2}}, {GgmlType::kQ5_K, {0, 2}},
                                                          {GgmlType::kQ6_K, {208}}};
  for (const auto& [type, offsets] : fields) {
    const Case c = load_case(type);
    for (uint16_t special : {0x7C00, 0xFC00, 0x7C01, 0xFE00, 0x7FFF}) {
      for (int off : offsets) {
        std::vector<uint8_t> blocks = c.blocks;
        for (int64_t i = 0; i < c.block_count(); ++i) {
          std::memcpy(blocks.data() + i * c.traits.block_bytes + off, &special, 2);
        }
        std::vector<float> portable(c.expected.size()), avx2(c.expected.size());
        set_kernel_path(KernelPath::kPortable);
        dequantize_row(type, blocks.data(), portable.data(), static_cast<int64_t>(portable.size()));
        set_kernel_path(KernelPath::kAvx2);
        dequantize_row(type, blocks.data(), avx2.data(), static_cast<int64_t>(avx2.size()));
        std::ostringstream what;
        what << c.traits.name << " with the f16 at byte " << off << " = 0x" << std::hex << special
             << ", AVX2 vs portable";
        check_same_bits(avx2.data(), portable.data(), avx2.size(), what.str());
      }
    }
  }
}

TEST_CASE("ggml_f16_scale_offsets names each block's f16 scales: zeroing them zeroes the block") {
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                        GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    CAPTURE(std::string(ggml_traits(type).name));
    const GgmlTypeTraits t = ggml_traits(type);
    std::vector<uint8_t> block(static_cast<size_t>(t.block_bytes));
    for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<uint8_t>(37 * i + 11);
    const std::vector<int> offsets = ggml_f16_scale_offsets(type);
    REQUIRE_FALSE(offsets.empty());
    for (int off : offsets) {
      REQUIRE(off + 2 <= t.block_bytes);
      block[static_cast<size_t>(off)] = 0x00;
      block[static_cast<size_t>(off) + 1] = 0x3C;  // f16 1.0: the block is not all zeros yet
    }
    std::vector<float> out(static_cast<size_t>(t.block_elements));
    dequantize_row(type, block.data(), out.data(), t.block_elements);
    CHECK(std::any_of(out.begin(), out.end(), [](float v) { return v != 0.0f; }));
    for (int off : offsets) block[static_cast<size_t>(off)] = block[static_cast<size_t>(off) + 1] = 0;
    dequantize_row(type, block.data(), out.data(), t.block_elements);
    CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; }));
  }
  CHECK(ggml_f16_scale_offsets(GgmlType::kMXFP4).empty());  // its scale is an e8m0 byte
  CHECK(ggml_f16_scale_offsets(GgmlType::kF16).empty());
}
