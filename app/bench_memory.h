// `charm bench memory`: a STREAM-like measurement of this machine's memory bandwidth.
#pragma once

#include <CLI/CLI.hpp>

namespace charm {

/// Registers `memory` under the `bench` subcommand group. The benchmark runs in the
/// subcommand's callback (during parsing): after parsing, a caller only checks `*bench`
/// and returns 0. Errors (bad sizes, allocation failure, wrong results) throw charm::Error.
void add_bench_memory(CLI::App& bench);

}  // namespace charm
