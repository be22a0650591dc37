// The main() of a GPU test (tests/gpu/): without a usable CUDA device it prints why,
// checks what a user who asks for the GPU is told (`ask_gpu` must throw an Error naming
// `refusal`) and exits 77, which ctest reports as skipped, never as passed; with one it
// runs the doctest cases.
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <functional>
#include <string>

#include "common/error.h"
#include "common/gpu_runtime.h"

namespace charm::test {

inline int gpu_test_main(int argc, char** argv, const std::function<void()>& ask_gpu, const std::string& refusal) {
  const GpuAvailability gpu = gpu_availability();
  if (!gpu.available) {
    std::printf("SKIPPED: no usable CUDA device: %s\n", gpu.why_not.c_str());
    try {
      ask_gpu();
      std::printf("FAILED: asking for the GPU was not refused\n");
      return 1;
    } catch (const Error& e) {
      if (std::string(e.what()).find(refusal) == std::string::npos) {
        std::printf("FAILED: unexpected refusal: %s\n", e.what());
        return 1;
      }
    }
    return 77;
  }
  std::printf("CUDA devices: %d\n", gpu.devices);
  doctest::Context context(argc, argv);
  return context.run();
}

}  // namespace charm::test
