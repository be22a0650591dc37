// The matmul / dequantiser kernel paths a test runs both of (common/matmul.h KernelPath).
#pragma once

#include <doctest/doctest.h>

#include <vector>

#include "common/matmul.h"

namespace charm::test {

/// The paths this CPU can run; says so when the AVX2 one cannot be checked here.
inline std::vector<KernelPath> paths_to_check() {
  if (cpu_supports_avx2()) return {KernelPath::kPortable, KernelPath::kAvx2};
  MESSAGE("this CPU lacks avx2/fma/f16c: the AVX2 path was NOT checked");
  return {KernelPath::kPortable};
}

/// Restores the process's kernel path when a test case ends.
struct PathGuard {
  KernelPath saved = active_kernel_path();
  ~PathGuard() { set_kernel_path(saved); }
};

}  // namespace charm::test
