// GPU matrix products under common/matmul.h's bit contract (see cuda_api.h): the summation
// order of common/kernels.h's `dot`, no fused multiply-add (__fmul_rn / __fadd_rn, and the
// build passes -fmad=false), so a row's result on the GPU equals the CPU's bit for bit.
// Memory-bound decode can afford the fixed order: eight threads share a row, thread k
// summing elements k, k + 8, ..., so each step of the eight reads 32 contiguous bytes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "common/cuda/cuda_api.h"

namespace {

constexpr int kLanes = 8;            // common/kernels.h dot's accumulators
constexpr int kRowsPerBlock = 32;    // output rows per thread block (256 threads)

template <int Format>
__device__ float widen(const void* w, int64_t index) {
  if constexpr (Format == CHARM_CUDA_F32) {
    return static_cast<const float*>(w)[index];
  } else if constexpr (Format == CHARM_CUDA_F16) {
    return __half2float(static_cast<const __half*>(w)[index]);
  } else {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(w)[index]);
  }
}

/// One output row's block of outputs: y_row[o] = x_row . w[o] (+ bias[o]) for the
/// kRowsPerBlock outputs o of blockIdx.x, one per group of eight threads.
template <int Format>
__device__ void linear_row(const void* w, int64_t out, int64_t in, const float* xr, const float* bias, float* yr) {
  const int lane = threadIdx.x % kLanes;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLanes;
  __shared__ float partial[kRowsPerBlock][kLanes];
  __shared__ float tails[kRowsPerBlock];
  const int slot = threadIdx.x / kLanes;
  const int64_t whole = in / kLanes * kLanes;
  float acc = 0.0f;
  if (o < out) {
    const int64_t row = o * in;
    for (int64_t i = lane; i < whole; i += kLanes) acc = __fadd_rn(acc, __fmul_rn(xr[i], widen<Format>(w, row + i)));
    if (lane == 0) {
      float tail = 0.0f;
      for (int64_t i = whole; i < in; ++i) tail = __fadd_rn(tail, __fmul_rn(xr[i], widen<Format>(w, row + i)));
      tails[slot] = tail;
    }
  }
  partial[slot][lane] = acc;
  __syncthreads();
  if (o < out && lane == 0) {
    const float* a = partial[slot];
    float sum = __fadd_rn(__fadd_rn(__fadd_rn(a[0], a[1]), __fadd_rn(a[2], a[3])),
                          __fadd_rn(__fadd_rn(a[4], a[5]), __fadd_rn(a[6], a[7])));
    sum = __fadd_rn(sum, tails[slot]);
    if (bias != nullptr) sum = __fadd_rn(sum, bias[o]);
    yr[o] = sum;
  }
}

/// y[r] = x[r] w^T (+ bias) for r = r0 + blockIdx.y.
template <int Format>
__global__ void linear_kernel(const void* w, int64_t out, int64_t in, const float* x, const float* bias, float* y,
                              int64_t r0) {
  const int64_t r = r0 + blockIdx.y;
  linear_row<Format>(w, out, in, x + r * in, bias, y + r * out);
}

/// A batch's product as the kernel reads it: its first row of x and of y.
struct DeviceProduct {
  const void* w;
  const float* bias;
  int64_t x_row;
  int64_t y_row;
};

/// A batch's output row r = r0 + blockIdx.y belongs to products[row_product[r]].
template <int Format>
__global__ void linear_batch_kernel(const DeviceProduct* products, const int32_t* row_product, int64_t out,
                                    int64_t in, const float* x, float* y, int64_t r0) {
  const int64_t r = r0 + blockIdx.y;
  const DeviceProduct p = products[row_product[r]];
  linear_row<Format>(p.w, out, in, x + (p.x_row + (r - p.y_row)) * in, p.bias, y + r * out);
}

size_t element_bytes(int format) { return format == CHARM_CUDA_F32 ? 4 : 2; }

