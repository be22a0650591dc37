#include "coordinator/local_dispatch.h"

#include <string>

#include "common/error.h"
#include "coordinator/metrics.h"

namespace charm {

void LocalDispatcher::begin_layer(uint32_t layer, const float* hidden, uint32_t num_rows, uint32_t hidden_size,
                                  const std::vector<ExpertAssignment>& assignments, float* outputs) {
  if (hidden_size != executor_.store().hidden_size()) {
    fail_internal("hidden_size " + std::to_string(hidden_size) + " does not match the expert store's");
  }
  pending_ = Pending{layer, hidden, num_rows, &assignments, outputs};
}

void LocalDispatcher::finish_layer() {
  if (!pending_) fail_internal("finish_layer without begin_layer");
  const Pending p = *pending_;
  pending_.reset();
  const ExpertStats stats = executor_.run_into(p.layer, p.hidden, p.num_rows, *p.assignments, p.outputs);
  ++requests_;
  if (metrics_) metrics_->expert_stats("local", stats.hits, stats.misses, stats.bytes_read);
}

std::vector<WorkerStatus> LocalDispatcher::status() const {
  WorkerStatus s;
  s.name = "local";
  s.address = "in-process";
  s.state = "in-process";
  s.experts_held = executor_.store().size();
  s.requests = requests_.load();
  s.experts_by_tier = split_by_tier(s.experts_held, executor_.store().cache().slot_count());
  return {s};
}

}  // namespace charm
