#include "worker/expert_executor.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/kernels.h"
#include "common/weight_format.h"

namespace charm {
namespace {

/// y [H] = down(silu(gate(x)) * up(x)) for one row; scratch [2 * I + max(H, I)].
void swiglu_expert(const ExpertView& w, const float* x, int64_t hidden, int64_t inter, float* scratch, float* y) {
  float* g = scratch;
  float* u = scratch + inter;
  float* row = scratch + 2 * inter;
  matvec_stored(w.gate, x, g, row);
  matvec_stored(w.up, x, u, row);
  for (int64_t i = 0; i < inter; ++i) g[i] = silu(g[i]) * u[i];
  matvec_stored(w.down, g, y, row);
}

}  // namespace

ExpertStats ExpertExecutor::run_into(uint32_t layer, const float* hidden, uint32_t num_rows,
                                     const std::vector<ExpertAssignment>& assignments, float* outputs) const {
  const auto start = std::chrono::steady_clock::now();
  const int64_t h = store_.hidden_size();
  const int64_t inter = store_.intermediate_size();
  std::map<uint32_t, std::vector<size_t>> rows_of;  // expert -> assignment indices
  for (size_t i = 0; i < assignments.size(); ++i) {
    const auto& a = assignments[i];
    if (a.row >= num_rows) {
      fail_invalid("layer " + std::to_string(layer) + ": assignment row " + std::to_string(a.row) +
                   " out of range (rows: " + std::to_string(num_rows) + ")");
    }
    if (!store_.holds(layer, a.expert)) {
      fail_invalid("layer " + std::to_string(layer) + " expert " + std::to_string(a.expert) +
                   " is not held by this worker");
    }
    rows_of[a.expert].push_back(i);
  }
  std::vector<uint32_t> distinct;
  for (const auto& [expert, rows] : rows_of) distinct.push_back(expert);
  std::unique_ptr<ExpertFetch> fetch = store_.fetch(layer, distinct);
  // Resident experts come first, missing ones as their reads land. Each assignment is
  // independent and computed by the same serial code, so the result of one row never
  // depends on the batch it was in or on the thread that ran it.
  std::vector<ExpertLease> batch;
  for (;;) {
    batch.clear();  // give the slots back before asking for more (a layer may have one)
    batch = fetch->next();
    if (batch.empty()) break;
    std::vector<std::pair<size_t, const ExpertView*>> work;  // (assignment, weights)
    for (const ExpertLease& lease : batch) {
      for (size_t i : rows_of[lease.expert()]) work.emplace_back(i, &lease.view());
    }
    // Threads only pay off past a few hundred thousand multiply-adds; below that, waking
    // them costs more than the work (measured: 28 tiny assignments, 0.35 ms serial).
    const bool parallel = work.size() > 1 && work.size() * 3 * h * inter > (1u << 18);
#pragma omp parallel if (parallel)
    {
      std::vector<float> scratch(2 * inter + std::max(h, inter));
#pragma omp for schedule(dynamic)
      for (size_t j = 0; j < work.size(); ++j) {
        const size_t i = work[j].first;
        swiglu_expert(*work[j].second, hidden + assignments[i].row * h, h, inter, scratch.data(), outputs + i * h);
      }
    }
  }
  const TierStats& tier = fetch->stats();
  ExpertStats stats;
  stats.experts_computed = static_cast<uint32_t>(distinct.size());
  stats.rows_computed = static_cast<uint32_t>(assignments.size());
  stats.hits = static_cast<uint32_t>(tier.hits);
  stats.misses = static_cast<uint32_t>(tier.misses);
  stats.bytes_read = tier.bytes_read;
  stats.io_wait_ns = tier.io_wait_ns;
  stats.disk_ns = tier.disk_ns;
  stats.prefetch_hits = static_cast<uint32_t>(tier.prefetch_hits);
  // compute_ns is the request's time minus what it spent waiting for the disk.
  const auto elapsed = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  stats.compute_ns = elapsed > tier.io_wait_ns ? elapsed - tier.io_wait_ns : 0;
  return stats;
}

ExpertResponse ExpertExecutor::run(const ExpertRequest& request) const {
  if (request.hidden_size != store_.hidden_size()) {
    fail_invalid("layer " + std::to_string(request.layer) + ": hidden_size " + std::to_string(request.hidden_size) +
                 " does not match the model's " + std::to_string(store_.hidden_size()));
  }
  if (request.hidden.size() != static_cast<size_t>(request.num_rows) * request.hidden_size) {
    fail_invalid("layer " + std::to_string(request.layer) + ": hidden holds " + std::to_string(request.hidden.size()) +
                 " floats, expected num_rows * hidden_size = " +
                 std::to_string(static_cast<size_t>(request.num_rows) * request.hidden_size));
  }
  ExpertResponse response;
  response.request_id = request.request_id;
  response.outputs.resize(request.assignments.size() * request.hidden_size);
  response.stats = run_into(request.layer, request.hidden.data(), request.num_rows, request.assignments,
                            response.outputs.data());
  return response;
}

}  // namespace charm
