// AVX2 row dots of common/matmul_q8.h (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K weights). Same bits
// as the portable dots of common/matmul_q8.cpp: the integer dot of each block is exact
// (u8 x s8 pairs through maddubs stay below 2^15: at most 2 * 128 * 127; the i32 sums
// below 2^31), so only the f32 operations could differ, and they are the same rounded
// multiplies and adds in the same order (eight lanes of blocks, common/matmul_q8_detail.h
// reduce_lanes, then the tail). f16 weight scales are widened with F16C, exact for every
// finite f16 (for a NaN scale both paths give NaN, perhaps with another payload).
#include "common/matmul_q8_detail.h"

#include <immintrin.h>

#include <cstring>

#include "common/ggml_dequantize_detail.h"

// Everything from here on is compiled for AVX2 + F16C (without FMA: the products and
// sums must round as the portable code's do); matmul_q8_tile calls it only on
// KernelPath::kAvx2, which needs cpu_supports_avx2(). The headers above are parsed
// before the pragma, so none of their inline functions is compiled for AVX2.
#include "common/avx2_target_begin.inc"

namespace charm {
namespace {

float f16_scale(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)));
}

__m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

/// Quants 32 c .. 32 c + 31 of half h of a Q6_K block `wb` (ggml-common.h block_q6_K), 0..63:
/// the low nibble from ql, the two high bits from `qh` (the half's qh bytes, loaded).
__m256i q6k_quants(const uint8_t* wb, __m256i qh, int h, int c, __m256i mask4, __m256i mask2) {
  const __m256i ql = load32(wb + 64 * h + 32 * (c % 2));
  const __m256i low = _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (c / 2)), mask4);
  const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), mask2), 4);
  return _mm256_or_si256(low, high);
}

/// The sum of the eight i32 lanes of v.
int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

/// Lane k of the result: the sum of the eight i32 lanes of v[k] (a transpose-reduce).
__m256i hsum8_i32(const __m256i* v) {
  const __m256i t0 = _mm256_hadd_epi32(v[0], v[1]);
  const __m256i t1 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i t2 = _mm256_hadd_epi32(v[4], v[5]);
  const __m256i t3 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i u0 = _mm256_hadd_epi32(t0, t1);  // [v0..v3 low halves | v0..v3 high halves]
  const __m256i u1 = _mm256_hadd_epi32(t2, t3);
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}

/// Eight i32 partial sums of the signed-byte dot w . a (32 bytes each).
__m256i dot_s8(__m256i w, __m256i a) {
  const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/// Eight i32 partial sums of the dot of unsigned bytes q (< 128) with signed bytes a.
__m256i dot_u8(__m256i q, __m256i a) { return _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), _mm256_set1_epi16(1)); }

/// The 32 quants of a Q4_0 block (lo nibbles, then hi), 0..15.
__m256i q4_0_quants(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask));
}

/// The f16 scales at w + stride * k (k < 8), widened.
__m256 scales8(const uint8_t* w, int64_t stride) {
  uint16_t s[8];
  for (int k = 0; k < 8; ++k) std::memcpy(&s[k], w + stride * k, 2);
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
}

/// The row dot of a type with 32-blocks: `kQ4` Q4_0 (18 bytes) else Q8_0 (34 bytes).
template <bool kQ4>
float dot_32(const uint8_t* w, const Q8Row& a) {
  constexpr int64_t kBytes = kQ4 ? 18 : 34;
  auto block_isum = [&](int64_t b) -> __m256i {  // eight partial sums of block b
    const uint8_t* wb = w + b * kBytes;
    const __m256i ab = load32(a.qs + 32 * b);
    if constexpr (kQ4) {
      return dot_u8(q4_0_quants(wb + 2), ab);
    } else {
      return dot_s8(load32(wb + 2), ab);
    }
  };
  const int64_t full = a.blocks / 8 * 8;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < full; b += 8) {
    __m256i v[8];
    for (int k = 0; k < 8; ++k) v[k] = block_isum(b + k);
    __m256i isum = hsum8_i32(v);
    if constexpr (kQ4) {
      isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.sums + b)), 3));
    }
    const __m256 d = _mm256_mul_ps(scales8(w + b * kBytes, kBytes), _mm256_loadu_ps(a.d + b));
    acc = _mm256_add_ps(acc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum)));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  float s = reduce_lanes(lanes);
  for (int64_t b = full; b < a.blocks; ++b) {
    int32_t isum = hsum_i32(block_isum(b));
    if constexpr (kQ4) isum -= 8 * a.sums[b];
    s += (f16_scale(w + b * kBytes) * a.d[b]) * static_cast<float>(isum);
  }
  return s;
}

/// Sums c(b) in common/matmul_q8.h's order (the portable lane_sum, written out here so
/// that the block function inlines into AVX2 code).
template <typename BlockFn>
inline float lane_sum_avx2(int64_t blocks, BlockFn&& c) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t full = blocks / 8 * 8;
  for (int64_t b = 0; b < full; ++b) lanes[b % 8] += c(b);
  float s = reduce_lanes(lanes);
  for (int64_t b = full; b < blocks; ++b) s += c(b);
  return s;
}

