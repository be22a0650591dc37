#include "common/gpu_runtime.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
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
  std::string why_not;  // set when the library could not be used
};

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
    found.api_version = reinterpret_cast<int (*)()>(dlsym(handle, "charm_cuda_api_version"));
    found.device_count = reinterpret_cast<decltype(found.device_count)>(dlsym(handle, "charm_cuda_device_count"));
    found.linear = reinterpret_cast<decltype(found.linear)>(dlsym(handle, "charm_cuda_linear"));
    std::string wrong;
    if (found.api_version == nullptr || found.device_count == nullptr || found.linear == nullptr) {
      wrong = path + " lacks the charm_cuda_* entry points";
    } else if (found.api_version() != CHARM_CUDA_API_VERSION) {
      wrong = path + " has interface version " + std::to_string(found.api_version()) + ", this charm needs " +
              std::to_string(CHARM_CUDA_API_VERSION) + " (rebuild both)";
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

void gpu_matmul(const MatrixView& w, const float* x, size_t rows, const float* bias, float* y) {
  require_gpu("a GPU matrix product");
  int format = 0;
  switch (w.shape.format) {
    case WeightFormat::kF32: format = CHARM_CUDA_F32; break;
    case WeightFormat::kF16: format = CHARM_CUDA_F16; break;
    case WeightFormat::kBF16: format = CHARM_CUDA_BF16; break;
    default:
      fail_unsupported(std::string("GPU matmul of ") + weight_format_name(w.shape.format) +
                       " weights (supported: F32, F16, BF16)");
  }
  char err[512] = "";
  if (library().linear(w.data, format, w.shape.rows, w.shape.cols, x, static_cast<int64_t>(rows), bias, y, err,
                       sizeof err) != 0) {
    fail_internal(std::string("GPU matmul failed: ") + err);
  }
}

}  // namespace charm
