// Single-node mode: the coordinator calls the in-process worker role directly, with no
// serialisation, through the same ExpertDispatcher interface the cluster path uses.
#pragma once

#include <atomic>

#include "coordinator/expert_dispatch.h"
#include "worker/expert_executor.h"

namespace charm {

class LocalDispatcher final : public ExpertDispatcher {
 public:
  /// `executor` must outlive the dispatcher.
  explicit LocalDispatcher(const ExpertExecutor& executor) : executor_(executor) {}

  void run_layer(uint32_t layer, const float* hidden, uint32_t num_rows, uint32_t hidden_size,
                 const std::vector<ExpertAssignment>& assignments, float* outputs) override;
  std::vector<WorkerStatus> status() const override;

 private:
  const ExpertExecutor& executor_;
  std::atomic<uint64_t> requests_{0};
};

}  // namespace charm
