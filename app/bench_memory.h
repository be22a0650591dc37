// `charm bench memory`: a STREAM-like measurement of this machine's memory bandwidth.
#pragma once

#include <CLI/CLI.hpp>

namespace charm {

/// Registers `memory` under the `bench` subcommand group. The benchmark runs in the
/// subcommand's callback (during parsing): after parsing, a caller only checks `*bench`
/// and returns 0. Errors (bad sizes, allocation failure, wrong results) throw charm::Error.
void add_bench_memory(CLI::App& bench);

/// The best STREAM copy rate of this machine in GB/s (1e9 bytes/s, read + written bytes
/// as STREAM counts them) over `repeat` timed passes (plus one warm-up) of arrays of
/// `array_mib` MiB with the current OpenMP threads: the quick memory probe of `charm plan`.
/// Throws Error(kInvalidInput) when the arrays would take more than 80% of the available
/// memory, Error(kIo) when they cannot be allocated, Error(kInternal) for wrong results.
double stream_copy_gb_per_s(double array_mib, int repeat);

}  // namespace charm
