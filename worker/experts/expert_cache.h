// The RAM tier of a worker: per MoE layer, a pinned set (loaded at start, never evicted)
// and an LRU over the remaining slots, in front of the disk tier (an ExpertSource).
// Lookup order: VRAM (worker/experts/vram_tier.h, when configured), pinned, LRU, disk.
//
// Every slot is sized for the largest expert (align_up(max blob, 4 KiB)) and holds one
// expert's blob as the source stores it (the checkpoint's dtype, or a container's
// quantised form): the cache never changes a weight, so whichever tier serves an expert
// the executor computes the same bits.
//
// A request asks for its layer's distinct experts with fetch(): experts already resident
// come back at once (leased, so not evictable while computed); missing ones are read by a
// bounded pool of I/O threads into free LRU slots (evicting the least recently used
// unleased expert) and come back as they land. prefetch() starts such reads without
// waiting. Memory: slot_bytes * (pinned + LRU slots), allocated at start.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/load_progress.h"
#include "common/moe_types.h"
#include "worker/experts/expert_source.h"
#include "worker/experts/io_pool.h"

namespace charm {

/// How one layer's slots are used.
struct LayerPlan {
  std::vector<uint32_t> owned;   ///< experts the worker owns on this layer
  std::vector<uint32_t> pinned;  ///< subset of owned loaded at start and never evicted
  size_t lru_slots = 0;          ///< further slots, shared LRU-fashion by the other experts
};

class ExpertCache;

/// Which unleased resident expert a miss evicts when no slot is free.
enum class EvictionPolicy {
  kLru,   ///< the least recently used
  /// LRFU (Lee et al. 2001): the lowest use count decayed by half every
  /// kLrfuHalfLifeCalls fetches of the layer (ties: least recently used, then higher id);
  /// counts outlive eviction. Opt-in (`cache_policy: lrfu`): a replay of the demo model's
  /// routing credits it with 93-95 % of Belady's hits where LRU gets 88 %, but the store
  /// measured +0.7 % hits over LRU (docs/benchmarks.md).
  kLrfu,
};
inline constexpr double kLrfuHalfLifeCalls = 8.0;

/// A resident expert, not evictable while the lease lives. Move-only.
class ExpertLease {
 public:
  ExpertLease(ExpertLease&& other) noexcept;
  ExpertLease& operator=(ExpertLease&&) = delete;
  ~ExpertLease();
  uint32_t expert() const { return expert_; }
  /// The expert's matrices in the slot (valid while the lease lives).
  const ExpertView& view() const { return view_; }

 private:
  friend class ExpertFetch;
  ExpertLease(ExpertCache* cache, uint32_t layer, size_t slot, uint32_t expert, ExpertView view);
  ExpertCache* cache_;
  uint32_t layer_;
  size_t slot_;
  uint32_t expert_;
  ExpertView view_;
};

/// One request's experts on one layer. Thread-safety: one thread per fetch.
class ExpertFetch {
 public:
  ~ExpertFetch();  // waits for this fetch's reads still in flight
  ExpertFetch(const ExpertFetch&) = delete;
  ExpertFetch& operator=(const ExpertFetch&) = delete;

  /// The next experts ready to compute: first every resident one, then missing ones as
  /// their reads complete (blocking, counted as I/O wait). Empty when all were returned.
  /// Release the previous batch's leases before calling again (a one-slot layer needs
  /// that slot back). Throws Error(kIo) naming the expert when its read failed.
  std::vector<ExpertLease> next();
  /// This request's counters so far (prefetch_issued is always 0 here).
  const TierCounters& stats() const { return stats_; }

 private:
  friend class ExpertCache;
  ExpertFetch(ExpertCache& cache, uint32_t layer, const std::vector<uint32_t>& experts);
  ExpertCache& cache_;
  uint32_t layer_;
  std::vector<uint32_t> to_load_;  // misses not yet given a slot
  struct Waiting {
    size_t slot;
    bool own_read;  // this fetch started the read: its bytes and time are ours
  };
  std::vector<Waiting> waiting_;   // slots we hold a reference on, not yet returned
  TierCounters stats_;
};

class ExpertCache {
 public:
  /// Allocates every slot and reads every pinned expert (in parallel on the pool).
  /// `source` must outlive the cache and hold every owned expert. `io_threads` >= 1.
  /// `eviction` picks what a miss replaces. A non-empty `progress_label` shows the pinned
  /// reads' progress (LoadProgress) when they take more than a couple of seconds. Throws
  /// what the source throws for a pinned expert.
  ExpertCache(const ExpertSource& source, std::map<uint32_t, LayerPlan> plan, int io_threads,
              EvictionPolicy eviction = EvictionPolicy::kLru, const std::string& progress_label = "");
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  /// Starts a request's fetch of `experts` (distinct ids owned on `layer`; the caller
  /// checks ownership). Throws Error(kInternal) for a layer without a plan.
  std::unique_ptr<ExpertFetch> fetch(uint32_t layer, const std::vector<uint32_t>& experts);

