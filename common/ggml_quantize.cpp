#include "common/ggml_quantize.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/dtype.h"
#include "common/error.h"

namespace charm {
namespace {

constexpr int64_t kBlock = 32;

/// The block's f16 scale bits at out[0..2); false when d overflows f16.
bool store_scale(float d, uint8_t* out) {
  const uint16_t bits = f32_to_f16(d);
  std::memcpy(out, &bits, 2);
  return (bits & 0x7C00u) != 0x7C00u;
}

/// 1 / d as ggml and gguf-py compute it (from the unrounded d), but 0 where that
/// overflows: a d below 2^-128 rounds to f16 zero, so the block is zero whatever its
/// quants, and an Inf would make them undefined.
float inverse(float d) {
  if (d == 0.0f) return 0.0f;
  const float id = 1.0f / d;
  return std::isinf(id) ? 0.0f : id;
}

/// quantize_row_q8_0_ref, one block: {f16 d; i8 q[32]}.
bool quantize_q8_0_block(const float* x, uint8_t* out) {
  float amax = 0.0f;
  for (int64_t j = 0; j < kBlock; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = inverse(d);
  for (int64_t j = 0; j < kBlock; ++j) out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
  return store_scale(d, out);
}

/// quantize_row_q4_0_ref, one block: {f16 d; u8 q[16]}, element j in the low nibble of
/// q[j], element j + 16 in the high one, each stored as q + 8.
bool quantize_q4_0_block(const float* x, uint8_t* out) {
  float amax = 0.0f, max = 0.0f;  // max: the first value of largest magnitude, signed
  for (int64_t j = 0; j < kBlock; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = inverse(d);
  auto quant = [id](float v) {
    const auto q = static_cast<int>(std::trunc(v * id + 8.5f));  // in [0, 16]: |v * id| <= 8
    return static_cast<uint8_t>(q < 15 ? q : 15);
  };
  for (int64_t j = 0; j < kBlock / 2; ++j) out[2 + j] = static_cast<uint8_t>(quant(x[j]) | quant(x[j + 16]) << 4);
  return store_scale(d, out);
}

}  // namespace

bool can_quantize_ggml(GgmlType type) { return type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0; }

bool quantize_ggml(GgmlType type, const float* x, int64_t n, uint8_t* out) {
  if (!can_quantize_ggml(type)) {
    fail_invalid(std::string("quantize_ggml: cannot quantise to ") + ggml_traits(type).name + " (only Q8_0, Q4_0)");
  }
  if (n % kBlock != 0) fail_invalid("quantize_ggml: " + std::to_string(n) + " values are not whole blocks of 32");
  const int64_t bytes = ggml_traits(type).block_bytes;
  bool ok = true;
  for (int64_t b = 0; b < n / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    ok &= type == GgmlType::kQ8_0 ? quantize_q8_0_block(xb, out + b * bytes) : quantize_q4_0_block(xb, out + b * bytes);
  }
  return ok;
}

std::optional<GgmlType> parse_dense_quant(std::string_view value, std::string_view what) {
  if (value == "q8_0") return GgmlType::kQ8_0;
  if (value == "q4_0") return GgmlType::kQ4_0;
  if (value == "none") return std::nullopt;
  fail_invalid(fmt::format("{}: expected q8_0, q4_0 or none, got '{}'", what, value));
}

std::string dense_quant_name(std::optional<GgmlType> type) {
  if (!type) return "none";
  return *type == GgmlType::kQ8_0 ? "q8_0" : "q4_0";
}

std::optional<uint64_t> dense_quant_row_bytes(GgmlType type, bool ggml_blocks, int64_t cols) {
  return ggml_blocks ? std::nullopt : ggml_row_bytes(type, cols);
}

StoredMatrix quantize_dense(StoredMatrix m, GgmlType type, const std::string& name) {
  const std::optional<uint64_t> row_bytes =
      dense_quant_row_bytes(type, m.shape.format == WeightFormat::kGgml, m.shape.cols);
  if (!row_bytes) return m;
  StoredMatrix q;
  q.shape.format = WeightFormat::kGgml;
  q.shape.ggml_type = type;
  q.shape.rows = m.shape.rows;
  q.shape.cols = m.shape.cols;
  q.data.resize(q.shape.data_bytes());
  std::vector<float> row(static_cast<size_t>(m.shape.cols));
  const MatrixView view = m.view();
  for (int64_t r = 0; r < m.shape.rows; ++r) {
    matrix_row_to_f32(view, r, row.data());
    if (!quantize_ggml(type, row.data(), m.shape.cols, q.data.data() + static_cast<uint64_t>(r) * *row_bytes)) {
      fail_invalid(fmt::format("quant_dense {}: tensor '{}' row {} has a weight too large for a {} block's f16 scale; "
                               "serve it without quant_dense",
                               dense_quant_name(type), name, r, ggml_traits(type).name));
    }
  }
  return q;
}

}  // namespace charm
