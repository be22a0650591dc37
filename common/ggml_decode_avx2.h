// Internal to common/ggml_dequantize_avx2.cpp and common/matmul_avx2.cpp: the AVX2
// decoders of one GGML block each, shared so that dequantize_row's AVX2 path and the
// fused GEMV of matmul widen every value with the very same instructions (hence the same
// bits; those equal the portable dequantisers', see common/ggml_dequantize.cpp on why
// every product there is exact).
//
// A decoder (struct Q8_0 .. Q6_K below, decode_block) calls sink(j, v) for j = 0, 1, ..,
// block_elements / 8 - 1 in ascending order, v being elements [8 j, 8 j + 8) of the
// block as f32. The ascending order matters to a sink that accumulates (GEMV: each lane
// of dot's accumulators sums its columns in column order); a storing sink ignores it.
//
// Compiled for AVX2 + FMA + F16C by the target pragma below; call only when
// cpu_supports_avx2(). The one fused multiply-add here is the decoders' (d * sc) * q - m
// (Q2_K, Q4_K, Q5_K): (d * sc) * q is exact in f32 (common/ggml_dequantize.cpp says why),
// so rounding it and then the subtraction gives the bits of one rounding of the whole.
// The dot's own multiply and add stay apart (common/matmul_avx2.cpp). Everything is in an
// unnamed namespace, so each including file has its own copy and no AVX2 function can be
// picked by the linker for a portable caller. The standard headers are included before
// the pragma, so none of their inline functions is compiled for AVX2.
#pragma once

#include <immintrin.h>

#include <bit>
#include <cstdint>
#include <cstring>

#include "common/avx2_target_begin.inc"

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

/// The 8 bytes at `p` as eight i32 lanes, unsigned (zx) or signed (sx). A load that the
/// compiler folds into vpmovzxbd / vpmovsxbd: one shuffle per 8 values, where widening a
/// register of 32 bytes (widen_i8) takes 7 shuffles per 32.
inline __m128i load64(const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }
inline __m256i load8_zx(const uint8_t* p) { return _mm256_cvtepu8_epi32(load64(p)); }
inline __m256i load8_sx(const uint8_t* p) { return _mm256_cvtepi8_epi32(load64(p)); }

/// The 8 sub-block scales and 8 mins of a Q4_K / Q5_K super-block (12 bytes at `q`) as
/// bytes: sc[0..8) then m[0..8), each equal to get_scale_min_k4's (llama.cpp's
/// ggml_vec_dot_q4_K_q8_K unpacks them the same way, with 32-bit masks).
inline void unpack_scale_min_k4(const uint8_t* q, uint8_t out[16]) {
  uint32_t u[4];
  std::memcpy(u, q, 12);
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);  // m[4..8): high nibbles of q[8..12), top of q[4..8)
  const uint32_t mins_low = u[1] & kLow6;                         // m[0..4)
  u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);           // sc[4..8): low nibbles of q[8..12), top of q[0..4)
  u[2] = mins_low;
  u[0] &= kLow6;                                                  // sc[0..4)
  std::memcpy(out, u, 16);
}

/// The per-sub-block f32 products d * sc[s] and dmin * m[s] of a Q4_K / Q5_K block, in
/// eight lanes: each lane is the same rounded product as the portable path's scalar one.
struct ScalesMins {
  alignas(32) float d[8];
  alignas(32) float m[8];
};
inline void scales_mins_k4(const uint8_t* b, ScalesMins& out) {
  uint8_t sm[16];
  unpack_scale_min_k4(b + 4, sm);
  const __m256 sc = _mm256_cvtepi32_ps(load8_zx(sm));
  const __m256 mn = _mm256_cvtepi32_ps(load8_zx(sm + 8));
  _mm256_store_ps(out.d, _mm256_mul_ps(_mm256_set1_ps(f16_scale(b)), sc));
  _mm256_store_ps(out.m, _mm256_mul_ps(_mm256_set1_ps(f16_scale(b + 2)), mn));
}

// The small loops below are unrolled by pragma: rolled, GCC kept each row's vectors in a
// loop of its own (a widened quant array spilled to the stack, one add chain at a time),
// and the GEMV ran about a third slower.
//
// Each block type is a struct: kElements / kBytes (ggml-common.h's block sizes; a wrong
// one fails tests/unit/test_matmul.cpp), prepare(block, prep) computes the block's
// scales once, chunk(block, prep, c, sink) emits chunk c's 8-column vectors (32
// elements, or 64 for Q4_K), for c < kChunks in ascending order. The split lets the GEMV
// interleave the chunks of several rows: one row's accumulation is a chain of dependent
// adds, and a 256-element block of one row (32 adds) is longer than the out-of-order
// window can overlap with the next row's.

