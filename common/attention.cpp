#include "common/attention.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/attention_detail.h"
#include "common/error.h"
#include "common/matmul.h"

namespace charm {

namespace attention_portable {
using Vec = float __attribute__((vector_size(16)));
using VecI = int32_t __attribute__((vector_size(16)));
constexpr size_t kLanes = 4;
void transpose_keys(const float* const* rows, size_t key_dim, float* kt) {
  for (size_t j = 0; j < kAttentionTile; ++j) {
    for (size_t d = 0; d < key_dim; ++d) kt[d * kAttentionTile + j] = rows[j] ? rows[j][d] : 0.0f;
  }
}
#include "common/attention_kernel.inc"
}  // namespace attention_portable

namespace attention_detail {

void attend_portable(const Query* queries, size_t n, const KvRows& kv, size_t head, size_t key_dim,
                     size_t value_dim, float scale, float* work) {
  attention_portable::attend(queries, n, kv, head, key_dim, value_dim, scale, work);
}

float exp_portable(float x) { return attention_portable::vexp(attention_portable::splat(x))[0]; }

}  // namespace attention_detail

namespace {

/// Queries one work item aims at: enough to reuse each transposed key tile, few enough
/// that their running outputs stay in the core's caches.
constexpr size_t kItemQueries = 128;
constexpr size_t kItemRows = 16;

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

}  // namespace

float attention_exp(float x) { return attention_detail::exp_portable(x); }

void causal_attention(const float* q, size_t rows, size_t pos0, const AttentionShape& shape, const KvRows& kv,
                      float* out) {
  const size_t heads = shape.num_heads, kv_heads = shape.num_kv_heads;
  if (kv_heads == 0 || heads % kv_heads != 0 || shape.key_dim == 0 || shape.value_dim == 0) {
    fail_invalid("causal_attention: " + std::to_string(heads) + " query heads over " + std::to_string(kv_heads) +
                 " KV heads, key_dim " + std::to_string(shape.key_dim) + ", value_dim " +
                 std::to_string(shape.value_dim) + " (need KV heads dividing the query heads, dims > 0)");
  }
  if (rows == 0) return;
  const auto attend = active_kernel_path() == KernelPath::kAvx2 ? attention_detail::attend_avx2
                                                                : attention_detail::attend_portable;
  // Work items: (KV head, block of rows, block of that KV head's query heads). How the
  // (row, head) pairs are grouped changes no bit (common/attention.h), so the blocks are
  // sized for speed: kItemQueries queries, split further until every thread has one
  // (each item transposes its own key tiles, so a decode step is best cut no finer).
  const size_t group = heads / kv_heads;
  const size_t want = static_cast<size_t>(std::max(1, omp_get_max_threads()));
  size_t rows_per = std::min(rows, kItemRows);
  size_t heads_per = std::clamp<size_t>(kItemQueries / rows_per, 1, group);
  auto items_for = [&] { return kv_heads * ceil_div(rows, rows_per) * ceil_div(group, heads_per); };
  while (items_for() < want && heads_per > 1) heads_per = ceil_div(heads_per, 2);
  while (items_for() < want && rows_per > 1) rows_per = ceil_div(rows_per, 2);
  const size_t row_blocks = ceil_div(rows, rows_per), head_blocks = ceil_div(group, heads_per);
  const size_t items = kv_heads * row_blocks * head_blocks;
#pragma omp parallel if (items > 1)
  {
    std::vector<attention_detail::Query> queries;
    std::vector<float> work;
    // The last rows see the most keys: they go first, so the dynamic schedule ends even.
#pragma omp for schedule(dynamic, 1)
    for (size_t item = 0; item < items; ++item) {
      const size_t row_block = row_blocks - 1 - item / (kv_heads * head_blocks);
      const size_t kvh = item / head_blocks % kv_heads;
      const size_t head_block = item % head_blocks;
      const size_t r0 = row_block * rows_per, r1 = std::min(rows, r0 + rows_per);
      const size_t h0 = kvh * group + head_block * heads_per, h1 = std::min((kvh + 1) * group, h0 + heads_per);
      queries.clear();
      for (size_t r = r0; r < r1; ++r) {
        for (size_t h = h0; h < h1; ++h) {
          const size_t i = r * heads + h;
          const size_t last = pos0 + r;
          const size_t w = shape.sliding_window;
          const size_t first = w != 0 && last + 1 > w ? last + 1 - w : 0;
          const float sink = shape.sinks ? shape.sinks[h] : -__builtin_inff();
          queries.push_back({q + i * shape.key_dim, first, last, out + i * shape.value_dim, sink});
        }
      }
      work.resize(attention_detail::work_floats(queries.size(), shape.key_dim));
      attend(queries.data(), queries.size(), kv, kvh, shape.key_dim, shape.value_dim, shape.scale, work.data());
    }
  }
}

}  // namespace charm
