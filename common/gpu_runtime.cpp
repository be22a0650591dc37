#include "common/gpu_runtime.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <utility>
#include <vector>

#include "common/cuda/cuda_api.h"
#include "common/error.h"

namespace charm {
namespace {

/// The library's entry points, resolved once.
struct CudaLibrary {
  int (*api_version)() = nullptr;
  int (*device_count)(char*, size_t) = nullptr;
  int (*linear)(const void*, int, int64_t, int64_t, const float*, int64_t, const float*, float*, char*,
                size_t) = nullptr;
  int (*linear_batch)(int, int64_t, int64_t, const CharmCudaProduct*, int, const float*, int64_t, float*, char*,
                      size_t) = nullptr;
  int (*alloc)(size_t, void**, char*, size_t) = nullptr;
  void (*free)(void*) = nullptr;
  int (*upload)(void*, const void*, size_t, char*, size_t) = nullptr;
  int (*memory)(size_t*, size_t*, char*, size_t) = nullptr;
  std::string why_not;  // set when the library could not be used

  bool complete() const {
    return api_version && device_count && linear && linear_batch && alloc && free && upload && memory;
  }
};

/// Points `fn` at the library's `name` (null when it lacks it).
template <typename Fn>
void resolve(void* handle, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
}

std::vector<std::string> library_candidates() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("CHARM_CUDA_LIBRARY"); env != nullptr && *env != '\0') paths.push_back(env);
#ifdef CHARM_CUDA_LIBRARY_PATH
  paths.push_back(CHARM_CUDA_LIBRARY_PATH);
#endif
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) paths.push_back((self.parent_path() / "libcharm_cuda.so").string());
  return paths;
}

CudaLibrary open_library() {
  CudaLibrary lib;
#ifndef CHARM_CUDA_LIBRARY_PATH
  if (std::getenv("CHARM_CUDA_LIBRARY") == nullptr) {
    lib.why_not = "this build of charm has no CUDA (nvcc was not found, or CHARM_CUDA was off)";
    return lib;
  }
#endif
  std::string tried;
  for (const std::string& path : library_candidates()) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      tried += std::string(tried.empty() ? "" : "; ") + dlerror();
      continue;
    }
    CudaLibrary found;
    resolve(handle, "charm_cuda_api_version", found.api_version);
    resolve(handle, "charm_cuda_device_count", found.device_count);
    resolve(handle, "charm_cuda_linear", found.linear);
    resolve(handle, "charm_cuda_linear_batch", found.linear_batch);
    resolve(handle, "charm_cuda_alloc", found.alloc);
    resolve(handle, "charm_cuda_free", found.free);
    resolve(handle, "charm_cuda_upload", found.upload);
    resolve(handle, "charm_cuda_memory", found.memory);
    std::string wrong;
    if (found.api_version != nullptr && found.api_version() != CHARM_CUDA_API_VERSION) {
      wrong = path + " has interface version " + std::to_string(found.api_version()) + ", this charm needs " +
              std::to_string(CHARM_CUDA_API_VERSION) + " (rebuild both)";
    } else if (!found.complete()) {
      wrong = path + " lacks the charm_cuda_* entry points";
    }
    if (wrong.empty()) return found;  // the handle stays open for the process
    dlclose(handle);
    tried += (tried.empty() ? "" : "; ") + wrong;  // a stale library: try the next place
  }
  lib.why_not = "cannot load libcharm_cuda.so: " + tried;
  return lib;
}

const CudaLibrary& library() {
  static const CudaLibrary lib = open_library();
  return lib;
}

}  // namespace

GpuAvailability gpu_availability() {
  static std::once_flag once;
  static GpuAvailability result;
  std::call_once(once, [] {
    const CudaLibrary& lib = library();
    if (!lib.why_not.empty()) {
      result.why_not = lib.why_not;
      return;
    }
    char err[512] = "";
    const int n = lib.device_count(err, sizeof err);
    if (n < 0) {
      result.why_not = err;
    } else if (n == 0) {
      result.why_not = "the CUDA runtime sees no device";
    } else {
      result.available = true;
      result.devices = n;
    }
  });
  return result;
}

