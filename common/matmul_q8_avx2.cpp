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
#include <type_traits>

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

/// One block's exact integers, as eight i32 partial sums each: the sum of `isum`'s lanes
/// is the block's isum_b (common/matmul_q8.h, offsets included), of `msum`'s its msum_b.
struct BlockTerms {
  __m256i isum;
  __m256i msum;
};

/// Bit `from` of every byte of v moved to bit 4, all other bits cleared (a 16-bit shift
/// never carries across bytes here: the bit comes from the same byte).
template <int kFrom>
__m256i bit_to_16(__m256i v) {
  const __m256i sixteen = _mm256_set1_epi8(16);
  if constexpr (kFrom < 4) return _mm256_and_si256(_mm256_slli_epi16(v, 4 - kFrom), sixteen);
  if constexpr (kFrom > 4) return _mm256_and_si256(_mm256_srli_epi16(v, kFrom - 4), sixteen);
  return _mm256_and_si256(v, sixteen);
}

/// Q8_0 and Q4_0 (`kQ4`) against Q8_0 activations: isum_b = w . a (Q4_0: - 8 * sum(a)).
template <bool kQ4>
struct Block32 {
  static constexpr int64_t kBytes = kQ4 ? 18 : 34;
  static constexpr int64_t kElements = 32;
  static constexpr bool kHasMin = false;
  static constexpr int kScaleOffset = 0;
  static constexpr int kSumsOffset = kQ4 ? 8 : 0;  ///< isum_b -= kSumsOffset * a.sums[b]
  static BlockTerms terms(const uint8_t* wb, const Q8Row& a, int64_t b) {
    const __m256i ab = load32(a.qs + 32 * b);
    if constexpr (kQ4) {  // the - 8 * sum(a) is row_dot's (kSumsOffset), for eight blocks at once
      return {dot_u8(q4_0_quants(wb + 2), ab), _mm256_setzero_si256()};
    } else {
      return {dot_s8(load32(wb + 2), ab), _mm256_setzero_si256()};
    }
  }
};

/// The 8 scales (bytes 0..7) and 8 mins (bytes 8..15) of a Q4_K / Q5_K block's 12 scale
/// bytes, as get_scale_min_k4 unpacks them, four at a time in 32-bit words.
__m128i scales_mins_k4(const uint8_t* q) {
  uint32_t w[3];
  std::memcpy(w, q, 12);
  constexpr uint32_t kLow6 = 0x3F3F3F3F, kLow4 = 0x0F0F0F0F, kLow2 = 0x03030303;
  const uint32_t scales_lo = w[0] & kLow6;                                 // j < 4: q[j] & 63
  const uint32_t mins_lo = w[1] & kLow6;                                   // j < 4: q[j + 4] & 63
  const uint32_t scales_hi = (w[2] & kLow4) | (((w[0] >> 6) & kLow2) << 4);  // q[j + 4] low, q[j - 4] top
  const uint32_t mins_hi = ((w[2] >> 4) & kLow4) | (((w[1] >> 6) & kLow2) << 4);  // q[j + 4] high, q[j] top
  return _mm_set_epi32(static_cast<int>(mins_hi), static_cast<int>(mins_lo), static_cast<int>(scales_hi),
                       static_cast<int>(scales_lo));
}

/// Q4_K / Q5_K (kFifthBit) against Q8_K: per pair of sub-blocks 2k, 2k + 1, the 32 bytes
/// of qs[32 k ..] hold sub-block 2k's quants in the low nibbles, 2k + 1's in the high;
/// bit s of qh[l] is bit 4 of sub-block s's element l.
template <bool kFifthBit>
struct BlockQ45K {
  static constexpr int64_t kBytes = kFifthBit ? 176 : 144;
  static constexpr int64_t kElements = 256;
  static constexpr bool kHasMin = true;
  static constexpr int kScaleOffset = 0;  // d, then dmin at 2
  static constexpr int kSumsOffset = 0;

