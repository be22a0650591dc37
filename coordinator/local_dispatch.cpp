#include "coordinator/local_dispatch.h"

#include <string>

#include "common/error.h"

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
  executor_.run_into(p.layer, p.hidden, p.num_rows, *p.assignments, p.outputs);
  ++requests_;
}

std::vector<WorkerStatus> LocalDispatcher::status() const {
  WorkerStatus s;
  s.name = "local";
  s.address = "in-process";
  s.state = "in-process";
  s.experts_held = executor_.store().size();
  s.requests = requests_.load();
  return {s};
}

}  // namespace charm
