// AVX2 kernels of dequantize_row (common/ggml_dequantize_detail.h) for the types models
// ship most: F16, Q8_0, Q4_0, the K-quants Q2_K .. Q6_K, MXFP4. Same bits as the
// portable functions of common/ggml_dequantize.cpp: the quants are widened to i32 and
// converted to f32 exactly, and each value is the same rounded multiply (and subtract) of
// the same f32 operands in the same order, eight lanes at a time; the per-block and
// per-sub-block scales are the same scalar f32 products as there. f16 scales are widened
// with F16C, exact for every finite and infinite f16; for a NaN scale the product is the
// same quiet NaN on both paths (tests/unit/test_ggml_dequantize.cpp checks Inf and NaN
// scales of every type here that has f16 scales). The per-block decoders live in
// common/ggml_decode_avx2.h, shared with the fused GGML GEMV of common/matmul_avx2.cpp:
// one set of instructions, so the GEMV widens every value to these very bits.
#include "common/ggml_dequantize_detail.h"

#include <immintrin.h>

#include <cstring>

#include "common/dtype.h"
#include "common/ggml_decode_avx2.h"

// Everything from here on is compiled for AVX2 + F16C, without FMA (the contract is a
// rounded multiply then a rounded add; see common/matmul_avx2.cpp, whose pattern this
// follows); dequantize_row calls it only when active_kernel_path() is kAvx2, which needs
// cpu_supports_avx2(). The standard headers above are parsed before the pragma, so none
// of their inline functions is compiled for AVX2.
#include "common/avx2_target_begin.inc"

namespace charm {
namespace {

using ggml_avx2::StoreSink;

/// F16 elements, eight at a time with F16C, the tail one by one (common/dtype.h).
/// vcvtph2ps quiets a signalling NaN (sets f32 bit 22); gguf-py (numpy) and f16_to_f32
/// keep it signalling, so that bit is cleared again in the lanes whose f16 was one
/// (exponent all ones, quiet bit 0x200 clear, rest of the mantissa nonzero).
bool f16(const uint8_t* src, float* dst, int64_t elements) {
  const __m256i exp_quiet = _mm256_set1_epi32(0x7E00), signalling_exp = _mm256_set1_epi32(0x7C00);
  const __m256i payload = _mm256_set1_epi32(0x01FF), zero = _mm256_setzero_si256();
  const __m256i f32_quiet = _mm256_set1_epi32(0x00400000);
  int64_t i = 0;
  for (; i + 8 <= elements; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    const __m256i f = _mm256_castps_si256(_mm256_cvtph_ps(h));
    const __m256i h32 = _mm256_cvtepu16_epi32(h);
    const __m256i snan = _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_and_si256(h32, payload), zero),
                                             _mm256_cmpeq_epi32(_mm256_and_si256(h32, exp_quiet), signalling_exp));
    const __m256i fixed = _mm256_andnot_si256(_mm256_and_si256(snan, f32_quiet), f);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(fixed));
  }
  for (; i < elements; ++i) {
    uint16_t bits;
    std::memcpy(&bits, src + 2 * i, 2);
    dst[i] = f16_to_f32(bits);
  }
  return true;
}

/// Widens every block of a row with block type T's decoder (common/ggml_decode_avx2.h,
/// shared with the fused GEMV of common/matmul_avx2.cpp) into dst.
template <class T>
bool run(const uint8_t* src, float* dst, int64_t elements) {
  for (int64_t i = 0; i < elements / T::kElements; ++i) {
    StoreSink sink{dst + i * T::kElements};
    ggml_avx2::decode_block<T>(src + i * T::kBytes, sink);
  }
  return true;
}

}  // namespace

bool dequantize_row_avx2(GgmlType type, const uint8_t* src, float* dst, int64_t elements) {
  switch (type) {
    case GgmlType::kF16: return f16(src, dst, elements);
    case GgmlType::kQ8_0: return run<ggml_avx2::Q8_0>(src, dst, elements);
    case GgmlType::kQ4_0: return run<ggml_avx2::Q4_0>(src, dst, elements);
    case GgmlType::kQ2_K: return run<ggml_avx2::Q2_K>(src, dst, elements);
    case GgmlType::kQ3_K: return run<ggml_avx2::Q3_K>(src, dst, elements);
    case GgmlType::kQ4_K: return run<ggml_avx2::Q4_K>(src, dst, elements);
    case GgmlType::kQ5_K: return run<ggml_avx2::Q5_K>(src, dst, elements);
    case GgmlType::kQ6_K: return run<ggml_avx2::Q6_K>(src, dst, elements);
    case GgmlType::kMXFP4: return run<ggml_avx2::MXFP4>(src, dst, elements);
    default: return false;  // the portable path serves the rest
  }
}

}  // namespace charm

#include "common/avx2_target_end.inc"
