#include "worker/expert_executor.h"

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/kernels.h"

namespace charm {
namespace {

/// y [H] = down(silu(gate(x)) * up(x)) for one row; scratch [2 * I].
void swiglu_expert(const ExpertWeights& w, const float* x, int64_t hidden, int64_t inter, float* scratch,
                   float* y) {
  float* g = scratch;
  float* u = scratch + inter;
  linear_serial(x, 1, w.gate.data(), hidden, inter, g);
  linear_serial(x, 1, w.up.data(), hidden, inter, u);
  for (int64_t i = 0; i < inter; ++i) g[i] = silu(g[i]) * u[i];
  linear_serial(g, 1, w.down.data(), inter, hidden, y);
}

}  // namespace

ExpertStats ExpertExecutor::run_into(uint32_t layer, const float* hidden, uint32_t num_rows,
                                     const std::vector<ExpertAssignment>& assignments, float* outputs) const {
  const auto start = std::chrono::steady_clock::now();
  const int64_t h = store_.hidden_size();
  const int64_t inter = store_.intermediate_size();
  std::vector<const ExpertWeights*> weights(assignments.size());
  std::set<uint32_t> distinct;
  for (size_t i = 0; i < assignments.size(); ++i) {
    const auto& a = assignments[i];
    if (a.row >= num_rows) {
      fail_invalid("layer " + std::to_string(layer) + ": assignment row " + std::to_string(a.row) +
                   " out of range (rows: " + std::to_string(num_rows) + ")");
    }
    weights[i] = store_.find(layer, a.expert);
    if (!weights[i]) {
      fail_invalid("layer " + std::to_string(layer) + " expert " + std::to_string(a.expert) +
                   " is not held by this worker");
    }
    distinct.insert(a.expert);
  }
  // Each assignment is independent and computed by the same serial code, so the result
  // of one row never depends on the others or on the thread that ran it.
  // Threads only pay off past a few hundred thousand multiply-adds; below that, waking
  // them costs more than the work (measured: 28 tiny assignments, 0.35 ms serial).
  const bool parallel = assignments.size() > 1 && assignments.size() * 3 * h * inter > (1u << 18);
#pragma omp parallel if (parallel)
  {
    std::vector<float> scratch(2 * inter);
#pragma omp for schedule(dynamic)
    for (size_t i = 0; i < assignments.size(); ++i) {
      swiglu_expert(*weights[i], hidden + assignments[i].row * h, h, inter, scratch.data(), outputs + i * h);
    }
  }
  ExpertStats stats;
  stats.experts_computed = static_cast<uint32_t>(distinct.size());
  stats.rows_computed = static_cast<uint32_t>(assignments.size());
  stats.compute_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
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
