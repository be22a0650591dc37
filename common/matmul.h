// Matrix products with a weight kept in its stored form (common/weight_format.h): the
// one kernel behind every linear layer of the coordinator and every routed expert of
// the workers. Decode is the rows = 1 case (matrix-vector); prefill and the
// batch-union call it with every row that shares the weight (one GEMM, not many GEMVs).
//
// Bits: y[r][o] equals dot(x_r, w_o) of common/kernels.h, with w_o the row widened to
// f32 by matrix_row_to_f32 (plus bias[o]), whatever `rows`, the other rows, the thread
// count or the instruction set. That is the placement invariant of DESIGN.md: a row's
// result never depends on which batch, worker or tier produced it.
#pragma once

#include <cstddef>
#include <cstdint>
#include "common/weight_format.h"

namespace charm {

/// y [rows, out] = x [rows, in] W^T (+ bias [out] when non-null), with W = `w`
/// [out = w.shape.rows, in = w.shape.cols] in any WeightFormat. x and y are f32
/// row-major and must not overlap. Parallel (OpenMP) over output features when the
/// product is large enough to pay for waking threads.
void matmul(const MatrixView& w, const float* x, size_t rows, const float* bias, float* y);

/// Same bits as matmul, single-threaded: for callers already inside a parallel region.
void matmul_serial(const MatrixView& w, const float* x, size_t rows, const float* bias, float* y);

}  // namespace charm
