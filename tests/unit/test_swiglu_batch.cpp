// worker/experts/swiglu_batch.h: the batch-union as GEMMs gives every row the bits of that row
// computed alone (one GEMV chain), whatever the other rows and experts, the thread
// count and the kernel path.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "common/kernels.h"
#include "common/ggml_type.h"
#include "common/matmul.h"
#include "common/matmul_q8.h"
#include "tests/support/ggml_matrix.h"
#include "worker/experts/swiglu_batch.h"

using namespace charm;

namespace {

StoredMatrix bf16_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-0.5f, 0.5f);
  StoredMatrix m;
  m.shape = MatrixShape{WeightFormat::kBF16, rows, cols, 0};
  m.data.resize(m.shape.data_bytes());
  for (int64_t i = 0; i < rows * cols; ++i) {
    const uint16_t bits = f32_to_bf16(uniform(rng));
    std::memcpy(m.data.data() + 2 * i, &bits, 2);
  }
  return m;
}

struct Expert {
  StoredMatrix gate, up, down;
  ExpertView view;
  Expert(int64_t hidden, int64_t inter, uint32_t seed)
      : Expert(bf16_matrix(inter, hidden, seed), bf16_matrix(inter, hidden, seed + 1), bf16_matrix(hidden, inter, seed + 2)) {}
  Expert(StoredMatrix g, StoredMatrix u, StoredMatrix d) : gate(std::move(g)), up(std::move(u)), down(std::move(d)) {
    view = ExpertView{gate.view(), up.view(), down.view()};
  }
};

/// One row alone, one matrix-vector product at a time: the pre-GEMM executor's order.
std::vector<float> one_row(const ExpertView& w, const float* x, int64_t hidden, int64_t inter) {
  std::vector<float> g(inter), u(inter), y(hidden);
  matmul_serial(w.gate, x, 1, nullptr, g.data());
  matmul_serial(w.up, x, 1, nullptr, u.data());
  for (int64_t i = 0; i < inter; ++i) g[i] = silu(g[i]) * u[i];
  matmul_serial(w.down, g.data(), 1, nullptr, y.data());
  return y;
}

/// A larger batch of NaN rows through swiglu_batch, so that the buffers it keeps between
/// calls (common/reused_buffer.h) hold NaN where the next call must write before it reads.
void poison_scratch(const std::vector<Expert>& experts, int64_t hidden, int64_t inter) {
  constexpr size_t kRows = 16;
  std::vector<float> x(kRows * hidden, std::nanf("")), y(experts.size() * kRows * hidden);
  std::vector<SwigluJob> jobs;
  for (size_t e = 0; e < experts.size(); ++e) {
    jobs.push_back(SwigluJob{&experts[e].view, x.data(), kRows, y.data() + e * kRows * hidden});
  }
  swiglu_batch(jobs, hidden, inter);
  REQUIRE(std::isnan(y[0]));
}

/// swiglu_batch over `experts` (rows {1, 7, 3}) against one_row for every row, by memcmp,
/// on both kernel paths and 1 or 2 threads, each after a NaN batch (poison_scratch).
void check_rows_alone(const std::vector<Expert>& experts, int64_t hidden, int64_t inter) {
  const std::vector<size_t> rows_per_expert = {1, 7, 3};
  size_t total = 0;
  for (size_t r : rows_per_expert) total += r;
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(total * hidden);
  for (float& v : x) v = uniform(rng);

  const KernelPath saved_path = active_kernel_path();
  const int saved_threads = omp_get_max_threads();
  std::vector<KernelPath> paths = {KernelPath::kPortable};
  if (cpu_supports_avx2()) {
    paths.push_back(KernelPath::kAvx2);
  } else {
    MESSAGE("this CPU lacks avx2/fma/f16c: swiglu_batch was NOT checked on the AVX2 path");
  }
  for (KernelPath path : paths) {
    set_kernel_path(path);
    std::vector<float> want(total * hidden);
    for (size_t e = 0, at = 0; e < experts.size(); at += rows_per_expert[e], ++e) {
      for (size_t r = at; r < at + rows_per_expert[e]; ++r) {
        const std::vector<float> y = one_row(experts[e].view, x.data() + r * hidden, hidden, inter);
        std::memcpy(want.data() + r * hidden, y.data(), y.size() * sizeof(float));
      }
    }
    for (int threads : {1, 2}) {
      CAPTURE(std::string(kernel_path_name(path)));
      CAPTURE(threads);
      omp_set_num_threads(threads);
      poison_scratch(experts, hidden, inter);
      std::vector<float> got(total * hidden, -1.0f);
      std::vector<SwigluJob> jobs;
      for (size_t e = 0, at = 0; e < experts.size(); at += rows_per_expert[e], ++e) {
        jobs.push_back(SwigluJob{&experts[e].view, x.data() + at * hidden, rows_per_expert[e], got.data() + at * hidden});
      }
      swiglu_batch(jobs, hidden, inter);
      CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
      for (float v : got) REQUIRE(std::isfinite(v));
    }
  }
  set_kernel_path(saved_path);
  omp_set_num_threads(saved_threads);
}

}  // namespace

