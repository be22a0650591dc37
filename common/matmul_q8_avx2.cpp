// The AVX2 q8 kernels of common/matmul_q8.h: common/matmul_q8_kernels.inc with the
// integer dots built from maddubs and madd (for CPUs without AVX-VNNI).
#include "common/matmul_q8_detail.h"

#include <immintrin.h>

#include <cmath>
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

bool abs_max_avx2(const float* x, int64_t n, float* amax) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i below_inf = _mm256_set1_epi32(0x7F7FFFFF);  // the largest finite |x|'s bits
  __m256 m = _mm256_setzero_ps();
  __m256i non_finite = _mm256_setzero_si256();
  for (int64_t j = 0; j < n; j += 8) {
    const __m256 ax = _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask);
    non_finite = _mm256_or_si256(non_finite, _mm256_cmpgt_epi32(_mm256_castps_si256(ax), below_inf));
    m = _mm256_max_ps(m, ax);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, m);
  float best = 0.0f;
  for (float v : lanes) best = v > best ? v : best;
  *amax = best;
  return _mm256_testz_si256(non_finite, non_finite) != 0;
}

int32_t quantize_q8_0_block_avx2(const float* x, float id, int8_t* q) {
  const __m256 vid = _mm256_set1_ps(id);
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  __m256i v[4];
  for (int k = 0; k < 4; ++k) {
    // std::round, half away from zero: the truncation, plus the sign of v where the dropped
    // fraction (exact: |v| is far below 2^23) is at least one half.
    const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), vid);
    const __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign_bit, _mm256_sub_ps(p, t));
    const __m256 step = _mm256_or_ps(_mm256_and_ps(p, sign_bit), one);  // +-1 with p's sign
    const __m256 r = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_GE_OQ), step));
    v[k] = _mm256_cvttps_epi32(r);
  }
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  return hsum_i32(_mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3])));
}

Q8KBlock quantize_q8_k_block_avx2(const float* x, int8_t* q, float* d, int16_t* sums) {
  float m = 0.0f;
  if (!abs_max_avx2(x, 256, &m)) return Q8KBlock::kNonFinite;
  if (m == 0.0f) return Q8KBlock::kZero;
  int first = 0;  // the first element of largest |x| (the portable scan's `max`)
  while (std::fabs(x[first]) != m) ++first;
  const float iscale = -127.0f / x[first];
  if (!(std::fabs(iscale) <= 3.4028235e38f)) return Q8KBlock::kZero;  // -127 / max overflowed
  const __m256 vs = _mm256_set1_ps(iscale);
  const __m256 top = _mm256_set1_ps(127.0f);
  for (int j = 0; j < 256; j += 32) {
    __m256i v[4];
    for (int k = 0; k < 4; ++k) {  // nearbyint (the current rounding mode, as std::nearbyint), then min 127
      const __m256 r = _mm256_round_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + j + 8 * k)), _MM_FROUND_CUR_DIRECTION);
      v[k] = _mm256_cvtps_epi32(_mm256_min_ps(r, top));
    }
    sums[j / 16] = static_cast<int16_t>(hsum_i32(_mm256_add_epi32(v[0], v[1])));
    sums[j / 16 + 1] = static_cast<int16_t>(hsum_i32(_mm256_add_epi32(v[2], v[3])));
    // packs work per 128-bit lane: bytes come out as v0[0..3] v1[0..3] v2[0..3] v3[0..3] |
    // v0[4..7] ...; the dword permute puts them back in order.
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
  *d = 1.0f / iscale;
  return Q8KBlock::kQuantised;
}

}  // namespace charm

#include "common/avx2_target_end.inc"