  template <int k>
  static __m256i pair(const uint8_t* qs, __m256i qh, const int8_t* ab, __m256i scales16, __m256i mask) {
    const __m256i raw = load32(qs + 32 * k);
    __m256i lo = _mm256_and_si256(raw, mask);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
    if constexpr (kFifthBit) {
      lo = _mm256_or_si256(lo, bit_to_16<2 * k>(qh));
      hi = _mm256_or_si256(hi, bit_to_16<2 * k + 1>(qh));
    }
    // Sub-block s's scale in every i16 lane: bytes 2s, 2s + 1 of scales16.
    const __m256i pick0 = _mm256_set1_epi16(static_cast<short>((4 * k) | ((4 * k + 1) << 8)));
    const __m256i pick1 = _mm256_set1_epi16(static_cast<short>((4 * k + 2) | ((4 * k + 3) << 8)));
    const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load32(ab + 64 * k)), _mm256_shuffle_epi8(scales16, pick0));
    const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load32(ab + 64 * k + 32)), _mm256_shuffle_epi8(scales16, pick1));
    return _mm256_add_epi32(p0, p1);
  }

  static BlockTerms terms(const uint8_t* wb, const Q8Row& a, int64_t b) {
    const uint8_t* qs = wb + (kFifthBit ? 48 : 16);
    const int8_t* ab = a.qs + b * 256;
    const __m128i sm = scales_mins_k4(wb + 4);
    const __m256i scales16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const __m256i qh = kFifthBit ? load32(wb + 16) : _mm256_setzero_si256();
    __m256i isum = pair<0>(qs, qh, ab, scales16, mask);
    isum = _mm256_add_epi32(isum, pair<1>(qs, qh, ab, scales16, mask));
    isum = _mm256_add_epi32(isum, pair<2>(qs, qh, ab, scales16, mask));
    isum = _mm256_add_epi32(isum, pair<3>(qs, qh, ab, scales16, mask));
    // msum_b = sum over s of min_s * (bsum[2s] + bsum[2s + 1]).
    const int32_t* bsums = a.sums + b * 16;
    const __m256i pairs = _mm256_hadd_epi32(load32(bsums), load32(bsums + 8));  // s = 0 1 4 5 | 2 3 6 7
    const __m256i mins = _mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8));
    const __m256i mins_hadd_order = _mm256_permutevar8x32_epi32(mins, _mm256_set_epi32(7, 6, 3, 2, 5, 4, 1, 0));
    return {isum, _mm256_mullo_epi32(pairs, mins_hadd_order)};
  }
};

/// Q6_K against Q8_K: 32 quants (two sub-blocks of 16) per (h, c); the -32 offset as
/// -32 * sum of scale_g * bsum_g.
struct BlockQ6K {
  static constexpr int64_t kBytes = 210;
  static constexpr int64_t kElements = 256;
  static constexpr bool kHasMin = false;
  static constexpr int kScaleOffset = 208;
  static constexpr int kSumsOffset = 0;

  /// Chunk (h, c)'s scales: scale[8h + 2c] in the low 8 i16 lanes, scale[8h + 2c + 1] in
  /// the high 8, from `half` = the i16 scales 8h .. 8h + 7 in both 128-bit lanes.
  template <int c>
  static __m256i chunk_scales(__m256i half) {
    const auto lo = static_cast<char>(4 * c), hi = static_cast<char>(4 * c + 2);
    const __m256i pick = _mm256_setr_epi8(lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo,
                                          lo + 1, lo, lo + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1,
                                          hi, hi + 1, hi, hi + 1, hi, hi + 1);
    return _mm256_shuffle_epi8(half, pick);
  }

  template <int h>
  static __m256i half_isum(const uint8_t* wb, const int8_t* ab, __m256i half) {
    const __m256i mask4 = _mm256_set1_epi8(0x0F), mask2 = _mm256_set1_epi8(0x03);
    const __m256i qh = load32(wb + 128 + 32 * h);
    __m256i acc = _mm256_setzero_si256();
    auto chunk = [&](auto cc) {
      constexpr int c = decltype(cc)::value;
      const __m256i q = q6k_quants(wb, qh, h, c, mask4, mask2);
      const __m256i p = _mm256_maddubs_epi16(q, load32(ab + 128 * h + 32 * c));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, chunk_scales<c>(half)));
    };
    chunk(std::integral_constant<int, 0>{});
    chunk(std::integral_constant<int, 1>{});
    chunk(std::integral_constant<int, 2>{});
    chunk(std::integral_constant<int, 3>{});
    return acc;
  }

  static BlockTerms terms(const uint8_t* wb, const Q8Row& a, int64_t b) {
    const int8_t* ab = a.qs + b * 256;
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 192));
    const __m256i s16 = _mm256_cvtepi8_epi16(raw);  // scales 0..7 | 8..15
    const __m256i isum = _mm256_add_epi32(half_isum<0>(wb, ab, _mm256_permute2x128_si256(s16, s16, 0x00)),
                                          half_isum<1>(wb, ab, _mm256_permute2x128_si256(s16, s16, 0x11)));
    const int32_t* bsums = a.sums + b * 16;
    const __m256i corr = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_cvtepi8_epi32(raw), load32(bsums)),
                                          _mm256_mullo_epi32(_mm256_cvtepi8_epi32(_mm_srli_si128(raw, 8)), load32(bsums + 8)));
    return {_mm256_sub_epi32(isum, _mm256_slli_epi32(corr, 5)), _mm256_setzero_si256()};
  }
};

