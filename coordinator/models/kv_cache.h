// Per-sequence key/value cache, f32. Two shapes (which family uses which: its
// Model::new_cache; the families are listed in coordinator/models/families.h):
//  - GQA: per layer and position the post-RoPE key and the value,
//    kv_dim = num_key_value_heads * head_dim each (DecoderModel::new_cache).
//  - MLA, compressed: per layer and position one row [kv_lora_rank latent |
//    qk_rope_head_dim rotated key] and no values; keys and values of every head are
//    computed from the latent at attention time (coordinator/models/mla_attention.h).
#pragma once

#include <cstddef>
#include <vector>

namespace charm {

/// KV cache of one sequence. Layout per layer: [max_tokens, key_dim] keys and
/// [max_tokens, value_dim] values (value_dim 0: no values). Not thread-safe.
class KvCache {
 public:
  /// GQA cache: key_dim = value_dim = kv_dim.
  KvCache(size_t num_layers, size_t max_tokens, size_t kv_dim);
  /// Any key / value widths; MLA uses (kv_lora_rank + qk_rope_head_dim, 0).
  KvCache(size_t num_layers, size_t max_tokens, size_t key_dim, size_t value_dim);

  /// Key row of `layer` at position `pos` (key_dim floats); for MLA, the latent row.
  float* key(size_t layer, size_t pos) { return keys_[layer].data() + pos * key_dim_; }
  /// Value row (value_dim floats); REQUIRES value_dim > 0.
  float* value(size_t layer, size_t pos) { return values_[layer].data() + pos * value_dim_; }
  const float* key(size_t layer, size_t pos) const { return keys_[layer].data() + pos * key_dim_; }
  const float* value(size_t layer, size_t pos) const { return values_[layer].data() + pos * value_dim_; }

  /// Positions already stored (the next token's position).
  size_t length() const { return length_; }
  size_t capacity() const { return max_tokens_; }
  size_t key_dim() const { return key_dim_; }
  size_t value_dim() const { return value_dim_; }
  /// Marks `n` more positions as stored. Throws Error(kInvalidInput) past capacity.
  void advance(size_t n);
  /// Bytes held per token over all layers (keys and values, f32), for reports.
  size_t bytes_per_token() const { return keys_.size() * (key_dim_ + value_dim_) * sizeof(float); }

 private:
  size_t max_tokens_;
  size_t key_dim_;
  size_t value_dim_;
  size_t length_ = 0;
  std::vector<std::vector<float>> keys_;
  std::vector<std::vector<float>> values_;
};

}  // namespace charm
