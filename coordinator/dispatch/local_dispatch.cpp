#include "coordinator/dispatch/local_dispatch.h"

#include <algorithm>
#include <string>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/fixed_point.h"
#include "coordinator/api/metrics.h"

namespace charm {
namespace {

// A hint is advice: a store that cannot take it must not fail the generation.
void issue_hint(const LocalDispatcher::PrefetchFn& prefetch, const PrefetchHintMsg& hint) noexcept {
  try {
    prefetch(hint.layer, hint.experts);
  } catch (const std::exception& e) {
    spdlog::debug("local experts: prefetch hint for layer {} dropped: {}", hint.layer, e.what());
  }
}

}  // namespace

void LocalDispatcher::begin_layer(uint32_t layer, const float* hidden, uint32_t num_rows, uint32_t hidden_size,
                                  const std::vector<ExpertAssignment>& assignments, int64_t* sums) {
  if (hidden_size != executor_.store().hidden_size()) {
    fail_internal("hidden_size " + std::to_string(hidden_size) + " does not match the expert store's");
  }
  if (pending_.size() >= kMaxLayersInFlight) drop_unfinished();
  pending_.push_back(Pending{layer, hidden, num_rows, hidden_size, &assignments, sums, std::move(staged_)});
  staged_.reset();
}

void LocalDispatcher::drop_unfinished() {
  pending_.clear();  // the hints kept with an abandoned layer go with it
  staged_.reset();
}

void LocalDispatcher::finish_layer() {
  if (pending_.empty()) fail_internal("finish_layer without begin_layer");
  const Pending p = std::move(pending_.front());
  pending_.pop_front();
  std::fill_n(p.sums, size_t{p.num_rows} * p.hidden_size, int64_t{0});
  std::function<void()> prefetch;
  if (p.prefetch) prefetch = [&] { issue_hint(prefetch_, *p.prefetch); };
  const LayerStats stats = executor_.run_into(p.layer, p.hidden, p.num_rows, *p.assignments, p.sums, prefetch);
  ++requests_;
  warn_saturated_once(stats.saturated, "layer " + std::to_string(p.layer));
  if (metrics_) metrics_->expert_stats("local", stats.hits, stats.misses, stats.bytes_read);
}

void LocalDispatcher::hint_layer(uint32_t layer, const std::vector<uint32_t>& experts) {
  if (!prefetch_) return;
  if (staged_) issue_hint(prefetch_, *staged_);
  staged_ = PrefetchHintMsg{layer, experts};
}

std::vector<WorkerStatus> LocalDispatcher::status() const {
  WorkerStatus s;
  s.name = "local";
  s.address = "in-process";
  s.state = WorkerState::kInProcess;
  s.experts_held = executor_.store().size();
  s.requests = requests_.load();
  s.tier_layers = executor_.store().layer_stats();
  s.residency = executor_.store().residency();
  s.experts_by_tier =
      split_by_tier(s.experts_held, executor_.store().cache().slot_count(), vram_experts_of(s.residency));
  s.residency_age_ms = 0;
  return {s};
}

}  // namespace charm
