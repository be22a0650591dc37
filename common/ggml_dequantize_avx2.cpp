// AVX2 kernels of dequantize_row (common/ggml_dequantize_detail.h) for the types models
// ship most: F16, Q8_0, Q4_0, the K-quants Q2_K .. Q6_K, MXFP4. Same bits as the
// portable functions of common/ggml_dequantize.cpp: the quants are widened to i32 and
// converted to f32 exactly, and each value is the same rounded multiply (and subtract) of
// the same f32 operands in the same order, eight lanes at a time; the per-block and
// per-sub-block scales are the same scalar f32 products as there. f16 scales are widened
// with F16C, exact for every finite and infinite f16; for a NaN scale the product is the
// same quiet NaN on both paths (tests/unit/test_ggml_dequantize.cpp checks Inf and NaN
// scales of every type here that has f16 scales).
#include "common/ggml_dequantize_detail.h"

#include <immintrin.h>

#include <bit>
#include <cstring>

#include "common/dtype.h"

// Everything from here on is compiled for AVX2 + F16C, without FMA (the contract is a
// rounded multiply then a rounded add; see common/matmul_avx2.cpp, whose pattern this
// follows); dequantize_row calls it only when active_kernel_path() is kAvx2, which needs
// cpu_supports_avx2(). The standard headers above are parsed before the pragma, so none
// of their inline functions is compiled for AVX2.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#endif

namespace charm {
namespace {

float f16_scale(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)));
}

/// The 32 signed bytes of `v`, in order, as four vectors of eight f32 (exact).
struct Widened {
  __m256 f[4];
};
inline Widened widen_i8(__m256i v) {
  const __m128i lo = _mm256_castsi256_si128(v);
  const __m128i hi = _mm256_extracti128_si256(v, 1);
  return {{_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)),
           _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))),
           _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)),
           _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))}};
}

/// y[0..32) = d * q (Q8_0's order: gguf-py's x * d, the same product).
inline void store_scaled(float* y, __m256 d, const Widened& q) {
  for (int k = 0; k < 4; ++k) _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(d, q.f[k]));
}

void q8_0(const uint8_t* b, float* y) {
  const __m256 d = _mm256_set1_ps(f16_scale(b));
  store_scaled(y, d, widen_i8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2))));
}

/// Q4_0: y[j] = d * (lo(qs[j]) - 8), y[j + 16] = d * (hi(qs[j]) - 8).
void q4_0(const uint8_t* b, float* y) {
  const __m256 d = _mm256_set1_ps(f16_scale(b));
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(qs, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(qs, 4), mask);
  const __m256i q = _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8));
  store_scaled(y, d, widen_i8(q));
}

/// Q2_K: y = (d * sc) * q - (dmin * m) per sub-block of 16; elements 128 h + 32 k + l
/// are bits 2k..2k+1 of qs[32 h + l] (sub-blocks 8 h + 2 k and 8 h + 2 k + 1).
void q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const float d = f16_scale(b + 80);
  const float dmin = f16_scale(b + 82);
  float dl[16], ml[16];  // the same scalar products as the portable path
  for (int s = 0; s < 16; ++s) {
    dl[s] = d * static_cast<float>(scales[s] & 0x0F);
    ml[s] = dmin * static_cast<float>(scales[s] >> 4);
  }
  const __m256i mask = _mm256_set1_epi8(0x03);
  for (int h = 0; h < 2; ++h) {
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * h));
    for (int k = 0; k < 4; ++k) {
      const Widened q = widen_i8(_mm256_and_si256(_mm256_srl_epi16(bytes, _mm_cvtsi32_si128(2 * k)), mask));
      const int s = 8 * h + 2 * k;
      float* out = y + 128 * h + 32 * k;
      for (int v = 0; v < 4; ++v) {
        const __m256 d1 = _mm256_set1_ps(dl[s + v / 2]), m1 = _mm256_set1_ps(ml[s + v / 2]);
        _mm256_storeu_ps(out + 8 * v, _mm256_sub_ps(_mm256_mul_ps(d1, q.f[v]), m1));
      }
    }
  }
}

