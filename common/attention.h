// Causal scaled-dot-product attention over key/value rows fetched one position at a
// time, with the online softmax of FlashAttention-2 (Tri Dao, "FlashAttention-2: Faster
// Attention with Better Parallelism and Work Partitioning", 2023, algorithm 1): keys are
// visited in tiles, and a running maximum, sum and output are rescaled when a tile
// raises the maximum, so no row of scores is ever stored whole.
//
// Two variants join the plain causal softmax, both as transformers writes them:
//  - a sliding window W (masking_utils.sliding_window_overlay: kv_idx > q_idx - W): the
//    query at position p attends positions max(0, p - W + 1) .. p, W keys at most;
//  - attention sinks (GptOssAttention.sinks; eager_attention_forward): one learned logit
//    per query head that joins the softmax's maximum and denominator but has no value,
//    so the weights of the real keys sum to less than 1. The running max starts at the
//    sink and the running sum at exp(sink - sink) = 1, which is that softmax computed
//    online; without sinks they start at -inf and 0.
//
// Bit contract (DESIGN.md, "the batch never changes a bit"): the output of a query that
// attends positions first..last depends only on that query, its head's sink and those
// rows, by one fixed sequence of f32 operations, whatever the other queries of the call,
// the thread count, the kernel path (portable or AVX2) or whether the call is a decode
// step or a prefill:
//  - key tiles are kAttentionTile positions aligned to absolute position 0, so the tile
//    boundaries a query sees depend only on `first` and `last`; positions of a tile
//    before `first` or after `last` are masked (score -inf, never added);
//  - a score is one f32 sum over the key dimensions in order (d = 0, 1, ...) of rounded
//    products, times the scale;
//  - per tile: max of the tile's scores and the running max, p = exp(s - max) by
//    attention_exp's polynomial, the tile's p summed by a fixed pairwise tree (the
//    tile's maximum too, by the same tree), the running sum and output rescaled by
//    exp(old max - new max) when the max rose, then p_t * v_t added position by position;
//  - the output is the running output divided by the running sum.
// No multiply is fused with an add (the build has -ffp-contract=off). One query's
// reduction is never split between threads.
#pragma once

#include <cstddef>

namespace charm {

/// Positions per key tile; tiles start at multiples of it (the paged KV cache's block).
inline constexpr size_t kAttentionTile = 16;

/// Where attention finds the key and value row of a KV head at a position. Nothing is
/// assumed about where one position's row lies relative to the next. Implementations are
/// read from several threads at once, so they must be safe for concurrent const calls.
class KvRows {
 public:
  virtual ~KvRows() = default;
  /// Key row [key_dim] f32 of KV head `head` at position `pos`.
  virtual const float* key(size_t head, size_t pos) const = 0;
  /// Value row [value_dim] f32 of KV head `head` at position `pos`.
  virtual const float* value(size_t head, size_t pos) const = 0;
};

/// The shape of one causal_attention call.
struct AttentionShape {
  size_t num_heads = 0;     ///< query heads
  size_t num_kv_heads = 0;  ///< KV heads; query head h reads KV head h / (num_heads / num_kv_heads)
  size_t key_dim = 0;       ///< floats per query and key row
  size_t value_dim = 0;     ///< floats per value row and output head
  float scale = 1.0f;       ///< scores are (q . k) * scale
  /// Sliding window W: the query at position p attends max(0, p - W + 1) .. p. 0: none
  /// (all of 0 .. p).
  size_t sliding_window = 0;
  /// Attention sinks [num_heads] f32 (the caller keeps them alive for the call), one
  /// logit per query head in the softmax's denominator only; nullptr: none.
  const float* sinks = nullptr;
};

/// Causal attention, OpenMP over (row, head) pairs: q [rows, num_heads, key_dim] f32 for
/// positions pos0..pos0+rows-1, out [rows, num_heads, value_dim] f32; row r attends
/// positions 0..pos0+r of `kv` (from pos0+r-W+1 under a sliding window W), which must be
/// stored; no other position is read. Bits as the contract above
/// says. Uses the kernel path active_kernel_path() (common/matmul.h) names. Throws
/// Error(kInvalidInput) when num_kv_heads is 0 or does not divide num_heads, or a
/// dimension is 0.
void causal_attention(const float* q, size_t rows, size_t pos0, const AttentionShape& shape, const KvRows& kv,
                      float* out);

/// exp(x) in f32 for x <= 0 as the attention kernel computes it (range reduction by
/// ln 2, Cephes' degree-6 polynomial, scaling by 2^n; within 2 ulp of exp, 0 below
/// -87.3, x clamped to at most 88): exposed for tests.
float attention_exp(float x);

}  // namespace charm
