// Tests for common/dtype: the float8_e4m3fn decoder against torch's conversion of all 256
// codes (tests/fixtures/dtype/f8_e4m3fn.f32, scripts/gen_dtype_table.py) and against the
// format's definition computed here independently; names and sizes of every dtype.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "common/dtype.h"

using namespace charm;

namespace {

std::vector<float> torch_table() {
  std::ifstream in(std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/dtype/f8_e4m3fn.f32", std::ios::binary);
  REQUIRE(in.good());
  std::vector<float> table(256);
  in.read(reinterpret_cast<char*>(table.data()), 256 * sizeof(float));
  REQUIRE(in.gcount() == 256 * static_cast<std::streamsize>(sizeof(float)));
  return table;
}

/// The e4m3fn value of `code` from the definition: (-1)^S * 2^(E-7) * (1 + M/8) for
/// E > 0, (-1)^S * 2^-6 * M/8 for E == 0, NaN for E == 15 && M == 7 (no infinities).
double definition(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double magnitude = e == 0 ? std::pow(2.0, -6) * (m / 8.0) : std::pow(2.0, e - 7) * (1.0 + m / 8.0);
  return s ? -magnitude : magnitude;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("f8e4m3_to_f32 matches torch's float8_e4m3fn conversion on all 256 codes, bit for bit") {
  const std::vector<float> table = torch_table();
  int nans = 0;
  for (int code = 0; code < 256; ++code) {
    CAPTURE(code);
    const float got = f8e4m3_to_f32(static_cast<uint8_t>(code));
    if (std::isnan(table[code])) {
      CHECK(std::isnan(got));
      ++nans;
    } else {
      CHECK(same_bits(got, table[code]));  // also tells +0 from -0
    }
  }
  CHECK(nans == 2);  // 0x7f and 0xff only
}

TEST_CASE("f8e4m3_to_f32 follows the e4m3fn definition: subnormals, signed zero, 448 max, no infinity") {
  for (int code = 0; code < 256; ++code) {
    CAPTURE(code);
    const double want = definition(code);
    const float got = f8e4m3_to_f32(static_cast<uint8_t>(code));
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
    } else {
      CHECK(static_cast<double>(got) == want);
      CHECK(std::signbit(got) == (code >= 128));
      CHECK(std::isfinite(got));
    }
  }
  CHECK(f8e4m3_to_f32(0x7e) == 448.0f);
  CHECK(f8e4m3_to_f32(0x01) == std::ldexp(1.0f, -9));  // smallest subnormal
  CHECK(f8e4m3_to_f32(0x08) == std::ldexp(1.0f, -6));  // smallest normal
}

TEST_CASE("convert_to_f32 reads F8_E4M3 bytes; names and sizes round-trip for every dtype") {
  const uint8_t bytes[4] = {0x38, 0xb8, 0x00, 0x7e};  // 1, -1, 0, 448
  float out[4];
  convert_to_f32(DType::kF8E4M3, bytes, out, 4);
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == -1.0f);
  CHECK(out[2] == 0.0f);
  CHECK(out[3] == 448.0f);
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3}) {
    CHECK(parse_dtype(dtype_name(d)) == d);
  }
  CHECK(dtype_size(DType::kF8E4M3) == 1);
  CHECK_FALSE(parse_dtype("F8_E5M2").has_value());  // not read: would need its own decoder
}

TEST_CASE("first_non_finite agrees with std::isfinite on every 8- and 16-bit code, at any alignment and block edge") {
  // Every code of each dtype, once each, at an odd byte offset, then a single bad one
  // placed either side of the scan's 2048-element block boundary.
  for (DType d : {DType::kF16, DType::kBF16, DType::kF8E4M3}) {
    CAPTURE(dtype_name(d));
    const size_t width = dtype_size(d);
    const size_t codes = width == 1 ? 256 : 65536;
    for (size_t code = 0; code < codes; ++code) {
      uint8_t bytes[3] = {0xaa, static_cast<uint8_t>(code & 0xff), static_cast<uint8_t>(code >> 8)};
      float value;
      convert_to_f32(d, bytes + 1, &value, 1);
      if (first_non_finite(d, bytes + 1, 1) != (std::isfinite(value) ? 1u : 0u)) {
        FAIL_CHECK("code " << code << " of " << dtype_name(d) << " misjudged");
      }
    }
  }
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3}) {
    CAPTURE(dtype_name(d));
    const size_t width = dtype_size(d);
    for (size_t bad : {size_t{0}, size_t{2047}, size_t{2048}, size_t{4999}}) {
      CAPTURE(bad);
      std::vector<uint8_t> data(1 + 5000 * width, 0);  // zeros: finite in every dtype
      const uint32_t nan32 = 0x7fc00000u;
      const uint8_t* code = d == DType::kF32    ? reinterpret_cast<const uint8_t*>(&nan32)
                            : d == DType::kF16  ? reinterpret_cast<const uint8_t*>("\x00\x7c")  // +Inf
                            : d == DType::kBF16 ? reinterpret_cast<const uint8_t*>("\x80\xff")  // -Inf
                                                : reinterpret_cast<const uint8_t*>("\xff");     // NaN
      std::memcpy(data.data() + 1 + bad * width, code, width);
      CHECK(first_non_finite(d, data.data() + 1, 5000) == bad);
      CHECK(first_non_finite(d, data.data() + 1, bad) == bad);  // stops before it: all finite
    }
  }
  CHECK(non_finite_name(std::numeric_limits<float>::quiet_NaN()) == "NaN");
  CHECK(non_finite_name(-std::numeric_limits<float>::infinity()) == "-Inf");
}