/// Q3_K: y = (d * (sc - 32)) * q per sub-block of 16, q = the 2 bits of Q2_K's place
/// minus 4 where bit 4 h + k of hmask[l] is clear.
void q3_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b + 96;
  const float d = f16_scale(b + 108);
  float dl[16];  // the same scalar products as the portable path
  for (int s = 0; s < 16; ++s) {
    const int low = (scales[s % 8] >> (4 * (s / 8))) & 0x0F;
    const int high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    dl[s] = d * static_cast<float>((low | (high << 4)) - 32);
  }
  const __m256i hmask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  const __m256i mask = _mm256_set1_epi8(0x03), one = _mm256_set1_epi8(1);
  for (int h = 0; h < 2; ++h) {
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32 + 32 * h));
    for (int k = 0; k < 4; ++k) {
      const __m256i q2 = _mm256_and_si256(_mm256_srl_epi16(bytes, _mm_cvtsi32_si128(2 * k)), mask);
      const __m256i hbit = _mm256_and_si256(_mm256_srl_epi16(hmask, _mm_cvtsi32_si128(4 * h + k)), one);
      // 4 where the bit is clear: (hbit ^ 1) << 2 <= 4, so 16-bit shifts keep bytes apart.
      const __m256i offset = _mm256_slli_epi16(_mm256_xor_si256(hbit, one), 2);
      const Widened q = widen_i8(_mm256_sub_epi8(q2, offset));
      const int s = 8 * h + 2 * k;
      float* out = y + 128 * h + 32 * k;
      for (int v = 0; v < 4; ++v) _mm256_storeu_ps(out + 8 * v, _mm256_mul_ps(_mm256_set1_ps(dl[s + v / 2]), q.f[v]));
    }
  }
}

/// Q4_K: y = (d * sc) * q - (dmin * m) per sub-block of 32; sub-blocks 2p and 2p + 1 are
/// the low and high nibbles of qs[32 p .. 32 p + 32).
void q4_k(const uint8_t* b, float* y) {
  const float d = f16_scale(b);
  const float dmin = f16_scale(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  float d1[8], m1[8];  // the same scalar products as the portable path
  for (int s = 0; s < 8; ++s) {
    const ScaleMin sm = get_scale_min_k4(s, scales);
    d1[s] = d * static_cast<float>(sm.scale);
    m1[s] = dmin * static_cast<float>(sm.min);
  }
  const __m256i mask = _mm256_set1_epi8(0x0F);
  for (int p = 0; p < 4; ++p) {
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * p));
    const Widened lo = widen_i8(_mm256_and_si256(bytes, mask));
    const Widened hi = widen_i8(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask));
    const __m256 dlo = _mm256_set1_ps(d1[2 * p]), mlo = _mm256_set1_ps(m1[2 * p]);
    const __m256 dhi = _mm256_set1_ps(d1[2 * p + 1]), mhi = _mm256_set1_ps(m1[2 * p + 1]);
    for (int k = 0; k < 4; ++k) {
      _mm256_storeu_ps(y + 64 * p + 8 * k, _mm256_sub_ps(_mm256_mul_ps(dlo, lo.f[k]), mlo));
      _mm256_storeu_ps(y + 64 * p + 32 + 8 * k, _mm256_sub_ps(_mm256_mul_ps(dhi, hi.f[k]), mhi));
    }
  }
}

/// Q5_K: as Q4_K with a fifth bit, bit s of qh[l] for element 32 s + l.
void q5_k(const uint8_t* b, float* y) {
  const float d = f16_scale(b);
  const float dmin = f16_scale(b + 2);
  const uint8_t* scales = b + 4;
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
  const uint8_t* qs = b + 48;
  const __m256i mask = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  for (int s = 0; s < 8; ++s) {
    const ScaleMin sm = get_scale_min_k4(s, scales);
    const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(sm.scale));
    const __m256 m1 = _mm256_set1_ps(dmin * static_cast<float>(sm.min));
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (s / 2)));
    const __m256i low = _mm256_and_si256(_mm256_srl_epi16(bytes, _mm_cvtsi32_si128(4 * (s % 2))), mask);
    const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(s)), one);
    // bit <= 1, so shifting 16-bit lanes left by 4 keeps every byte to itself.
    const Widened q = widen_i8(_mm256_or_si256(low, _mm256_slli_epi16(bit, 4)));
    for (int k = 0; k < 4; ++k) {
      _mm256_storeu_ps(y + 32 * s + 8 * k, _mm256_sub_ps(_mm256_mul_ps(d1, q.f[k]), m1));
    }
  }
}

