// `charm bench wire`: the round trip of one layer request over loopback TCP, the old
// copying path (owning LayerRequest / LayerResponse) beside the in-place one
// (common/wire_layer.h), at DeepSeek-V3's shape (hidden 7168, top-8 of 256 experts).
#pragma once

#include <CLI/CLI.hpp>

namespace charm {

/// Registers `wire` under the `bench` subcommand group; the benchmark runs in the
/// subcommand's callback, as `charm bench memory` does. Errors throw charm::Error.
void add_bench_wire(CLI::App& bench);

}  // namespace charm