/// Q4_K / Q5_K (kFifthBit) against Q8_K: per pair of sub-blocks 2k, 2k + 1, the 32 bytes
/// of qs[32 k ..] hold sub-block 2k's quants in the low nibbles, 2k + 1's in the high.
template <bool kFifthBit>
float dot_q45_k(const uint8_t* w, const Q8Row& a) {
  constexpr int64_t kBytes = kFifthBit ? 176 : 144;
  const __m256i mask = _mm256_set1_epi8(0x0F);
  return lane_sum_avx2(a.blocks, [&](int64_t b) {
    const uint8_t* wb = w + b * kBytes;
    const uint8_t* scales = wb + 4;
    const uint8_t* qs = wb + (kFifthBit ? 48 : 16);
    const int8_t* ab = a.qs + b * 256;
    const int32_t* bsums = a.sums + b * 16;
    __m256i qh;
    if constexpr (kFifthBit) qh = load32(wb + 16);
    __m256i acc = _mm256_setzero_si256();
    int32_t msum = 0;
    for (int k = 0; k < 4; ++k) {
      const __m256i raw = load32(qs + 32 * k);
      __m256i lo = _mm256_and_si256(raw, mask);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
      if constexpr (kFifthBit) {  // bit s of qh[l] is bit 4 of sub-block s's element l
        const __m256i b0 = _mm256_set1_epi8(static_cast<char>(1 << (2 * k)));
        const __m256i b1 = _mm256_set1_epi8(static_cast<char>(1 << (2 * k + 1)));
        const __m256i sixteen = _mm256_set1_epi8(16);
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), sixteen));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), sixteen));
      }
      const ScaleMin s0 = get_scale_min_k4(2 * k, scales);
      const ScaleMin s1 = get_scale_min_k4(2 * k + 1, scales);
      const __m256i p0 = _mm256_maddubs_epi16(lo, load32(ab + 64 * k));
      const __m256i p1 = _mm256_maddubs_epi16(hi, load32(ab + 64 * k + 32));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p0, _mm256_set1_epi16(s0.scale)));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p1, _mm256_set1_epi16(s1.scale)));
      msum += s0.min * (bsums[4 * k] + bsums[4 * k + 1]) + s1.min * (bsums[4 * k + 2] + bsums[4 * k + 3]);
    }
    const int32_t isum = hsum_i32(acc);
    const float d = f16_scale(wb) * a.d[b];
    const float dmin = f16_scale(wb + 2) * a.d[b];
    return d * static_cast<float>(isum) - dmin * static_cast<float>(msum);
  });
}

/// Q6_K against Q8_K: 32 quants (two sub-blocks of 16) per (h, c), as the portable dot.
float dot_q6_k(const uint8_t* w, const Q8Row& a) {
  const __m256i mask4 = _mm256_set1_epi8(0x0F);
  const __m256i mask2 = _mm256_set1_epi8(0x03);
  return lane_sum_avx2(a.blocks, [&](int64_t b) {
    const uint8_t* wb = w + b * 210;
    const auto* scales = reinterpret_cast<const int8_t*>(wb + 192);
    const int8_t* ab = a.qs + b * 256;
    const int32_t* bsums = a.sums + b * 16;
    __m256i acc = _mm256_setzero_si256();
    int32_t corr = 0;  // sum of scale * bsum: the -32 offset, applied once
    for (int h = 0; h < 2; ++h) {
      const __m256i qh = load32(wb + 128 + 32 * h);
      for (int c = 0; c < 4; ++c) {
        const __m256i q = q6k_quants(wb, qh, h, c, mask4, mask2);
        const __m256i p = _mm256_maddubs_epi16(q, load32(ab + 128 * h + 32 * c));
        const int sb = 8 * h + 2 * c;
        const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(scales[sb + 1]), _mm_set1_epi16(scales[sb]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
        corr += scales[sb] * bsums[sb] + scales[sb + 1] * bsums[sb + 1];
      }
    }
    const int32_t isum = hsum_i32(acc) - 32 * corr;
    return (f16_scale(wb + 208) * a.d[b]) * static_cast<float>(isum);
  });
}

/// One K-quant super-block unpacked: quants 0..63 as bytes, a scale per 16 elements, and
/// for Q4_K / Q5_K the 8 sub-block mins.
struct UnpackedK {
  alignas(32) uint8_t q[256];
  int16_t sc[16];
  int32_t mins[8];
  float d, dmin;
};

template <GgmlType T>
void unpack_k(const uint8_t* wb, UnpackedK& u) {
  if constexpr (T == GgmlType::kQ6_K) {
    const auto* scales = reinterpret_cast<const int8_t*>(wb + 192);
    for (int g = 0; g < 16; ++g) u.sc[g] = scales[g];
    const __m256i mask4 = _mm256_set1_epi8(0x0F), mask2 = _mm256_set1_epi8(0x03);
    for (int h = 0; h < 2; ++h) {
      const __m256i qh = load32(wb + 128 + 32 * h);
      for (int c = 0; c < 4; ++c) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(u.q + 128 * h + 32 * c), q6k_quants(wb, qh, h, c, mask4, mask2));
      }
    }
    u.d = f16_scale(wb + 208);
  } else {
    constexpr bool kFifthBit = T == GgmlType::kQ5_K;
    const uint8_t* scales = wb + 4;
    const uint8_t* qs = wb + (kFifthBit ? 48 : 16);
    const __m256i mask = _mm256_set1_epi8(0x0F);
    __m256i qh;
    if constexpr (kFifthBit) qh = load32(wb + 16);
    for (int k = 0; k < 4; ++k) {
      const __m256i raw = load32(qs + 32 * k);
      __m256i lo = _mm256_and_si256(raw, mask);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
      if constexpr (kFifthBit) {
        const __m256i b0 = _mm256_set1_epi8(static_cast<char>(1 << (2 * k)));
        const __m256i b1 = _mm256_set1_epi8(static_cast<char>(1 << (2 * k + 1)));
        const __m256i sixteen = _mm256_set1_epi8(16);
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), sixteen));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), sixteen));
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(u.q + 64 * k), lo);
      _mm256_store_si256(reinterpret_cast<__m256i*>(u.q + 64 * k + 32), hi);
    }
    for (int s = 0; s < 8; ++s) {
      const ScaleMin sm = get_scale_min_k4(s, scales);
      u.sc[2 * s] = u.sc[2 * s + 1] = sm.scale;
      u.mins[s] = sm.min;
    }
    u.d = f16_scale(wb);
    u.dmin = f16_scale(wb + 2);
  }
}

