#include "app/bench_kernels.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "app/bench_timing.h"
#include "common/cpu_threads.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/ggml_type.h"
#include "common/kernels.h"
#include "common/matmul.h"
#include "common/matmul_q8.h"
#include "worker/experts/swiglu_batch.h"

namespace charm {
namespace {

// An OLMoE-1B-7B expert: gate and up [1024, 2048], down [2048, 1024].
constexpr int64_t kHidden = 2048;
constexpr int64_t kInter = 1024;
// Distinct weight bytes a GEMV walks through, far beyond any L3, so it measures RAM.
constexpr uint64_t kStreamBytes = uint64_t{256} << 20;

struct BenchArgs {
  std::optional<int> threads;
  double seconds = 1.0;
  std::string part = "all";  ///< all, matmul, ggml or batch-union
  double copy_gbps = 0;      ///< `charm bench memory`'s copy rate: the GGML table's 100 %
  std::string activations = "f32";  ///< the GGML table's activation mode (common/matmul_q8.h)
  std::string q8_form = "auto";      ///< the q8 kernels' form (common/matmul_q8.h Q8Form), or auto
};

struct FormSpec {
  const char* label;
  WeightFormat format;
  int64_t group;
};

/// `count` distinct copies (own memory each) of one [rows, cols] matrix in `form`.
std::vector<StoredMatrix> make_matrices(const FormSpec& form, int64_t rows, int64_t cols, size_t count) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-0.05f, 0.05f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (float& v : values) v = uniform(rng);
  StoredMatrix base;
  base.shape = MatrixShape{form.format, rows, cols, form.group};
  base.data.resize(base.shape.data_bytes());
  if (is_quantized(form.format)) {
    base.scales.resize(base.shape.scale_bytes() / 4);
    quantize_matrix(values.data(), base.shape, base.data.data(), base.scales.data());
  } else if (form.format == WeightFormat::kBF16) {
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t bits = f32_to_bf16(values[i]);
      std::memcpy(base.data.data() + 2 * i, &bits, 2);
    }
  } else {
    std::memcpy(base.data.data(), values.data(), base.data.size());
  }
  return std::vector<StoredMatrix>(count, base);
}

uint64_t stored_bytes(const StoredMatrix& m) { return m.shape.data_bytes() + m.shape.scale_bytes(); }

/// `count` distinct copies of one [rows, cols] matrix of GGML `type` blocks: random
/// quants, every scale about 1e-3 (MXFP4: 2^-8), so that the sums stay normal floats.
std::vector<StoredMatrix> make_ggml_matrices(GgmlType type, int64_t rows, int64_t cols, size_t count) {
  std::mt19937 rng(1);
  StoredMatrix base;
  base.shape = MatrixShape{WeightFormat::kGgml, rows, cols, 0};
  base.shape.ggml_type = type;
  base.data.resize(base.shape.data_bytes());
  for (uint8_t& b : base.data) b = static_cast<uint8_t>(rng());
  const GgmlTypeTraits t = ggml_traits(type);
  constexpr uint16_t kScale = 0x1419;  // f16 1.0e-3
  for (size_t at = 0; at < base.data.size(); at += static_cast<size_t>(t.block_bytes)) {
    if (type == GgmlType::kMXFP4) base.data[at] = 120;  // its e8m0 scale byte (2^-8 above)
    for (int off : ggml_f16_scale_offsets(type)) std::memcpy(base.data.data() + at + off, &kScale, 2);
  }
  return std::vector<StoredMatrix>(count, base);
}

/// GEMV GB/s of weight bytes, streaming distinct matrices from RAM.
double gemv_gbps(const std::vector<StoredMatrix>& ms, double seconds) {
  std::vector<float> x(static_cast<size_t>(ms[0].shape.cols), 0.01f), y(static_cast<size_t>(ms[0].shape.rows));
  const double secs =
      median_call_seconds(seconds, [&](uint64_t i) { matmul(ms[i % ms.size()].view(), x.data(), 1, nullptr, y.data()); });
  return static_cast<double>(stored_bytes(ms[0])) / secs / 1e9;
}

