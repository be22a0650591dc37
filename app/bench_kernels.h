// `charm bench kernels`: how fast common/matmul.h runs on this machine, per stored form
// and kernel path (GEMV weight bandwidth, GEMM GFLOP/s), and the worker's decode and
// prefill batch-union (worker/experts/swiglu_batch.h).
#pragma once

#include <CLI/CLI.hpp>

namespace charm {

/// Adds the `kernels` subcommand to `bench` (the `charm bench` group); it runs as
/// CLI11's callback when parsed.
void add_bench_kernels(CLI::App& bench);

}  // namespace charm
