// The VRAM tier of a worker (issue 19): experts copied to a device (the GPU,
// worker/experts/expert_device.h) and computed there, in front of the RAM tier
// (worker/experts/expert_cache.h). Lookup order: VRAM, pinned RAM, LRU, disk.
//
// At start the hottest experts of the usage file fill the budget (plan_vram); online, an
// expert served from RAM whose routing count has grown well past the coldest resident's
// takes its place (VramTier::lookup queues it; the tier's promotion thread reads it from
// the disk tier and uploads it, off the requests' path). Which tier computes an expert never changes a bit:
// the device follows common/matmul.h's contract.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/moe_types.h"
#include "worker/experts/expert_device.h"
#include "worker/experts/expert_source.h"
#include "worker/experts/usage_log.h"

namespace charm {

/// Which owned experts start in VRAM: slots = vram_bytes / slot_bytes (slot_bytes: the
/// largest owned blob). Every expert when they all fit; else the hottest of `usage`
/// (count > 0; ties by the smaller (layer, expert)), then the rest of the slots filled
/// round-robin over the layers in ascending expert id, so a tier without usage counts
/// still serves every layer. `owned` ascending. Throws Error(kInvalidInput) naming the
/// worker, the budget and the smallest useful one when it holds no slot.
std::vector<ExpertKey> plan_vram(const std::vector<ExpertKey>& owned, uint64_t slot_bytes, uint64_t vram_bytes,
                                 const UsageCounts& usage, const std::string& worker_name);

/// An expert in VRAM, kept on the device while a request computes it.
struct VramLease {
  uint32_t expert = 0;
  std::shared_ptr<const DeviceExpert> copy;
};

/// Experts in device memory. Thread-safety: every method from any thread.
class VramTier {
 public:
  /// An expert is offered for promotion on every kOfferEvery-th use ...
  static constexpr uint64_t kOfferEvery = 8;
  /// ... and replaces the coldest resident when its routing count exceeds
  /// kPromoteFactor times that one's plus kPromoteMargin (hysteresis: no swapping back and
  /// forth between experts of about equal heat).
  static constexpr uint64_t kPromoteFactor = 2;
  static constexpr uint64_t kPromoteMargin = 16;

  /// Device memory the tier leaves free beyond its experts: for the products' buffers
  /// (an x and a y of a request's rows per call) and the CUDA context's own needs.
  static constexpr uint64_t kHeadroomBytes = uint64_t{256} << 20;

  /// Reads each of `placed` (plan_vram's) from `source` (which must outlive the tier: the
  /// promotion thread reads from it too) and uploads it to `device`; the tier holds that
  /// many experts from then on. `usage` seeds the routing counts. Throws
  /// Error(kUnavailable) naming the worker and the most vram_gb that fits when the
  /// placed experts' bytes, one more `slot_bytes` (a promotion's copy is uploaded before
  /// the one it replaces goes) and kHeadroomBytes exceed the device's free memory; what
  /// the source and the device throw, the device's prefixed with the worker and expert.
  VramTier(std::shared_ptr<ExpertDevice> device, const ExpertSource& source, const std::vector<ExpertKey>& placed,
           uint64_t slot_bytes, const UsageCounts& usage, const std::string& worker_name);

  /// Joins the promotion thread (a promotion in flight finishes first).
  ~VramTier();
  VramTier(const VramTier&) = delete;
  VramTier& operator=(const VramTier&) = delete;

  /// Counts one routing use of each of `experts` (distinct, on `layer`) and splits them:
  /// the VRAM ones are returned (ascending), the others appended to `rest`.
  ///
  /// Online promotion: an expert of `rest` on its kOfferEvery-th use is queued for VRAM
  /// when a slot is free or when its count beats the coldest resident's (kPromoteFactor,
  /// kPromoteMargin), unless a promotion is in flight. The promotion thread reads it from
  /// the source, uploads it and then swaps it in; the coldest resident at that moment
  /// leaves VRAM (its memory is freed when the last request computing it ends). A failed
  /// read or upload is logged and ends promotion for the process (the expert stays in
  /// RAM; the device is probably full): promotion is an optimisation.
  std::vector<VramLease> lookup(uint32_t layer, const std::vector<uint32_t>& experts, std::vector<uint32_t>& rest);

  /// Blocks until no promotion is queued or in flight (tests; a status snapshot).
  void wait_idle() const;

  /// True when `key` is in VRAM now (a prefetch skips it).
  bool holds(const ExpertKey& key) const;
  /// Experts in VRAM now, per layer, ascending.
  std::map<uint32_t, std::vector<uint32_t>> resident() const;
  /// Requests' VRAM hits per layer since start.
  std::map<uint32_t, uint64_t> hits() const;
  size_t size() const;
  size_t capacity() const { return capacity_; }
  /// Device bytes the residents take.
  uint64_t bytes() const;
  /// Promotions since start.
  uint64_t promotions() const;
  const ExpertDevice& device() const { return *device_; }

 private:
  // REQUIRES: mutex_ held. The resident with the lowest count (ties: the larger key).
  std::map<ExpertKey, std::shared_ptr<const DeviceExpert>>::iterator coldest();
  // REQUIRES: mutex_ held. Queues `key` when the promotion rule says so.
  void consider(const ExpertKey& key);
  // The promotion thread: each queued expert read, uploaded and swapped in.
  void promote_loop();

  std::shared_ptr<ExpertDevice> device_;
  const ExpertSource& source_;
  uint64_t slot_bytes_;
  size_t capacity_;
  std::string worker_name_;
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;  // a key queued, a promotion done, or stopping
  std::map<ExpertKey, std::shared_ptr<const DeviceExpert>> residents_;
  std::map<ExpertKey, uint64_t> counts_;  // routing uses: the usage file's, then this run's
  std::map<uint32_t, uint64_t> hits_;
  std::optional<ExpertKey> queued_;
  bool promoting_ = false;  // queued or in flight
  bool promotion_failed_ = false;
  bool stopping_ = false;
  uint64_t promotions_ = 0;
  std::thread promoter_;  // last: started once everything above is set
};

}  // namespace charm
