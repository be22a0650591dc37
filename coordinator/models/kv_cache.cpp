#include "coordinator/models/kv_cache.h"

#include <algorithm>
#include <limits>
#include <new>
#include <numeric>
#include <string>

#include <xxhash.h>

#include "common/error.h"

namespace charm {

uint64_t prefix_block_key(uint64_t parent_key, std::span<const int32_t> tokens) {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent_key);
}

namespace {

/// new float[n] without initialising it (the kernel then maps pages only as they are
/// written); Error(kInvalidInput) naming the pool's size when it cannot be had.
std::unique_ptr<float[]> allocate_floats(size_t n, size_t blocks, size_t pool_bytes) {
  if (n == 0) return nullptr;
  float* p = new (std::nothrow) float[n];
  if (p == nullptr) {
    fail_invalid("a KV cache of " + std::to_string(blocks) + " blocks (" + std::to_string(pool_bytes >> 20) +
                 " MiB) cannot be allocated; lower kv_cache_gb");
  }
  return std::unique_ptr<float[]>(p);
}

}  // namespace

KvBlockPool::KvBlockPool(const KvLayout& layout, size_t num_blocks) : layout_(layout) {
  if (num_blocks == 0) fail_invalid("a KV cache needs at least one block");
  // A wrapped product would allocate a small buffer that the accessors then run past.
  const size_t width = std::max(layout.key_dim, layout.value_dim);
  const size_t max = std::numeric_limits<size_t>::max() / sizeof(float);
  if (width != 0 && (num_blocks > max / kBlockSize / width ||
                     layout.num_layers > max / (num_blocks * kBlockSize * width))) {
    fail_invalid("a KV cache of " + std::to_string(num_blocks * kBlockSize) + " tokens of " + std::to_string(width) +
                 " floats does not fit in memory");
  }
  if (num_blocks > std::numeric_limits<uint32_t>::max()) {
    fail_invalid("a KV cache of " + std::to_string(num_blocks) + " blocks has more than 2^32 blocks");
  }
  const size_t rows = layout.num_layers * num_blocks * kBlockSize;
  const size_t pool_bytes = rows * (layout.key_dim + layout.value_dim) * sizeof(float);
  keys_ = allocate_floats(rows * layout.key_dim, num_blocks, pool_bytes);
  values_ = allocate_floats(rows * layout.value_dim, num_blocks, pool_bytes);
  refs_.assign(num_blocks, 0);
  never_used_.resize(num_blocks);
  // Handed out lowest first (allocate pops the back).
  std::iota(never_used_.rbegin(), never_used_.rend(), 0u);
}

std::optional<uint32_t> KvBlockPool::allocate() {
  uint32_t block;
  if (!never_used_.empty()) {
    block = never_used_.back();
    never_used_.pop_back();
  } else if (!cached_lru_.empty()) {
    block = cached_lru_.front();
    cached_lru_.pop_front();
    unpublish(block);
  } else {
    return std::nullopt;
  }
  refs_[block] = 1;
  return block;
}

void KvBlockPool::release(uint32_t block) {
  if (refs_.at(block) == 0) fail_internal("KV block " + std::to_string(block) + " released twice");
  if (--refs_[block] > 0) return;
  auto it = cached_.find(block);
  if (it == cached_.end()) {
    never_used_.push_back(block);
  } else {
    it->second.lru = cached_lru_.insert(cached_lru_.end(), block);
  }
}

std::optional<uint32_t> KvBlockPool::find_cached(uint64_t key, std::span<const int32_t> tokens) {
  auto it = by_key_.find(key);
  if (it == by_key_.end() || !std::ranges::equal(cached_.at(it->second).tokens, tokens)) return std::nullopt;
  const uint32_t block = it->second;
  if (refs_[block]++ == 0) cached_lru_.erase(cached_.at(block).lru);
  return block;
}

void KvBlockPool::publish(uint32_t block, uint64_t key, std::span<const int32_t> tokens) {
  if (by_key_.count(key) || cached_.count(block)) return;
  by_key_.emplace(key, block);
  cached_.emplace(block, Cached{key, std::vector<int32_t>(tokens.begin(), tokens.end()), {}});
}

void KvBlockPool::unpublish(uint32_t block) {
  auto it = cached_.find(block);
  if (it == cached_.end()) return;
  by_key_.erase(it->second.key);
  cached_.erase(it);
}

KvCache::KvCache(KvBlockPool& pool) : pool_(&pool) {}

KvCache::KvCache(const KvLayout& layout, size_t max_tokens)
    : own_pool_(std::make_unique<KvBlockPool>(
          layout, std::max<size_t>(1, max_tokens / kBlock + (max_tokens % kBlock != 0)))),
      pool_(own_pool_.get()) {
  reserve(max_tokens);
}

KvCache::KvCache(size_t num_layers, size_t max_tokens, size_t kv_dim)
    : KvCache(KvLayout{num_layers, kv_dim, kv_dim}, max_tokens) {}

KvCache::KvCache(size_t num_layers, size_t max_tokens, size_t key_dim, size_t value_dim)
    : KvCache(KvLayout{num_layers, key_dim, value_dim}, max_tokens) {}

KvCache::~KvCache() { clear(); }

KvCache::KvCache(KvCache&& other) noexcept
    : own_pool_(std::move(other.own_pool_)),
      pool_(other.pool_),
      blocks_(std::move(other.blocks_)),
      length_(other.length_),
      state_(std::move(other.state_)) {
  other.blocks_.clear();
  other.length_ = 0;
  other.state_.clear();
  other.pool_ = nullptr;  // the pool may be the one this cache now owns
}

KvCache& KvCache::operator=(KvCache&& other) noexcept {
  if (this == &other) return *this;
  clear();
  own_pool_ = std::move(other.own_pool_);
  pool_ = other.pool_;
  blocks_ = std::move(other.blocks_);
  length_ = other.length_;
  state_ = std::move(other.state_);
  other.blocks_.clear();
  other.length_ = 0;
  other.state_.clear();
  other.pool_ = nullptr;
  return *this;
}

void KvCache::advance(size_t n) {
  if (n > capacity() - length_) {
    fail_invalid("sequence of " + std::to_string(length_ + n) + " tokens exceeds the KV cache capacity of " +
                 std::to_string(capacity()));
  }
  length_ += n;
}

bool KvCache::reserve(size_t positions) {
  while (capacity() < positions) {
    std::optional<uint32_t> block = pool_->allocate();
    if (!block) return false;
    blocks_.push_back(*block);
  }
  return true;
}

void KvCache::append_cached(uint32_t block) {
  if (length_ != capacity()) fail_internal("KvCache::append_cached with reserved positions not yet stored");
  if (pool_->layout().state_floats > 0) fail_internal("KvCache::append_cached on a cache with per-sequence state");
  blocks_.push_back(block);
  length_ += kBlock;
}

void KvCache::clear() {
  if (pool_ == nullptr) return;
  for (uint32_t block : blocks_) pool_->release(block);
  blocks_.clear();
  length_ = 0;
  std::vector<float>().swap(state_);
}

float* KvCache::state() {
  if (state_.empty()) state_.assign(pool_->layout().state_floats, 0.0f);
  return state_.data();
}

}  // namespace charm
