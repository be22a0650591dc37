// Internals of common/attention.h shared by its two kernel paths (attention.cpp, the
// portable one, and attention_avx2.cpp); nothing outside those files includes this.
#pragma once

#include <cstddef>

#include "common/attention.h"

namespace charm::attention_detail {

/// One query of a call to attend: q [key_dim], attending positions first..last,
/// out [value_dim]; `sink` its head's sink logit (-inf: none).
struct Query {
  const float* q = nullptr;
  size_t first = 0;
  size_t last = 0;
  float* out = nullptr;
  float sink = -__builtin_inff();
};

/// Floats of working memory attend needs for n queries of key width key_dim.
inline size_t work_floats(size_t n, size_t key_dim) { return key_dim * kAttentionTile + 2 * n; }

/// The online-softmax attention of n queries over KV head `head` of kv, single-threaded,
/// each query by the contract of common/attention.h (the others do not change its bits).
/// work: work_floats(n, key_dim) floats. The paths differ only in vector width.
void attend_portable(const Query* queries, size_t n, const KvRows& kv, size_t head, size_t key_dim,
                     size_t value_dim, float scale, float* work);
void attend_avx2(const Query* queries, size_t n, const KvRows& kv, size_t head, size_t key_dim, size_t value_dim,
                 float scale, float* work);

/// attention_exp of the portable path (the AVX2 path's equals it lane for lane).
float exp_portable(float x);

}  // namespace charm::attention_detail
