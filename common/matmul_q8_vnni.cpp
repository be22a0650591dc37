// The AVX-VNNI q8 kernels of common/matmul_q8.h: common/matmul_q8_kernels.inc with the
// integer dots as vpdpbusd / vpdpwssd (one instruction for AVX2's maddubs + madd + add),
// the same integers, so the same bits.
#include "common/matmul_q8_detail.h"

#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "common/ggml_dequantize_detail.h"

// Compiled for AVX2 + F16C + AVX-VNNI (VEX-encoded, 256-bit; no FMA, as the AVX2 file);
// called only when cpu_supports_avx_vnni(). The headers above are parsed before the pragma.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c,avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c,avxvnni")
#endif

namespace charm {
namespace {

__m256i dot4_u8s8(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }

__m256i dot2_i16(__m256i acc, __m256i p, __m256i s) { return _mm256_dpwssd_avx_epi32(acc, p, s); }

#include "common/matmul_q8_kernels.inc"

}  // namespace

Q8Kernels q8_kernels_avx_vnni(GgmlType type) { return kernels_for(type); }

}  // namespace charm

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
