// The AVX2 half of common/matmul.h (internal: only common/matmul.cpp calls it, and only
// when cpu_supports_avx2()). Same bits as the portable path: every (row, output) is one
// 8-lane accumulator of separately rounded multiplies and adds in common/kernels.h
// `dot`'s order, then dot's reduction tree, then the sequential tail.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/weight_format.h"

namespace charm {

/// Weight rows widened to f32 at a time by the GEMM path: a panel of panel_rows(cols) *
/// cols floats stays in L2 (about 128 KiB) while every row of x streams past it. A
/// multiple of 4 (the micro-kernel's weight rows), at least 4, at most 64.
inline int64_t panel_rows(int64_t cols) {
  const int64_t fit = (int64_t{128} * 1024 / 4) / (cols > 0 ? cols : 1) / 4 * 4;
  return fit < 4 ? 4 : (fit > 64 ? 64 : fit);
}

/// Caller-owned buffers for matmul_tile_avx2 (allocated in portable code, so that no
/// standard-library template is instantiated for AVX2 and later picked by the linker
/// for a CPU without it).
struct Avx2Scratch {
  float* panel = nullptr;                ///< panel_rows(cols) * cols floats
  const int32_t* column_group = nullptr;  ///< [cols]: i / group_size; needed only when
                                          ///< quantised with group_size % 8 != 0
};

/// y[r * w.shape.rows + o] for r < rows, o in [o0, o1) (+ bias[o] when non-null):
/// matmul_tile's contract, single-threaded. Requires cpu_supports_avx2().
void matmul_tile_avx2(const MatrixView& w, const float* x, size_t rows, const float* bias, float* y, int64_t o0,
                      int64_t o1, const Avx2Scratch& scratch);

}  // namespace charm
