#include "coordinator/dispatch/routing_counts.h"

namespace charm {

RoutingCounts::RoutingCounts(const std::vector<uint32_t>& layers, uint32_t num_experts) : num_experts_(num_experts) {
  for (uint32_t layer : layers) counts_[layer].assign(num_experts, 0);
}

void RoutingCounts::add(uint32_t layer, const std::vector<ExpertAssignment>& assignments) {
  std::lock_guard lock(mutex_);
  std::vector<uint64_t>& row = counts_[layer];
  if (row.size() < num_experts_) row.resize(num_experts_, 0);
  for (const ExpertAssignment& a : assignments) {
    if (a.expert >= row.size()) row.resize(size_t{a.expert} + 1, 0);
    ++row[a.expert];
  }
}

std::map<uint32_t, std::vector<uint64_t>> RoutingCounts::snapshot() const {
  std::lock_guard lock(mutex_);
  return counts_;
}

}  // namespace charm
