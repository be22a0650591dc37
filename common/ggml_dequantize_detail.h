// Internal to common/ggml_dequantize.cpp and common/ggml_dequantize_avx2.cpp: the
// K-quant scale unpacking both share, and the AVX2 entry point.
#pragma once

#include <cstdint>

#include "common/ggml_type.h"

namespace charm {

/// The 6-bit scale and min of sub-block j (< 8) of a Q4_K / Q5_K super-block, unpacked
/// from its 12 scale bytes `q` (ggml-quants.c get_scale_min_k4; gguf-py Q4_K.get_scale_min):
/// j < 4: scale = q[j] & 63, min = q[j + 4] & 63; j >= 4: the low 4 bits from nibbles of
/// q[j + 4], the high 2 from the top bits of q[j - 4] (scale) and q[j] (min).
struct ScaleMin {
  uint8_t scale;
  uint8_t min;
};
/// (Inline so the AVX2 kernels need no call per sub-block; defined before their target
/// pragma, so it is never compiled for AVX2.)
inline ScaleMin get_scale_min_k4(int j, const uint8_t* q) {
  if (j < 4) return {static_cast<uint8_t>(q[j] & 63), static_cast<uint8_t>(q[j + 4] & 63)};
  return {static_cast<uint8_t>((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4)),
          static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4))};
}

/// The scale of sub-block s (< 16) of a Q3_K super-block from its 12 scale bytes `q`,
/// minus 32 (-32..31): the low 4 bits are nibble s / 8 of q[s % 8], the high 2 bits bits
/// 2 (s / 4)..+1 of q[8 + s % 4] (ggml-quants.c dequantize_row_q3_K's kmask1 / kmask2).
inline int q3_k_scale(int s, const uint8_t* q) {
  const int low = (q[s % 8] >> (4 * (s / 8))) & 0x0F;
  const int high = (q[8 + s % 4] >> (2 * (s / 4))) & 3;
  return (low | (high << 4)) - 32;
}

/// MXFP4's block scale: half the e8m0 value, 2^(e - 128) as f32 (its kvalues are twice the
/// e2m1 values); e = 0 and 1 are the f32 subnormals 2^-128, 2^-127, and e = 255 is 2^127,
/// not NaN (ggml's ggml_e8m0_to_fp32_half). Exact.
inline float e8m0_half_to_f32(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t{e} - 1) << 23;
  float d;
  __builtin_memcpy(&d, &bits, sizeof d);
  return d;
}

/// MXFP4's 16 values of a nibble (ggml's kvalues_mxfp4): twice the e2m1 values.
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/// dequantize_row's plain C++ path: the reference semantics (the AVX2 one matches it).
/// Requires elements % block_elements == 0.
void dequantize_row_portable(GgmlType type, const void* src, float* dst, int64_t elements);

/// dequantize_row with AVX2 + F16C for the types that have a kernel (F16, Q8_0, Q4_0,
/// Q2_K .. Q6_K, MXFP4): returns false, writing nothing, for any other type. Same
/// bits as the portable path. Requires cpu_supports_avx2() and whole blocks.
bool dequantize_row_avx2(GgmlType type, const uint8_t* src, float* dst, int64_t elements);

}  // namespace charm