/// GEMM GFLOP/s (2 flops per multiply-add) for `rows` rows of x.
double gemm_gflops(const std::vector<StoredMatrix>& ms, size_t rows, double seconds) {
  std::vector<float> x(rows * kHidden, 0.01f), y(rows * kInter);
  const double secs = median_call_seconds(
      seconds, [&](uint64_t i) { matmul(ms[i % ms.size()].view(), x.data(), rows, nullptr, y.data()); });
  return 2.0 * static_cast<double>(rows) * kInter * kHidden / secs / 1e9;
}

std::vector<KernelPath> available_paths() {
  if (cpu_supports_avx2()) return {KernelPath::kPortable, KernelPath::kAvx2};
  std::printf("(this CPU lacks avx2/fma/f16c: only the portable path is measured)\n");
  return {KernelPath::kPortable};
}

/// GEMV of GGML block matrices (the decode case of a GGUF model): GB/s of block bytes
/// from RAM (distinct matrices, kStreamBytes in all) and from cache (one [kCacheRows x
/// kHidden] matrix), and each as a share of `copy_gbps` when given.
void bench_ggml(double seconds, double copy_gbps, ActivationMode activations) {
  // 0.1-0.6 MB: in L2 / L3, and large enough (16 tiles) that waking a second thread does
  // not dominate the call.
  constexpr int64_t kCacheRows = 256;
  const GgmlType types[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kMXFP4, GgmlType::kQ4_K,
                            GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ2_K, GgmlType::kQ3_K};
  std::printf("\nGGML block GEMV, W [%lld x %lld]: from RAM (%llu MiB of distinct matrices), "
              "from cache ([%lld x %lld])",
              static_cast<long long>(kInter), static_cast<long long>(kHidden),
              static_cast<unsigned long long>(kStreamBytes >> 20), static_cast<long long>(kCacheRows),
              static_cast<long long>(kHidden));
  if (copy_gbps > 0) std::printf("; %% of copy %.2f GB/s", copy_gbps);
  std::printf("; activations %s", activation_mode_name(activations));
  if (activations == ActivationMode::kQ8) std::printf(" (lossy; types without q8 kernels stay exact)");
  if (activations == ActivationMode::kQ8) std::printf(", form %s", q8_form_name(active_q8_form()));
  const ActivationMode saved = active_activation_mode();
  set_activation_mode(activations);
  std::printf("\n%-6s %-9s %12s %8s %14s %8s %16s\n", "type", "path", "RAM GB/s", "% copy", "cache GB/s", "% copy",
              "GEMM r=16 GF/s");
  auto share = [&](double gbps) {  // "-" without --copy-gbps
    char text[16] = "-";
    if (copy_gbps > 0) std::snprintf(text, sizeof text, "%.0f", 100.0 * gbps / copy_gbps);
    return std::string(text);
  };
  for (GgmlType type : types) {
    const uint64_t one = *ggml_row_bytes(type, kHidden) * kInter;
    const std::vector<StoredMatrix> ram =
        make_ggml_matrices(type, kInter, kHidden, static_cast<size_t>((kStreamBytes + one - 1) / one));
    const std::vector<StoredMatrix> cache = make_ggml_matrices(type, kCacheRows, kHidden, 1);
    for (KernelPath path : available_paths()) {
      set_kernel_path(path);
      const double from_ram = gemv_gbps(ram, seconds);
      const double from_cache = gemv_gbps(cache, seconds);
      const double g16 = gemm_gflops(ram, 16, seconds);
      std::printf("%-6s %-9s %12.2f %8s %14.2f %8s %16.2f\n", ggml_traits(type).name, kernel_path_name(path), from_ram,
                  share(from_ram).c_str(), from_cache, share(from_cache).c_str(), g16);
      std::fflush(stdout);
    }
  }
  set_activation_mode(saved);
}

