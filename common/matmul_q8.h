// The opt-in int8-activation matmul (`activations: q8`, docs/configuration.md): GGML
// block weights times activations quantised on the fly, as llama.cpp's CPU backend
// computes them. LOSSY: the default (kF32) widens weights to f32 and takes an exact f32
// dot (common/matmul.h); kQ8 rounds every activation to 8 bits first.
//
// What kQ8 computes (the semantics both the portable and the AVX2 kernels give bit for
// bit, for any thread count and any batch; where the weights' own scales are NaN or Inf
// both give NaN, perhaps with another sign or payload; sources: llama.cpp's ggml/src/ggml-quants.c
// quantize_row_q8_0_ref / quantize_row_q8_K_ref and ggml-cpu/quants.c
// ggml_vec_dot_*_q8_*_generic):
//  - Each activation row is quantised on its own (so a row's result never depends on the
//    other rows of the batch). For Q8_0 / Q4_0 / Q5_0 / MXFP4 weights: blocks of 32 as
//    Q8_0, d = amax / 127 rounded to f16, q = round-half-away(x * (1 / d)); for Q4_1 /
//    Q5_1 the same blocks as Q8_1, which adds s = f16(d * sum of q) with the unrounded d
//    (quantize_row_q8_1_ref). For Q2_K / Q3_K / Q4_K / Q5_K / Q6_K
//    weights: blocks of 256 as Q8_K, with `max` the first value of largest |x|, iscale =
//    -127 / max, q = min(127, round-half-even(iscale * x)), d = 1 / iscale (f32), and the
//    sums of q over each 16.
//  - Per weight block b, an exact integer dot isum_b of the weight's quants and the
//    activation's (for Q2_K / Q4_K / Q5_K also msum_b, the sub-block mins times the
//    activation's sums), then c_b = (d_w * d_a) * float(isum_b) [- (dmin_w * d_a) * float(msum_b)]
//    [+ m_w * s_a for Q4_1 / Q5_1], each a rounded f32 operation. Q4_0's quants are taken
//    minus 8, Q5_0's minus 16, Q3_K's minus 4 where their hmask bit is clear, Q6_K's minus
//    32, MXFP4's through its value table (ggml's kvalues_mxfp4) with d_w = 2^(e - 128).
//  - y = sum of c_b in f32: blocks b < 8 * floor(nb / 8) into eight lanes (lane b % 8,
//    in order), the lanes added as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)),
//    then the remaining blocks one by one; then + bias[o] when there is a bias.
// For up to 7 blocks this is ggml's generic sequential sum exactly (tests check it on
// hand-made blocks); with more, only the order of the f32 additions differs. (ggml's
// generic Q3_K dot scales eight partial integer sums separately; the integers are the same.)
// Measured error against the exact f32 path: tests/unit/test_matmul_q8.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "common/matmul.h"
#include "common/weight_format.h"

