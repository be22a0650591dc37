// The routed experts one worker serves, behind its tier hierarchy: an optional VRAM tier
// (worker/experts/vram_tier.h) over a RAM cache (pinned
// set + per-layer LRU, worker/experts/expert_cache.h) over a disk tier (the checkpoint itself or
// an expert container, worker/experts/expert_source.h), sized by a RAM budget, with expert usage
// recorded for `pin: auto` (worker/experts/usage_log.h). Placement of an expert in a tier changes
// speed only, never a bit of the output.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/checkpoint.h"
#include "worker/experts/expert_cache.h"
#include "common/expert_activation.h"
#include "worker/experts/expert_source.h"
#include "worker/experts/usage_log.h"
#include "worker/experts/vram_tier.h"

namespace charm {

/// How pinned experts are chosen: the hottest of the usage file (auto), none, or the
/// hottest of a given usage-format file.
enum class PinMode { kAuto, kNone, kFile };

/// A worker's tier settings (the YAML keys of docs/configuration.md).
struct StoreOptions {
  std::string worker_name = "local";     ///< for messages
  std::optional<uint64_t> ram_bytes;     ///< expert slot budget; nullopt = every owned expert resident
  PinMode pin = PinMode::kAuto;
  std::filesystem::path pin_file;        ///< with PinMode::kFile
  std::filesystem::path usage_file;      ///< where usage is recorded; empty = not recorded
  std::string model_fingerprint;         ///< written into / checked against usage files
  int io_threads = 4;                    ///< bounded async read pool
  EvictionPolicy eviction = EvictionPolicy::kLru;  ///< the LRU slots' replacement (`cache_policy`)
  ExpertActivation activation;           ///< the model's (ModelConfig::expert_activation)
  /// The VRAM tier's budget (`vram_gb`) and its device (both set, or neither): the
  /// hottest experts (plan_vram) are computed there, and are not pinned in RAM as well.
  std::optional<uint64_t> vram_bytes;
  std::shared_ptr<ExpertDevice> vram_device;
};

/// A request's experts on one layer, by tier: those in VRAM (ascending) and the fetch of
/// the others from RAM / disk (ExpertFetch; it returns nothing when all were in VRAM).
struct LayerFetch {
  std::vector<VramLease> vram;
  std::unique_ptr<ExpertFetch> ram;
};

/// How a budget becomes slots: per layer, `pinned` + `lru_slots` (LayerPlan).
/// Rules: no budget, or a budget holding every owned expert -> every expert pinned.
/// Otherwise total = ram_bytes / slot_bytes slots are shared among layers in proportion
/// to the experts owned there (at least one each, at most the layer's count); on each
/// layer the hottest experts of `usage` (count > 0) are pinned, leaving
/// max(1, slots / 4) slots to the LRU. Throws Error(kInvalidInput) naming the worker, the
/// budget, the slot size and the minimum budget when it holds fewer slots than layers.
std::map<uint32_t, LayerPlan> plan_slots(const std::vector<ExpertKey>& owned, uint64_t slot_bytes,
                                         std::optional<uint64_t> ram_bytes, const UsageCounts& usage,
                                         const std::string& worker_name);

/// Owned routed-expert weights. Thread-safety: every method from any thread.
class ExpertStore {
 public:
  /// Serves `owned` from `source` (owned by the store) with `options`. Reads the usage
  /// or pin file (a bad one is warned about and ignored), plans slots (plan_slots; its
  /// errors) and reads the pinned experts. Throws Error(kInvalidInput) when the source
  /// lacks an owned expert.
  ExpertStore(std::unique_ptr<ExpertSource> source, const std::vector<ExpertKey>& owned, int64_t hidden_size,
              int64_t intermediate_size, StoreOptions options);

  /// Every expert of `owned` resident, read from `checkpoint` (which must outlive the
  /// store), no usage recorded: the in-RAM store of tests and simple setups. The experts'
  /// content identities are hashed from the checkpoint here (no manifest cache).
  ExpertStore(const Checkpoint& checkpoint, const ExpertTensorNames& names, const std::vector<ExpertKey>& owned,
              int64_t hidden_size, int64_t intermediate_size);
  ~ExpertStore();

  /// True when this worker owns (layer, expert).
  bool holds(uint32_t layer, uint32_t expert) const { return owned_.count({layer, expert}) > 0; }
  /// Starts fetching a request's distinct `experts` on `layer` (all held) and records
  /// their use: the VRAM ones at once, the others through ExpertFetch.
  LayerFetch fetch(uint32_t layer, const std::vector<uint32_t>& experts) const;
  /// The VRAM tier, or null when none is configured.
  const VramTier* vram() const { return vram_.get(); }
  /// Starts async reads of the missing ones of `experts` into free LRU slots, without
  /// blocking (the entry point for a coordinator's prefetch hint). Experts this worker
  /// does not own, or serves from VRAM, are ignored. Returns the number of reads started.
  size_t prefetch(uint32_t layer, const std::vector<uint32_t>& experts) const;

  size_t size() const { return owned_.size(); }
  int64_t hidden_size() const { return hidden_size_; }
  int64_t intermediate_size() const { return intermediate_size_; }
  /// The activation between the experts' gate/up and down projections.
  const ExpertActivation& activation() const { return activation_; }
  /// Held experts per layer (for status and the handshake).
  std::map<uint32_t, std::vector<uint32_t>> held() const;
  /// The content identity of every held expert as its source reports it
  /// (ExpertSource::identity): what the handshake compares with the coordinator's.
  ExpertIdentities identities() const;
  /// The source's lossy form ("" when it serves the checkpoint's values exactly).
  std::string lossy_form() const { return source_->lossy_form(); }
  /// Tier counters per layer since start (the VRAM tier's hits among the hits).
  std::map<uint32_t, TierCounters> layer_stats() const;
  /// Per layer, the experts in VRAM and in RAM now (LayerResidency).
  std::map<uint32_t, LayerResidency> residency() const;
  /// Their sum.
  TierCounters total_stats() const;
  const ExpertCache& cache() const { return *cache_; }
  /// Merges recorded usage into the usage file now (also done periodically and at exit).
  void flush_usage() const { usage_->flush(); }

 private:
  int64_t hidden_size_;
  int64_t intermediate_size_;
  ExpertActivation activation_;
  std::set<ExpertKey> owned_;
  std::unique_ptr<ExpertSource> source_;
  std::unique_ptr<UsageLog> usage_;
  std::unique_ptr<ExpertCache> cache_;
  std::unique_ptr<VramTier> vram_;
};

}  // namespace charm
