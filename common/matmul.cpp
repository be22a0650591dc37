#include "common/matmul.h"

#include <algorithm>
#include <atomic>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <omp.h>

#include "common/error.h"
#include "common/kernels.h"
#include "common/matmul_avx2.h"
#include "common/matmul_q8.h"

namespace charm {
namespace {

/// Outputs [o0, o1) the reference way: widen each weight row once, then common/kernels.h
/// `dot` for every row of x. This is the contract the AVX2 path matches bit for bit.
void portable_tile(const MatrixView& w, const float* x, size_t rows, const float* bias, float* y, int64_t o0,
                   int64_t o1) {
  const auto in = static_cast<size_t>(w.shape.cols);
  const auto out = static_cast<size_t>(w.shape.rows);
  thread_local std::vector<float> scratch;
  if (scratch.size() < in) scratch.resize(in);
  for (int64_t o = o0; o < o1; ++o) {
    const float* wo = scratch.data();
    if (w.shape.format == WeightFormat::kF32) {
      wo = reinterpret_cast<const float*>(w.data) + static_cast<size_t>(o) * in;
    } else {
      matrix_row_to_f32(w, o, scratch.data());
    }
    for (size_t r = 0; r < rows; ++r) {
      const float v = dot(x + r * in, wo, in);
      y[r * out + static_cast<size_t>(o)] = bias ? v + bias[o] : v;
    }
  }
}

/// This thread's buffers for the AVX2 path (kept between calls: no allocation per tile).
Avx2Scratch avx2_scratch(const MatrixView& w) {
  thread_local std::vector<float> panel;
  thread_local std::vector<int32_t> column_group;
  thread_local int64_t column_group_size = 0;  // group_size column_group was made for
  const int64_t cols = w.shape.cols;
  Avx2Scratch s;
  if (w.shape.format != WeightFormat::kF32) {
    const auto need = static_cast<size_t>(panel_rows(cols) * cols);
    if (panel.size() < need) panel.resize(need);
    s.panel = panel.data();
  }
  const int64_t group = w.shape.group_size;
  if (is_quantized(w.shape.format) && group % 8 != 0) {
    if (column_group_size != group || column_group.size() < static_cast<size_t>(cols)) {
      column_group.resize(static_cast<size_t>(cols));
      for (int64_t i = 0; i < cols; ++i) column_group[static_cast<size_t>(i)] = static_cast<int32_t>(i / group);
      column_group_size = group;
    }
    s.column_group = column_group.data();
  }
  return s;
}

void tile_on(KernelPath path, const MatrixView& w, const float* x, size_t rows, const float* bias, float* y,
             int64_t o0, int64_t o1) {
  if (rows == 0 || o0 >= o1) return;
  // `activations: q8` (lossy, opt-in): GGML weights with a q8 kernel take it instead.
  if (uses_q8(w) && matmul_q8_tile(path, w, x, rows, bias, y, o0, o1)) return;
  if (path == KernelPath::kAvx2) {
    matmul_tile_avx2(w, x, rows, bias, y, o0, o1, avx2_scratch(w));
  } else {
    portable_tile(w, x, rows, bias, y, o0, o1);
  }
}

/// Throws Error(kInvalidInput) for a view the kernels cannot read.
void check_view(const MatrixView& w) {
  const MatrixShape& s = w.shape;
  if (s.rows < 0 || s.cols < 0) {
    fail_invalid("matmul: negative weight shape [" + std::to_string(s.rows) + ", " + std::to_string(s.cols) + "]");
  }
  if (s.rows > 0 && s.cols > 0 && w.data == nullptr) fail_invalid("matmul: weight data is null");
  if (is_quantized(s.format) && (s.group_size < 1 || w.scales == nullptr)) {
    fail_invalid(std::string("matmul: ") + weight_format_name(s.format) + " weight needs group_size >= 1 and scales (group_size " +
                 std::to_string(s.group_size) + ")");
  }
  if (is_quantized(s.format) && s.cols > (int64_t{1} << 31)) {
    fail_invalid("matmul: quantised rows wider than 2^31 columns are not supported");
  }
  if (s.format == WeightFormat::kGgml && !ggml_row_bytes(s.ggml_type, s.cols)) {
    fail_invalid(std::string("matmul: a ") + ggml_traits(s.ggml_type).name + " row of " + std::to_string(s.cols) +
                 " columns is not whole blocks");
  }
  if (s.format == WeightFormat::kF8E4M3Block && (s.block_rows < 1 || s.block_cols < 1 || w.scales == nullptr)) {
    fail_invalid("matmul: F8_E4M3B weight needs block_rows, block_cols >= 1 and scales");
  }
}

/// Products below this many multiply-adds run on the calling thread: waking the OpenMP
/// team (futex wake-ups under OMP_WAIT_POLICY=passive) costs more than it saves.
constexpr uint64_t kParallelMinWork = uint64_t{1} << 17;

constexpr int kPathUnresolved = -1;
std::atomic<int> g_path{kPathUnresolved};

}  // namespace

const char* kernel_path_name(KernelPath path) { return path == KernelPath::kAvx2 ? "avx2" : "portable"; }

bool cpu_supports_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  // F16C and FMA by cpuid leaf 1 (ECX bits 29, 12): clang's __builtin_cpu_supports does
  // not know F16C. Every AVX2 CPU made has both.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool leaf1 = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0;
  return __builtin_cpu_supports("avx2") && leaf1 && (ecx & bit_F16C) != 0 && (ecx & bit_FMA) != 0;
#else
  return false;
#endif
}

