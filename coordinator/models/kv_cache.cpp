#include "coordinator/models/kv_cache.h"

#include <algorithm>
#include <limits>
#include <string>

#include "common/error.h"

namespace charm {

KvCache::KvCache(size_t num_layers, size_t max_tokens, size_t kv_dim)
    : KvCache(num_layers, max_tokens, kv_dim, kv_dim) {}

KvCache::KvCache(size_t num_layers, size_t max_tokens, size_t key_dim, size_t value_dim)
    : max_tokens_(max_tokens), key_dim_(key_dim), value_dim_(value_dim), keys_(num_layers), values_(num_layers) {
  // A wrapped product would allocate a small buffer that advance() then lets writes run
  // past: refuse instead.
  const size_t width = std::max(key_dim, value_dim);
  if (width != 0 && max_tokens > std::numeric_limits<size_t>::max() / sizeof(float) / width) {
    fail_invalid("a KV cache of " + std::to_string(max_tokens) + " tokens of " + std::to_string(width) +
                 " floats does not fit in memory");
  }
  for (size_t l = 0; l < num_layers; ++l) {
    keys_[l].resize(max_tokens * key_dim);
    values_[l].resize(max_tokens * value_dim);
  }
}

void KvCache::advance(size_t n) {
  if (n > max_tokens_ - length_) {
    fail_invalid("sequence of " + std::to_string(length_ + n) + " tokens exceeds the KV cache capacity of " +
                 std::to_string(max_tokens_));
  }
  length_ += n;
}

}  // namespace charm