void bench_matmul(double seconds) {
  const FormSpec forms[] = {{"F32", WeightFormat::kF32, 0},
                            {"BF16", WeightFormat::kBF16, 0},
                            {"I8G gs32", WeightFormat::kInt8, 32},
                            {"I4G gs32", WeightFormat::kInt4, 32}};
  std::printf("\nmatmul, W [%lld x %lld]; GEMV over %llu MiB of distinct matrices (from RAM)\n",
              static_cast<long long>(kInter), static_cast<long long>(kHidden),
              static_cast<unsigned long long>(kStreamBytes >> 20));
  std::printf("%-10s %-9s %12s %16s %17s\n", "form", "path", "GEMV GB/s", "GEMM r=16 GF/s", "GEMM r=128 GF/s");
  for (const FormSpec& form : forms) {
    const uint64_t one = MatrixShape{form.format, kInter, kHidden, form.group}.data_bytes();
    const std::vector<StoredMatrix> ms =
        make_matrices(form, kInter, kHidden, static_cast<size_t>((kStreamBytes + one - 1) / one));
    for (KernelPath path : available_paths()) {
      set_kernel_path(path);
      const double gbps = gemv_gbps(ms, seconds);
      const double g16 = gemm_gflops(ms, 16, seconds);
      const double g128 = gemm_gflops(ms, 128, seconds);
      std::printf("%-10s %-9s %12.2f %16.2f %17.2f\n", form.label, kernel_path_name(path), gbps, g16, g128);
      std::fflush(stdout);
    }
  }
}

/// One layer of the worker's batch-union the pre-batch way, for comparison: each
/// expert's matrices one after another, threads inside each matmul.
void swiglu_per_matmul(const std::vector<SwigluJob>& jobs, std::vector<float>& gate, std::vector<float>& up) {
  for (const SwigluJob& job : jobs) {
    gate.resize(job.rows * kInter);
    up.resize(job.rows * kInter);
    matmul(job.weights->gate, job.x, job.rows, nullptr, gate.data());
    matmul(job.weights->up, job.x, job.rows, nullptr, up.data());
    for (size_t i = 0; i < gate.size(); ++i) gate[i] = silu(gate[i]) * up[i];
    matmul(job.weights->down, gate.data(), job.rows, nullptr, job.y);
  }
}

/// The executor before the batch-union became GEMMs: OpenMP over (row, expert) pairs,
/// one matrix-vector chain each (on the portable path this is the old matvec_stored).
void swiglu_per_row(const std::vector<SwigluJob>& jobs) {
  std::vector<std::pair<const SwigluJob*, size_t>> pairs;
  for (const SwigluJob& job : jobs) {
    for (size_t r = 0; r < job.rows; ++r) pairs.emplace_back(&job, r);
  }
#pragma omp parallel
  {
    std::vector<float> gate(kInter), up(kInter);
#pragma omp for schedule(dynamic)
    for (size_t p = 0; p < pairs.size(); ++p) {
      const SwigluJob& job = *pairs[p].first;
      const size_t r = pairs[p].second;
      matmul_serial(job.weights->gate, job.x + r * kHidden, 1, nullptr, gate.data());
      matmul_serial(job.weights->up, job.x + r * kHidden, 1, nullptr, up.data());
      for (int64_t i = 0; i < kInter; ++i) gate[i] = silu(gate[i]) * up[i];
      matmul_serial(job.weights->down, gate.data(), 1, nullptr, job.y + r * kHidden);
    }
  }
}