/// MXFP4: y = kvalues[nibble] * d (the portable path's order), d = 2^(e - 128) as there;
/// the nibbles are looked up in the 16-entry table with pshufb.
void mxfp4(const uint8_t* b, float* y) {
  const uint32_t e = b[0];
  const __m256 d = _mm256_set1_ps(std::bit_cast<float>(e < 2 ? 0x00200000u << e : (e - 1) << 23));
  const __m128i table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 1));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(qs, mask));
  const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(qs, 4), mask));
  const Widened q = widen_i8(_mm256_set_m128i(hi, lo));
  for (int k = 0; k < 4; ++k) _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(q.f[k], d));
}

/// Q6_K: y = (d * sc[e / 16]) * (q - 32). For half h and chunk c < 4 of 32 values:
/// low 4 bits = nibble c / 2 of ql[64 h + 32 (c % 2) + l], high 2 bits = bits 2c..2c+1 of
/// qh[32 h + l].
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_scale(b + 208);
  const __m256i mask4 = _mm256_set1_epi8(0x0F);
  const __m256i mask2 = _mm256_set1_epi8(0x03);
  for (int h = 0; h < 2; ++h) {
    const __m256i high_bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
    for (int c = 0; c < 4; ++c) {
      const __m256i low_bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h + 32 * (c % 2)));
      const __m256i low = _mm256_and_si256(_mm256_srl_epi16(low_bytes, _mm_cvtsi32_si128(4 * (c / 2))), mask4);
      const __m256i high = _mm256_and_si256(_mm256_srl_epi16(high_bytes, _mm_cvtsi32_si128(2 * c)), mask2);
      // high <= 3, so shifting 16-bit lanes left by 4 keeps every byte to itself.
      const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32));
      const Widened w = widen_i8(q);
      const int e = 128 * h + 32 * c;
      const __m256 d0 = _mm256_set1_ps(d * static_cast<float>(scales[e / 16]));
      const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(scales[e / 16 + 1]));
      _mm256_storeu_ps(y + e, _mm256_mul_ps(d0, w.f[0]));
      _mm256_storeu_ps(y + e + 8, _mm256_mul_ps(d0, w.f[1]));
      _mm256_storeu_ps(y + e + 16, _mm256_mul_ps(d1, w.f[2]));
      _mm256_storeu_ps(y + e + 24, _mm256_mul_ps(d1, w.f[3]));
    }
  }
}

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

template <void (*Fn)(const uint8_t*, float*)>
bool run(GgmlType type, const uint8_t* src, float* dst, int64_t elements) {
  const GgmlTypeTraits t = ggml_traits(type);
  for (int64_t i = 0; i < elements / t.block_elements; ++i) Fn(src + i * t.block_bytes, dst + i * t.block_elements);
  return true;
}

}  // namespace

bool dequantize_row_avx2(GgmlType type, const uint8_t* src, float* dst, int64_t elements) {
  switch (type) {
    case GgmlType::kF16: return f16(src, dst, elements);
    case GgmlType::kQ8_0: return run<q8_0>(type, src, dst, elements);
    case GgmlType::kQ4_0: return run<q4_0>(type, src, dst, elements);
    case GgmlType::kQ2_K: return run<q2_k>(type, src, dst, elements);
    case GgmlType::kQ3_K: return run<q3_k>(type, src, dst, elements);
    case GgmlType::kQ4_K: return run<q4_k>(type, src, dst, elements);
    case GgmlType::kQ5_K: return run<q5_k>(type, src, dst, elements);
    case GgmlType::kQ6_K: return run<q6_k>(type, src, dst, elements);
    case GgmlType::kMXFP4: return run<mxfp4>(type, src, dst, elements);
    default: return false;  // the portable path serves the rest
  }
}

}  // namespace charm

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
