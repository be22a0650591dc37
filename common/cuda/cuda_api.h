// The C interface of libcharm_cuda.so (common/cuda/*.cu), the one place charm runs CUDA.
// The CPU build never links it: common/gpu_runtime.h loads it with dlopen only when a GPU
// tier or device is configured, so a machine without the CUDA driver runs everything
// else. Plain C types only, so the loader needs no CUDA headers.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// The interface version; the loader refuses a library that reports another.
#define CHARM_CUDA_API_VERSION 2
int charm_cuda_api_version(void);

/// Weight formats the GPU kernels read, numbered as charm::WeightFormat's kF32, kF16, kBF16.
enum { CHARM_CUDA_F32 = 0, CHARM_CUDA_F16 = 1, CHARM_CUDA_BF16 = 2 };

/// Number of CUDA devices (>= 0), or -1 with the runtime's error text in err[err_len]
/// (no driver, no device, driver older than the runtime).
int charm_cuda_device_count(char* err, size_t err_len);

/// y [rows, out] f32 = x [rows, in] f32 times w^T (+ bias [out] when non-null), w [out, in]
/// in `format` (F32, F16 or BF16 element bytes), all host pointers: copied to device 0,
/// computed, copied back. Bits: each y[r][o] is common/kernels.h's `dot` of x_r and the
/// widened row w_o (eight lane sums over i = k mod 8 in order, combined as
/// ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)) + tail, every multiply and add
/// rounded separately: __fmul_rn / __fadd_rn), then + bias[o] — the CPU's bits. Returns
/// 0 (rows 0: nothing done), or -1 with the error text in err.
int charm_cuda_linear(const void* w, int format, int64_t out, int64_t in, const float* x, int64_t rows,
                      const float* bias, float* y, char* err, size_t err_len);

/// Device memory on device 0 for resident weights (the VRAM expert tier): `bytes` > 0
/// bytes, 256-byte aligned, into *ptr. Returns 0, or -1 with the error text (out of
/// memory: "cudaMalloc: out of memory").
int charm_cuda_alloc(size_t bytes, void** ptr, char* err, size_t err_len);
/// Frees what charm_cuda_alloc returned (null: nothing).
void charm_cuda_free(void* ptr);
/// Copies `bytes` host bytes to device memory at dst. Returns 0, or -1 with the error text.
int charm_cuda_upload(void* dst, const void* src, size_t bytes, char* err, size_t err_len);
/// Free and total bytes of device 0 now (cudaMemGetInfo). Returns 0, or -1 with the error.
int charm_cuda_memory(size_t* free_bytes, size_t* total_bytes, char* err, size_t err_len);

/// One product of a batch: rows [x_row, x_row + rows) of the batch's x times w^T (+ bias
/// when non-null), w [out, in] and bias [out] in device memory.
typedef struct {
  const void* w;
  const float* bias;
  int64_t x_row;
  int64_t rows;
} CharmCudaProduct;

/// `count` products of one shape [out, in] and `format` in one launch: x [x_rows, in] f32
/// on the host in, y [sum of rows, out] f32 on the host out, the products' rows one after
/// another in order. Each row has charm_cuda_linear's bits. One copy of x up and of y
/// down for the batch (the VRAM tier's gate and up products of every expert of a
/// request are one call, their down products another). Thread-safe (each call has its
/// own buffers and stream). Returns 0 (nothing to do: 0),
/// or -1 with the error text (a product's rows outside x, a negative count).
int charm_cuda_linear_batch(int format, int64_t out, int64_t in, const CharmCudaProduct* products, int count,
                            const float* x, int64_t x_rows, float* y, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
