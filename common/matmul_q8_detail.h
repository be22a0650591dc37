// Internal to common/matmul_q8.cpp and the x86 kernels (common/matmul_q8_avx2.cpp,
// common/matmul_q8_vnni.cpp, common/matmul_q8_avx512vnni.cpp, each compiling common/matmul_q8_kernels.inc): one quantised
// activation row, the lane sum all paths share, and the x86 entry points.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/ggml_type.h"

namespace charm {

/// One activation row quantised to Q8_0 / Q8_1 (blocks of 32) or Q8_K (blocks of 256).
struct Q8Row {
  const int8_t* qs = nullptr;    ///< [cols] the quants
  const float* d = nullptr;      ///< [blocks] the block scales (Q8_0: the f16 value, widened)
  const int16_t* sums = nullptr; ///< Q8_0: [blocks] sum of each block's qs; Q8_K: [blocks * 16]
                                 ///< sum of each 16 (ggml's bsums)
  int64_t blocks = 0;
  const float* s = nullptr;      ///< Q8_1 only: [blocks] f16(d * sum of qs) widened (ggml's
                                 ///< block_q8_1 s); null for Q8_0 / Q8_K
};

/// The dot of one weight row (whole blocks of its type) with one quantised activation
/// row, as common/matmul_q8.h defines it.
using Q8RowDot = float (*)(const uint8_t* w, const Q8Row& a);

/// The eight lanes' sum, in the order common/matmul_q8.h states. (Inline, defined before
/// the AVX2 file's target pragma, so both paths run this same code.)
inline float reduce_lanes(const float* l) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); }

/// Sums c(b) for b < blocks in common/matmul_q8.h's order (eight lanes, then the tail).
template <typename BlockFn>
inline float lane_sum(int64_t blocks, BlockFn&& c) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t full = blocks / 8 * 8;
  for (int64_t b = 0; b < full; ++b) lanes[b % 8] += c(b);
  float s = reduce_lanes(lanes);
  for (int64_t b = full; b < blocks; ++b) s += c(b);
  return s;
}

/// out[r] = the row dot of `w` with a[r] for r < n (1 <= n <= kQ8MaxRows): the same bits
/// as n calls of the type's Q8RowDot, with the weight row unpacked once per block.
using Q8RowsDot = void (*)(const uint8_t* w, const Q8Row* a, size_t n, float* out);
constexpr size_t kQ8MaxRows = 8;

/// out[o - o0] = the row dot of weight row o (row_bytes apart from w) with `a`, for
/// o0 <= o < o1: the decode GEMV, the same bits as the row dot of each row. It prefetches
/// rows ahead up to row `rows` (the matrix's end: a thread's next tile follows this one).
using Q8Gemv = void (*)(const uint8_t* w, uint64_t row_bytes, const Q8Row& a, int64_t o0, int64_t o1, int64_t rows,
                        float* out);

/// The GEMM of eight weight rows (every type with q8 kernels): y[r * y_stride + i] = the row dot
/// of weight row i (w + i * row_bytes, i < 8) with a[r] (+ bias[i] when bias is non-null),
/// for r < n: the same bits as the type's Q8RowDot. The eight rows are first unpacked into
/// `scratch` (kPanel8BytesPerColumn per weight column, 32-byte aligned; the caller
/// allocates it, so that no standard-library template is instantiated for AVX2): quants as
/// bytes, four columns of the eight rows per 32-byte vector, so that each vector
/// instruction serves eight rows and no row needs a horizontal sum (the layout of
/// llama.cpp's repacked Q4_Kx8 GEMM, built per call instead of stored).
using Q8Gemm8 = void (*)(const uint8_t* w, uint64_t row_bytes, const Q8Row* a, size_t n, const float* bias, float* y,
                         size_t y_stride, uint8_t* scratch);
/// Scratch bytes per weight column of a Q8Gemm8 (a K-quant block of 256 columns takes
/// 2880, a Q8_0 block of 32 takes 288).
constexpr size_t kPanel8BytesPerColumn = 12;

/// One instruction set's q8 kernels for one weight type (all null for a type without): the
/// GEMM, the GEMV and the eight-row GEMM (the portable row dot stays the reference and the
/// fallback).
struct Q8Kernels {
  Q8RowsDot rows_dot = nullptr;
  Q8Gemv gemv = nullptr;
  Q8Gemm8 gemm8 = nullptr;
};

/// The AVX2 kernels (maddubs + madd). Call only when cpu_supports_avx2().
Q8Kernels q8_kernels_avx2(GgmlType type);

/// *amax = max |x[j]| for j < n (n a multiple of 8), with AVX2; false when some x[j] is
/// NaN or Inf (then *amax means nothing). Call only when cpu_supports_avx2().
bool abs_max_avx2(const float* x, int64_t n, float* amax);

/// q[j] = round-half-away(x[j] * id) for the 32 activations of a Q8_0 block (the portable
/// quantiser's std::round; |x * id| must stay below 128), with AVX2; returns their sum.
/// Call only when cpu_supports_avx2().
int32_t quantize_q8_0_block_avx2(const float* x, float id, int8_t* q);

/// What quantising one Q8_K block found.
enum class Q8KBlock : uint8_t {
  kQuantised,  ///< q, d and the 16 sums written
  kNonFinite,  ///< a NaN or Inf: nothing written (the caller poisons the block)
  kZero,       ///< amax 0, or -127 / max overflows: nothing written (the caller zeroes it)
};

/// One Q8_K block of 256 activations at x quantised as quantize_row_q8_K_ref, with AVX2:
/// the portable quantiser's bits (q, d and the 16 sums). Call only when cpu_supports_avx2().
Q8KBlock quantize_q8_k_block_avx2(const float* x, int8_t* q, float* d, int16_t* sums);

/// The AVX-VNNI kernels (vpdpbusd / vpdpwssd), the same bits as the AVX2 ones. Call only
/// when cpu_supports_q8_form(Q8Form::kAvxVnni).
Q8Kernels q8_kernels_avx_vnni(GgmlType type);

/// The AVX512-VNNI kernels (EVEX vpdpbusd / vpdpwssd on 256-bit vectors), the same bits as
/// the AVX2 ones. Call only when cpu_supports_q8_form(Q8Form::kAvx512Vnni).
Q8Kernels q8_kernels_avx512_vnni(GgmlType type);

}  // namespace charm
