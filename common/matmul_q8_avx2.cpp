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

/// One block's exact integers for one activation row, as eight i32 partial sums each:
/// the sum of `isum`'s lanes is the block's isum_b (common/matmul_q8.h; Q4_0's offset is
/// applied later, kSumsOffset), of `msum`'s its msum_b.
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

// Each block type below gives terms<N>(wb, a, b, t): t[r] for activation rows a[0..N),
// the weight block decoded once for all N rows.

/// Q8_0 and Q4_0 (`kQ4`) against Q8_0 activations: isum_b = w . a (Q4_0: - 8 * sum(a)).
template <bool kQ4>
struct Block32 {
  static constexpr int64_t kBytes = kQ4 ? 18 : 34;
  static constexpr int64_t kElements = 32;
  static constexpr bool kHasMin = false;
  static constexpr int kScaleOffset = 0;
  static constexpr int kSumsOffset = kQ4 ? 8 : 0;  ///< isum_b -= kSumsOffset * a.sums[b]

  template <int N>
  static void terms(const uint8_t* wb, const Q8Row* a, int64_t b, BlockTerms* t) {
    if constexpr (kQ4) {
      const __m256i q = q4_0_quants(wb + 2);
      for (int r = 0; r < N; ++r) t[r] = {dot_u8(q, load32(a[r].qs + 32 * b)), _mm256_setzero_si256()};
    } else {  // maddubs takes unsigned x signed: |w| times a with w's sign
      const __m256i w = load32(wb + 2);
      const __m256i w_abs = _mm256_sign_epi8(w, w);
      for (int r = 0; r < N; ++r) {
        const __m256i p = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(load32(a[r].qs + 32 * b), w));
        t[r] = {_mm256_madd_epi16(p, _mm256_set1_epi16(1)), _mm256_setzero_si256()};
      }
    }
  }
};