/// Q8_0 {f16 d; i8 qs[32]}: d * q (gguf-py's x * d, the same product).
struct Q8_0 {
  static constexpr int64_t kElements = 32, kBytes = 34;
  static constexpr int kChunks = 1;
  struct Prep {
    __m256 d;
  };
  static void prepare(const uint8_t* b, Prep& p) { p.d = _mm256_set1_ps(f16_scale(b)); }
  template <class Sink>
  static void chunk(const uint8_t* b, const Prep& p, int, Sink& sink) {
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) sink(k, _mm256_mul_ps(p.d, _mm256_cvtepi32_ps(load8_sx(b + 2 + 8 * k))));
  }
};

/// Q4_0 {f16 d; u8 qs[16]}: element j = d * (lo(qs[j]) - 8), j + 16 = d * (hi(qs[j]) - 8).
struct Q4_0 {
  static constexpr int64_t kElements = 32, kBytes = 18;
  static constexpr int kChunks = 1;
  using Prep = Q8_0::Prep;
  static void prepare(const uint8_t* b, Prep& p) { p.d = _mm256_set1_ps(f16_scale(b)); }
  template <class Sink>
  static void chunk(const uint8_t* b, const Prep& p, int, Sink& sink) {
    const __m256i a[2] = {load8_zx(b + 2), load8_zx(b + 10)};  // qs[0..8), qs[8..16) in i32 lanes
    const __m256i mask = _mm256_set1_epi32(0x0F), eight = _mm256_set1_epi32(8);
    #pragma GCC unroll 4
    for (int k = 0; k < 2; ++k) {
      sink(k, _mm256_mul_ps(p.d, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(a[k], mask), eight))));
    }
    #pragma GCC unroll 4
    for (int k = 0; k < 2; ++k) {
      sink(2 + k, _mm256_mul_ps(p.d, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(a[k], 4), eight))));
    }
  }
};

/// MXFP4 {u8 e (e8m0); u8 qs[16]}: kvalues[nibble] * d (the portable path's order),
/// d = 2^(e - 128) as there; the nibbles are looked up in the 16-entry table with pshufb.
struct MXFP4 {
  static constexpr int64_t kElements = 32, kBytes = 17;
  static constexpr int kChunks = 1;
  using Prep = Q8_0::Prep;
  static void prepare(const uint8_t* b, Prep& p) {
    const uint32_t e = b[0];
    p.d = _mm256_set1_ps(std::bit_cast<float>(e < 2 ? 0x00200000u << e : (e - 1) << 23));
  }
  template <class Sink>
  static void chunk(const uint8_t* b, const Prep& p, int, Sink& sink) {
    const __m128i table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 1));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(qs, mask));  // elements 0..15
    const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(qs, 4), mask));  // 16..31
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) sink(k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])), p.d));
  }
};

/// Q2_K {u8 scales[16]; u8 qs[64]; f16 d, dmin}: (d * sc) * q - (dmin * m) per sub-block
/// of 16; elements 128 h + 32 k + l are bits 2k..2k+1 of qs[32 h + l] (chunk 4 h + k).
struct Q2_K {
  static constexpr int64_t kElements = 256, kBytes = 84;
  static constexpr int kChunks = 8;
  struct Prep {
    alignas(32) float dl[16];  // the same rounded products as the portable path
    alignas(32) float ml[16];
  };
  static void prepare(const uint8_t* b, Prep& p) {  // d * lo(scales[s]), dmin * hi(scales[s])
    const __m256 d = _mm256_set1_ps(f16_scale(b + 80));
    const __m256 dmin = _mm256_set1_ps(f16_scale(b + 82));
    const __m256i mask = _mm256_set1_epi32(0x0F);
    for (int h = 0; h < 2; ++h) {
      const __m256i sc = load8_zx(b + 8 * h);
      _mm256_store_ps(p.dl + 8 * h, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(sc, mask))));
      _mm256_store_ps(p.ml + 8 * h, _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_srli_epi32(sc, 4))));
    }
  }
  template <class Sink>
  static void chunk(const uint8_t* b, const Prep& p, int c, Sink& sink) {
    const int h = c / 4, k = c % 4;
    const __m256i bytes = load256(b + 16 + 32 * h);
    const __m256i q2 = _mm256_and_si256(_mm256_srl_epi16(bytes, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3));
    const Widened q = widen_i8(q2);
    const int s = 8 * h + 2 * k;
    #pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m256 d1 = _mm256_broadcast_ss(&p.dl[s + v / 2]), m1 = _mm256_broadcast_ss(&p.ml[s + v / 2]);
      sink(4 * c + v, _mm256_fmsub_ps(d1, q.f[v], m1));  // d1 * q exact: one rounding either way
    }
  }
};

/// Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: (d * (sc - 32)) * q per
/// sub-block of 16, q = the 2 bits of Q2_K's place minus 4 where bit 4 h + k of hmask[l]
/// is clear.
struct Q3_K {
  static constexpr int64_t kElements = 256, kBytes = 110;
  static constexpr int kChunks = 8;
  struct Prep {
    alignas(32) float dl[16];  // the same scalar products as the portable path
  };
  // Sub-block s's 6-bit scale: low 4 bits = nibble s / 8 of scales[s % 8], high 2 bits =
  // bits 2 (s / 4)..+1 of scales[8 + s % 4]; eight sub-blocks at a time.
  static void prepare(const uint8_t* b, Prep& p) {
    const uint8_t* scales = b + 96;
    const __m256 d = _mm256_set1_ps(f16_scale(b + 108));
    uint32_t top;
    std::memcpy(&top, scales + 8, 4);
    const uint64_t twice = static_cast<uint64_t>(top) << 32 | top;  // scales[8 + s % 4] for s < 8
    const __m256i high_bytes = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(twice)));
    const __m256i low_bytes = load8_zx(scales);
    const __m256i mask4 = _mm256_set1_epi32(0x0F), mask2 = _mm256_set1_epi32(3), bias = _mm256_set1_epi32(32);
    for (int h = 0; h < 2; ++h) {  // s = 8 h + lane
      const __m256i low = _mm256_and_si256(_mm256_srli_epi32(low_bytes, 4 * h), mask4);
      const __m256i shifts = _mm256_setr_epi32(4 * h, 4 * h, 4 * h, 4 * h, 4 * h + 2, 4 * h + 2, 4 * h + 2, 4 * h + 2);
      const __m256i high = _mm256_and_si256(_mm256_srlv_epi32(high_bytes, shifts), mask2);
      const __m256i sc = _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32(high, 4)), bias);
      _mm256_store_ps(p.dl + 8 * h, _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc)));
    }
  }
  template <class Sink>
  static void chunk(const uint8_t* b, const Prep& p, int c, Sink& sink) {
    const int h = c / 4, k = c % 4;
    const __m256i one = _mm256_set1_epi8(1);
    const __m256i bytes = load256(b + 32 + 32 * h);
    const __m256i q2 = _mm256_and_si256(_mm256_srl_epi16(bytes, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3));
    const __m256i hbit = _mm256_and_si256(_mm256_srl_epi16(load256(b), _mm_cvtsi32_si128(4 * h + k)), one);
    // 4 where the bit is clear: (hbit ^ 1) << 2 <= 4, so 16-bit shifts keep bytes apart.
    const __m256i offset = _mm256_slli_epi16(_mm256_xor_si256(hbit, one), 2);
    const Widened q = widen_i8(_mm256_sub_epi8(q2, offset));
    const int s = 8 * h + 2 * k;
    #pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) sink(4 * c + v, _mm256_mul_ps(_mm256_broadcast_ss(&p.dl[s + v / 2]), q.f[v]));
  }
};

/// Q4_K {f16 d, dmin; u8 scales[12]; u8 qs[128]}: (d * sc) * q - (dmin * m) per sub-block
/// s of 32: the low nibbles of qs[32 p ..+32) for s = 2 p, the high ones for s = 2 p + 1.
/// A chunk here is such a pair (64 elements): each byte is widened once for both.
struct Q4_K {
  static constexpr int64_t kElements = 256, kBytes = 144;
  static constexpr int kChunks = 4;
  using Prep = ScalesMins;
  static void prepare(const uint8_t* b, Prep& p) { scales_mins_k4(b, p); }
  template <class Sink>
  static void chunk(const uint8_t* b, const Prep& p, int c, Sink& sink) {
    const uint8_t* qs = b + 16 + 32 * c;
    __m256i a[4];  // qs[32 c + 8 k ..+8) in i32 lanes
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) a[k] = load8_zx(qs + 8 * k);
    const __m256i mask = _mm256_set1_epi32(0x0F);
    const __m256 dlo = _mm256_broadcast_ss(&p.d[2 * c]), mlo = _mm256_broadcast_ss(&p.m[2 * c]);
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(a[k], mask));
      sink(8 * c + k, _mm256_fmsub_ps(dlo, q, mlo));  // dlo * q exact: one rounding either way
    }
    const __m256 dhi = _mm256_broadcast_ss(&p.d[2 * c + 1]), mhi = _mm256_broadcast_ss(&p.m[2 * c + 1]);
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256 q = _mm256_cvtepi32_ps(_mm256_srli_epi32(a[k], 4));  // a byte >> 4: the high nibble
      sink(8 * c + 4 + k, _mm256_fmsub_ps(dhi, q, mhi));
    }
  }
};