/// Block b's c_b (common/matmul_q8.h) for one activation row, from the unpacked weights:
/// the same integers and the same f32 operations as the row dots above.
template <GgmlType T>
float block_k(const UnpackedK& u, const Q8Row& a, int64_t b) {
  const int8_t* ab = a.qs + b * 256;
  const int32_t* bsums = a.sums + b * 16;
  __m256i acc = _mm256_setzero_si256();
  for (int j = 0; j < 8; ++j) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(u.q + 32 * j)),
                                           load32(ab + 32 * j));
    const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(u.sc[2 * j + 1]), _mm_set1_epi16(u.sc[2 * j]));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
  }
  int32_t isum = hsum_i32(acc);
  if constexpr (T == GgmlType::kQ6_K) {
    int32_t corr = 0;
    for (int g = 0; g < 16; ++g) corr += u.sc[g] * bsums[g];
    isum -= 32 * corr;
    return (u.d * a.d[b]) * static_cast<float>(isum);
  } else {
    int32_t msum = 0;
    for (int s = 0; s < 8; ++s) msum += u.mins[s] * (bsums[2 * s] + bsums[2 * s + 1]);
    const float d = u.d * a.d[b];
    const float dmin = u.dmin * a.d[b];
    return d * static_cast<float>(isum) - dmin * static_cast<float>(msum);
  }
}

template <GgmlType T>
void rows_dot_k(const uint8_t* w, const Q8Row* a, size_t n, float* out) {
  constexpr int64_t kBytes = T == GgmlType::kQ4_K ? 144 : (T == GgmlType::kQ5_K ? 176 : 210);
  const int64_t blocks = a[0].blocks;
  const int64_t full = blocks / 8 * 8;
  float lanes[kQ8MaxRows][8] = {};
  UnpackedK u;
  for (int64_t b = 0; b < full; ++b) {
    unpack_k<T>(w + b * kBytes, u);
    for (size_t r = 0; r < n; ++r) lanes[r][b % 8] += block_k<T>(u, a[r], b);
  }
  for (size_t r = 0; r < n; ++r) out[r] = reduce_lanes(lanes[r]);
  for (int64_t b = full; b < blocks; ++b) {
    unpack_k<T>(w + b * kBytes, u);
    for (size_t r = 0; r < n; ++r) out[r] += block_k<T>(u, a[r], b);
  }
}

}  // namespace

Q8RowsDot q8_rows_dot_avx2(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_K: return rows_dot_k<GgmlType::kQ4_K>;
    case GgmlType::kQ5_K: return rows_dot_k<GgmlType::kQ5_K>;
    case GgmlType::kQ6_K: return rows_dot_k<GgmlType::kQ6_K>;
    default: return nullptr;
  }
}

Q8RowDot q8_row_dot_avx2(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0: return dot_32<false>;
    case GgmlType::kQ4_0: return dot_32<true>;
    case GgmlType::kQ4_K: return dot_q45_k<false>;
    case GgmlType::kQ5_K: return dot_q45_k<true>;
    case GgmlType::kQ6_K: return dot_q6_k;
    default: return nullptr;
  }
}

}  // namespace charm

#include "common/avx2_target_end.inc"