/// The 8 scales (bytes 0..7) and 8 mins (bytes 8..15) of a Q4_K / Q5_K block's 12 scale
/// bytes, as get_scale_min_k4 unpacks them, four at a time in 32-bit words.
__m128i scales_mins_k4(const uint8_t* q) {
  uint32_t w[3];
  std::memcpy(w, q, 12);
  constexpr uint32_t kLow6 = 0x3F3F3F3F, kLow4 = 0x0F0F0F0F, kLow2 = 0x03030303;
  const uint32_t scales_lo = w[0] & kLow6;                                        // j < 4: q[j] & 63
  const uint32_t mins_lo = w[1] & kLow6;                                          // j < 4: q[j + 4] & 63
  const uint32_t scales_hi = (w[2] & kLow4) | (((w[0] >> 6) & kLow2) << 4);         // q[j + 4] low, q[j - 4] top
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

  template <int k, int N>
  static void pair(const uint8_t* qs, __m256i qh, const Q8Row* a, int64_t b, __m256i scales16, BlockTerms* t) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const __m256i raw = load32(qs + 32 * k);
    __m256i lo = _mm256_and_si256(raw, mask);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
    if constexpr (kFifthBit) {
      lo = _mm256_or_si256(lo, bit_to_16<2 * k>(qh));
      hi = _mm256_or_si256(hi, bit_to_16<2 * k + 1>(qh));
    }
    // Sub-block s's scale in every i16 lane: bytes 2s, 2s + 1 of scales16.
    const __m256i s0 = _mm256_shuffle_epi8(scales16, _mm256_set1_epi16(static_cast<short>((4 * k) | ((4 * k + 1) << 8))));
    const __m256i s1 =
        _mm256_shuffle_epi8(scales16, _mm256_set1_epi16(static_cast<short>((4 * k + 2) | ((4 * k + 3) << 8))));
    for (int r = 0; r < N; ++r) {
      const int8_t* ab = a[r].qs + b * 256 + 64 * k;
      const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load32(ab)), s0);
      const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load32(ab + 32)), s1);
      const __m256i both = _mm256_add_epi32(p0, p1);
      t[r].isum = k == 0 ? both : _mm256_add_epi32(t[r].isum, both);
    }
  }

  template <int N>
  static void terms(const uint8_t* wb, const Q8Row* a, int64_t b, BlockTerms* t) {
    const uint8_t* qs = wb + (kFifthBit ? 48 : 16);
    const __m128i sm = scales_mins_k4(wb + 4);
    const __m256i scales16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
    const __m256i qh = kFifthBit ? load32(wb + 16) : _mm256_setzero_si256();
    pair<0, N>(qs, qh, a, b, scales16, t);
    pair<1, N>(qs, qh, a, b, scales16, t);
    pair<2, N>(qs, qh, a, b, scales16, t);
    pair<3, N>(qs, qh, a, b, scales16, t);
    // msum_b = sum over s of min_s * (bsum[2s] + bsum[2s + 1]); hadd leaves s in the order
    // 0 1 4 5 | 2 3 6 7, so the mins are put in that order.
    const __m256i mins = _mm256_permutevar8x32_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8)),
                                                     _mm256_set_epi32(7, 6, 3, 2, 5, 4, 1, 0));
    for (int r = 0; r < N; ++r) {
      const int32_t* bsums = a[r].sums + b * 16;
      t[r].msum = _mm256_mullo_epi32(_mm256_hadd_epi32(load32(bsums), load32(bsums + 8)), mins);
    }
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

  template <int h, int c, int N>
  static void chunk(const uint8_t* wb, __m256i qh, __m256i half, const Q8Row* a, int64_t b, BlockTerms* t) {
    const __m256i q = q6k_quants(wb, qh, h, c, _mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x03));
    const __m256i sc = chunk_scales<c>(half);
    for (int r = 0; r < N; ++r) {
      const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, load32(a[r].qs + b * 256 + 128 * h + 32 * c)), sc);
      t[r].isum = h == 0 && c == 0 ? p : _mm256_add_epi32(t[r].isum, p);
    }
  }

  template <int h, int N>
  static void half_terms(const uint8_t* wb, __m256i half, const Q8Row* a, int64_t b, BlockTerms* t) {
    const __m256i qh = load32(wb + 128 + 32 * h);
    chunk<h, 0, N>(wb, qh, half, a, b, t);
    chunk<h, 1, N>(wb, qh, half, a, b, t);
    chunk<h, 2, N>(wb, qh, half, a, b, t);
    chunk<h, 3, N>(wb, qh, half, a, b, t);
  }

  template <int N>
  static void terms(const uint8_t* wb, const Q8Row* a, int64_t b, BlockTerms* t) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 192));
    const __m256i s16 = _mm256_cvtepi8_epi16(raw);  // scales 0..7 | 8..15
    half_terms<0, N>(wb, _mm256_permute2x128_si256(s16, s16, 0x00), a, b, t);
    half_terms<1, N>(wb, _mm256_permute2x128_si256(s16, s16, 0x11), a, b, t);
    const __m256i sc_lo = _mm256_cvtepi8_epi32(raw), sc_hi = _mm256_cvtepi8_epi32(_mm_srli_si128(raw, 8));
    for (int r = 0; r < N; ++r) {
      const int32_t* bsums = a[r].sums + b * 16;
      const __m256i corr = _mm256_add_epi32(_mm256_mullo_epi32(sc_lo, load32(bsums)),
                                            _mm256_mullo_epi32(sc_hi, load32(bsums + 8)));
      t[r] = {_mm256_sub_epi32(t[r].isum, _mm256_slli_epi32(corr, 5)), _mm256_setzero_si256()};
    }
  }
};

