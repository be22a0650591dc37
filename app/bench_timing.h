// Timing for the `charm bench` subcommands.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace charm {

/// Calls `step(i)` for i = 0, 1, ... until `seconds` have passed (after one warm-up
/// call, and at least `min_calls` calls); returns the median seconds per call. The
/// median, not the mean: on a shared machine some calls lose their core to other processes.
template <typename Step>
double median_call_seconds(double seconds, Step step, size_t min_calls = 5) {
  step(0);
  std::vector<double> calls;
  double total = 0;
  for (uint64_t i = 1; total < seconds || calls.size() < min_calls; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step(i);
    calls.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    total += calls.back();
  }
  std::nth_element(calls.begin(), calls.begin() + static_cast<long>(calls.size() / 2), calls.end());
  return calls[calls.size() / 2];
}

}  // namespace charm
