// Internal to common/ggml_dequantize_avx2.cpp and common/matmul_avx2.cpp: the AVX2
// decoders of one GGML block each, shared so that dequantize_row's AVX2 path and the
// fused GEMV of matmul widen every value with the very same instructions (hence the same
// bits; those equal the portable dequantisers', see common/ggml_dequantize.cpp on why
// every product there is exact).
//
// A decoder `decode_<type>(block, sink)` calls sink(j, v) for j = 0, 1, ..,
// block_elements / 8 - 1 in ascending order, v being elements [8 j, 8 j + 8) of the
// block as f32. The ascending order matters to a sink that accumulates (GEMV: each lane
// of dot's accumulators sums its columns in column order); a storing sink ignores it.
//
// Compiled for AVX2 + F16C by the target pragma below (without FMA: see
// common/matmul_avx2.cpp); call only when cpu_supports_avx2(). Everything is in an
// unnamed namespace, so each including file has its own copy and no AVX2 function can be
// picked by the linker for a portable caller. The standard headers are included before
// the pragma, so none of their inline functions is compiled for AVX2.
#pragma once

#include <immintrin.h>

#include <bit>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "common/ggml_dequantize_detail.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#endif

namespace charm {
namespace {
namespace ggml_avx2 {

/// The f16 at `p` as f32 (F16C: exact for every finite and infinite f16).
inline float f16_scale(const uint8_t* p) {
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

inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

/// Q8_0 {f16 d; i8 qs[32]}: d * q (gguf-py's x * d, the same product).
template <class Sink>
inline void decode_q8_0(const uint8_t* b, Sink& sink) {
  const __m256 d = _mm256_set1_ps(f16_scale(b));
  const Widened q = widen_i8(load256(b + 2));
  for (int k = 0; k < 4; ++k) sink(k, _mm256_mul_ps(d, q.f[k]));
}

/// Q4_0 {f16 d; u8 qs[16]}: element j = d * (lo(qs[j]) - 8), j + 16 = d * (hi(qs[j]) - 8).
template <class Sink>
inline void decode_q4_0(const uint8_t* b, Sink& sink) {
  const __m256 d = _mm256_set1_ps(f16_scale(b));
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(qs, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(qs, 4), mask);
  const Widened q = widen_i8(_mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8)));
  for (int k = 0; k < 4; ++k) sink(k, _mm256_mul_ps(d, q.f[k]));
}

/// MXFP4 {u8 e (e8m0); u8 qs[16]}: kvalues[nibble] * d (the portable path's order),
/// d = 2^(e - 128) as there; the nibbles are looked up in the 16-entry table with pshufb.
template <class Sink>
inline void decode_mxfp4(const uint8_t* b, Sink& sink) {
  const uint32_t e = b[0];
  const __m256 d = _mm256_set1_ps(std::bit_cast<float>(e < 2 ? 0x00200000u << e : (e - 1) << 23));
  const __m128i table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 1));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(qs, mask));
  const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(qs, 4), mask));
  const Widened q = widen_i8(_mm256_set_m128i(hi, lo));
  for (int k = 0; k < 4; ++k) sink(k, _mm256_mul_ps(q.f[k], d));
}

/// Q2_K {u8 scales[16]; u8 qs[64]; f16 d, dmin}: (d * sc) * q - (dmin * m) per sub-block
/// of 16; elements 128 h + 32 k + l are bits 2k..2k+1 of qs[32 h + l].
template <class Sink>
inline void decode_q2_k(const uint8_t* b, Sink& sink) {
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
    const __m256i bytes = load256(b + 16 + 32 * h);
    for (int k = 0; k < 4; ++k) {
      const Widened q = widen_i8(_mm256_and_si256(_mm256_srl_epi16(bytes, _mm_cvtsi32_si128(2 * k)), mask));
      const int s = 8 * h + 2 * k;
      for (int v = 0; v < 4; ++v) {
        const __m256 d1 = _mm256_set1_ps(dl[s + v / 2]), m1 = _mm256_set1_ps(ml[s + v / 2]);
        sink(16 * h + 4 * k + v, _mm256_sub_ps(_mm256_mul_ps(d1, q.f[v]), m1));
      }
    }
  }
}

/// Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: (d * (sc - 32)) * q per
/// sub-block of 16, q = the 2 bits of Q2_K's place minus 4 where bit 4 h + k of hmask[l]
/// is clear.
template <class Sink>
inline void decode_q3_k(const uint8_t* b, Sink& sink) {
  const uint8_t* scales = b + 96;
  const float d = f16_scale(b + 108);
  float dl[16];  // the same scalar products as the portable path
  for (int s = 0; s < 16; ++s) {
    const int low = (scales[s % 8] >> (4 * (s / 8))) & 0x0F;
    const int high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    dl[s] = d * static_cast<float>((low | (high << 4)) - 32);
  }
  const __m256i hmask = load256(b);
  const __m256i mask = _mm256_set1_epi8(0x03), one = _mm256_set1_epi8(1);
  for (int h = 0; h < 2; ++h) {
    const __m256i bytes = load256(b + 32 + 32 * h);
    for (int k = 0; k < 4; ++k) {
      const __m256i q2 = _mm256_and_si256(_mm256_srl_epi16(bytes, _mm_cvtsi32_si128(2 * k)), mask);
      const __m256i hbit = _mm256_and_si256(_mm256_srl_epi16(hmask, _mm_cvtsi32_si128(4 * h + k)), one);
      // 4 where the bit is clear: (hbit ^ 1) << 2 <= 4, so 16-bit shifts keep bytes apart.
      const __m256i offset = _mm256_slli_epi16(_mm256_xor_si256(hbit, one), 2);
      const Widened q = widen_i8(_mm256_sub_epi8(q2, offset));
      const int s = 8 * h + 2 * k;
      for (int v = 0; v < 4; ++v) sink(16 * h + 4 * k + v, _mm256_mul_ps(_mm256_set1_ps(dl[s + v / 2]), q.f[v]));
    }
  }
}

