// dequantize_row of common/ggml_type.h: GGML blocks widened to f32, bit for bit as
// gguf-py's gguf.quants.dequantize (gguf 0.19.0, the oracle of
// tests/fixtures/ggml_quants/, scripts/gen_ggml_quant_cases.py).
//
// The block layouts are ggml-common.h's block_* structs (little-endian, packed); each
// type has one short function per block below. Every value is computed with the same
// rounded f32 operations, in the same order, as gguf-py's numpy code (which widens every
// f16 / integer to f32 first and then multiplies and adds in f32); the comment on each
// function gives the formula. ggml's C dequantize_row_* (ggml-quants.c) writes the same
// formulas in the same order, and both agree on every quantised type: checked over the
// fixtures with scripts/gen_ggml_quant_cases.py --against-ggml (libggml-base of llama.cpp
// 0.3.36's vendored ggml). One difference, F16 only: ggml_fp16_to_fp32 quiets a
// signalling NaN (0x7C01 -> 0x7FC02000) where numpy (and common/dtype.h) keep the payload
// as it is (0x7F802000); this follows gguf-py.
//
// Why the orders cannot disagree for these types: every product is exact in f32. A
// finite f16 has an 11-bit significand, the sub-block scales and quants are integers of
// at most 7 and 5 significant bits (Q6_K's int8 scale times q - 32 is the widest: at most
// 11 + 7 + 5 = 23 bits), and no product leaves the f32 normal range (MXFP4's 2^-128 * q is
// an exact subnormal; its 2^127 * 12 is inf everywhere). So (d * sc) * q, d * (sc * q) and
// a fused multiply-add all give the same bits, and only the final add of Q4_1 / Q5_1 /
// Q2_K / Q4_K / Q5_K rounds. The build's -ffp-contract=off is kept all the same (it is the
// project's rule, and a future type may have inexact products).
//
// The AVX2 kernels of common/ggml_dequantize_avx2.cpp compute the same bits for some
// types; dequantize_row picks them by active_kernel_path() (common/matmul.h).
#include <bit>
#include <cstring>
#include <string>

#include "common/dtype.h"
#include "common/error.h"
#include "common/ggml_dequantize_detail.h"
#include "common/ggml_type.h"
#include "common/matmul.h"

static_assert(std::endian::native == std::endian::little, "GGML blocks are read as little-endian");

namespace charm {
namespace {

constexpr int kQK = 32;    // elements of a 32-element block (QK4_0 .. QK8_0, QK_MXFP4)

float load_f16(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return f16_to_f32(bits);
}

/// Q4_0 {f16 d; u8 qs[16]}: y[j] = d * (lo(qs[j]) - 8), y[j + 16] = d * (hi(qs[j]) - 8).
void q4_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
    y[j + kQK / 2] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

/// Q4_1 {f16 d, m; u8 qs[16]}: y = d * q + m, q the nibbles as Q4_0 (no offset).
void q4_1(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0F) + m;
    y[j + kQK / 2] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

/// The little-endian u32 at `p` (a Q5 block's qh: bit j is the fifth bit of element j).
uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

/// Q5_0 {f16 d; u8 qh[4]; u8 qs[16]}: y = d * (q - 16), q = nibble | bit(qh, j) << 4.
void q5_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint32_t qh = load_u32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < kQK / 2; ++j) {
    const int q0 = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int q1 = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(q0 - 16);
    y[j + kQK / 2] = d * static_cast<float>(q1 - 16);
  }
}

/// Q5_1 {f16 d, m; u8 qh[4]; u8 qs[16]}: y = d * q + m, q as Q5_0 without the offset.
void q5_1(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const uint32_t qh = load_u32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < kQK / 2; ++j) {
    const int q0 = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int q1 = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(q0) + m;
    y[j + kQK / 2] = d * static_cast<float>(q1) + m;
  }
}

/// Q8_0 {f16 d; i8 qs[32]}: y = d * q.
void q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(static_cast<int8_t>(b[2 + j]));
}

