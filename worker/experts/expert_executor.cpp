#include "worker/experts/expert_executor.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/fixed_point.h"
#include "common/reused_buffer.h"
#include "worker/experts/swiglu_batch.h"

namespace charm {

LayerStats ExpertExecutor::run_into(uint32_t layer, const float* hidden, uint32_t num_rows,
                                     const std::vector<ExpertAssignment>& assignments, int64_t* sums,
                                     const std::function<void()>& after_fetch) const {
  const auto start = std::chrono::steady_clock::now();
  const int64_t h = store_.hidden_size();
  const int64_t inter = store_.intermediate_size();
  std::map<uint32_t, std::vector<size_t>> rows_of;  // expert -> assignment indices
  std::vector<uint32_t> terms(num_rows, 0);         // row -> assignments (the sums' headroom)
  for (size_t i = 0; i < assignments.size(); ++i) {
    const auto& a = assignments[i];
    if (a.row >= num_rows) {
      fail_invalid("layer " + std::to_string(layer) + ": assignment row " + std::to_string(a.row) +
                   " out of range (rows: " + std::to_string(num_rows) + ")");
    }
    if (++terms[a.row] > kMaxTermsPerRow) {
      fail_invalid("layer " + std::to_string(layer) + ": row " + std::to_string(a.row) + " has more than " +
                   std::to_string(kMaxTermsPerRow) + " assignments (the fixed-point sum's headroom)");
    }
    if (!store_.holds(layer, a.expert)) {
      fail_invalid("layer " + std::to_string(layer) + " expert " + std::to_string(a.expert) +
                   " is not held by this worker");
    }
    rows_of[a.expert].push_back(i);
  }
  std::vector<uint32_t> distinct;
  for (const auto& [expert, rows] : rows_of) distinct.push_back(expert);
  // The rows of `expert`'s assignments copied into x, in order; returns their count.
  auto gather = [&](uint32_t expert, float* x) {
    const std::vector<size_t>& rows = rows_of[expert];
    for (size_t k = 0; k < rows.size(); ++k) std::copy_n(hidden + assignments[rows[k]].row * h, h, x + k * h);
    return rows.size();
  };
  // Each of `expert`'s outputs y (as gathered), weighted, into its row's fixed-point sum;
  // integer sums make the order (device or CPU, experts by tier, then by id) irrelevant
  // to the bits. Returns the rows consumed.
  uint64_t saturated = 0;
  auto add_terms = [&](uint32_t expert, const float* y) {
    const std::vector<size_t>& rows = rows_of[expert];
    for (size_t k = 0; k < rows.size(); ++k) {
      const ExpertAssignment& a = assignments[rows[k]];
      add_weighted_term(y + k * h, a.weight, static_cast<size_t>(h), sums + size_t{a.row} * h, saturated);
    }
    return rows.size();
  };
  LayerFetch fetch = store_.fetch(layer, distinct);
  if (after_fetch) after_fetch();
  // The VRAM tier's experts compute on the device, on a thread of their own, while this
  // one computes the rest; their terms are added once both are done.
  std::vector<float> device_x, device_y;
  std::future<void> on_device;
  if (!fetch.vram.empty()) {
    size_t total = 0;
    for (const VramLease& lease : fetch.vram) total += rows_of[lease.expert].size();
    device_x.resize(total * h);
    device_y.resize(total * h);
    std::vector<DeviceJob> device_jobs;
    size_t at = 0;  // first gathered row of the current expert
    for (const VramLease& lease : fetch.vram) {
      const size_t n = gather(lease.expert, device_x.data() + at * h);
      device_jobs.push_back({lease.copy.get(), at, n});
      at += n;
    }
    // The thread reads only its jobs (whose copies fetch.vram keeps) and these buffers.
    on_device = std::async(std::launch::async, [this, jobs = std::move(device_jobs), &device_x, &device_y, total] {
      store_.vram()->device().swiglu_batch(jobs, device_x.data(), total, device_y.data(), store_.activation());
    });
  }
  // Resident experts come first, missing ones as their reads land. Each expert's rows
  // are gathered into one block and computed as GEMMs (worker/experts/swiglu_batch.h), whose
  // bits for a row never depend on the other rows, the batch or the thread count.
  std::vector<ExpertLease> batch;
  // Gathered rows in, their outputs, expert by expert: this thread's, kept between layers
  // (common/reused_buffer.h: a 512-token prefill at top-8 and hidden 2048 makes each
  // 32 MiB, fresh pages on every layer when allocated per call).
  thread_local ReusedBuffer<float> x_buffer, y_buffer;
  std::vector<SwigluJob> jobs;
  for (;;) {
    batch.clear();  // give the slots back before asking for more (a layer may have one)
    batch = fetch.ram->next();
    if (batch.empty()) break;
    size_t total = 0;
    for (const ExpertLease& lease : batch) total += rows_of[lease.expert()].size();
    float* const x = x_buffer.get(total * h);
    float* const y = y_buffer.get(total * h);
    jobs.clear();
    size_t at = 0;  // first gathered row of the current expert
    for (const ExpertLease& lease : batch) {
      const size_t n = gather(lease.expert(), x + at * h);
      jobs.push_back(SwigluJob{&lease.view(), x + at * h, n, y + at * h});
      at += n;
    }
    swiglu_batch(jobs, h, inter, store_.activation());
    at = 0;
    for (const ExpertLease& lease : batch) {
      at += add_terms(lease.expert(), y + at * h);
    }
  }
  if (on_device.valid()) {
    on_device.get();  // rethrows the device's error
    size_t at = 0;
    for (const VramLease& lease : fetch.vram) at += add_terms(lease.expert, device_y.data() + at * h);
  }
  const TierCounters& tier = fetch.ram->stats();
  LayerStats stats;
  static_cast<TierCounters&>(stats) = tier;
  stats.hits += fetch.vram.size();
  stats.vram_hits = fetch.vram.size();
  stats.experts_computed = static_cast<uint32_t>(distinct.size());
  stats.rows_computed = static_cast<uint32_t>(assignments.size());
  stats.saturated = saturated;
  // compute_ns is the request's time minus what it spent waiting for the disk.
  const auto elapsed = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  stats.compute_ns = elapsed > tier.io_wait_ns ? elapsed - tier.io_wait_ns : 0;
  return stats;
}

LayerResponse ExpertExecutor::run(const LayerRequest& request) const {
  if (request.hidden_size != store_.hidden_size()) {
    fail_invalid("layer " + std::to_string(request.layer) + ": hidden_size " + std::to_string(request.hidden_size) +
                 " does not match the model's " + std::to_string(store_.hidden_size()));
  }
  if (request.hidden.size() != static_cast<size_t>(request.num_rows) * request.hidden_size) {
    fail_invalid("layer " + std::to_string(request.layer) + ": hidden holds " + std::to_string(request.hidden.size()) +
                 " floats, expected num_rows * hidden_size = " +
                 std::to_string(static_cast<size_t>(request.num_rows) * request.hidden_size));
  }
  LayerResponse response;
  response.request_id = request.request_id;
  response.outputs.assign(size_t{request.num_rows} * request.hidden_size, 0);
  std::function<void()> prefetch;
  if (request.prefetch) prefetch = [&] { start_prefetch(*request.prefetch); };
  response.stats = run_into(request.layer, request.hidden.data(), request.num_rows, request.assignments,
                            response.outputs.data(), prefetch);
  return response;
}

void ExpertExecutor::start_prefetch(const PrefetchHintMsg& hint) const noexcept {
  try {
    store_.prefetch(hint.layer, hint.experts);
  } catch (const std::exception& e) {
    spdlog::debug("experts: prefetch of layer {} dropped: {}", hint.layer, e.what());
  }
}

}  // namespace charm