namespace charm {

/// How GGML-block weights meet activations (the `activations:` key).
enum class ActivationMode : uint8_t {
  kF32,  ///< exact: weights widened to f32, f32 dot (the default; common/matmul.h)
  kQ8,   ///< lossy: activations quantised to Q8_0 / Q8_K, integer dots (llama.cpp's way)
};

/// "f32" or "q8".
const char* activation_mode_name(ActivationMode mode);
/// The mode spelled "f32" or "q8"; throws Error(kInvalidInput) naming `what` (the key or
/// flag the value came from) for any other value.
ActivationMode parse_activation_mode(std::string_view value, std::string_view what);
/// The mode matmul uses for GGML weights now (kF32 until set). Thread-safe.
ActivationMode active_activation_mode();
/// Sets the process-wide mode (at start, before any matmul; the coordinator and every
/// worker apply their topology's `activations`). Thread-safe.
void set_activation_mode(ActivationMode mode);

/// set_activation_mode(mode) at a process's start, logging (spdlog) a warning naming
/// `who` when mode is the lossy kQ8. The coordinator's engine and every worker call it
/// with their topology's `activations`.
void start_activation_mode(ActivationMode mode, std::string_view who);

/// The instruction-set form KernelPath::kAvx2's q8 kernels take. Every form gives the
/// same bits (the integers are exact in each); they differ in speed only.
enum class Q8Form : uint8_t {
  kMaddubs,     ///< AVX2's maddubs + madd (any AVX2 CPU)
  kAvxVnni,     ///< AVX-VNNI's 256-bit vpdpbusd / vpdpwssd (VEX)
  kAvx512Vnni,  ///< AVX512-VNNI's vpdpbusd / vpdpwssd on 256-bit vectors (EVEX; AVX512VL)
};

/// Every Q8Form, in declaration order.
inline constexpr Q8Form kQ8Forms[] = {Q8Form::kMaddubs, Q8Form::kAvxVnni, Q8Form::kAvx512Vnni};

/// "maddubs", "avx-vnni" or "avx512-vnni".
const char* q8_form_name(Q8Form form);
/// True when the CPU can run `form` (kMaddubs: cpu_supports_avx2(); kAvxVnni also its
/// CPUID bit; kAvx512Vnni also AVX512F, AVX512VL and AVX512-VNNI with the OS's AVX-512 state).
bool cpu_supports_q8_form(Q8Form form);
/// The form in use: by default a VNNI form where the CPU has one (AVX-VNNI first: where a
/// CPU has both, the VEX form needs no AVX-512 state; else AVX512-VNNI), else maddubs.
/// Thread-safe.
Q8Form active_q8_form();
/// Picks a form (tests, benchmarks). Throws Error(kUnsupported), naming it, for a form the
/// CPU cannot run. Thread-safe.
void set_q8_form(Q8Form form);

/// True when GGML type `type` has q8 kernels: Q8_0, Q4_0, Q5_0, MXFP4 (Q8_0 activations),
/// Q4_1, Q5_1 (Q8_1), Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (Q8_K). Other types (F32 / F16 / BF16,
/// which llama.cpp does not quantise either) keep the exact f32 path under kQ8.
bool has_q8_kernel(GgmlType type);

/// True when matmul takes the q8 kernels for `w` now: mode kQ8, a kGgml weight, and its
/// type has_q8_kernel.
bool uses_q8(const MatrixView& w);

/// Activation rows quantised for one GGML weight type's kernels (Q8_0 blocks of 32 or
/// Q8_K blocks of 256, common/matmul_q8.h's semantics). Filled by quantize_activations.
struct Q8Activations {
  std::vector<int8_t> qs;     ///< [rows * cols] the quants
  std::vector<float> d;       ///< [rows * blocks] block scales
  std::vector<int16_t> sums;  ///< Q8_0 / Q8_1: [rows * blocks] sum of each block's qs; Q8_K: 16 per block (|sum| <= 32 * 127)
  std::vector<float> s;       ///< Q8_1 only: [rows * blocks] f16(d * sum) widened, d unrounded; else empty
  int type_kind = -1;         ///< which blocks (internal: Q8_0 or Q8_K); -1 until filled
  int64_t cols = 0;
  size_t rows = 0;
};

/// x [rows, w.shape.cols] quantised once for `w`'s type (which must have_q8_kernel), into
/// `out` (its buffers reused), on `path`'s quantiser (the same bits on every path). Each
/// row on its own. Throws Error(kInvalidInput) when cols are not whole activation blocks.
void quantize_activations(KernelPath path, const MatrixView& w, const float* x, size_t rows, Q8Activations& out);

/// Outputs [o0, o1) of y [a.rows, w.shape.rows] = a W^T (+ bias) with the prepared rows
/// `a` (quantize_activations for this w), single-threaded, on `path`'s kernels (kAvx2
/// requires cpu_supports_avx2()). Requires a kGgml view with a q8 kernel that matmul's
/// checks accept and 0 <= o0 <= o1 <= w.shape.rows. Thread-safe (reads `a` only), so one
/// quantisation serves every tile of a product on every thread.
void matmul_q8_tile(KernelPath path, const MatrixView& w, const Q8Activations& a, const float* bias, float* y,
                    int64_t o0, int64_t o1);

/// Outputs [o0, o1) of y [rows, w.shape.rows] = x [rows, w.shape.cols] W^T (+ bias) with
/// q8 activations (the semantics above), single-threaded, on `path`'s kernels (kAvx2
/// requires cpu_supports_avx2()). Returns false, writing nothing, when `w` is not kGgml
/// or its type has no q8 kernel. Requires a view matmul's checks accept (whole blocks)
/// and 0 <= o0 <= o1 <= w.shape.rows. Thread-safe (per-thread scratch: each x row is
/// quantised once and reused by later calls of this thread on bit-identical rows).
bool matmul_q8_tile(KernelPath path, const MatrixView& w, const float* x, size_t rows, const float* bias, float* y,
                    int64_t o0, int64_t o1);

}  // namespace charm
