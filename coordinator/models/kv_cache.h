// The paged key/value cache, f32: one pool of fixed-size blocks per engine, each
// sequence's KvCache a table of the blocks it holds (vLLM's PagedAttention, Kwon et al.
// 2023), and a prefix cache that lets sequences share full blocks of equal token prefixes.
// Two row shapes (which family uses which: its Model::kv_layout; the families are listed
// in coordinator/models/families.h):
//  - GQA: per layer and position the post-RoPE key and the value,
//    kv_dim = num_key_value_heads * head_dim each (DecoderModel::kv_layout).
//  - MLA, compressed: per layer and position one row [kv_lora_rank latent |
//    qk_rope_head_dim rotated key] and no values; keys and values of every head are
//    computed from the latent at attention time (coordinator/models/mla_attention.h);
//    under DeepSeek Sparse Attention (GLM-5) the lightning indexer's key follows in the
//    same row (coordinator/models/dsa_indexer.h).
// A model with linear attention (Qwen3-Next's gated DeltaNet) also keeps a fixed-size
// state per sequence beside its blocks (KvLayout::state_floats, KvCache::state()).
// A position's rows depend only on the tokens up to it (the batch-invariance contract of
// DESIGN.md), so a block computed by one sequence is, bit for bit, the block any other
// sequence with the same prefix would compute: sharing it changes nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace charm {

/// The shape of one model's cache rows.
struct KvLayout {
  size_t num_layers = 0;
  size_t key_dim = 0;    ///< floats per key row (MLA: the latent row)
  size_t value_dim = 0;  ///< floats per value row (0: no values, MLA)
  /// Floats of fixed-size state per sequence, beside the rows: linear attention's
  /// recurrent and convolution states (Qwen3-Next's gated DeltaNet), 0 for none. A
  /// sequence's state sums up all its positions, so no block can be shared or resumed
  /// from the prefix cache when this is > 0 (Scheduler::prefix_cache_enabled).
  size_t state_floats = 0;
  /// Bytes per cached position over all layers (keys and values, f32).
  size_t bytes_per_token() const { return num_layers * (key_dim + value_dim) * sizeof(float); }
  bool operator==(const KvLayout&) const = default;
};

/// The prefix-cache key of a full block: XXH3-64 of the block's kBlockSize token ids
/// seeded with the parent block's key (0 for the first block), so equal keys mean equal whole prefixes (up to hash
/// collisions, which KvBlockPool::find_cached rules out by comparing the tokens).
uint64_t prefix_block_key(uint64_t parent_key, std::span<const int32_t> tokens);

/// Blocks of kBlockSize positions for every layer, with reference counts and an LRU
/// prefix cache over the unreferenced full blocks. Storage is allocated once and touched
/// lazily (pages are faulted in as blocks are first written). Not thread-safe: the
/// engine loop owns it.
class KvBlockPool {
 public:
  static constexpr size_t kBlockSize = 16;

  /// Throws Error(kInvalidInput) when num_blocks is 0 or the pool's bytes overflow size_t.
  KvBlockPool(const KvLayout& layout, size_t num_blocks);
  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;

  const KvLayout& layout() const { return layout_; }
  size_t num_blocks() const { return refs_.size(); }
  /// Blocks no sequence references: never used, released, or cached (evictable).
  size_t free_blocks() const { return never_used_.size() + cached_lru_.size(); }
  /// Unreferenced blocks that hold a reusable prefix.
  size_t cached_blocks() const { return cached_lru_.size(); }
  size_t bytes_per_block() const { return kBlockSize * layout_.bytes_per_token(); }

  /// A block for one sequence's exclusive use (reference count 1): an unused one, else
  /// the least recently released cached block (dropped from the prefix cache). nullopt
  /// when every block is referenced.
  std::optional<uint32_t> allocate();
  /// Drops one reference; an unreferenced block with a prefix key stays findable until
  /// allocate() needs it.
  void release(uint32_t block);
  /// The cached block for `key` holding exactly `tokens`, with a reference taken; nullopt
  /// when none.
  std::optional<uint32_t> find_cached(uint64_t key, std::span<const int32_t> tokens);
  /// Makes a full block (every position written) findable under `key` (prefix_block_key
  /// of its prefix). A key another block already has is left to that block.
  void publish(uint32_t block, uint64_t key, std::span<const int32_t> tokens);

  /// Full prompt blocks admitted sequences found in the prefix cache, and did not (the
  /// scheduler records them once per admission: record_prefix_lookup), so hits / (hits +
  /// misses) is the block hit rate.
  uint64_t prefix_hits() const { return hits_; }
  uint64_t prefix_misses() const { return misses_; }
  void record_prefix_lookup(size_t found, size_t missed) {
    hits_ += found;
    misses_ += missed;
  }

  /// The key row of `layer` at `offset` (< kBlockSize) in `block`; value rows likewise
  /// (REQUIRES value_dim > 0).
  float* key(uint32_t block, size_t layer, size_t offset) { return keys_.get() + key_index(block, layer, offset); }
  float* value(uint32_t block, size_t layer, size_t offset) {
    return values_.get() + value_index(block, layer, offset);
  }
  const float* key(uint32_t block, size_t layer, size_t offset) const {
    return keys_.get() + key_index(block, layer, offset);
  }
  const float* value(uint32_t block, size_t layer, size_t offset) const {
    return values_.get() + value_index(block, layer, offset);
  }

