// `charm bench attention`: how fast prefill and decode causal attention run on this
// machine at the demo model's shapes (common/attention.h through causal_gqa_attention),
// beside the kernel it replaced.
#pragma once

#include <CLI/CLI.hpp>

namespace charm {

/// Adds the `attention` subcommand to `bench` (the `charm bench` group); it runs as
/// CLI11's callback when parsed.
void add_bench_attention(CLI::App& bench);

}  // namespace charm
