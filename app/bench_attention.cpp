#include "app/bench_attention.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "app/bench_timing.h"
#include "common/cpu_threads.h"
#include "common/error.h"
#include "common/kernels.h"
#include "common/matmul.h"
#include "coordinator/models/blocks.h"
#include "coordinator/models/kv_cache.h"

namespace charm {
namespace {

// Qwen2.5-0.5B (the demo model's attention): 14 query heads, 2 KV heads of 64, 24 layers.
constexpr size_t kHeads = 14;
constexpr size_t kKvHeads = 2;
constexpr size_t kHeadDim = 64;
constexpr size_t kLayers = 24;

struct AttentionArgs {
  std::optional<int> threads;
  double seconds = 1.0;
  std::vector<size_t> tokens = {512, 1024, 4096};
  bool before = true;
};

/// The kernel causal_gqa_attention had before common/attention.h, kept here only to be
/// measured against: per (row, head) a stored row of scores, softmax over it (a double
/// sum), then the weighted sum of the values.
void stored_scores_attention(const float* q, size_t rows, size_t pos0, const KvCache& cache, size_t layer,
                             float* out) {
  const size_t group = kHeads / kKvHeads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
#pragma omp parallel for collapse(2) schedule(static) if (rows * kHeads > 1)
  for (size_t r = 0; r < rows; ++r) {
    for (size_t h = 0; h < kHeads; ++h) {
      const size_t visible = pos0 + r + 1;
      const size_t kvh = h / group;
      const float* qh = q + (r * kHeads + h) * kHeadDim;
      std::vector<float> scores(visible);
      for (size_t t = 0; t < visible; ++t) scores[t] = dot(qh, cache.key(layer, t) + kvh * kHeadDim, kHeadDim) * scale;
      softmax(scores.data(), visible);
      float* oh = out + (r * kHeads + h) * kHeadDim;
      std::fill(oh, oh + kHeadDim, 0.0f);
      for (size_t t = 0; t < visible; ++t) {
        const float* vt = cache.value(layer, t) + kvh * kHeadDim;
        for (size_t d = 0; d < kHeadDim; ++d) oh[d] += scores[t] * vt[d];
      }
    }
  }
}

void bench_attention(const AttentionArgs& args) {
  if (!(args.seconds >= 0.01)) fail_invalid("--seconds must be a number >= 0.01");
  const int threads = configure_threads(args.threads);
  const KernelPath saved = active_kernel_path();
  std::printf(
      "charm bench attention: causal attention of one layer, %zu heads, %zu KV heads, head_dim %zu (Qwen2.5-0.5B); "
      "%d thread(s), %.1f s per number (median call)\n",
      kHeads, kKvHeads, kHeadDim, threads, args.seconds);
  std::printf("prefill: all N prompt rows in one call; decode: one row at position N-1; tok/s: N over %zu layers' "
              "prefill attention alone\n\n",
              kLayers);
  std::printf("%6s %-9s %-14s %14s %14s %16s\n", "N", "path", "kernel", "prefill ms", "decode ms", "prefill tok/s");
  std::vector<KernelPath> paths = {KernelPath::kPortable};
  if (cpu_supports_avx2()) paths.push_back(KernelPath::kAvx2);
  const size_t kv_dim = kKvHeads * kHeadDim;
  for (size_t n : args.tokens) {
    std::mt19937 rng(static_cast<unsigned>(n));
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    KvCache cache(1, n, kv_dim);
    std::vector<float> q(n * kHeads * kHeadDim), out(q.size());
    for (size_t t = 0; t < n; ++t) {
      for (size_t i = 0; i < kv_dim; ++i) {
        cache.key(0, t)[i] = uniform(rng);
        cache.value(0, t)[i] = uniform(rng);
      }
    }
    for (float& x : q) x = uniform(rng);
    cache.advance(n);
    const float* last_q = q.data() + (n - 1) * kHeads * kHeadDim;
    auto report = [&](const char* path, const char* kernel, double prefill, double decode) {
      std::printf("%6zu %-9s %-14s %14.2f %14.4f %16.1f\n", n, path, kernel, 1e3 * prefill, 1e3 * decode,
                  static_cast<double>(n) / (prefill * kLayers));
      std::fflush(stdout);
    };
    if (args.before) {
      const double prefill = median_call_seconds(
          args.seconds, [&](uint64_t) { stored_scores_attention(q.data(), n, 0, cache, 0, out.data()); }, 3);
      const double decode = median_call_seconds(
          args.seconds, [&](uint64_t) { stored_scores_attention(last_q, 1, n - 1, cache, 0, out.data()); });
      report("-", "stored scores", prefill, decode);
    }
    for (KernelPath path : paths) {
      set_kernel_path(path);
      const double prefill = median_call_seconds(args.seconds, [&](uint64_t) {
        causal_gqa_attention(q.data(), n, 0, cache, 0, kHeads, kKvHeads, kHeadDim, out.data());
      }, 3);
      const double decode = median_call_seconds(args.seconds, [&](uint64_t) {
        causal_gqa_attention(last_q, 1, n - 1, cache, 0, kHeads, kKvHeads, kHeadDim, out.data());
      });
      report(kernel_path_name(path), "online tiles", prefill, decode);
    }
  }
  set_kernel_path(saved);
}

}  // namespace

void add_bench_attention(CLI::App& bench) {
  auto args = std::make_shared<AttentionArgs>();
  CLI::App* cmd = bench.add_subcommand("attention", "Prefill and decode causal attention at the demo model's shapes");
  cmd->add_option("--threads", args->threads, "OpenMP threads (default: OMP_NUM_THREADS, else physical cores)")
      ->check(CLI::Range(1, kMaxThreads));
  cmd->add_option("--seconds", args->seconds, "Time per measurement")->check(CLI::Range(0.01, 3600.0));
  cmd->add_option("--tokens", args->tokens, "Prompt lengths N")->delimiter(',')->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("!--no-before", args->before, "Skip the replaced kernel (slow at long prompts)");
  cmd->callback([args] { bench_attention(*args); });
}

}  // namespace charm