  /// Starts reads of those `experts` of `layer` that are neither resident nor loading,
  /// into free LRU slots (evicting the least recently used unleased experts), without
  /// waiting for them; stops when no slot is free. Unknown layers/experts are ignored.
  /// Returns the number of reads started.
  size_t prefetch(uint32_t layer, const std::vector<uint32_t>& experts);

  /// Counters per layer, cumulative since start.
  std::map<uint32_t, TierCounters> stats() const;
  /// Bytes of one slot.
  uint64_t slot_bytes() const { return slot_bytes_; }
  /// Slots (pinned + LRU) over all layers.
  size_t slot_count() const;
  /// Experts resident on `layer` now, in slot order (for tests and status).
  std::vector<uint32_t> resident(uint32_t layer) const;
  /// Per layer, the experts in RAM now (ready slots only, ascending): pinned ones and
  /// those in LRU slots. Each layer's lists are one consistent look (under its lock).
  std::map<uint32_t, LayerResidency> residency() const;

 private:
  friend class ExpertFetch;
  friend class ExpertLease;
  enum class State { kEmpty, kLoading, kReady, kFailed };
  struct Slot {
    AlignedBuffer buffer;
    State state = State::kEmpty;
    uint32_t expert = 0;
    const ExpertLayout* layout = nullptr;
    bool pinned = false;
    bool prefetched = false;  // loaded by prefetch() and not used by a request yet
    int refs = 0;             // leases and fetches waiting on it
    uint64_t last_use = 0;    // LRU clock value of the last release
    uint64_t read_bytes = 0;  // of the last completed read
    uint64_t read_ns = 0;
    std::string error;        // when kFailed
  };
  struct Layer {
    mutable std::mutex mutex;
    std::condition_variable cv;
    std::vector<Slot> slots;
    std::unordered_map<uint32_t, size_t> where;  // expert -> slot (loading or ready)
    uint64_t clock = 0;
    TierCounters stats;
    // LRFU: fetches of this layer so far, and per expert its decayed use count as of
    // the fetch that last used it.
    uint64_t calls = 0;
    struct Use {
      double score = 0;
      uint64_t call = 0;
    };
    std::unordered_map<uint32_t, Use> uses;
  };

  Layer& layer(uint32_t id);
  // REQUIRES: l.mutex held. A slot a new read may use, or -1: LRU (not pinned), unused,
  // not loading; an empty one first, else the eviction policy's victim.
  long free_slot(Layer& l) const;
  // REQUIRES: l.mutex held. A fetch uses `experts` (LRFU's counts).
  static void record_use(Layer& l, const std::vector<uint32_t>& experts);
  // REQUIRES: l.mutex held. LRFU's decayed count of `expert` now.
  static double lrfu_score(const Layer& l, uint32_t expert);
  // REQUIRES: l.mutex held. Claims `slot` for `expert` and queues its read.
  void start_read(uint32_t layer_id, Layer& l, size_t slot, uint32_t expert, bool prefetch);
  void release(uint32_t layer_id, size_t slot);
  // REQUIRES: l.mutex held. Drops one reference (a failed slot becomes free at zero).
  static void unref(Layer& l, size_t slot);
  // REQUIRES: l.mutex held. A request uses resident/loading `slot`: hold it, count a hit.
  static void hold_hit(Layer& l, size_t slot, TierCounters& request);
  ExpertView view_of(const Slot& s) const;

  const ExpertSource& source_;
  uint64_t slot_bytes_ = 0;
  EvictionPolicy eviction_ = EvictionPolicy::kLru;
  // Counts the constructor's pinned reads (null without a progress label). Set before any
  // read starts and kept until after pool_ has joined, so an I/O thread never sees it go.
  std::unique_ptr<LoadProgress> startup_progress_;
  std::map<uint32_t, std::unique_ptr<Layer>> layers_;
  std::unique_ptr<IoPool> pool_;  // last member: joined first, while the slots still exist
};

}  // namespace charm