/// Q4_K {f16 d, dmin; u8 scales[12]; u8 qs[128]}: (d * sc) * q - (dmin * m) per sub-block
/// of 32; sub-blocks 2p and 2p + 1 are the low and high nibbles of qs[32 p .. 32 p + 32).
template <class Sink>
inline void decode_q4_k(const uint8_t* b, Sink& sink) {
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
    const __m256i bytes = load256(qs + 32 * p);
    const Widened lo = widen_i8(_mm256_and_si256(bytes, mask));
    const __m256 dlo = _mm256_set1_ps(d1[2 * p]), mlo = _mm256_set1_ps(m1[2 * p]);
    for (int k = 0; k < 4; ++k) sink(8 * p + k, _mm256_sub_ps(_mm256_mul_ps(dlo, lo.f[k]), mlo));
    const Widened hi = widen_i8(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask));
    const __m256 dhi = _mm256_set1_ps(d1[2 * p + 1]), mhi = _mm256_set1_ps(m1[2 * p + 1]);
    for (int k = 0; k < 4; ++k) sink(8 * p + 4 + k, _mm256_sub_ps(_mm256_mul_ps(dhi, hi.f[k]), mhi));
  }
}

/// Q5_K {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: as Q4_K with a fifth bit,
/// bit s of qh[l] for element 32 s + l.
template <class Sink>
inline void decode_q5_k(const uint8_t* b, Sink& sink) {
  const float d = f16_scale(b);
  const float dmin = f16_scale(b + 2);
  const uint8_t* scales = b + 4;
  const __m256i qh = load256(b + 16);
  const uint8_t* qs = b + 48;
  const __m256i mask = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  for (int s = 0; s < 8; ++s) {
    const ScaleMin sm = get_scale_min_k4(s, scales);
    const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(sm.scale));
    const __m256 m1 = _mm256_set1_ps(dmin * static_cast<float>(sm.min));
    const __m256i bytes = load256(qs + 32 * (s / 2));
    const __m256i low = _mm256_and_si256(_mm256_srl_epi16(bytes, _mm_cvtsi32_si128(4 * (s % 2))), mask);
    const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(s)), one);
    // bit <= 1, so shifting 16-bit lanes left by 4 keeps every byte to itself.
    const Widened q = widen_i8(_mm256_or_si256(low, _mm256_slli_epi16(bit, 4)));
    for (int k = 0; k < 4; ++k) sink(4 * s + k, _mm256_sub_ps(_mm256_mul_ps(d1, q.f[k]), m1));
  }
}

/// Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: (d * sc[e / 16]) * (q - 32). For
/// half h and chunk c < 4 of 32 values: low 4 bits = nibble c / 2 of
/// ql[64 h + 32 (c % 2) + l], high 2 bits = bits 2c..2c+1 of qh[32 h + l].
template <class Sink>
inline void decode_q6_k(const uint8_t* b, Sink& sink) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_scale(b + 208);
  const __m256i mask4 = _mm256_set1_epi8(0x0F);
  const __m256i mask2 = _mm256_set1_epi8(0x03);
  for (int h = 0; h < 2; ++h) {
    const __m256i high_bytes = load256(qh + 32 * h);
    for (int c = 0; c < 4; ++c) {
      const __m256i low_bytes = load256(ql + 64 * h + 32 * (c % 2));
      const __m256i low = _mm256_and_si256(_mm256_srl_epi16(low_bytes, _mm_cvtsi32_si128(4 * (c / 2))), mask4);
      const __m256i high = _mm256_and_si256(_mm256_srl_epi16(high_bytes, _mm_cvtsi32_si128(2 * c)), mask2);
      // high <= 3, so shifting 16-bit lanes left by 4 keeps every byte to itself.
      const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32));
      const Widened w = widen_i8(q);
      const int e = 128 * h + 32 * c;
      const __m256 d0 = _mm256_set1_ps(d * static_cast<float>(scales[e / 16]));
      const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(scales[e / 16 + 1]));
      const int j = e / 8;
      sink(j, _mm256_mul_ps(d0, w.f[0]));
      sink(j + 1, _mm256_mul_ps(d0, w.f[1]));
      sink(j + 2, _mm256_mul_ps(d1, w.f[2]));
      sink(j + 3, _mm256_mul_ps(d1, w.f[3]));
    }
  }
}

/// A sink that stores: elements [8 j, 8 j + 8) of the block go to y + 8 j.
struct StoreSink {
  float* y;
  void operator()(int j, __m256 v) const { _mm256_storeu_ps(y + 8 * j, v); }
};

}  // namespace ggml_avx2
}  // namespace
}  // namespace charm

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