/// c_b for one block, in scalar f32 (the tail blocks): d * isum [- dmin * msum], with
/// d = d_w * d_a and dmin = dmin_w * d_a.
template <class B>
float block_value(const uint8_t* wb, const Q8Row& a, int64_t b) {
  const BlockTerms t = B::terms(wb, a, b);
  const float d = f16_scale(wb + B::kScaleOffset) * a.d[b];
  const float v = d * static_cast<float>(hsum_i32(t.isum) - B::kSumsOffset * a.sums[b]);
  if constexpr (B::kHasMin) return v - (f16_scale(wb + 2) * a.d[b]) * static_cast<float>(hsum_i32(t.msum));
  return v;
}

/// The row dot of common/matmul_q8.h for block type B: blocks in groups of eight, block
/// g * 8 + l into lane l (their integers transposed into one vector, then c_b for all
/// eight at once), then the tail one by one. While it reads a block it prefetches the
/// same bytes of the row at `ahead` (a later row; may be null): the hardware prefetcher
/// alone leaves a core far below the memory's pace (see common/matmul_avx2.cpp).
template <class B>
float row_dot(const uint8_t* w, const Q8Row& a, const uint8_t* ahead) {
  const int64_t full = a.blocks / 8 * 8;
  uint64_t line = 0;
  auto prefetch_to = [&](int64_t b) {
    if (!ahead) return;
    for (const auto end = static_cast<uint64_t>((b + 1) * B::kBytes); line < end; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(ahead + line), _MM_HINT_T0);
    }
  };
  __m256 acc = _mm256_setzero_ps();
  for (int64_t g = 0; g < full; g += 8) {
    __m256i isum[8], msum[8];
    if constexpr (B::kElements == 32) prefetch_to(g + 7);  // small blocks: a line per group
    for (int k = 0; k < 8; ++k) {
      if constexpr (B::kElements != 32) prefetch_to(g + k);
      const BlockTerms t = B::terms(w + (g + k) * B::kBytes, a, g + k);
      isum[k] = t.isum;
      msum[k] = t.msum;
    }
    const __m256 da = _mm256_loadu_ps(a.d + g);
    const __m256 d = _mm256_mul_ps(scales8(w + g * B::kBytes + B::kScaleOffset, B::kBytes), da);
    __m256i isums = hsum8_i32(isum);
    if constexpr (B::kSumsOffset != 0) isums = _mm256_sub_epi32(isums, _mm256_mullo_epi32(load32(a.sums + g), _mm256_set1_epi32(B::kSumsOffset)));
    __m256 c = _mm256_mul_ps(d, _mm256_cvtepi32_ps(isums));
    if constexpr (B::kHasMin) {
      const __m256 dmin = _mm256_mul_ps(scales8(w + g * B::kBytes + 2, B::kBytes), da);
      c = _mm256_sub_ps(c, _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(hsum8_i32(msum))));
    }
    acc = _mm256_add_ps(acc, c);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  float s = reduce_lanes(lanes);
  for (int64_t b = full; b < a.blocks; ++b) {
    prefetch_to(b);
    s += block_value<B>(w + b * B::kBytes, a, b);
  }
  return s;
}

template <class B>
float row_dot_plain(const uint8_t* w, const Q8Row& a) {
  return row_dot<B>(w, a, nullptr);
}

/// GEMV: out[k] = the row dot of rows o0 + k, o0 <= o < o1, each prefetching the row
/// kAhead later while it runs.
template <class B>
void gemv(const uint8_t* w, uint64_t row_bytes, const Q8Row& a, int64_t o0, int64_t o1, float* out) {
  constexpr int64_t kAhead = 2;
  for (int64_t o = o0; o < o1; ++o) {
    const uint8_t* row = w + static_cast<uint64_t>(o) * row_bytes;
    out[o - o0] = row_dot<B>(row, a, o + kAhead < o1 ? row + kAhead * row_bytes : nullptr);
  }
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
    case GgmlType::kQ8_0: return row_dot_plain<Block32<false>>;
    case GgmlType::kQ4_0: return row_dot_plain<Block32<true>>;
    case GgmlType::kQ4_K: return row_dot_plain<BlockQ45K<false>>;
    case GgmlType::kQ5_K: return row_dot_plain<BlockQ45K<true>>;
    case GgmlType::kQ6_K: return row_dot_plain<BlockQ6K>;
    default: return nullptr;
  }
}

Q8Gemv q8_gemv_avx2(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0: return gemv<Block32<false>>;
    case GgmlType::kQ4_0: return gemv<Block32<true>>;
    case GgmlType::kQ4_K: return gemv<BlockQ45K<false>>;
    case GgmlType::kQ5_K: return gemv<BlockQ45K<true>>;
    case GgmlType::kQ6_K: return gemv<BlockQ6K>;
    default: return nullptr;
  }
}

}  // namespace charm

#include "common/avx2_target_end.inc"
