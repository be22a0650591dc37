// common/weight_format.h's finiteness check (issue 12, item 7): a NaN or Inf element, or a
// scale that is not finite or makes value * scale overflow f32, is found and placed, in
// every stored form (GGML blocks too, at the first value dequantising finds); finite
// matrices pass.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "common/ggml_type.h"
#include "common/weight_format.h"
#include "tests/support/ggml_matrix.h"

using namespace charm;

namespace {
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

/// A [3, 8] matrix of `format` (int forms: group 4; fp8: blocks [2, 4]) holding finite
/// values, with its scales set to 0.5.
StoredMatrix finite_matrix(WeightFormat format) {
  StoredMatrix m;
  m.shape = MatrixShape{format, 3, 8, is_quantized(format) ? 4 : 0, format == WeightFormat::kF8E4M3Block ? 2 : 0,
                        format == WeightFormat::kF8E4M3Block ? 4 : 0};
  m.data.assign(m.shape.data_bytes(), 0x11);  // finite in every form
  m.scales.assign(m.shape.scale_bytes() / sizeof(float), 0.5f);
  return m;
}
}  // namespace

TEST_CASE("find_non_finite places a NaN or Inf element of a float form") {
  for (WeightFormat f : {WeightFormat::kF32, WeightFormat::kF16, WeightFormat::kBF16, WeightFormat::kF8E4M3Block}) {
    CAPTURE(weight_format_name(f));
    StoredMatrix m = finite_matrix(f);
    CHECK_FALSE(find_non_finite(m.view()).has_value());
    const size_t width = f == WeightFormat::kF32 ? 4 : f == WeightFormat::kF8E4M3Block ? 1 : 2;
    const size_t at = (2 * 8 + 5) * width;  // [2, 5]
    if (f == WeightFormat::kF32) std::memcpy(m.data.data() + at, &kInf, 4);
    if (f == WeightFormat::kF16) std::memcpy(m.data.data() + at, "\x00\x7c", 2);
    if (f == WeightFormat::kBF16) std::memcpy(m.data.data() + at, "\xc0\x7f", 2);
    if (f == WeightFormat::kF8E4M3Block) m.data[at] = 0xff;
    const auto bad = find_non_finite(m.view());
    REQUIRE(bad.has_value());
    CHECK_FALSE(bad->in_scales);
    CHECK(bad->row == 2);
    CHECK(bad->col == 5);
    CHECK(bad->describe(m.shape).find(" at [2, 5]") != std::string::npos);
  }
}

TEST_CASE("find_non_finite refuses scales that are not finite or make value * scale overflow") {
  for (WeightFormat f : {WeightFormat::kInt8, WeightFormat::kInt4, WeightFormat::kF8E4M3Block}) {
    CAPTURE(weight_format_name(f));
    for (float scale : {kNaN, -kInf, max_finite_scale(f) * 2.0f}) {
      CAPTURE(scale);
      StoredMatrix m = finite_matrix(f);
      m.scales.back() = scale;  // int: [2, 1] of [3, 2]; fp8: [1, 1] of [2, 2]
      const auto bad = find_non_finite(m.view());
      REQUIRE(bad.has_value());
      CHECK(bad->in_scales);
      CHECK(bad->row == (f == WeightFormat::kF8E4M3Block ? 1 : 2));
      CHECK(bad->col == 1);
      CHECK(bad->describe(m.shape).find("scale grid") != std::string::npos);
    }
    StoredMatrix edge = finite_matrix(f);
    edge.scales[0] = -max_finite_scale(f);  // the largest allowed magnitude
    CHECK_FALSE(find_non_finite(edge.view()).has_value());
  }
  CHECK(max_finite_scale(WeightFormat::kF8E4M3Block) * 448.0f <= FLT_MAX);
  CHECK(max_finite_scale(WeightFormat::kInt8) * 128.0f <= FLT_MAX);
  CHECK(max_finite_scale(WeightFormat::kInt4) * 8.0f <= FLT_MAX);
  CHECK(std::isinf(max_finite_scale(WeightFormat::kBF16)));
}

