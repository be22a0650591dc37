// The serving engine's load as /metrics reports it (Engine::load, Metrics::render): a
// plain snapshot, so that the metrics need not know the engine.
#pragma once

#include <cstdint>

namespace charm {

/// What the engine is doing now, for /metrics: updated after every step, read without
/// waiting for one.
struct EngineLoad {
  int64_t running = 0;            ///< sequences in the running batch
  int64_t waiting = 0;            ///< requests queued for admission
  int64_t kv_blocks_total = 0;    ///< blocks of the paged KV cache
  int64_t kv_blocks_used = 0;     ///< held by sequences
  int64_t kv_blocks_cached = 0;   ///< free but holding a reusable prefix
  int64_t kv_block_tokens = 0;    ///< positions per block
  uint64_t prefix_hits = 0;       ///< prefix-cache blocks reused
  uint64_t prefix_misses = 0;     ///< lookups that found none
  uint64_t preemptions = 0;       ///< sequences sent back to the queue for want of blocks
  uint64_t tokens_sampled = 0;    ///< tokens sampled since start, counted as each step ends
                                  ///< (a request still running included; completion_tokens
                                  ///< counts a request only when it finishes)
};

}  // namespace charm
