// The AVX2 q8 kernels of common/matmul_q8.h: common/matmul_q8_kernels.inc with the
// integer dots built from maddubs and madd (for CPUs without AVX-VNNI).
#include "common/matmul_q8_detail.h"

#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "common/ggml_dequantize_detail.h"

// Everything from here on is compiled for AVX2 + F16C (without FMA: the products and
// sums must round as the portable code's do); matmul_q8_tile calls it only on
// KernelPath::kAvx2, which needs cpu_supports_avx2(). The headers above are parsed
// before the pragma, so none of their inline functions is compiled for AVX2.
#include "common/avx2_target_begin.inc"

namespace charm {
namespace {

__m256i dot4_u8s8(__m256i acc, __m256i u, __m256i s) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

__m256i dot2_i16(__m256i acc, __m256i p, __m256i s) { return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s)); }

#include "common/matmul_q8_kernels.inc"

}  // namespace

Q8Kernels q8_kernels_avx2(GgmlType type) { return kernels_for(type); }

}  // namespace charm

#include "common/avx2_target_end.inc"
