#include "common/matmul.h"

#include <algorithm>

#include "common/kernels.h"

namespace charm {
namespace {

/// Output rows [o0, o1) for every input row: each weight row is widened once and used
/// for all rows of x (the GEMM's reuse), then the same `dot` as a GEMV.
void matmul_range(const MatrixView& w, const float* x, size_t rows, const float* bias, float* y, int64_t o0,
                  int64_t o1, float* scratch) {
  const auto in = static_cast<size_t>(w.shape.cols);
  const auto out = static_cast<size_t>(w.shape.rows);
  for (int64_t o = o0; o < o1; ++o) {
    const float* wo = scratch;
    if (w.shape.format == WeightFormat::kF32) {
      wo = reinterpret_cast<const float*>(w.data) + static_cast<size_t>(o) * in;
    } else {
      matrix_row_to_f32(w, o, scratch);
    }
    const float b = bias ? bias[o] : 0.0f;
    for (size_t r = 0; r < rows; ++r) y[r * out + static_cast<size_t>(o)] = dot(x + r * in, wo, in) + b;
  }
}

}  // namespace

void matmul_serial(const MatrixView& w, const float* x, size_t rows, const float* bias, float* y) {
  std::vector<float> scratch(static_cast<size_t>(w.shape.cols));
  matmul_range(w, x, rows, bias, y, 0, w.shape.rows, scratch.data());
}

void matmul(const MatrixView& w, const float* x, size_t rows, const float* bias, float* y) {
  const int64_t out = w.shape.rows;
  const bool parallel = static_cast<uint64_t>(out) * static_cast<uint64_t>(w.shape.cols) * rows > 32768;
#pragma omp parallel if (parallel)
  {
    std::vector<float> scratch(static_cast<size_t>(w.shape.cols));
#pragma omp for schedule(static)
    for (int64_t o = 0; o < out; ++o) matmul_range(w, x, rows, bias, y, o, o + 1, scratch.data());
  }
}

}  // namespace charm