/// Q5_K {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: as Q4_K with a fifth bit,
/// bit c of qh[l] for element 32 c + l.
struct Q5_K {
  static constexpr int64_t kElements = 256, kBytes = 176;
  static constexpr int kChunks = 8;
  using Prep = ScalesMins;
  static void prepare(const uint8_t* b, Prep& p) { scales_mins_k4(b, p); }
  template <class Sink>
  static void chunk(const uint8_t* b, const Prep& p, int c, Sink& sink) {
    const __m256i mask = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i bytes = load256(b + 48 + 32 * (c / 2));
    const __m256i low = _mm256_and_si256(_mm256_srl_epi16(bytes, _mm_cvtsi32_si128(4 * (c % 2))), mask);
    const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(load256(b + 16), _mm_cvtsi32_si128(c)), one);
    // bit <= 1, so shifting 16-bit lanes left by 4 keeps every byte to itself.
    const Widened q = widen_i8(_mm256_or_si256(low, _mm256_slli_epi16(bit, 4)));
    const __m256 d1 = _mm256_broadcast_ss(&p.d[c]), m1 = _mm256_broadcast_ss(&p.m[c]);
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) sink(4 * c + k, _mm256_fmsub_ps(d1, q.f[k], m1));  // d1 * q exact
  }
};

/// Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: (d * sc[e / 16]) * (q - 32). For
/// chunk c = 4 h + cc of 32 values: low 4 bits = nibble cc / 2 of
/// ql[64 h + 32 (cc % 2) + l], high 2 bits = bits 2cc..2cc+1 of qh[32 h + l].
struct Q6_K {
  static constexpr int64_t kElements = 256, kBytes = 210;
  static constexpr int kChunks = 8;
  struct Prep {
    alignas(32) float dl[16];  // d * sc[i], the same rounded products as the portable path
  };
  static void prepare(const uint8_t* b, Prep& p) {
    const __m256 d = _mm256_set1_ps(f16_scale(b + 208));
    _mm256_store_ps(p.dl, _mm256_mul_ps(d, _mm256_cvtepi32_ps(load8_sx(b + 192))));
    _mm256_store_ps(p.dl + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(load8_sx(b + 200))));
  }
  template <class Sink>
  static void chunk(const uint8_t* b, const Prep& p, int c, Sink& sink) {
    const int h = c / 4, cc = c % 4;
    const __m256i low_bytes = load256(b + 64 * h + 32 * (cc % 2));
    const __m256i high_bytes = load256(b + 128 + 32 * h);
    const __m256i mask4 = _mm256_set1_epi8(0x0F), mask2 = _mm256_set1_epi8(0x03);
    const __m256i low = _mm256_and_si256(_mm256_srl_epi16(low_bytes, _mm_cvtsi32_si128(4 * (cc / 2))), mask4);
    const __m256i high = _mm256_and_si256(_mm256_srl_epi16(high_bytes, _mm_cvtsi32_si128(2 * cc)), mask2);
    // high <= 3, so shifting 16-bit lanes left by 4 keeps every byte to itself.
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32));
    const Widened w = widen_i8(q);
    const __m256 d0 = _mm256_broadcast_ss(&p.dl[2 * c]), d1 = _mm256_broadcast_ss(&p.dl[2 * c + 1]);
    sink(4 * c, _mm256_mul_ps(d0, w.f[0]));
    sink(4 * c + 1, _mm256_mul_ps(d0, w.f[1]));
    sink(4 * c + 2, _mm256_mul_ps(d1, w.f[2]));
    sink(4 * c + 3, _mm256_mul_ps(d1, w.f[3]));
  }
};

/// All of block `b` of type T, chunk by chunk.
template <class T, class Sink>
inline void decode_block(const uint8_t* b, Sink& sink) {
  typename T::Prep p;
  T::prepare(b, p);
  for (int c = 0; c < T::kChunks; ++c) T::chunk(b, p, c, sink);
}

/// A sink that stores: elements [8 j, 8 j + 8) of the block go to y + 8 j.
struct StoreSink {
  float* y;
  void operator()(int j, __m256 v) const { _mm256_storeu_ps(y + 8 * j, v); }
};

}  // namespace ggml_avx2
}  // namespace
}  // namespace charm

#include "common/avx2_target_end.inc"