bool failed(cudaError_t status, const char* what, char* err, size_t err_len) {
  if (status == cudaSuccess) return false;
  if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s: %s", what, cudaGetErrorString(status));
  return true;
}

/// Writes `message` to err (when given) and returns -1.
int refuse(const char* message, char* err, size_t err_len) {
  if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s", message);
  return -1;
}

constexpr int64_t kMaxGridRows = 65535;  // grid.y's limit: longer batches go in slices

/// One call's stream and its device buffers (stream-ordered, so concurrent calls from
/// the worker's threads neither share buffers nor synchronise the whole device), released
/// on every path.
struct CallScope {
  cudaStream_t stream = nullptr;
  void* buffers[4] = {nullptr, nullptr, nullptr, nullptr};
  int used = 0;
  ~CallScope() {
    if (stream == nullptr) return;
    for (int i = 0; i < used; ++i) cudaFreeAsync(buffers[i], stream);
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
  bool open(char* err, size_t err_len) {
    return !failed(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate", err, err_len);
  }
  /// `bytes` of device memory (ordered on the stream) into *ptr, or false with err.
  template <typename T>
  bool alloc(T** ptr, size_t bytes, char* err, size_t err_len) {
    void* p = nullptr;
    if (failed(cudaMallocAsync(&p, bytes, stream), "cudaMallocAsync", err, err_len)) return false;
    buffers[used++] = p;
    *ptr = static_cast<T*>(p);
    return true;
  }
};

bool valid_format(int format) {
  return format == CHARM_CUDA_F32 || format == CHARM_CUDA_F16 || format == CHARM_CUDA_BF16;
}

/// Launches `kernel` over `rows` output rows in grid.y slices of at most kMaxGridRows.
template <typename Launch>
void over_rows(int64_t out, int64_t rows, Launch launch) {
  const dim3 block(kRowsPerBlock * kLanes);
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxGridRows) {
    const int64_t n = rows - r0 < kMaxGridRows ? rows - r0 : kMaxGridRows;
    launch(dim3(static_cast<unsigned>((out + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(n)), block, r0);
  }
}

/// y = x w^T (+ bias) on `stream`, every pointer on the device.
void launch_linear(const void* w, int format, int64_t out, int64_t in, const float* x, int64_t rows,
                   const float* bias, float* y, cudaStream_t stream) {
  over_rows(out, rows, [&](dim3 grid, dim3 block, int64_t r0) {
    switch (format) {
      case CHARM_CUDA_F32: linear_kernel<CHARM_CUDA_F32><<<grid, block, 0, stream>>>(w, out, in, x, bias, y, r0); break;
      case CHARM_CUDA_F16: linear_kernel<CHARM_CUDA_F16><<<grid, block, 0, stream>>>(w, out, in, x, bias, y, r0); break;
      default: linear_kernel<CHARM_CUDA_BF16><<<grid, block, 0, stream>>>(w, out, in, x, bias, y, r0); break;
    }
  });
}

/// The batch's products on `stream`: tables and x, y on the device.
void launch_linear_batch(int format, int64_t out, int64_t in, const DeviceProduct* products,
                         const int32_t* row_product, const float* x, int64_t y_rows, float* y, cudaStream_t stream) {
  over_rows(out, y_rows, [&](dim3 grid, dim3 block, int64_t r0) {
    switch (format) {
      case CHARM_CUDA_F32:
        linear_batch_kernel<CHARM_CUDA_F32><<<grid, block, 0, stream>>>(products, row_product, out, in, x, y, r0);
        break;
      case CHARM_CUDA_F16:
        linear_batch_kernel<CHARM_CUDA_F16><<<grid, block, 0, stream>>>(products, row_product, out, in, x, y, r0);
        break;
      default:
        linear_batch_kernel<CHARM_CUDA_BF16><<<grid, block, 0, stream>>>(products, row_product, out, in, x, y, r0);
        break;
    }
  });
}

/// After a kernel launch on scope's stream: the launch's error (`launch_what`), y <- dy
/// (y_bytes), then the stream's end (an execution error, `kernel_what`). 0, or -1 with err.
int finish_launch(CallScope& scope, const char* launch_what, const char* kernel_what, float* y, const float* dy,
                  size_t y_bytes, char* err, size_t err_len) {
  if (failed(cudaGetLastError(), launch_what, err, err_len) ||
      failed(cudaMemcpyAsync(y, dy, y_bytes, cudaMemcpyDeviceToHost, scope.stream), "cudaMemcpy", err, err_len) ||
      failed(cudaStreamSynchronize(scope.stream), kernel_what, err, err_len)) {
    return -1;
  }
  return 0;
}

/// Checks the arguments both entry points share; 1 when there is nothing to do.
int check_linear(int format, int64_t out, int64_t in, int64_t rows, char* err, size_t err_len) {
  if (!valid_format(format)) return refuse("the weight format is not one the GPU kernels read (F32, F16, BF16)", err, err_len);
  if (out <= 0 || in <= 0 || rows < 0) return refuse("linear: a matrix dimension is not positive", err, err_len);
  return rows == 0 ? 1 : 0;  // as matmul: 0 rows compute nothing
}

/// The product on `scope`'s stream with device-resident w and bias: x in, y out (host).
int linear_on(CallScope& scope, const void* w, int format, int64_t out, int64_t in, const float* x, int64_t rows,
              const float* bias, float* y, char* err, size_t err_len) {
  const size_t x_bytes = static_cast<size_t>(rows * in) * sizeof(float);
  const size_t y_bytes = static_cast<size_t>(rows * out) * sizeof(float);
  float *dx = nullptr, *dy = nullptr;
  if (!scope.alloc(&dx, x_bytes, err, err_len) || !scope.alloc(&dy, y_bytes, err, err_len) ||
      failed(cudaMemcpyAsync(dx, x, x_bytes, cudaMemcpyHostToDevice, scope.stream), "cudaMemcpy", err, err_len)) {
    return -1;
  }
  (void)cudaGetLastError();  // clear an earlier call's error on this thread (e.g. a failed alloc)
  launch_linear(w, format, out, in, dx, rows, bias, dy, scope.stream);
  return finish_launch(scope, "linear kernel launch", "linear kernel", y, dy, y_bytes, err, err_len);
}

}  // namespace

extern "C" int charm_cuda_api_version(void) { return CHARM_CUDA_API_VERSION; }

extern "C" int charm_cuda_device_count(char* err, size_t err_len) {
  int count = 0;
  if (failed(cudaGetDeviceCount(&count), "cudaGetDeviceCount", err, err_len)) return -1;
  return count;
}

extern "C" int charm_cuda_linear(const void* w, int format, int64_t out, int64_t in, const float* x, int64_t rows,
                                 const float* bias, float* y, char* err, size_t err_len) {
  if (const int c = check_linear(format, out, in, rows, err, err_len); c != 0) return c < 0 ? -1 : 0;
  CallScope scope;
  if (!scope.open(err, err_len)) return -1;
  const size_t w_bytes = static_cast<size_t>(out * in) * element_bytes(format);
  const size_t b_bytes = static_cast<size_t>(out) * sizeof(float);
  void* dw = nullptr;
  float* db = nullptr;
  if (!scope.alloc(&dw, w_bytes, err, err_len) ||
      failed(cudaMemcpyAsync(dw, w, w_bytes, cudaMemcpyHostToDevice, scope.stream), "cudaMemcpy", err, err_len)) {
    return -1;
  }
  if (bias != nullptr && (!scope.alloc(&db, b_bytes, err, err_len) ||
                          failed(cudaMemcpyAsync(db, bias, b_bytes, cudaMemcpyHostToDevice, scope.stream),
                                 "cudaMemcpy", err, err_len))) {
    return -1;
  }
  return linear_on(scope, dw, format, out, in, x, rows, db, y, err, err_len);
}

extern "C" int charm_cuda_linear_batch(int format, int64_t out, int64_t in, const CharmCudaProduct* products,
                                       int count, const float* x, int64_t x_rows, float* y, char* err,
                                       size_t err_len) {
  if (count < 0 || x_rows < 0) return refuse("linear batch: a negative count", err, err_len);
  int64_t y_rows = 0;
  for (int j = 0; j < count; ++j) {
    const CharmCudaProduct& p = products[j];
    if (p.rows < 0 || p.x_row < 0 || p.x_row > x_rows || p.rows > x_rows - p.x_row) {
      return refuse("linear batch: a product's rows lie outside x", err, err_len);
    }
    y_rows += p.rows;
  }
  if (const int c = check_linear(format, out, in, y_rows, err, err_len); c != 0) return c < 0 ? -1 : 0;
  // Device tables: each product with its first output row, and each output row's product.
  std::vector<DeviceProduct> table(static_cast<size_t>(count));
  std::vector<int32_t> row_product(static_cast<size_t>(y_rows));
  int64_t at = 0;
  for (int j = 0; j < count; ++j) {
    for (int64_t k = 0; k < products[j].rows; ++k) row_product[static_cast<size_t>(at + k)] = j;
    table[static_cast<size_t>(j)] = DeviceProduct{products[j].w, products[j].bias, products[j].x_row, at};
    at += products[j].rows;
  }
  CallScope scope;
  if (!scope.open(err, err_len)) return -1;
  const size_t x_bytes = static_cast<size_t>(x_rows * in) * sizeof(float);
  const size_t y_bytes = static_cast<size_t>(y_rows * out) * sizeof(float);
  DeviceProduct* d_table = nullptr;
  int32_t* d_rows = nullptr;
  float *dx = nullptr, *dy = nullptr;
  const size_t table_bytes = table.size() * sizeof(DeviceProduct), rows_bytes = row_product.size() * sizeof(int32_t);
  if (!scope.alloc(&d_table, table_bytes, err, err_len) || !scope.alloc(&d_rows, rows_bytes, err, err_len) ||
      !scope.alloc(&dx, x_bytes, err, err_len) || !scope.alloc(&dy, y_bytes, err, err_len) ||
      failed(cudaMemcpyAsync(d_table, table.data(), table_bytes, cudaMemcpyHostToDevice, scope.stream), "cudaMemcpy",
             err, err_len) ||
      failed(cudaMemcpyAsync(d_rows, row_product.data(), rows_bytes, cudaMemcpyHostToDevice, scope.stream),
             "cudaMemcpy", err, err_len) ||
      failed(cudaMemcpyAsync(dx, x, x_bytes, cudaMemcpyHostToDevice, scope.stream), "cudaMemcpy", err, err_len)) {
    return -1;
  }
  (void)cudaGetLastError();  // clear an earlier call's error on this thread
  launch_linear_batch(format, out, in, d_table, d_rows, dx, y_rows, dy, scope.stream);
  return finish_launch(scope, "linear batch kernel launch", "linear batch kernel", y, dy, y_bytes, err, err_len);
}

extern "C" int charm_cuda_alloc(size_t bytes, void** ptr, char* err, size_t err_len) {
  if (bytes == 0) return refuse("cudaMalloc: 0 bytes asked for", err, err_len);
  return failed(cudaMalloc(ptr, bytes), "cudaMalloc", err, err_len) ? -1 : 0;
}

extern "C" void charm_cuda_free(void* ptr) {
  if (ptr != nullptr) cudaFree(ptr);
}

extern "C" int charm_cuda_upload(void* dst, const void* src, size_t bytes, char* err, size_t err_len) {
  return failed(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy", err, err_len) ? -1 : 0;
}

extern "C" int charm_cuda_memory(size_t* free_bytes, size_t* total_bytes, char* err, size_t err_len) {
  return failed(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo", err, err_len) ? -1 : 0;
}
