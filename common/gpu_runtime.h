// The GPU, when there is one: loads libcharm_cuda.so (common/cuda/cuda_api.h) with dlopen
// on first use, so the CPU build needs no CUDA at run time and a machine without a driver
// or device gets a clear error only when something asks for the GPU (vram_gb, gpu: true,
// the GPU tests). Where the library is looked for, in order: $CHARM_CUDA_LIBRARY, the
// path the build wrote it to, then next to the running program.
#pragma once

#include <cstddef>
#include <string>

#include "common/weight_format.h"

namespace charm {

/// Whether a usable CUDA device is here, and if not, why (for messages and skips).
struct GpuAvailability {
  bool available = false;
  int devices = 0;
  std::string why_not;  ///< empty when available: e.g. "this build has no CUDA (CHARM_CUDA off)",
                        ///< "libcharm_cuda.so: cannot open ...", "cudaGetDeviceCount: no CUDA-capable device"
};

/// Loads the library if needed and counts devices. Thread-safe; never throws.
GpuAvailability gpu_availability();

/// Throws Error(kUnavailable) naming `what` (the setting that asked for the GPU, e.g.
/// "worker w1: vram_gb 8") and gpu_availability().why_not when no device is usable.
void require_gpu(const std::string& what);

/// matmul (common/matmul.h) on the GPU, host pointers in and out, for F32 / F16 / BF16
/// weights: the same bits as the CPU's matmul. Throws Error(kUnavailable) without a GPU,
/// Error(kUnsupported) for another weight format, Error(kInternal) with CUDA's message
/// when the device fails.
void gpu_matmul(const MatrixView& w, const float* x, size_t rows, const float* bias, float* y);

}  // namespace charm
