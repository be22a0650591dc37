// common/weight_format.h's finiteness check (issue 12, item 7): a NaN or Inf element, or a
// scale that is not finite or makes value * scale overflow f32, is found and placed, in
// every stored form; finite matrices pass.
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/weight_format.h"

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
