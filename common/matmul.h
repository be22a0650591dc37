// Matrix products with a weight kept in its stored form (common/weight_format.h): the
// one kernel behind every linear layer of the coordinator and every routed expert of
// the workers. Decode is the rows = 1 case (matrix-vector); prefill and the
// batch-union call it with every row that shares the weight (one GEMM, not many GEMVs).
//
// Bits: y[r][o] equals dot(x_r, w_o) of common/kernels.h, with w_o the row widened to
// f32 by matrix_row_to_f32 (plus bias[o]), whatever `rows`, the other rows, the thread
// count or the instruction set. That is the placement invariant of DESIGN.md: a row's
// result never depends on which batch, worker or tier produced it. (One caveat: where
// several NaNs meet in one sum, which NaN's payload survives follows the compiler's
// operand order, which IEEE 754 leaves open; the result is NaN on every path.)
// Without a bias nothing is added (not even +0, which would turn -0 into +0).
// The one exception, opt-in: under `activations: q8` (common/matmul_q8.h) GGML-block
// weights with a q8 kernel compute llama.cpp's int8-activation products instead (lossy;
// still independent of the batch, the thread count and the instruction set).
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

/// Outputs [o0, o1) of matmul only: y[r * w.shape.rows + o] for every r < rows and o in
/// [o0, o1), same bits as matmul, single-threaded. For callers that split one product
/// (or several) into work items of their own (worker/experts/expert_executor.cpp). Requires
/// 0 <= o0 <= o1 <= w.shape.rows.
void matmul_tile(const MatrixView& w, const float* x, size_t rows, const float* bias, float* y, int64_t o0,
                 int64_t o1);

/// Which implementation computes matmul. Both give the same bits (the contract above);
/// they differ only in speed.
enum class KernelPath : uint8_t {
  kPortable,  ///< plain C++ (common/matmul.cpp): the reference semantics, any CPU
  kAvx2,      ///< AVX2-era x86 (common/matmul_avx2.cpp): needs avx2, fma and f16c
};

/// "portable" or "avx2".
const char* kernel_path_name(KernelPath path);
/// True when this CPU can run KernelPath::kAvx2 (cpuid: avx2, fma and f16c).
bool cpu_supports_avx2();
/// The path a CHARM_KERNELS value asks for: null, "" or "auto" -> the fastest this CPU
/// runs; "portable"; "avx2". Throws Error(kInvalidInput) for any other value, and
/// Error(kUnsupported) for "avx2" on a CPU without avx2 / fma / f16c.
KernelPath parse_kernel_path(const char* value);
/// parse_kernel_path(getenv("CHARM_KERNELS")): same errors.
KernelPath kernel_path_from_env();
/// The path matmul uses now: kernel_path_from_env() on first use (its errors surface
/// there), or the last set_kernel_path. Thread-safe.
KernelPath active_kernel_path();
/// Forces the path for this process (tests and `charm bench kernels` compare both).
/// Throws Error(kUnsupported) for kAvx2 on a CPU without it.
void set_kernel_path(KernelPath path);

}  // namespace charm