/// The worker's layer: 8 BF16 experts of `rows` rows each, out of enough distinct
/// experts that their weights come from RAM; ms per layer for each threading scheme.
void bench_batch_union(double seconds) {
  const FormSpec bf16{"BF16", WeightFormat::kBF16, 0};
  constexpr size_t kExperts = 24;  // 24 x 12 MiB: beyond L3
  constexpr size_t kPerLayer = 8;
  const std::vector<StoredMatrix> gates = make_matrices(bf16, kInter, kHidden, kExperts);
  const std::vector<StoredMatrix> ups = make_matrices(bf16, kInter, kHidden, kExperts);
  const std::vector<StoredMatrix> downs = make_matrices(bf16, kHidden, kInter, kExperts);
  std::vector<ExpertView> views;
  for (size_t e = 0; e < kExperts; ++e) views.push_back(ExpertView{gates[e].view(), ups[e].view(), downs[e].view()});
  std::printf("\nbatch-union, %zu BF16 OLMoE experts per layer (hidden %lld, intermediate %lld), ms per layer\n",
              kPerLayer, static_cast<long long>(kHidden), static_cast<long long>(kInter));
  std::printf("%-9s %-12s %21s %18s %22s\n", "path", "rows/expert", "swiglu_batch (items)", "matmul per matrix",
              "per row (old executor)");
  for (KernelPath path : available_paths()) {
    set_kernel_path(path);
    for (size_t rows : {size_t{1}, size_t{16}}) {
      std::vector<float> x(kPerLayer * rows * kHidden, 0.01f), y(x.size()), gate, up;
      auto jobs_for = [&](uint64_t call) {
        std::vector<SwigluJob> jobs;
        for (size_t e = 0; e < kPerLayer; ++e) {
          const size_t expert = (call * kPerLayer + e) % kExperts;
          jobs.push_back(SwigluJob{&views[expert], x.data() + e * rows * kHidden, rows, y.data() + e * rows * kHidden});
        }
        return jobs;
      };
      const double batch = median_call_seconds(seconds, [&](uint64_t i) { swiglu_batch(jobs_for(i), kHidden, kInter); });
      const double per_matmul = median_call_seconds(seconds, [&](uint64_t i) { swiglu_per_matmul(jobs_for(i), gate, up); });
      const double per_row = median_call_seconds(seconds, [&](uint64_t i) { swiglu_per_row(jobs_for(i)); });
      std::printf("%-9s %-12zu %21.3f %18.3f %22.3f\n", kernel_path_name(path), rows, 1e3 * batch, 1e3 * per_matmul,
                  1e3 * per_row);
      std::fflush(stdout);
    }
  }
}

int bench_kernels(const BenchArgs& args) {
  if (!(args.seconds >= 0.01)) fail_invalid("--seconds must be a number >= 0.01");  // CLI11's Range lets NaN through
  const int threads = configure_threads(args.threads);
  const KernelPath saved = active_kernel_path();
  std::printf("charm bench kernels: %d thread(s) (physical cores: %d), default kernel path %s, %.1f s per number (median call)\n",
              threads, physical_core_count(), kernel_path_name(saved), args.seconds);
  if (args.part == "all" || args.part == "matmul") bench_matmul(args.seconds);
  if (args.part == "all" || args.part == "ggml") {
    for (Q8Form f : kQ8Forms) {
      if (args.q8_form == q8_form_name(f)) set_q8_form(f);
    }
    bench_ggml(args.seconds, args.copy_gbps, parse_activation_mode(args.activations, "--activations"));
  }
  if (args.part == "all" || args.part == "batch-union") bench_batch_union(args.seconds);
  set_kernel_path(saved);
  return 0;
}

}  // namespace

void add_bench_kernels(CLI::App& bench) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = bench.add_subcommand("kernels", "GEMV / GEMM speed of every stored form and kernel path");
  cmd->add_option("--threads", args->threads, "OpenMP threads (default: OMP_NUM_THREADS, else physical cores)")
      ->check(CLI::Range(1, kMaxThreads));
  cmd->add_option("--seconds", args->seconds, "Time per measurement")->check(CLI::Range(0.01, 3600.0));
  cmd->add_option("--part", args->part, "Which tables: all, matmul, ggml or batch-union")
      ->check(CLI::IsMember({"all", "matmul", "ggml", "batch-union"}));
  cmd->add_option("--copy-gbps", args->copy_gbps,
                  "Copy GB/s of `charm bench memory` at the same --threads: the GGML table's 100 %")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--activations", args->activations,
                  "The GGML table's activations: f32 (exact, default) or q8 (lossy integer dots)")
      ->check(CLI::IsMember({"f32", "q8"}));
  cmd->add_option("--q8-form", args->q8_form,
                  "The q8 kernels' instruction-set form: auto (the fastest this CPU has), maddubs, avx-vnni or avx512-vnni")
      ->check(CLI::IsMember({"auto", "maddubs", "avx-vnni", "avx512-vnni"}));
  cmd->callback([args] { bench_kernels(*args); });
}

}  // namespace charm
