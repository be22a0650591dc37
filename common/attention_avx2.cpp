// The AVX2 path of common/attention.h: the kernel of attention_kernel.inc with 8-lane
// vectors. common/attention.cpp calls it only when active_kernel_path() is kAvx2 (cpuid
// said yes). The standard headers are parsed before the target pragma, as in
// common/matmul_avx2.cpp, so none of their inline functions is compiled for AVX2.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "common/attention_detail.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif

namespace charm {

namespace attention_avx2 {
using Vec = float __attribute__((vector_size(32)));
using VecI = int32_t __attribute__((vector_size(32)));
constexpr size_t kLanes = 8;

/// kt[d * kAttentionTile + j] = rows[j][d] (0 for a null row) by 8 x 8 register transposes.
void transpose_keys(const float* const* rows, size_t key_dim, float* kt) {
  for (size_t j0 = 0; j0 < kAttentionTile; j0 += 8) {
    const float* const* r = rows + j0;
    size_t d0 = 0;
    for (; d0 + 8 <= key_dim; d0 += 8) {
      __m256 x[8];
      for (size_t i = 0; i < 8; ++i) x[i] = r[i] ? _mm256_loadu_ps(r[i] + d0) : _mm256_setzero_ps();
      __m256 lo[4], hi[4];  // pairs of rows interleaved
      for (size_t i = 0; i < 4; ++i) {
        lo[i] = _mm256_unpacklo_ps(x[2 * i], x[2 * i + 1]);
        hi[i] = _mm256_unpackhi_ps(x[2 * i], x[2 * i + 1]);
      }
      __m256 quad[8];  // within each 128-bit half: columns of 4 rows
      for (size_t i = 0; i < 2; ++i) {
        quad[4 * i + 0] = _mm256_shuffle_ps(lo[2 * i], lo[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0));
        quad[4 * i + 1] = _mm256_shuffle_ps(lo[2 * i], lo[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2));
        quad[4 * i + 2] = _mm256_shuffle_ps(hi[2 * i], hi[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0));
        quad[4 * i + 3] = _mm256_shuffle_ps(hi[2 * i], hi[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2));
      }
      for (size_t k = 0; k < 4; ++k) {
        _mm256_storeu_ps(kt + (d0 + k) * kAttentionTile + j0, _mm256_permute2f128_ps(quad[k], quad[4 + k], 0x20));
        _mm256_storeu_ps(kt + (d0 + 4 + k) * kAttentionTile + j0, _mm256_permute2f128_ps(quad[k], quad[4 + k], 0x31));
      }
    }
    for (; d0 < key_dim; ++d0) {
      for (size_t i = 0; i < 8; ++i) kt[d0 * kAttentionTile + j0 + i] = r[i] ? r[i][d0] : 0.0f;
    }
  }
}

#include "common/attention_kernel.inc"
}  // namespace attention_avx2

namespace attention_detail {

void attend_avx2(const Query* queries, size_t n, const KvRows& kv, size_t head, size_t key_dim, size_t value_dim,
                 float scale, float* work) {
  attention_avx2::attend(queries, n, kv, head, key_dim, value_dim, scale, work);
}

}  // namespace attention_detail

}  // namespace charm

#include "common/avx2_target_end.inc"
