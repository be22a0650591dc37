// Speed of dequantize_row (common/ggml_type.h) per GGML type and kernel path: GB/s of
// block bytes read and Gelem/s written, best of `repeat` over random blocks (f16 scales
// kept finite), single-threaded, for two row sizes: 16384 elements (64 KiB of f32: the
// output stays in L2, so this is the kernel's own speed; 512 calls per timing) and 8 Mi
// elements (32 MiB of f32: bound by memory bandwidth; one call).
// Build and run (after cmake --build build --target charm_common):
//   g++ -O3 -std=c++20 -ffp-contract=off -fopenmp -I. scripts/bench_ggml_dequantize.cpp \
//       build/libcharm_common.a -lspdlog -lfmt -o /tmp/bench_ggml_dequantize
//   /tmp/bench_ggml_dequantize [repeat, default 10]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "common/ggml_type.h"
#include "common/matmul.h"

using namespace charm;

int main(int argc, char** argv) {
  const int repeat = argc > 1 ? std::atoi(argv[1]) : 10;
  const GgmlType types[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0, GgmlType::kQ4_1,
                            GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K,
                            GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kMXFP4};
  const int64_t total = int64_t{8} << 20;
  std::mt19937 rng(1);
  std::vector<KernelPath> paths = {KernelPath::kPortable};
  if (cpu_supports_avx2()) paths.push_back(KernelPath::kAvx2);
  std::printf("%-6s %-9s %9s %10s %10s\n", "type", "path", "row", "GB/s in", "Gelem/s");
  for (int64_t elements : {int64_t{16384}, total}) {
  std::vector<float> out(static_cast<size_t>(elements));
  const int calls = static_cast<int>(elements == total ? 1 : 512);
  for (GgmlType type : types) {
    const GgmlTypeTraits t = ggml_traits(type);
    std::vector<uint8_t> src(*ggml_row_bytes(type, elements));
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    // Small finite scales everywhere a scale can be: clear the top exponent bit of every
    // f16 (bit 14 of each little-endian 16-bit word) so no value is Inf/NaN.
    if (t.block_elements > 1 && type != GgmlType::kMXFP4) {
      for (size_t i = 1; i < src.size(); i += 2) src[i] &= 0xBF;
    }
    for (KernelPath path : paths) {
      set_kernel_path(path);
      double best = 1e30;
      for (int r = 0; r < repeat; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int c = 0; c < calls; ++c) dequantize_row(type, src.data(), out.data(), elements);
        const auto t1 = std::chrono::steady_clock::now();
        best = std::min(best, std::chrono::duration<double>(t1 - t0).count() / calls);
      }
      std::printf("%-6s %-9s %9lld %10.2f %10.2f\n", t.name, kernel_path_name(path), static_cast<long long>(elements),
                  src.size() / best / 1e9, elements / best / 1e9);
    }
  }
  }
  return 0;
}