/// MXFP4 {u8 e (e8m0); u8 qs[16]}: y = kvalues[nibble] * d, d = 2^(e - 128) as f32 (half
/// the e8m0 scale, since kvalues are twice the e2m1 values); e = 0 and 1 are the f32
/// subnormals 2^-128, 2^-127, and e = 255 is 2^127, not NaN (ggml_e8m0_to_fp32_half).
void mxfp4(const uint8_t* b, float* y) {
  const float d = e8m0_half_to_f32(b[0]);
  const uint8_t* qs = b + 1;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>(kMxfp4Values[qs[j] & 0x0F]) * d;
    y[j + kQK / 2] = static_cast<float>(kMxfp4Values[qs[j] >> 4]) * d;
  }
}

/// Q2_K {u8 scales[16]; u8 qs[64]; f16 d, dmin}: 16 sub-blocks of 16; sub-block s has
/// scale lo(scales[s]) and min hi(scales[s]); y = (d * sc) * q - (dmin * m), q 2 bits.
/// Element e = 128 h + 32 k + l (h < 2, k < 4, l < 32) is bits 2k..2k+1 of qs[32 h + l].
void q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = load_f16(b + 80);
  const float dmin = load_f16(b + 82);
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 4; ++k) {
      for (int half = 0; half < 2; ++half) {  // sub-block 8 h + 2 k + half, elements 16 apart
        const uint8_t sc = scales[8 * h + 2 * k + half];
        const float dl = d * static_cast<float>(sc & 0x0F);
        const float ml = dmin * static_cast<float>(sc >> 4);
        const uint8_t* q = qs + 32 * h + 16 * half;
        float* out = y + 128 * h + 32 * k + 16 * half;
        for (int l = 0; l < 16; ++l) out[l] = dl * static_cast<float>((q[l] >> (2 * k)) & 3) - ml;
      }
    }
  }
}

/// Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: 16 sub-blocks of 16 with 6-bit
/// scales (low 4 bits: nibble s / 8 of scales[s % 8]; high 2 bits: bits
/// 2 (s / 4)..+1 of scales[8 + s % 4]), minus 32. y = (d * (sc - 32)) * q with
/// q = 2 bits (as Q2_K) - 4 unless bit k' of hmask[l] is set, for e = 32 k' + l.
void q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* scales = b + 96;
  const float d = load_f16(b + 108);
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 4; ++k) {
      for (int half = 0; half < 2; ++half) {
        const int s = 8 * h + 2 * k + half;
        const float dl = d * static_cast<float>(q3_k_scale(s, scales));
        const uint8_t* q = qs + 32 * h + 16 * half;
        const uint8_t* hm = hmask + 16 * half;
        const int hbit = 4 * h + k;  // the hmask bit of elements 32 (4 h + k) + l
        float* out = y + 128 * h + 32 * k + 16 * half;
        for (int l = 0; l < 16; ++l) {
          const int q2 = (q[l] >> (2 * k)) & 3;
          out[l] = dl * static_cast<float>(q2 - (((hm[l] >> hbit) & 1) ? 0 : 4));
        }
      }
    }
  }
}

/// Q4_K: d, dmin (f16), scales[12], qs[128]. y = (d * sc) * q - (dmin * m) for sub-block
/// s = e / 32 of 8; q is the low nibble of qs[32 (s / 2) + l] for even s, the high for odd.
/// Q5_K (kFifthBit): d, dmin, scales[12], qh[32], qs[128]; the same with a fifth bit: bit s
/// of qh[l] for element 32 s + l.
template <bool kFifthBit>
void q45_k(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (kFifthBit ? 48 : 16);
  for (int s = 0; s < 8; ++s) {
    const ScaleMin sm = get_scale_min_k4(s, scales);
    const float d1 = d * static_cast<float>(sm.scale);
    const float m1 = dmin * static_cast<float>(sm.min);
    const uint8_t* q = qs + 32 * (s / 2);
    const int shift = 4 * (s % 2);
    for (int l = 0; l < 32; ++l) {
      int v = (q[l] >> shift) & 0x0F;
      if constexpr (kFifthBit) v |= ((qh[l] >> s) & 1) << 4;
      y[32 * s + l] = d1 * static_cast<float>(v) - m1;
    }
  }
}

/// Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: y = (d * sc[e / 16]) * (q - 32),
/// q 6 bits; for e = 128 h + t (t < 128): low 4 bits = nibble t / 64 of ql[64 h + t % 64],
/// high 2 bits = bits 2 (t / 32)..+1 of qh[32 h + t % 32].
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int h = 0; h < 2; ++h) {
    for (int c = 0; c < 4; ++c) {  // t = 32 c + 16 half + l
      for (int half = 0; half < 2; ++half) {
        const float dl = d * static_cast<float>(scales[8 * h + 2 * c + half]);
        const uint8_t* lo = ql + 64 * h + 32 * (c % 2) + 16 * half;
        const uint8_t* hi = qh + 32 * h + 16 * half;
        float* out = y + 128 * h + 32 * c + 16 * half;
        for (int l = 0; l < 16; ++l) {
          const int low = (lo[l] >> (4 * (c / 2))) & 0x0F;
          const int high = (hi[l] >> (2 * c)) & 3;
          out[l] = dl * static_cast<float>((low | (high << 4)) - 32);
        }
      }
    }
  }
}

/// Runs `Fn` over every block of a row (a template, so each block function inlines).
template <void (*Fn)(const uint8_t*, float*)>
void blocks(const uint8_t* src, float* dst, int64_t elements, const GgmlTypeTraits& t) {
  for (int64_t i = 0; i < elements / t.block_elements; ++i) Fn(src + i * t.block_bytes, dst + i * t.block_elements);
}

}  // namespace

void dequantize_row_portable(GgmlType type, const void* src, float* dst, int64_t elements) {
  const GgmlTypeTraits t = ggml_traits(type);
  const auto* s = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(elements) * 4);
      return;
    case GgmlType::kF16:
      convert_to_f32(DType::kF16, src, dst, static_cast<size_t>(elements));
      return;
    case GgmlType::kBF16:
      convert_to_f32(DType::kBF16, src, dst, static_cast<size_t>(elements));
      return;
    case GgmlType::kQ4_0: return blocks<q4_0>(s, dst, elements, t);
    case GgmlType::kQ4_1: return blocks<q4_1>(s, dst, elements, t);
    case GgmlType::kQ5_0: return blocks<q5_0>(s, dst, elements, t);
    case GgmlType::kQ5_1: return blocks<q5_1>(s, dst, elements, t);
    case GgmlType::kQ8_0: return blocks<q8_0>(s, dst, elements, t);
    case GgmlType::kQ2_K: return blocks<q2_k>(s, dst, elements, t);
    case GgmlType::kQ3_K: return blocks<q3_k>(s, dst, elements, t);
    case GgmlType::kQ4_K: return blocks<q45_k<false>>(s, dst, elements, t);
    case GgmlType::kQ5_K: return blocks<q45_k<true>>(s, dst, elements, t);
    case GgmlType::kQ6_K: return blocks<q6_k>(s, dst, elements, t);
    case GgmlType::kMXFP4: return blocks<mxfp4>(s, dst, elements, t);
  }
  throw Error(ErrorCategory::kInternal, "dequantize_row: unhandled GGML type " + std::string(t.name));
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t elements) {
  const GgmlTypeTraits t = ggml_traits(type);
  if (elements < 0 || elements % t.block_elements != 0) {
    throw Error(ErrorCategory::kInvalidInput, "dequantize_row: " + std::to_string(elements) + " elements of " +
                                                  t.name + " are not whole blocks of " +
                                                  std::to_string(t.block_elements));
  }
#if defined(__x86_64__) || defined(__i386__)
  if (active_kernel_path() == KernelPath::kAvx2 &&
      dequantize_row_avx2(type, static_cast<const uint8_t*>(src), dst, elements)) {
    return;
  }
#endif
  dequantize_row_portable(type, src, dst, elements);
}

}  // namespace charm