TEST_CASE("swiglu_batch: every row has the bits of that row alone; 1 or 2 threads; both kernel paths") {
  const int64_t hidden = 200, inter = 136;  // several tiles of 64, with partial ones
  std::vector<Expert> experts;
  for (uint32_t e = 0; e < 3; ++e) experts.emplace_back(hidden, inter, 10 * e);
  check_rows_alone(experts, hidden, inter);
}

TEST_CASE("swiglu_batch under activations: q8 (rows quantised once per job) gives each row's q8 bits alone") {
  // Q4_K gate / up (one quantised x for both) and a Q8_0 down: both activation block
  // kinds; expert 1's gate is Q8_0, so its gate and up each quantise x their own way.
  // hidden 512 = 8 tiles.
  const int64_t hidden = 512, inter = 256;
  std::vector<Expert> experts;
  for (uint32_t e = 0; e < 3; ++e) {
    constexpr uint16_t kScale = 0x1419;  // f16 1.0e-3
    const GgmlType gate = e == 1 ? GgmlType::kQ8_0 : GgmlType::kQ4_K;
    experts.emplace_back(test::make_ggml_matrix(gate, inter, hidden, 10 * e, kScale),
                         test::make_ggml_matrix(GgmlType::kQ4_K, inter, hidden, 10 * e + 1, kScale),
                         test::make_ggml_matrix(GgmlType::kQ8_0, hidden, inter, 10 * e + 2, kScale));
  }
  struct Q8Scope {  // back to f32 even when a REQUIRE stops the test
    Q8Scope() { set_activation_mode(ActivationMode::kQ8); }
    ~Q8Scope() { set_activation_mode(ActivationMode::kF32); }
  } q8;
  check_rows_alone(experts, hidden, inter);
}

// GptOssExperts._apply_gate, worked by hand: gate clamped above only, up on both sides,
// (up + 1) * gate * sigmoid(alpha * gate).
TEST_CASE("the clamped SwiGLU clamps gate above and up on both sides, as GptOssExperts does") {
  const ExpertActivation clamped{.kind = ExpertActivation::Kind::kClampedSwiglu, .alpha = 1.702f, .limit = 7.0f};
  auto want = [](float g, float u) {
    return (u + 1.0f) * (g * (1.0f / (1.0f + std::exp(-(g * 1.702f)))));
  };
  CHECK(clamped(0.5f, 0.25f) == want(0.5f, 0.25f));
  CHECK(clamped(9.0f, 0.25f) == want(7.0f, 0.25f));     // gate above the limit
  CHECK(clamped(-9.0f, 0.25f) == want(-9.0f, 0.25f));   // gate has no lower clamp
  CHECK(clamped(0.5f, 8.0f) == want(0.5f, 7.0f));       // up clamped above ...
  CHECK(clamped(0.5f, -8.0f) == want(0.5f, -7.0f));     // ... and below
  CHECK(clamped(0.5f, 0.25f) != silu(0.5f) * 0.25f);    // not the plain SwiGLU
  const ExpertActivation plain;
  CHECK(plain(0.5f, 0.25f) == silu(0.5f) * 0.25f);
}
