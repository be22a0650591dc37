// Per-sequence key/value cache of a GQA decoder: for every layer, the post-RoPE keys and
// the values of every position so far, f32.
#pragma once

#include <cstddef>
#include <vector>

namespace charm {

/// KV cache of one sequence. Layout per layer: [max_tokens, kv_dim] for K and for V,
/// kv_dim = num_key_value_heads * head_dim. Not thread-safe.
class KvCache {
 public:
  KvCache(size_t num_layers, size_t max_tokens, size_t kv_dim);

  /// Key row of `layer` at position `pos` (kv_dim floats).
  float* key(size_t layer, size_t pos) { return keys_[layer].data() + pos * kv_dim_; }
  float* value(size_t layer, size_t pos) { return values_[layer].data() + pos * kv_dim_; }
  const float* key(size_t layer, size_t pos) const { return keys_[layer].data() + pos * kv_dim_; }
  const float* value(size_t layer, size_t pos) const { return values_[layer].data() + pos * kv_dim_; }

  /// Positions already stored (the next token's position).
  size_t length() const { return length_; }
  size_t capacity() const { return max_tokens_; }
  /// Marks `n` more positions as stored. Throws Error(kInvalidInput) past capacity.
  void advance(size_t n);
  /// Bytes held per token over all layers (K and V), for reports.
  size_t bytes_per_token() const { return keys_.size() * 2 * kv_dim_ * sizeof(float); }

 private:
  size_t max_tokens_;
  size_t kv_dim_;
  size_t length_ = 0;
  std::vector<std::vector<float>> keys_;
  std::vector<std::vector<float>> values_;
};

}  // namespace charm
