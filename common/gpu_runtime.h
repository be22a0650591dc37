// The GPU, when there is one: loads libcharm_cuda.so (common/cuda/cuda_api.h) with dlopen
// on first use, so the CPU build needs no CUDA at run time and a machine without a driver
// or device gets a clear error only when something asks for the GPU (vram_gb, gpu: true,
// the GPU tests). Where the library is looked for, in order: $CHARM_CUDA_LIBRARY, the
// path the build wrote it to, then next to the running program.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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

/// One product of gpu_matmul_batch: rows [x_row, x_row + rows) of its x times w^T
/// (+ bias when non-null), w and bias in device memory.
struct GpuProduct {
  MatrixView w;
  const float* bias = nullptr;
  size_t x_row = 0;
  size_t rows = 0;
};

/// Products of one shape and format (F32, F16, BF16) in one launch: x [x_rows, cols] f32
/// on the host in, y [sum of rows, w.rows] on the host out, the products' rows one after
/// another. Each row has matmul's bits. Throws Error(kInvalidInput) for products of
/// different shapes or formats, or rows outside x; Error(kUnavailable) without a GPU,
/// Error(kUnsupported) for another weight format, Error(kInternal) with CUDA's message
/// when the device fails.
void gpu_matmul_batch(const std::vector<GpuProduct>& products, const float* x, size_t x_rows, float* y);

/// Bytes of memory on the GPU (device 0), freed when the buffer dies. Move-only. The
/// VRAM expert tier keeps each resident expert's blob in one (worker/experts/expert_device.h).
class GpuBuffer {
 public:
  /// `bytes` (> 0) of device memory. Throws Error(kUnavailable) without a GPU or when the
  /// device has not that much free ("cudaMalloc: out of memory"), naming `what`.
  GpuBuffer(size_t bytes, const std::string& what);
  GpuBuffer(GpuBuffer&& other) noexcept;
  GpuBuffer& operator=(GpuBuffer&& other) noexcept;
  GpuBuffer(const GpuBuffer&) = delete;
  GpuBuffer& operator=(const GpuBuffer&) = delete;
  ~GpuBuffer();

  /// Copies `bytes` host bytes to offset `at`. Throws Error(kInvalidInput) past the end,
  /// Error(kInternal) with CUDA's message when the copy fails.
  void upload(const void* src, size_t bytes, size_t at = 0);
  /// The device address (never dereference it on the host).
  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

/// Device 0's memory now, bytes.
struct GpuMemory {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};
/// Throws Error(kUnavailable) without a GPU, Error(kInternal) when CUDA fails.
GpuMemory gpu_memory();

}  // namespace charm
