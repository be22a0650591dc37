// The AVX2 path of common/attention.h: the kernel of attention_kernel.inc with 8-lane
// vectors. common/attention.cpp calls it only when active_kernel_path() is kAvx2 (cpuid
// said yes). The standard headers are parsed before the target pragma, as in
// common/matmul_avx2.cpp, so none of their inline functions is compiled for AVX2.
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
#include "common/attention_kernel.inc"
}  // namespace attention_avx2

namespace attention_detail {

void attend_avx2(const Query* queries, size_t n, const KvRows& kv, size_t head, size_t key_dim, size_t value_dim,
                 float scale, float* work) {
  attention_avx2::attend(queries, n, kv, head, key_dim, value_dim, scale, work);
}

}  // namespace attention_detail

}  // namespace charm

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
