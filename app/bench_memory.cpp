// `charm bench memory`: STREAM's four kernels (McCalpin, "Memory Bandwidth and Machine
// Balance", 1995; stream.c v5.10) over three double arrays much larger than the caches,
// OpenMP-parallel with a static schedule, best of N passes. The copy rate is the memory
// bandwidth scripts/bench_llamacpp.py divides the bytes a decode step reads by (its
// roofline). As in STREAM, GB/s counts the bytes the kernel reads plus the bytes it
// writes (copy/scale: 16 per element, add/triad: 24), 1 GB = 1e9 bytes, and the
// write-allocate reads of the stored arrays are not counted.
#include "app/bench_memory.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cpu_threads.h"
#include "common/error.h"
#include "common/user_path.h"

namespace charm {
namespace {

struct MemoryArgs {
  double array_mib = 1024;  // per array; three arrays are allocated
  int repeat = 10;
  int threads = 0;  // 0 = OpenMP default (OMP_NUM_THREADS or every core)
  std::string json;
};

struct FreeDeleter {
  void operator()(double* p) const { std::free(p); }
};
using Array = std::unique_ptr<double[], FreeDeleter>;

/// An uninitialised page-aligned array of `n` doubles (first touched by the OpenMP
/// threads that later stream it, so its pages sit on their NUMA nodes).
Array allocate(size_t n) {
  const size_t bytes = (n * sizeof(double) + 4095) / 4096 * 4096;
  auto* p = static_cast<double*>(std::aligned_alloc(4096, bytes));
  if (p == nullptr) fail_io("bench memory: cannot allocate " + std::to_string(bytes) + " bytes");
  return Array(p);
}

/// One STREAM kernel: its name, bytes moved per element, and the loop.
struct Kernel {
  const char* name;
  int bytes_per_element;
};
constexpr Kernel kKernels[] = {{"copy", 16}, {"scale", 16}, {"add", 24}, {"triad", 24}};
constexpr double kScalar = 3.0;

/// Runs kernel k over n elements; returns seconds.
double run_kernel(int k, double* a, double* b, double* c, int64_t n) {
  const auto start = std::chrono::steady_clock::now();
  switch (k) {
    case 0:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) c[i] = a[i];
      break;
    case 1:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) b[i] = kScalar * c[i];
      break;
    case 2:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
      break;
    default:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) a[i] = b[i] + kScalar * c[i];
      break;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// STREAM's check: replays the passes on scalars and compares every element (a wrong
/// loop, e.g. one the compiler or a race broke, would otherwise print a fine rate).
void check_results(const double* a, const double* b, const double* c, int64_t n, int passes) {
  double aj = 2.0, bj = 2.0, cj = 0.0;
  for (int p = 0; p < passes; ++p) {
    cj = aj;
    bj = kScalar * cj;
    cj = aj + bj;
    aj = bj + kScalar * cj;
  }
  int64_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
  for (int64_t i = 0; i < n; ++i) {
    if (std::abs(a[i] - aj) > 1e-13 * aj || std::abs(b[i] - bj) > 1e-13 * bj || std::abs(c[i] - cj) > 1e-13 * cj) ++bad;
  }
  if (bad != 0) fail_internal("bench memory: " + std::to_string(bad) + " elements hold wrong values after the passes");
}

/// Bytes of memory the kernel may still claim (MemAvailable).
double available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (in >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024;
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

struct KernelTimes {
  double min_s = std::numeric_limits<double>::infinity();
  double max_s = 0;
  double sum_s = 0;
};

/// The element count of arrays of `array_mib` MiB, refusing three of them beyond 80%
/// of the available memory.
int64_t checked_elements(double array_mib) {
  const auto n = static_cast<int64_t>(array_mib * 1024 * 1024 / sizeof(double));
  const double total = 3.0 * static_cast<double>(n) * sizeof(double);
  const double available = available_bytes();
  if (total > 0.8 * available) {
    char message[256];
    std::snprintf(message, sizeof message,
                  "bench memory: 3 arrays of %.0f MiB need %.1f GiB, more than 80%% of the %.1f GiB "
                  "available; lower --array-mib",
                  array_mib, total / (1 << 30), available / (1 << 30));
    fail_invalid(message);
  }
  return n;
}

int bench_memory(const MemoryArgs& args) {
  if (!(args.array_mib >= 1.0)) fail_invalid("--array-mib must be a number >= 1");  // CLI11's Range lets NaN through
  if (args.threads > 0) omp_set_num_threads(args.threads);
  const int64_t n = checked_elements(args.array_mib);
  Array a = allocate(n), b = allocate(n), c = allocate(n);
  double* pa = a.get();
  double* pb = b.get();
  double* pc = c.get();
  int threads = 1;
#pragma omp parallel
  {
#pragma omp single
    threads = omp_get_num_threads();
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    pa[i] = 2.0;  // STREAM: a = 1, then a = 2 * a once before timing
    pb[i] = 2.0;
    pc[i] = 0.0;
  }
  std::vector<KernelTimes> times(std::size(kKernels));
  for (int pass = 0; pass < args.repeat + 1; ++pass) {
    for (size_t k = 0; k < std::size(kKernels); ++k) {
      const double s = run_kernel(static_cast<int>(k), pa, pb, pc, n);
      if (pass == 0) continue;  // the first pass warms up (page faults, frequency), as STREAM skips it
      times[k].min_s = std::min(times[k].min_s, s);
      times[k].max_s = std::max(times[k].max_s, s);
      times[k].sum_s += s;
    }
  }
  check_results(pa, pb, pc, n, args.repeat + 1);

  std::printf("charm bench memory: STREAM-like, 3 arrays x %.0f MiB (doubles), %d threads, best of %d passes\n",
              args.array_mib, threads, args.repeat);
  std::printf("%-8s %12s %12s %12s %12s\n", "kernel", "best GB/s", "avg time s", "min time s", "max time s");
  nlohmann::json out = {{"threads", threads}, {"array_bytes", n * static_cast<int64_t>(sizeof(double))},
                        {"repeat", args.repeat}, {"kernels", nlohmann::json::object()}};
  for (size_t k = 0; k < std::size(kKernels); ++k) {
    const double bytes = static_cast<double>(kKernels[k].bytes_per_element) * static_cast<double>(n);
    const double best = bytes / times[k].min_s / 1e9;
    const double avg = times[k].sum_s / args.repeat;
    std::printf("%-8s %12.2f %12.6f %12.6f %12.6f\n", kKernels[k].name, best, avg, times[k].min_s, times[k].max_s);
    out["kernels"][kKernels[k].name] = {{"best_gb_per_s", best}, {"avg_s", avg}, {"min_s", times[k].min_s},
                                        {"max_s", times[k].max_s}, {"bytes_per_pass", bytes}};
  }
  if (!args.json.empty()) {
    std::ofstream f(args.json, std::ios::trunc);
    f << out.dump(1) << '\n';
    if (!f) fail_io("bench memory: cannot write " + UserPath::from_command_line(args.json).describe());
  }
  return 0;
}

}  // namespace

double stream_copy_gb_per_s(double array_mib, int repeat) {
  if (!(array_mib >= 1.0) || repeat < 1) fail_invalid("bench memory: array_mib must be >= 1 and repeat >= 1");
  const int64_t n = checked_elements(array_mib);
  Array a = allocate(n), b = allocate(n), c = allocate(n);
  double* pa = a.get();
  double* pb = b.get();
  double* pc = c.get();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    pa[i] = 2.0;
    pb[i] = 2.0;
    pc[i] = 0.0;
  }
  double best = std::numeric_limits<double>::infinity();
  for (int pass = 0; pass < repeat + 1; ++pass) {
    const double s = run_kernel(0, pa, pb, pc, n);
    if (pass > 0) best = std::min(best, s);
  }
  if (pc[n / 2] != 2.0) fail_internal("bench memory: the copy kernel wrote a wrong value");
  return static_cast<double>(kKernels[0].bytes_per_element) * static_cast<double>(n) / best / 1e9;
}

void add_bench_memory(CLI::App& bench) {
  auto args = std::make_shared<MemoryArgs>();
  CLI::App* cmd = bench.add_subcommand("memory", "STREAM-like memory bandwidth (copy, scale, add, triad)");
  cmd->add_option("--array-mib", args->array_mib, "MiB per array (three arrays; far above the last-level cache)")
      ->check(CLI::Range(1.0, 1048576.0));
  cmd->add_option("--repeat", args->repeat, "Timed passes; the best is reported (plus one untimed warm-up)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--threads", args->threads, "OpenMP threads (0 = OMP_NUM_THREADS or every core)")
      ->check(CLI::Range(0, kMaxThreads));
  cmd->add_option("--json", args->json, "Also write the results to this JSON file");
  cmd->callback([args] { bench_memory(*args); });
}

}  // namespace charm
