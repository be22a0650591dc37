// Random GGML block matrices for kernel tests (common/ggml_type.h's block layouts).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/ggml_type.h"
#include "common/matmul.h"

namespace charm::test {

/// A [rows, cols] matrix of GGML `type` blocks: random bytes, with every f16 (scale or
/// element) finite and MXFP4's exponent at most 2^71, so that no sum overflows; cols is
/// whole blocks. With `fixed_scale` (f16 bits, non-zero) every f16 block scale is that
/// value instead, so that chains of products (an expert's MLP) stay finite too.
inline StoredMatrix make_ggml_matrix(GgmlType type, int64_t rows, int64_t cols, uint32_t seed,
                                     uint16_t fixed_scale = 0) {
  std::mt19937 rng(seed);
  StoredMatrix m;
  m.shape = MatrixShape{WeightFormat::kGgml, rows, cols, 0};
  m.shape.ggml_type = type;
  m.data.resize(m.shape.data_bytes());
  for (uint8_t& b : m.data) b = static_cast<uint8_t>(rng());
  auto finite_f16 = [](uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    if ((bits & 0x7c00) == 0x7c00) bits &= 0xbfff;
    std::memcpy(p, &bits, 2);
  };
  const GgmlTypeTraits t = ggml_traits(type);
  for (size_t at = 0; at < m.data.size(); at += static_cast<size_t>(t.block_bytes)) {
    uint8_t* block = m.data.data() + at;
    if (type == GgmlType::kF32) {
      const float v = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
      std::memcpy(block, &v, 4);
    } else if (type == GgmlType::kF16) {
      finite_f16(block);
    } else if (type == GgmlType::kBF16) {
      const uint16_t bits = f32_to_bf16(std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng));
      std::memcpy(block, &bits, 2);
    } else if (type == GgmlType::kMXFP4) {
      block[0] = static_cast<uint8_t>(block[0] % 200);  // 2^-128 (subnormal) .. 2^71
    }
    for (int off : ggml_f16_scale_offsets(type)) {
      finite_f16(block + off);
      if (fixed_scale != 0) std::memcpy(block + off, &fixed_scale, 2);
    }
  }
  return m;
}

}  // namespace charm::test
