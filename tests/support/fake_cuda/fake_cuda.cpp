// libcharm_fake_cuda.so: common/cuda/cuda_api.h's C interface implemented on the host,
// for the CPU tests of everything above it (the loader in common/gpu_runtime.cpp, GpuBuffer,
// the VRAM tier's GPU device, vram_gb in an engine or a `charm worker`). Tests point
// CHARM_CUDA_LIBRARY at it. "Device memory" is host memory counted against a capacity;
// the linear products follow the order cuda_api.h documents for linear.cu (eight lane
// sums over i = k mod 8, combined pairwise, then the tail, then the bias; every operation
// rounded on its own: this file is built with -ffp-contract=off), written out in plain
// C++. So a test passing against it checks the plumbing and the documented order, never
// the CUDA kernels themselves: tests/gpu/ on a real device does that.
//
// Environment: CHARM_FAKE_CUDA_DEVICES (default 1; 0 emulates a machine whose runtime
// sees no device), CHARM_FAKE_CUDA_MEMORY (bytes of device memory, default 1 GiB).
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "common/cuda/cuda_api.h"

namespace {

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

struct Memory {
  std::mutex mutex;
  std::unordered_map<void*, size_t> blocks;
  size_t used = 0;
  size_t capacity = env_or("CHARM_FAKE_CUDA_MEMORY", uint64_t{1} << 30);
};

Memory& memory() {
  static Memory m;
  return m;
}

int refuse(const char* message, char* err, size_t err_len) {
  if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s", message);
  return -1;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal: exact in f32
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    const uint32_t bits = ((exp + 112) << 23) | (mant << 13);
    std::memcpy(&v, &bits, 4);
  }
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits |= sign;
  std::memcpy(&v, &bits, 4);
  return v;
}

float widen(const void* w, int format, int64_t index) {
  if (format == CHARM_CUDA_F32) return static_cast<const float*>(w)[index];
  const uint16_t h = static_cast<const uint16_t*>(w)[index];
  if (format == CHARM_CUDA_F16) return f16_to_f32(h);
  const uint32_t bits = uint32_t{h} << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

int linear(const void* w, int format, int64_t out, int64_t in, const float* x, int64_t rows, const float* bias,
           float* y, char* err, size_t err_len) {
  if (format != CHARM_CUDA_F32 && format != CHARM_CUDA_F16 && format != CHARM_CUDA_BF16) {
    return refuse("the weight format is not one the GPU kernels read (F32, F16, BF16)", err, err_len);
  }
  if (out <= 0 || in <= 0 || rows < 0) return refuse("linear: a matrix dimension is not positive", err, err_len);
  const int64_t whole = in / 8 * 8;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * in;
    for (int64_t o = 0; o < out; ++o) {
      float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t i = 0; i < whole; ++i) a[i % 8] = a[i % 8] + xr[i] * widen(w, format, o * in + i);
      float tail = 0.0f;
      for (int64_t i = whole; i < in; ++i) tail = tail + xr[i] * widen(w, format, o * in + i);
      float sum = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
      sum = sum + tail;
      if (bias != nullptr) sum = sum + bias[o];
      y[r * out + o] = sum;
    }
  }
  return 0;
}

}  // namespace

extern "C" int charm_cuda_api_version(void) { return CHARM_CUDA_API_VERSION; }

extern "C" int charm_cuda_device_count(char*, size_t) {
  return static_cast<int>(env_or("CHARM_FAKE_CUDA_DEVICES", 1));
}

extern "C" int charm_cuda_linear(const void* w, int format, int64_t out, int64_t in, const float* x, int64_t rows,
                                 const float* bias, float* y, char* err, size_t err_len) {
  return linear(w, format, out, in, x, rows, bias, y, err, err_len);
}

extern "C" int charm_cuda_linear_batch(int format, int64_t out, int64_t in, const CharmCudaProduct* products,
                                       int count, const float* x, int64_t x_rows, float* y, char* err,
                                       size_t err_len) {
  if (count < 0 || x_rows < 0) return refuse("linear batch: a negative count", err, err_len);
  int64_t at = 0;  // the product's first row of y
  for (int j = 0; j < count; ++j) {
    const CharmCudaProduct& p = products[j];
    if (p.rows < 0 || p.x_row < 0 || p.x_row > x_rows || p.rows > x_rows - p.x_row) {
      return refuse("linear batch: a product's rows lie outside x", err, err_len);
    }
    if (linear(p.w, format, out, in, x + p.x_row * in, p.rows, p.bias, y + at * out, err, err_len) != 0) return -1;
    at += p.rows;
  }
  return 0;
}

extern "C" int charm_cuda_alloc(size_t bytes, void** ptr, char* err, size_t err_len) {
  if (bytes == 0) return refuse("cudaMalloc: 0 bytes asked for", err, err_len);
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  if (bytes > m.capacity - m.used) return refuse("cudaMalloc: out of memory", err, err_len);
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (p == nullptr) return refuse("cudaMalloc: out of memory", err, err_len);
  m.blocks[p] = bytes;
  m.used += bytes;
  *ptr = p;
  return 0;
}

extern "C" void charm_cuda_free(void* ptr) {
  if (ptr == nullptr) return;
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  const auto it = m.blocks.find(ptr);
  if (it == m.blocks.end()) std::abort();  // a double free or a foreign pointer: a bug in charm
  m.used -= it->second;
  m.blocks.erase(it);
  std::free(ptr);
}

extern "C" int charm_cuda_upload(void* dst, const void* src, size_t bytes, char*, size_t) {
  std::memcpy(dst, src, bytes);
  return 0;
}

extern "C" int charm_cuda_memory(size_t* free_bytes, size_t* total_bytes, char*, size_t) {
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  *free_bytes = m.capacity - m.used;
  *total_bytes = m.capacity;
  return 0;
}
