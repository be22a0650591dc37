#include "worker/experts/vram_tier.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "worker/experts/budget_text.h"

namespace charm {

std::vector<ExpertKey> plan_vram(const std::vector<ExpertKey>& owned, uint64_t slot_bytes, uint64_t vram_bytes,
                                 const UsageCounts& usage, const std::string& worker_name) {
  if (owned.empty()) return {};
  const uint64_t slots = slot_bytes ? vram_bytes / slot_bytes : owned.size();
  if (slots == 0) {
    fail_invalid("worker '" + worker_name + "': vram_gb " + gib_text(vram_bytes) + " (" + std::to_string(vram_bytes) +
                 " bytes) holds no expert of " + std::to_string(slot_bytes) + " bytes: set vram_gb to at least " +
                 gib_text(slot_bytes) + " (" + std::to_string(slot_bytes) + " bytes), or leave it out");
  }
  if (slots >= owned.size()) return owned;
  std::vector<std::pair<uint64_t, ExpertKey>> hot;  // (count, key)
  for (const ExpertKey& key : owned) {
    const auto it = usage.find(key);
    if (it != usage.end() && it->second > 0) hot.emplace_back(it->second, key);
  }
  std::sort(hot.begin(), hot.end(), [](auto& a, auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  std::set<ExpertKey> chosen;
  for (size_t i = 0; i < hot.size() && chosen.size() < slots; ++i) chosen.insert(hot[i].second);
  // The rest round-robin over layers: the i-th unchosen expert of every layer, for i = 0, 1, ...
  std::map<uint32_t, std::vector<uint32_t>> cold;
  for (const auto& [layer, expert] : owned) {
    if (!chosen.count({layer, expert})) cold[layer].push_back(expert);
  }
  for (size_t i = 0; chosen.size() < slots; ++i) {
    for (const auto& [layer, experts] : cold) {
      if (i < experts.size() && chosen.size() < slots) chosen.insert({layer, experts[i]});
    }
  }
  return {chosen.begin(), chosen.end()};
}

VramTier::VramTier(std::shared_ptr<ExpertDevice> device, const ExpertSource& source,
                   const std::vector<ExpertKey>& placed, uint64_t slot_bytes, const UsageCounts& usage,
                   const std::string& worker_name)
    : device_(std::move(device)), source_(source), slot_bytes_(slot_bytes), capacity_(placed.size()),
      worker_name_(worker_name), counts_(usage) {
  uint64_t need = 0, largest = 0;
  for (const ExpertKey& key : placed) {
    const ExpertLayout* layout = source.layout(key);
    if (!layout) fail_internal("VRAM tier: the source lacks a placed expert");
    need += layout->bytes;
    largest = std::max(largest, layout->bytes);
  }
  const uint64_t free = device_->free_bytes();
  const uint64_t reserve = slot_bytes + kHeadroomBytes;
  if (need > free || free - need < reserve) {
    const uint64_t fits = free > reserve ? free - reserve : 0;
    fail_unavailable("worker '" + worker_name + "': vram_gb places " + std::to_string(placed.size()) + " experts (" +
                     std::to_string(need) + " bytes) on the " + device_->describe() + ", which has " +
                     std::to_string(free) + " bytes free, and the tier keeps " + std::to_string(reserve) +
                     " of them free (one expert's slot for promotions, " + std::to_string(kHeadroomBytes >> 20) +
                     " MiB for the products' buffers): lower vram_gb to at most " + gib_text(fits));
  }
  AlignedBuffer staging(largest);
  for (const ExpertKey& key : placed) {
    const ExpertLayout& layout = *source.layout(key);
    source.read(key, staging.data());
    try {
      residents_.emplace(key, device_->upload(layout, staging.data()));
    } catch (const Error& e) {  // the device's refusal, with the setting that asked for it
      throw Error(e.category(), "worker '" + worker_name + "': vram_gb: layer " + std::to_string(key.first) +
                                    " expert " + std::to_string(key.second) + ": " + e.message());
    }
  }
  spdlog::info("worker {}: {} experts in VRAM on the {} ({:.1f} MiB)", worker_name, residents_.size(),
               device_->describe(), static_cast<double>(need) / (1 << 20));
  promoter_ = std::thread([this] { promote_loop(); });
}

VramTier::~VramTier() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  promoter_.join();
}

std::vector<VramLease> VramTier::lookup(uint32_t layer, const std::vector<uint32_t>& experts,
                                        std::vector<uint32_t>& rest) {
  std::vector<VramLease> out;
  std::lock_guard lock(mutex_);
  for (uint32_t e : experts) {
    ++counts_[{layer, e}];
    const auto it = residents_.find({layer, e});
    if (it == residents_.end()) {
      rest.push_back(e);
      consider({layer, e});
    } else {
      out.push_back({e, it->second});
    }
  }
  if (!out.empty()) hits_[layer] += out.size();
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.expert < b.expert; });
  return out;
}

