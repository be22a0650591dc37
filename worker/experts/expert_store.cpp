#include "worker/experts/expert_store.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "worker/experts/budget_text.h"
#include "worker/experts/expert_manifest.h"

namespace charm {
namespace {

/// Slot counts per layer: proportional to owned experts, >= 1, <= owned, summing to at
/// most `total` (>= number of layers).
std::map<uint32_t, size_t> share_slots(const std::map<uint32_t, std::vector<uint32_t>>& by_layer, size_t owned_total,
                                       size_t total) {
  std::map<uint32_t, size_t> slots;
  size_t used = 0;
  for (const auto& [layer, experts] : by_layer) {
    const size_t share = std::max<size_t>(1, total * experts.size() / owned_total);
    slots[layer] = std::min(share, experts.size());
    used += slots[layer];
  }
  // Hand out what rounding left, one slot per layer per round, in layer order.
  for (bool gave = true; used < total && gave;) {
    gave = false;
    for (const auto& [layer, experts] : by_layer) {
      if (used < total && slots[layer] < experts.size()) {
        ++slots[layer];
        ++used;
        gave = true;
      }
    }
  }
  while (used > total) {  // the minimum of one per layer overshot: take from the largest
    auto largest = std::max_element(slots.begin(), slots.end(), [](auto& a, auto& b) { return a.second < b.second; });
    --largest->second;
    --used;
  }
  return slots;
}

}  // namespace

std::map<uint32_t, LayerPlan> plan_slots(const std::vector<ExpertKey>& owned, uint64_t slot_bytes,
                                         std::optional<uint64_t> ram_bytes, const UsageCounts& usage,
                                         const std::string& worker_name) {
  std::map<uint32_t, std::vector<uint32_t>> by_layer;
  for (const auto& [layer, expert] : owned) by_layer[layer].push_back(expert);
  std::map<uint32_t, LayerPlan> plan;
  for (const auto& [layer, experts] : by_layer) plan[layer].owned = experts;
  const uint64_t total = ram_bytes && slot_bytes ? *ram_bytes / slot_bytes : owned.size();
  if (!ram_bytes || total >= owned.size()) {
    for (auto& [layer, p] : plan) p.pinned = p.owned;  // everything fits: all resident
    return plan;
  }
  if (total < by_layer.size()) {
    const uint64_t need = by_layer.size() * slot_bytes;
    fail_invalid("worker '" + worker_name + "': ram_gb " + gib_text(*ram_bytes) + " (" + std::to_string(*ram_bytes) +
                 " bytes) holds " + std::to_string(total) + " expert slots of " + std::to_string(slot_bytes) +
                 " bytes, but its experts span " + std::to_string(by_layer.size()) +
                 " MoE layers and each needs at least one slot: set ram_gb to at least " + gib_text(need) + " (" +
                 std::to_string(need) + " bytes)");
  }
  for (const auto& [layer, slots] : share_slots(by_layer, owned.size(), total)) {
    LayerPlan& p = plan[layer];
    if (slots == p.owned.size()) {
      p.pinned = p.owned;
      continue;
    }
    std::vector<std::pair<uint64_t, uint32_t>> hot;  // (count, expert)
    for (uint32_t e : p.owned) {
      const auto it = usage.find({layer, e});
      if (it != usage.end() && it->second > 0) hot.emplace_back(it->second, e);
    }
    // Hottest first; ties by the smaller id, so a plan is reproducible.
    std::sort(hot.begin(), hot.end(), [](auto& a, auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
    const size_t pinnable = slots - std::max<size_t>(1, slots / 4);
    for (size_t i = 0; i < hot.size() && i < pinnable; ++i) p.pinned.push_back(hot[i].second);
    p.lru_slots = slots - p.pinned.size();
  }
  return plan;
}

ExpertStore::ExpertStore(std::unique_ptr<ExpertSource> source, const std::vector<ExpertKey>& owned,
                         int64_t hidden_size, int64_t intermediate_size, StoreOptions options)
    : hidden_size_(hidden_size), intermediate_size_(intermediate_size), activation_(options.activation), owned_(owned.begin(), owned.end()),
      source_(std::move(source)) {
  uint64_t slot_bytes = 0;
  for (const ExpertKey& key : owned_) {
    const ExpertLayout* layout = source_->layout(key);
    if (!layout) {
      fail_invalid(source_->describe() + ": holds no layer " + std::to_string(key.first) + " expert " +
                   std::to_string(key.second) + ", which worker '" + options.worker_name +
                   "' owns (convert with --worker " + options.worker_name + " or without --worker)");
    }
    slot_bytes = std::max(slot_bytes, align_up(layout->bytes, kRecordAlignment));
  }
  // The counts that place experts: the pin file's (pin: FILE), else the usage file's. With
  // pin: none they pin nothing in RAM but still place the VRAM tier's experts.
  UsageCounts counts;
  if (options.pin != PinMode::kNone || options.vram_bytes) {
    const auto& file = options.pin == PinMode::kFile ? options.pin_file : options.usage_file;
    std::string warning;
    if (!file.empty()) counts = read_usage_file(file, options.model_fingerprint, &warning);
    if (!warning.empty()) spdlog::warn("worker {}: {}", options.worker_name, warning);
  }
  UsageCounts ram_usage = options.pin == PinMode::kNone ? UsageCounts{} : counts;
  std::vector<ExpertKey> sorted(owned_.begin(), owned_.end());
  std::vector<ExpertKey> placed;  // in VRAM at start
  if (options.vram_bytes) {
    if (!options.vram_device) fail_internal("StoreOptions: vram_bytes without a device");
    placed = plan_vram(sorted, slot_bytes, *options.vram_bytes, counts, options.worker_name);
    for (const ExpertKey& key : placed) ram_usage.erase(key);  // RAM pins the hottest of the rest
  }
  // Both plans are checked before any expert is read or uploaded.
  std::map<uint32_t, LayerPlan> plan = plan_slots(sorted, slot_bytes, options.ram_bytes, ram_usage, options.worker_name);
  if (options.vram_bytes) {
    vram_ = std::make_unique<VramTier>(options.vram_device, *source_, placed, slot_bytes, counts, options.worker_name);
  }
  size_t pinned = 0, lru = 0;
  for (const auto& [layer, p] : plan) {
    pinned += p.pinned.size();
    lru += p.lru_slots;
  }
  spdlog::info("worker {}: {} experts from {}: {} pinned + {} LRU slots of {} bytes ({:.1f} MiB)", options.worker_name,
               owned_.size(), source_->describe(), pinned, lru, slot_bytes,
               static_cast<double>((pinned + lru) * slot_bytes) / (1 << 20));
  usage_ = std::make_unique<UsageLog>(options.usage_file, options.model_fingerprint);
  cache_ = std::make_unique<ExpertCache>(*source_, std::move(plan), options.io_threads, options.eviction,
                                         "worker " + options.worker_name + ": pinned experts");
}

ExpertStore::ExpertStore(const Checkpoint& checkpoint, const ExpertTensorNames& names,
                         const std::vector<ExpertKey>& owned, int64_t hidden_size, int64_t intermediate_size)
    : ExpertStore(std::make_unique<CheckpointSource>(
                      checkpoint, names, owned, hidden_size, intermediate_size,
                      hash_expert_identities(checkpoint, names, owned, hidden_size, intermediate_size)),
                  owned, hidden_size, intermediate_size, StoreOptions{}) {}

ExpertStore::~ExpertStore() = default;

LayerFetch ExpertStore::fetch(uint32_t layer, const std::vector<uint32_t>& experts) const {
  for (uint32_t e : experts) usage_->record({layer, e});
  LayerFetch out;
  if (!vram_) {
    out.ram = cache_->fetch(layer, experts);
    return out;
  }
  std::vector<uint32_t> rest;
  out.vram = vram_->lookup(layer, experts, rest);
  out.ram = cache_->fetch(layer, rest);
  return out;
}

std::map<uint32_t, TierCounters> ExpertStore::layer_stats() const {
  std::map<uint32_t, TierCounters> out = cache_->stats();
  if (vram_) {
    for (const auto& [layer, hits] : vram_->hits()) {
      out[layer].hits += hits;
      out[layer].vram_hits += hits;
    }
  }
  return out;
}

std::map<uint32_t, LayerResidency> ExpertStore::residency() const {
  std::map<uint32_t, LayerResidency> out = cache_->residency();
  if (vram_) {
    for (auto& [layer, experts] : vram_->resident()) out[layer].vram = std::move(experts);
  }
  return out;
}

size_t ExpertStore::prefetch(uint32_t layer, const std::vector<uint32_t>& experts) const {
  std::vector<uint32_t> mine;  // owned, and not served from VRAM
  for (uint32_t e : experts) {
    if (holds(layer, e) && !(vram_ && vram_->holds({layer, e}))) mine.push_back(e);
  }
  return cache_->prefetch(layer, mine);
}

std::map<uint32_t, std::vector<uint32_t>> ExpertStore::held() const {
  std::map<uint32_t, std::vector<uint32_t>> out;
  for (const auto& [layer, expert] : owned_) out[layer].push_back(expert);
  return out;
}

ExpertIdentities ExpertStore::identities() const {
  ExpertIdentities out;
  for (const ExpertKey& key : owned_) {
    if (auto identity = source_->identity(key)) out.emplace(key, *identity);
  }
  return out;
}

TierCounters ExpertStore::total_stats() const {
  TierCounters total;
  for (const auto& [layer, s] : layer_stats()) total += s;
  return total;
}

}  // namespace charm
