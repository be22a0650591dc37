#include "coordinator/dispatch/routing_observer.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace charm {
namespace {

/// The distinct experts of `assignments`, ascending (the layer's batch-union).
std::vector<uint32_t> batch_union(const std::vector<ExpertAssignment>& assignments) {
  std::vector<uint32_t> out;
  out.reserve(assignments.size());
  for (const auto& a : assignments) out.push_back(a.expert);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

uint64_t count_common(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  uint64_t n = 0;
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    if (a[i] < b[j]) {
      ++i;
    } else if (b[j] < a[i]) {
      ++j;
    } else {
      ++n, ++i, ++j;
    }
  }
  return n;
}

RoutingObserver::RoutingObserver(std::unique_ptr<ExpertDispatcher> inner, RoutingObserverOptions options,
                                 const std::vector<uint32_t>& moe_layers, uint32_t num_experts)
    : inner_(std::move(inner)), options_(std::move(options)), counts_(moe_layers, num_experts) {
  if (!options_.trace_path.empty()) {
    trace_.open(options_.trace_path, std::ios::out | std::ios::trunc);
    if (!trace_) fail_io("cannot create routing trace file " + options_.trace_path);
  }
}

bool RoutingObserver::wants_hints() const { return options_.prefetch || trace_.is_open(); }

void RoutingObserver::begin_layer(uint32_t layer, const float* hidden, uint32_t num_rows, uint32_t hidden_size,
                                  const std::vector<ExpertAssignment>& assignments, int64_t* sums) {
  const std::vector<uint32_t> used = batch_union(assignments);
  std::optional<std::vector<uint32_t>> predicted;
  if (auto it = hints_.find(layer); it != hints_.end()) {
    // Oldest first: with two micro-batches, each half's hint is for its own next layer.
    predicted = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) hints_.erase(it);
  }
  record(layer, num_rows, assignments, used, predicted);
  counts_.add(layer, assignments);
  inner_->begin_layer(layer, hidden, num_rows, hidden_size, assignments, sums);
}

void RoutingObserver::finish_layer() { inner_->finish_layer(); }

void RoutingObserver::drop_unfinished() { inner_->drop_unfinished(); }

void RoutingObserver::hint_layer(uint32_t layer, const std::vector<uint32_t>& experts) {
  std::deque<std::vector<uint32_t>>& queue = hints_[layer];
  queue.push_back(experts);
  if (queue.size() > kMaxLayersInFlight) queue.pop_front();  // a hint no begin_layer took
  if (options_.prefetch) inner_->hint_layer(layer, experts);
}

void RoutingObserver::record(uint32_t layer, uint32_t num_rows, const std::vector<ExpertAssignment>& assignments,
                             const std::vector<uint32_t>& used,
                             const std::optional<std::vector<uint32_t>>& predicted) {
  if (static_cast<int64_t>(layer) <= last_layer_ || step_ < 0) ++step_;
  last_layer_ = layer;
  if (predicted) {
    PrefetchLayerStats& s = stats_[layer];
    s.steps += 1;
    s.actual += used.size();
    s.predicted += predicted->size();
    s.correct += count_common(*predicted, used);
  }
  if (!trace_.is_open()) return;
  // Rows in order, each row's experts in assignment (rank) order.
  std::vector<std::vector<uint32_t>> rows(num_rows);
  for (const auto& a : assignments) rows.at(a.row).push_back(a.expert);
  nlohmann::json line = {{"step", step_}, {"layer", layer}, {"rows", num_rows}, {"experts", rows}};
  if (predicted) line["predicted"] = *predicted;
  trace_ << line.dump() << '\n';
  if (!trace_) fail_io("cannot write routing trace file " + options_.trace_path);
}

PrefetchLayerStats RoutingObserver::prefetch_total() const {
  PrefetchLayerStats t;
  for (const auto& [layer, s] : stats_) {
    t.steps += s.steps;
    t.actual += s.actual;
    t.predicted += s.predicted;
    t.correct += s.correct;
  }
  return t;
}

}  // namespace charm