 private:
  // Layout: [layer][block][offset][dim], so a block's rows of one layer are contiguous.
  size_t key_index(uint32_t block, size_t layer, size_t offset) const {
    return ((layer * num_blocks() + block) * kBlockSize + offset) * layout_.key_dim;
  }
  size_t value_index(uint32_t block, size_t layer, size_t offset) const {
    return ((layer * num_blocks() + block) * kBlockSize + offset) * layout_.value_dim;
  }
  /// Forgets the prefix key of `block` (it is about to be rewritten).
  void unpublish(uint32_t block);

  struct Cached {
    uint64_t key = 0;
    std::vector<int32_t> tokens;            // the block's own tokens (collision check)
    std::list<uint32_t>::iterator lru;      // valid while unreferenced
  };

  KvLayout layout_;
  std::unique_ptr<float[]> keys_, values_;
  std::vector<uint32_t> refs_;
  std::vector<uint32_t> never_used_;              // unreferenced, no prefix key
  std::list<uint32_t> cached_lru_;                // unreferenced with a key, least recent first
  std::unordered_map<uint32_t, Cached> cached_;   // block -> its prefix key
  std::unordered_map<uint64_t, uint32_t> by_key_; // prefix key -> block
  uint64_t hits_ = 0, misses_ = 0;
};

/// The KV cache of one sequence: the pool blocks that hold its positions 0..length()-1,
/// in order. Positions are reserved (reserve) before a forward writes them and marked
/// stored (advance) by it. A cache made with a shape instead of a pool owns a private
/// pool sized for max_tokens (tests, one-off prompts). Move-only; releases its blocks
/// when destroyed.
class KvCache {
 public:
  /// A cache drawing blocks from `pool`, which must outlive it. Holds nothing yet.
  explicit KvCache(KvBlockPool& pool);
  /// A cache with its own pool, room for max_tokens positions reserved. Throws
  /// Error(kInvalidInput) when that does not fit in memory (KvBlockPool).
  KvCache(const KvLayout& layout, size_t max_tokens);
  /// GQA shape: key_dim = value_dim = kv_dim.
  KvCache(size_t num_layers, size_t max_tokens, size_t kv_dim);
  /// Any key / value widths; MLA uses (kv_lora_rank + qk_rope_head_dim, 0).
  KvCache(size_t num_layers, size_t max_tokens, size_t key_dim, size_t value_dim);
  ~KvCache();
  KvCache(KvCache&& other) noexcept;
  KvCache& operator=(KvCache&& other) noexcept;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  /// Key row of `layer` at `pos` (< capacity()); for MLA, the latent row.
  float* key(size_t layer, size_t pos) { return pool_->key(block_at(pos), layer, pos % kBlock); }
  /// Value row (value_dim floats); REQUIRES value_dim > 0.
  float* value(size_t layer, size_t pos) { return pool_->value(block_at(pos), layer, pos % kBlock); }
  const float* key(size_t layer, size_t pos) const { return pool_->key(block_at(pos), layer, pos % kBlock); }
  const float* value(size_t layer, size_t pos) const { return pool_->value(block_at(pos), layer, pos % kBlock); }

  /// Positions already stored (the next token's position).
  size_t length() const { return length_; }
  /// Positions the held blocks have room for.
  size_t capacity() const { return blocks_.size() * kBlock; }
  const KvLayout& layout() const { return pool_->layout(); }
  size_t key_dim() const { return pool_->layout().key_dim; }
  size_t value_dim() const { return pool_->layout().value_dim; }
  /// Marks `n` more positions as stored. Throws Error(kInvalidInput) past capacity().
  void advance(size_t n);
  /// Bytes held per token over all layers (keys and values, f32), for reports.
  size_t bytes_per_token() const { return pool_->layout().bytes_per_token(); }
  /// The sequence's state [layout().state_floats] f32: zeros while no position is stored
  /// (a new cache, or after clear()); the model updates it as positions are stored. Held
  /// from the first call until clear(), so a queued sequence holds none.
  float* state();

  /// Takes blocks from the pool until capacity() >= positions. Returns false (holding
  /// what it took) when the pool runs out.
  bool reserve(size_t positions);
  /// Appends a block found in the prefix cache (its reference already taken) as this
  /// sequence's next kBlockSize stored positions. REQUIRES length() == capacity().
  void append_cached(uint32_t block);
  /// The blocks held, in position order.
  std::span<const uint32_t> blocks() const { return blocks_; }
  /// Releases every block, forgets every position and drops the state.
  void clear();

 private:
  static constexpr size_t kBlock = KvBlockPool::kBlockSize;
  uint32_t block_at(size_t pos) const { return blocks_[pos / kBlock]; }

  std::unique_ptr<KvBlockPool> own_pool_;  // set when the cache owns its pool
  KvBlockPool* pool_;
  std::vector<uint32_t> blocks_;
  size_t length_ = 0;
  std::vector<float> state_;  // [layout.state_floats] once state() is called, else empty
};

}  // namespace charm
