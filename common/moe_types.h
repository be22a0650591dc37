// The data that crosses the coordinator <-> worker boundary for one MoE layer, in the
// form both the in-process and the remote path use.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace charm {

/// (layer, expert) ids of one routed expert: decoder layer index, expert index on it.
using ExpertKey = std::pair<uint32_t, uint32_t>;

/// One (row, expert) pair of a layer's batch-union: row `row` of the request's hidden
/// rows is to be run through routed expert `expert`, and its output y added to that row's
/// sum as weight * y (the router's combine weight for this pair, after any
/// renormalisation and routed scaling).
struct ExpertAssignment {
  uint32_t row = 0;
  uint32_t expert = 0;
  float weight = 1.0f;
};

/// `prefetchHint` (a message that gets no reply), or a layerRequest's `prefetch`: experts a
/// coming layerRequest is predicted to use.
struct PrefetchHintMsg {
  uint32_t layer = 0;             ///< decoder layer index of the predicted request
  std::vector<uint32_t> experts;  ///< predicted expert ids held by the receiving worker
};

/// Work for one worker on one MoE layer (schema/charm.capnp `LayerRequest`): the hidden
/// rows of the positions that route to it and their assignments. Rows are the
/// post-attention-norm hidden states.
struct LayerRequest {
  uint64_t request_id = 0;
  uint32_t layer = 0;
  uint32_t hidden_size = 0;
  uint32_t num_rows = 0;
  std::vector<float> hidden;                   ///< [num_rows, hidden_size] f32
  std::vector<ExpertAssignment> assignments;   ///< grouped by expert is not required
  /// The next MoE layer's predicted experts, to start reading while this one computes
  /// (protocol 5); nullopt: none.
  std::optional<PrefetchHintMsg> prefetch;
};

/// A worker's expert-tier counters (schema/charm.capnp `TierCounters`;
/// worker/experts/expert_cache.h), cumulative, for one layer or summed over layers.
/// Units: bytes and nanoseconds.
struct TierCounters {
  uint64_t hits = 0;             ///< experts a request found resident (or being prefetched)
  uint64_t misses = 0;           ///< experts a request had to read from disk itself
  uint64_t bytes_read = 0;       ///< bytes read from disk (misses and prefetches)
  uint64_t io_wait_ns = 0;       ///< time requests blocked waiting for reads or free slots
  uint64_t disk_ns = 0;          ///< total time the I/O threads spent in reads
  uint64_t prefetch_issued = 0;  ///< reads started by prefetch()
  uint64_t prefetch_hits = 0;    ///< prefetched experts a request then used
  uint64_t vram_hits = 0;        ///< hits served from the VRAM tier (computed on the device); <= hits
  TierCounters& operator+=(const TierCounters& o) {
    hits += o.hits;
    misses += o.misses;
    bytes_read += o.bytes_read;
    io_wait_ns += o.io_wait_ns;
    disk_ns += o.disk_ns;
    prefetch_issued += o.prefetch_issued;
    prefetch_hits += o.prefetch_hits;
    vram_hits += o.vram_hits;
    return *this;
  }
  bool operator==(const TierCounters&) const = default;
};

/// Where one layer's experts live on a worker right now (schema/charm.capnp
/// `LayerResidency`): expert ids, ascending; pinned and cached disjoint. An owned expert
/// in none of the lists is on disk only (read on a miss).
struct LayerResidency {
  std::vector<uint32_t> pinned;  ///< RAM, loaded at start and never evicted
  std::vector<uint32_t> cached;  ///< RAM, in an LRU slot now (may be evicted)
  std::vector<uint32_t> vram;    ///< on the device (the VRAM tier serves them first; they may be in RAM too)
  bool operator==(const LayerResidency&) const = default;
};

/// What a worker measured while serving one request (schema/charm.capnp `LayerStats`):
/// the tier counters of this request alone (the one counter type: what the store's fetch
/// counted, not a narrowed copy; prefetch_issued is 0, hits + misses is experts_computed)
/// plus what it computed.
struct LayerStats : TierCounters {
  uint32_t experts_computed = 0;  ///< distinct experts run (the union's size on this worker)
  uint32_t rows_computed = 0;     ///< assignments computed
  uint64_t compute_ns = 0;        ///< wall time spent in expert kernels (I/O wait excluded)
  uint64_t saturated = 0;         ///< output values clamped to the fixed-point range (common/fixed_point.h)
};

/// A worker's answer (schema/charm.capnp `LayerResponse`, less its error): per request
/// row, the fixed-point sum (common/fixed_point.h) of weight * y over that row's
/// assignments. Integer sums are exactly associative, so the coordinator's total never
/// depends on which worker computed what (DESIGN.md invariant), and the reply has one row
/// per position however many of its experts the worker ran.
struct LayerResponse {
  uint64_t request_id = 0;
  std::vector<int64_t> outputs;  ///< [num_rows, hidden_size] int64, 2^-32 units
  LayerStats stats;
};

}  // namespace charm
