// Single-node mode: the coordinator calls the in-process worker role directly, with no
// serialisation, through the same ExpertDispatcher interface the cluster path uses.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <optional>

#include "coordinator/dispatch/expert_dispatch.h"
#include "worker/experts/expert_executor.h"

namespace charm {

class Metrics;

class LocalDispatcher final : public ExpertDispatcher {
 public:
  /// Starts loading `experts` of `layer` without waiting (the store's prefetch).
  using PrefetchFn = std::function<void(uint32_t layer, const std::vector<uint32_t>& experts)>;

  /// `executor` must outlive the dispatcher. `prefetch` receives hint_layer's hints (none
  /// given: hints are dropped). `metrics` (may be null; must outlive the dispatcher) gets
  /// the in-process store's tier counts of every layer as worker "local".
  explicit LocalDispatcher(const ExpertExecutor& executor, PrefetchFn prefetch = nullptr, Metrics* metrics = nullptr)
      : executor_(executor), prefetch_(std::move(prefetch)), metrics_(metrics) {}

  /// Records the layer (behind any unfinished one); the experts run in finish_layer, on the same cores a shared
  /// expert would use, so deferring loses nothing.
  void begin_layer(uint32_t layer, const float* hidden, uint32_t num_rows, uint32_t hidden_size,
                   const std::vector<ExpertAssignment>& assignments, int64_t* sums) override;
  void finish_layer() override;
  void drop_unfinished() override;
  /// Keeps the hint for the next begin_layer: when that layer runs (finish_layer), the hint
  /// goes to `prefetch` right after the layer's own reads are queued, as a worker starts a
  /// hint carried by a request. A hint already kept (no begin_layer came between) goes to
  /// `prefetch` at once.
  void hint_layer(uint32_t layer, const std::vector<uint32_t>& experts) override;
  std::vector<WorkerStatus> status() const override;

 private:
  struct Pending {
    uint32_t layer = 0;
    const float* hidden = nullptr;
    uint32_t num_rows = 0;
    uint32_t hidden_size = 0;
    const std::vector<ExpertAssignment>* assignments = nullptr;
    int64_t* sums = nullptr;
    std::optional<PrefetchHintMsg> prefetch;  // the hint given just before it
  };

  const ExpertExecutor& executor_;
  PrefetchFn prefetch_;
  Metrics* metrics_;
  std::deque<Pending> pending_;  // begun, oldest first (at most kMaxLayersInFlight)
  std::optional<PrefetchHintMsg> staged_;  // hint_layer's, for the next begin_layer
  std::atomic<uint64_t> requests_{0};
};

}  // namespace charm
