// The AVX512-VNNI q8 kernels of common/matmul_q8.h: common/matmul_q8_kernels.inc with the
// integer dots as the EVEX-encoded 256-bit vpdpbusd / vpdpwssd (AVX512-VNNI + AVX512VL).
// CPUs with AVX-512 but without AVX-VNNI's VEX form (AMD Zen 4, Intel Ice Lake and Cascade
// Lake servers) get the one-instruction dots too; the same integers, so the same bits.
#include "common/matmul_q8_detail.h"

#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "common/ggml_dequantize_detail.h"

// Compiled for AVX2 + F16C + AVX512-VNNI on 256-bit vectors. AVX512F brings FMA into the
// target, but CMakeLists.txt builds with -ffp-contract=off and these kernels call no FMA
// intrinsic, so every f32 operation rounds as the AVX2 file's. Called only when
// cpu_supports_q8_form(Q8Form::kAvx512Vnni). The headers above are parsed before the pragma.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c,avx512f,avx512vl,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c,avx512f,avx512vl,avx512vnni")
#endif

namespace charm {
namespace {

__m256i dot4_u8s8(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }

__m256i dot2_i16(__m256i acc, __m256i p, __m256i s) { return _mm256_dpwssd_epi32(acc, p, s); }

#include "common/matmul_q8_kernels.inc"

}  // namespace

Q8Kernels q8_kernels_avx512_vnni(GgmlType type) { return kernels_for(type); }

}  // namespace charm

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