/// out[r] = the row dot of common/matmul_q8.h of weight row `w` (block type B) with
/// activation rows a[0..N): blocks in groups of eight, block g * 8 + l into lane l (their
/// integers transposed into one vector, then c_b for all eight at once), then the tail
/// one by one, each c_b = d * isum [- dmin * msum] with d = d_w * d_a, dmin = dmin_w * d_a.
/// While it reads a block it prefetches the same bytes of the row at `ahead` (a later
/// row; may be null): the hardware prefetcher alone leaves a core far below the memory's
/// pace (see common/matmul_avx2.cpp).
template <class B, int N>
void rows_dot(const uint8_t* w, const Q8Row* a, float* out, const uint8_t* ahead) {
  const int64_t blocks = a[0].blocks;
  const int64_t full = blocks / 8 * 8;
  uint64_t line = 0;
  auto prefetch_to = [&](int64_t b) {
    if (!ahead) return;
    for (const auto end = static_cast<uint64_t>((b + 1) * B::kBytes); line < end; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(ahead + line), _MM_HINT_T0);
    }
  };
  __m256 acc[N];
  for (int r = 0; r < N; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < full; g += 8) {
    if constexpr (B::kElements == 32) prefetch_to(g + 7);  // small blocks: a line per group
    BlockTerms t[8][N];
    for (int k = 0; k < 8; ++k) {
      if constexpr (B::kElements != 32) prefetch_to(g + k);
      B::template terms<N>(w + (g + k) * B::kBytes, a, g + k, t[k]);
    }
    const __m256 dw = scales8(w + g * B::kBytes + B::kScaleOffset, B::kBytes);
    __m256 dminw = _mm256_setzero_ps();
    if constexpr (B::kHasMin) dminw = scales8(w + g * B::kBytes + 2, B::kBytes);
    for (int r = 0; r < N; ++r) {
      __m256i v[8];
      for (int k = 0; k < 8; ++k) v[k] = t[k][r].isum;
      __m256i isums = hsum8_i32(v);
      if constexpr (B::kSumsOffset != 0) {
        isums = _mm256_sub_epi32(isums, _mm256_mullo_epi32(load32(a[r].sums + g), _mm256_set1_epi32(B::kSumsOffset)));
      }
      const __m256 da = _mm256_loadu_ps(a[r].d + g);
      __m256 c = _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isums));
      if constexpr (B::kHasMin) {
        for (int k = 0; k < 8; ++k) v[k] = t[k][r].msum;
        c = _mm256_sub_ps(c, _mm256_mul_ps(_mm256_mul_ps(dminw, da), _mm256_cvtepi32_ps(hsum8_i32(v))));
      }
      acc[r] = _mm256_add_ps(acc[r], c);
    }
  }
  for (int r = 0; r < N; ++r) {
    float lanes[8];
    _mm256_storeu_ps(lanes, acc[r]);
    out[r] = reduce_lanes(lanes);
  }
  for (int64_t b = full; b < blocks; ++b) {
    prefetch_to(b);
    const uint8_t* wb = w + b * B::kBytes;
    BlockTerms t[N];
    B::template terms<N>(wb, a, b, t);
    const float dw = f16_scale(wb + B::kScaleOffset);
    for (int r = 0; r < N; ++r) {
      const float d = dw * a[r].d[b];
      float c = d * static_cast<float>(hsum_i32(t[r].isum) - B::kSumsOffset * a[r].sums[b]);
      if constexpr (B::kHasMin) c = c - (f16_scale(wb + 2) * a[r].d[b]) * static_cast<float>(hsum_i32(t[r].msum));
      out[r] += c;
    }
  }
}

template <class B>
float row_dot(const uint8_t* w, const Q8Row& a) {
  float v;
  rows_dot<B, 1>(w, &a, &v, nullptr);
  return v;
}

/// out[r] for n <= kQ8MaxRows activation rows, four at a time.
template <class B>
void rows_dot_n(const uint8_t* w, const Q8Row* a, size_t n, float* out) {
  size_t r = 0;
  for (; r + 4 <= n; r += 4) rows_dot<B, 4>(w, a + r, out + r, nullptr);
  switch (n - r) {
    case 3: rows_dot<B, 3>(w, a + r, out + r, nullptr); break;
    case 2: rows_dot<B, 2>(w, a + r, out + r, nullptr); break;
    case 1: rows_dot<B, 1>(w, a + r, out + r, nullptr); break;
    default: break;
  }
}

/// GEMV: out[o - o0] = the row dot of row o, o0 <= o < o1, each prefetching the row
/// kAhead later while it runs (two measured best on one core: 1 and 4 about 5 % slower,
/// 8 and 16 10-25 % slower).
template <class B>
void gemv(const uint8_t* w, uint64_t row_bytes, const Q8Row& a, int64_t o0, int64_t o1, float* out) {
  constexpr int64_t kAhead = 2;
  for (int64_t o = o0; o < o1; ++o) {
    const uint8_t* row = w + static_cast<uint64_t>(o) * row_bytes;
    rows_dot<B, 1>(row, &a, out + (o - o0), o + kAhead < o1 ? row + kAhead * row_bytes : nullptr);
  }
}

}  // namespace

Q8RowsDot q8_rows_dot_avx2(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0: return rows_dot_n<Block32<false>>;
    case GgmlType::kQ4_0: return rows_dot_n<Block32<true>>;
    case GgmlType::kQ4_K: return rows_dot_n<BlockQ45K<false>>;
    case GgmlType::kQ5_K: return rows_dot_n<BlockQ45K<true>>;
    case GgmlType::kQ6_K: return rows_dot_n<BlockQ6K>;
    default: return nullptr;
  }
}

Q8RowDot q8_row_dot_avx2(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0: return row_dot<Block32<false>>;
    case GgmlType::kQ4_0: return row_dot<Block32<true>>;
    case GgmlType::kQ4_K: return row_dot<BlockQ45K<false>>;
    case GgmlType::kQ5_K: return row_dot<BlockQ45K<true>>;
    case GgmlType::kQ6_K: return row_dot<BlockQ6K>;
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