void require_gpu(const std::string& what) {
  const GpuAvailability gpu = gpu_availability();
  if (!gpu.available) fail_unavailable(what + " needs a CUDA GPU, and none is usable: " + gpu.why_not);
}

namespace {

/// The library's number for a weight format the GPU kernels read; throws
/// Error(kUnsupported) for another.
int cuda_format(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32: return CHARM_CUDA_F32;
    case WeightFormat::kF16: return CHARM_CUDA_F16;
    case WeightFormat::kBF16: return CHARM_CUDA_BF16;
    default:
      fail_unsupported(std::string("GPU matmul of ") + weight_format_name(format) +
                       " weights (supported: F32, F16, BF16)");
  }
}

}  // namespace

void gpu_matmul(const MatrixView& w, const float* x, size_t rows, const float* bias, float* y) {
  require_gpu("a GPU matrix product");
  const int format = cuda_format(w.shape.format);
  char err[512] = "";
  if (library().linear(w.data, format, w.shape.rows, w.shape.cols, x, static_cast<int64_t>(rows), bias, y, err,
                       sizeof err) != 0) {
    fail_internal(std::string("GPU matmul failed: ") + err);
  }
}

void gpu_matmul_batch(const std::vector<GpuProduct>& products, const float* x, size_t x_rows, float* y) {
  require_gpu("a GPU matrix product");
  if (products.empty()) return;
  const MatrixShape& shape = products.front().w.shape;
  std::vector<CharmCudaProduct> table;
  table.reserve(products.size());
  for (const GpuProduct& p : products) {
    if (p.w.shape.format != shape.format || p.w.shape.rows != shape.rows || p.w.shape.cols != shape.cols) {
      fail_invalid("GPU matmul batch: its products differ in shape or format");
    }
    if (p.x_row > x_rows || p.rows > x_rows - p.x_row) fail_invalid("GPU matmul batch: a product's rows lie outside x");
    table.push_back(CharmCudaProduct{p.w.data, p.bias, static_cast<int64_t>(p.x_row), static_cast<int64_t>(p.rows)});
  }
  char err[512] = "";
  if (library().linear_batch(cuda_format(shape.format), shape.rows, shape.cols, table.data(),
                             static_cast<int>(table.size()), x, static_cast<int64_t>(x_rows), y, err, sizeof err) != 0) {
    fail_internal(std::string("GPU matmul failed: ") + err);
  }
}

GpuBuffer::GpuBuffer(size_t bytes, const std::string& what) : bytes_(bytes) {
  require_gpu(what);
  char err[512] = "";
  void* p = nullptr;
  if (library().alloc(bytes, &p, err, sizeof err) != 0) {
    fail_unavailable(what + ": cannot allocate " + std::to_string(bytes) + " bytes on the GPU: " + err);
  }
  data_ = static_cast<uint8_t*>(p);
}

GpuBuffer::GpuBuffer(GpuBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

GpuBuffer& GpuBuffer::operator=(GpuBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) library().free(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

GpuBuffer::~GpuBuffer() {
  if (data_ != nullptr) library().free(data_);
}

void GpuBuffer::upload(const void* src, size_t bytes, size_t at) {
  if (at > bytes_ || bytes > bytes_ - at) {
    fail_invalid("GPU upload of " + std::to_string(bytes) + " bytes at " + std::to_string(at) + " overruns a buffer of " +
                 std::to_string(bytes_));
  }
  char err[512] = "";
  if (library().upload(data_ + at, src, bytes, err, sizeof err) != 0) fail_internal(std::string("GPU upload: ") + err);
}

GpuMemory gpu_memory() {
  require_gpu("reading the GPU's memory");
  size_t free_bytes = 0, total_bytes = 0;
  char err[512] = "";
  if (library().memory(&free_bytes, &total_bytes, err, sizeof err) != 0) {
    fail_internal(std::string("GPU memory: ") + err);
  }
  return {free_bytes, total_bytes};
}

}  // namespace charm