namespace {
/// The first non-finite value of a GGML matrix found the slow way: every row dequantised.
std::optional<std::pair<int64_t, int64_t>> first_non_finite_dequantised(const MatrixView& m) {
  std::vector<float> row(static_cast<size_t>(m.shape.cols));
  for (int64_t r = 0; r < m.shape.rows; ++r) {
    matrix_row_to_f32(m, r, row.data());
    for (size_t c = 0; c < row.size(); ++c) {
      if (!std::isfinite(row[c])) return std::pair{r, static_cast<int64_t>(c)};
    }
  }
  return std::nullopt;
}

const GgmlType kGgmlTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0,
                               GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ2_K, GgmlType::kQ3_K,
                               GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kMXFP4};
}  // namespace

TEST_CASE("find_non_finite of GGML blocks: every value finite at the largest finite f16 scales and quants") {
  // The scan reads only the f16 scales of quantised blocks; this is the bound it rests on.
  for (GgmlType type : kGgmlTypes) {
    if (ggml_f16_scale_offsets(type).empty()) continue;
    CAPTURE(ggml_traits(type).name);
    for (uint16_t scale : {uint16_t{0x7BFF}, uint16_t{0xFBFF}}) {  // +-65504
      for (uint8_t fill : {uint8_t{0x00}, uint8_t{0xFF}, uint8_t{0x80}, uint8_t{0x7F}}) {
        StoredMatrix m = test::make_ggml_matrix(type, 2, 512, 1, scale);
        const int64_t block_bytes = ggml_traits(type).block_bytes;
        const std::vector<int> offsets = ggml_f16_scale_offsets(type);
        for (size_t at = 0; at < m.data.size(); at += static_cast<size_t>(block_bytes)) {
          for (int64_t k = 0; k < block_bytes; ++k) {
            if (std::find(offsets.begin(), offsets.end(), k) != offsets.end()) ++k;  // both bytes of the f16
            else m.data[at + static_cast<size_t>(k)] = fill;
          }
        }
        CHECK_FALSE(first_non_finite_dequantised(m.view()).has_value());
        CHECK_FALSE(find_non_finite(m.view()).has_value());
      }
    }
  }
}

TEST_CASE("find_non_finite places a GGML matrix's first non-finite value where dequantising finds it") {
  for (GgmlType type : kGgmlTypes) {
    CAPTURE(ggml_traits(type).name);
    const GgmlTypeTraits t = ggml_traits(type);
    const int64_t cols = 2 * 256;
    for (uint32_t seed = 1; seed <= 4; ++seed) {
      StoredMatrix m = test::make_ggml_matrix(type, 4, cols, seed);
      CHECK_FALSE(find_non_finite(m.view()).has_value());
      // Poison block 1 of row 2 (or, for a one-element type, element 2 * cols + 5): its
      // first f16 scale, its last, or (MXFP4) its exponent, NaN or Inf.
      const uint64_t row2 = 2 * (m.shape.data_bytes() / 4);
      const std::vector<int> offsets = ggml_f16_scale_offsets(type);
      const bool nan = seed % 2 == 1;
      if (t.block_elements == 1) {
        const size_t at = row2 + 5 * static_cast<size_t>(t.block_bytes);
        if (type == GgmlType::kF32) std::memcpy(m.data.data() + at, nan ? &kNaN : &kInf, 4);
        else if (type == GgmlType::kF16) std::memcpy(m.data.data() + at, nan ? "\x01\x7e" : "\x00\xfc", 2);
        else std::memcpy(m.data.data() + at, nan ? "\xc0\x7f" : "\x80\xff", 2);
      } else if (offsets.empty()) {  // MXFP4: 2^127 times any non-zero value overflows
        m.data[row2 + static_cast<size_t>(t.block_bytes)] = 0xFF;
        m.data[row2 + static_cast<size_t>(t.block_bytes) + 1] = 0x77;  // values 7 (12) and 7 (12)
      } else {
        const int off = seed <= 2 ? offsets.front() : offsets.back();
        std::memcpy(m.data.data() + row2 + static_cast<size_t>(t.block_bytes + off), nan ? "\x01\x7e" : "\x00\xfc", 2);
      }
      const auto expected = first_non_finite_dequantised(m.view());
      REQUIRE(expected.has_value());
      CHECK(expected->first == 2);
      const auto bad = find_non_finite(m.view());
      REQUIRE(bad.has_value());
      CHECK_FALSE(bad->in_scales);
      CHECK(bad->row == expected->first);
      CHECK(bad->col == expected->second);
      CHECK_FALSE(std::isfinite(bad->value));
    }
  }
}