std::map<ExpertKey, std::shared_ptr<const DeviceExpert>>::iterator VramTier::coldest() {
  auto best = residents_.end();
  uint64_t best_count = 0;
  for (auto it = residents_.begin(); it != residents_.end(); ++it) {
    const uint64_t c = counts_[it->first];
    if (best == residents_.end() || c <= best_count) {  // <=: the larger key wins ties
      best = it;
      best_count = c;
    }
  }
  return best;
}

void VramTier::consider(const ExpertKey& key) {
  const uint64_t count = counts_[key];
  if (promoting_ || promotion_failed_ || count % kOfferEvery != 0) return;
  if (residents_.size() >= capacity_) {
    const auto victim = coldest();
    if (victim == residents_.end() || count <= kPromoteFactor * counts_[victim->first] + kPromoteMargin) return;
  }
  queued_ = key;
  promoting_ = true;
  cv_.notify_all();
}

void VramTier::promote_loop() {
  AlignedBuffer staging(slot_bytes_);
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || queued_; });
    if (stopping_) return;
    const ExpertKey key = *queued_;
    queued_.reset();
    lock.unlock();  // the read and the upload run without the lock: requests go on
    std::unique_ptr<DeviceExpert> copy;
    try {
      const ExpertLayout* layout = source_.layout(key);
      if (!layout) fail_internal("VRAM tier: the source lacks a promoted expert");
      source_.read(key, staging.data());
      copy = device_->upload(*layout, staging.data());
    } catch (const std::exception& e) {
      spdlog::warn("worker {}: promoting layer {} expert {} to VRAM failed, it stays in RAM, and the VRAM tier "
                   "promotes no more experts: {}", worker_name_, key.first, key.second, e.what());
    }
    lock.lock();
    if (copy) {
      if (residents_.size() >= capacity_) residents_.erase(coldest());  // the coldest now
      residents_.emplace(key, std::move(copy));
      ++promotions_;
    } else {
      promotion_failed_ = true;
    }
    promoting_ = false;
    cv_.notify_all();
  }
}

void VramTier::wait_idle() const {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return !promoting_; });
}

bool VramTier::holds(const ExpertKey& key) const {
  std::lock_guard lock(mutex_);
  return residents_.count(key) > 0;
}

std::map<uint32_t, std::vector<uint32_t>> VramTier::resident() const {
  std::lock_guard lock(mutex_);
  std::map<uint32_t, std::vector<uint32_t>> out;
  for (const auto& [key, copy] : residents_) out[key.first].push_back(key.second);
  return out;
}

std::map<uint32_t, uint64_t> VramTier::hits() const {
  std::lock_guard lock(mutex_);
  return hits_;
}

size_t VramTier::size() const {
  std::lock_guard lock(mutex_);
  return residents_.size();
}

uint64_t VramTier::bytes() const {
  std::lock_guard lock(mutex_);
  uint64_t total = 0;
  for (const auto& [key, copy] : residents_) total += copy->bytes();
  return total;
}

uint64_t VramTier::promotions() const {
  std::lock_guard lock(mutex_);
  return promotions_;
}

}  // namespace charm