KernelPath parse_kernel_path(const char* value) {
  const std::string v = value ? value : "";
  if (v.empty() || v == "auto") return cpu_supports_avx2() ? KernelPath::kAvx2 : KernelPath::kPortable;
  if (v == "portable") return KernelPath::kPortable;
  if (v == "avx2") {
    if (!cpu_supports_avx2()) fail_unsupported("CHARM_KERNELS=avx2, but this CPU lacks avx2, fma or f16c");
    return KernelPath::kAvx2;
  }
  fail_invalid("CHARM_KERNELS='" + v + "' is not one of auto, portable, avx2");
}

KernelPath kernel_path_from_env() { return parse_kernel_path(std::getenv("CHARM_KERNELS")); }

KernelPath active_kernel_path() {
  int path = g_path.load(std::memory_order_relaxed);
  if (path == kPathUnresolved) {
    path = static_cast<int>(kernel_path_from_env());
    g_path.store(path, std::memory_order_relaxed);
  }
  return static_cast<KernelPath>(path);
}

void set_kernel_path(KernelPath path) {
  if (path == KernelPath::kAvx2 && !cpu_supports_avx2()) {
    fail_unsupported("the avx2 kernels need a CPU with avx2, fma and f16c");
  }
  g_path.store(static_cast<int>(path), std::memory_order_relaxed);
}

void matmul_tile(const MatrixView& w, const float* x, size_t rows, const float* bias, float* y, int64_t o0,
                 int64_t o1) {
  check_view(w);
  if (o0 < 0 || o0 > o1 || o1 > w.shape.rows) {
    fail_invalid("matmul_tile: outputs [" + std::to_string(o0) + ", " + std::to_string(o1) + ") outside [0, " +
                 std::to_string(w.shape.rows) + ")");
  }
  tile_on(active_kernel_path(), w, x, rows, bias, y, o0, o1);
}

void matmul_serial(const MatrixView& w, const float* x, size_t rows, const float* bias, float* y) {
  check_view(w);
  tile_on(active_kernel_path(), w, x, rows, bias, y, 0, w.shape.rows);
}

void matmul(const MatrixView& w, const float* x, size_t rows, const float* bias, float* y) {
  check_view(w);
  const KernelPath path = active_kernel_path();  // outside the parallel region: it may throw
  const int64_t out = w.shape.rows;
  const int64_t tile = panel_rows(w.shape.cols);
  const int64_t tiles = (out + tile - 1) / tile;
  const bool parallel =
      tiles > 1 && static_cast<uint64_t>(out) * static_cast<uint64_t>(w.shape.cols) * rows >= kParallelMinWork;
  if (uses_q8(w)) {  // `activations: q8`: x quantised once here, not per tile
    thread_local Q8Activations mine;
    const Q8Activations& q8 = mine;  // the team reads this thread's rows (a thread_local
                                     // named inside the region would be each thread's own)
    quantize_activations(path, w, x, rows, mine);
    // One tile per thread (whole panels of 8 rows): the q8 kernels need no panel buffer,
    // and a 50k-row lm_head cut into panel_rows tiles made 3k tile calls per token, whose
    // set-up showed in a decode profile (~1.5 %); alone per thread, the dense q8 GEMVs took
    // 0.92-1.01x the time (from RAM, alternating medians).
    const auto threads = static_cast<int64_t>(std::max(1, omp_get_max_threads()));
    const int64_t q8_tile = ((out + threads - 1) / threads + 7) / 8 * 8;
    const int64_t q8_tiles = (out + q8_tile - 1) / q8_tile;
#pragma omp parallel for schedule(static) if (parallel && q8_tiles > 1)
    for (int64_t t = 0; t < q8_tiles; ++t) {
      const int64_t o0 = t * q8_tile;
      matmul_q8_tile(path, w, q8, bias, y, o0, o0 + q8_tile < out ? o0 + q8_tile : out);
    }
    return;
  }
  // Each output is computed whole by one thread, so the bits do not depend on the team.
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t o0 = t * tile;
    tile_on(path, w, x, rows, bias, y, o0, o0 + tile < out ? o0 + tile : out);
  }
}

}  // namespace charm
