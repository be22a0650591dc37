// common/matmul.h's bit contract: y[r][o] has exactly the bits of
// dot(x_r, matrix_row_to_f32(w, o)) (+ bias[o]), for every stored form and shape, on the
// portable and the AVX2 path, whatever the batch and the thread count; GGML blocks (the
// fused AVX2 GEMV of common/matmul_avx2.cpp included) against the portable dequantiser.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"
#include "common/ggml_type.h"
#include "common/kernels.h"
#include "common/matmul.h"
#include "tests/support/ggml_matrix.h"
#include "tests/support/expect_error.h"
#include "tests/support/kernel_paths.h"

using namespace charm;

namespace {

using charm::test::make_ggml_matrix;
using charm::test::PathGuard;
using charm::test::paths_to_check;

/// A stored matrix of one form with pseudo-random contents (all finite).
StoredMatrix make_matrix(WeightFormat format, int64_t rows, int64_t cols, int64_t group, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (float& v : values) v = uniform(rng);
  StoredMatrix m;
  m.shape = MatrixShape{format, rows, cols, is_quantized(format) ? group : 0};
  m.data.resize(m.shape.data_bytes());
  switch (format) {
    case WeightFormat::kF32: std::memcpy(m.data.data(), values.data(), m.data.size()); break;
    case WeightFormat::kBF16:
    case WeightFormat::kF16:
      for (size_t i = 0; i < values.size(); ++i) {
        uint16_t bits = f32_to_bf16(values[i]);
        if (format == WeightFormat::kF16) {
          bits = static_cast<uint16_t>(rng() & 0xffff);
          if ((bits & 0x7c00) == 0x7c00) bits &= 0xbfff;  // keep it finite (specials: own test)
        }
        std::memcpy(m.data.data() + 2 * i, &bits, 2);
      }
      break;
    case WeightFormat::kInt8:
    case WeightFormat::kInt4:
      m.scales.resize(m.shape.scale_bytes() / 4);
      quantize_matrix(values.data(), m.shape, m.data.data(), m.scales.data());
      break;
    case WeightFormat::kF8E4M3Block:
      m.shape.block_rows = 3;  // partial blocks at the bottom and the right
      m.shape.block_cols = 5;
      for (uint8_t& b : m.data) {
        b = static_cast<uint8_t>(rng() & 0xff);
        if ((b & 0x7f) == 0x7f) b &= 0xfe;  // not NaN
      }
      m.scales.resize(m.shape.scale_bytes() / 4);
      for (float& s : m.scales) s = 0.001f + std::fabs(uniform(rng));
      break;
    case WeightFormat::kGgml: FAIL("GGML blocks: make_ggml_matrix"); break;
  }
  return m;
}

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = uniform(rng);
  return v;
}

/// The contract, written out: widen row o, common/kernels.h dot, then + bias[o].
std::vector<float> reference(const MatrixView& w, const std::vector<float>& x, size_t rows, const float* bias) {
  const auto in = static_cast<size_t>(w.shape.cols);
  const auto out = static_cast<size_t>(w.shape.rows);
  std::vector<float> y(rows * out), row(in);
  for (size_t o = 0; o < out; ++o) {
    matrix_row_to_f32(w, static_cast<int64_t>(o), row.data());
    for (size_t r = 0; r < rows; ++r) {
      const float v = dot(x.data() + r * in, row.data(), in);
      y[r * out + o] = bias ? v + bias[o] : v;
    }
  }
  return y;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Bits equal, except that any NaN equals any NaN: when several NaNs meet in one sum,
/// which payload and sign survives depends on the operand order the compiler picked for
/// each add (IEEE 754 leaves it open), not on the kernel's summation order.
bool same_bits_or_both_nan(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  }
  return true;
}

std::vector<float> run_matmul(const MatrixView& w, const std::vector<float>& x, size_t rows, const float* bias) {
  std::vector<float> y(rows * static_cast<size_t>(w.shape.rows), -12345.0f);
  matmul(w, x.data(), rows, bias, y.data());
  return y;
}

struct FormCase {
  const char* label;
  WeightFormat format;
  int64_t group;
};

const FormCase kForms[] = {
    {"F32", WeightFormat::kF32, 0},        {"F16", WeightFormat::kF16, 0},
    {"BF16", WeightFormat::kBF16, 0},      {"I8G gs32", WeightFormat::kInt8, 32},
    {"I8G gs5", WeightFormat::kInt8, 5},   {"I8G gs20", WeightFormat::kInt8, 20},
    {"I4G gs32", WeightFormat::kInt4, 32}, {"I4G gs5", WeightFormat::kInt4, 5},
    {"I4G gs8", WeightFormat::kInt4, 8},
    {"F8_E4M3B 3x5", WeightFormat::kF8E4M3Block, 0},
};

}  // namespace

TEST_CASE("matmul equals dot over matrix_row_to_f32 bit for bit: every form, tails, batch sizes, bias") {
  PathGuard guard;
  for (KernelPath path : paths_to_check()) {
    set_kernel_path(path);
    for (const FormCase& form : kForms) {
      for (int64_t out : {1, 3, 5, 17}) {
        for (int64_t in : {1, 7, 8, 9, 37, 261}) {
          const StoredMatrix m = make_matrix(form.format, out, in, form.group, static_cast<uint32_t>(out * 1000 + in));
          const std::vector<float> bias = random_vector(static_cast<size_t>(out), 7);
          for (size_t rows : {1, 2, 3, 4, 7, 33}) {
            const std::vector<float> x = random_vector(rows * static_cast<size_t>(in), static_cast<uint32_t>(rows));
            for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
              CAPTURE(std::string(kernel_path_name(path)));
              CAPTURE(form.label);
              CAPTURE(out);
              CAPTURE(in);
              CAPTURE(rows);
              CAPTURE(b != nullptr);
              const std::vector<float> got = run_matmul(m.view(), x, rows, b);
              CHECK(same_bits(got, reference(m.view(), x, rows, b)));
              // (b) the batch does not matter: each row alone gives the same bits.
              std::vector<float> alone(got.size());
              for (size_t r = 0; r < rows; ++r) {
                const std::vector<float> xr(x.begin() + static_cast<long>(r * in), x.begin() + static_cast<long>((r + 1) * in));
                const std::vector<float> yr = run_matmul(m.view(), xr, 1, b);
                std::memcpy(alone.data() + r * out, yr.data(), yr.size() * sizeof(float));
              }
              CHECK(same_bits(got, alone));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("matmul: 1 thread and 2 threads, matmul_serial and matmul_tile give the same bits") {
  PathGuard guard;
  const int saved_threads = omp_get_max_threads();
  for (KernelPath path : paths_to_check()) {
    set_kernel_path(path);
    for (const FormCase& form : kForms) {
      // Large enough for several tiles and the parallel branch.
      for (auto [out, in] : {std::pair<int64_t, int64_t>{300, 261}, {129, 1000}}) {
        const StoredMatrix m = make_matrix(form.format, out, in, form.group, 99);
        for (size_t rows : {1, 5}) {
          CAPTURE(std::string(kernel_path_name(path)));
          CAPTURE(form.label);
          CAPTURE(out);
          CAPTURE(rows);
          const std::vector<float> x = random_vector(rows * static_cast<size_t>(in), 3);
          omp_set_num_threads(1);
          const std::vector<float> one = run_matmul(m.view(), x, rows, nullptr);
          omp_set_num_threads(2);
          const std::vector<float> two = run_matmul(m.view(), x, rows, nullptr);
          CHECK(same_bits(one, two));
          CHECK(same_bits(one, reference(m.view(), x, rows, nullptr)));
          std::vector<float> serial(one.size()), tiles(one.size());
          matmul_serial(m.view(), x.data(), rows, nullptr, serial.data());
          CHECK(same_bits(one, serial));
          for (int64_t o0 = 0; o0 < out; o0 += 13) {  // odd tile edges
            matmul_tile(m.view(), x.data(), rows, nullptr, tiles.data(), o0, std::min(out, o0 + 13));
          }
          CHECK(same_bits(one, tiles));
        }
      }
    }
  }
  omp_set_num_threads(saved_threads);
}

TEST_CASE("matmul: every f16 and bf16 bit pattern (subnormals, infinities, NaNs) widens as matrix_row_to_f32") {
  PathGuard guard;
  for (KernelPath path : paths_to_check()) {
    set_kernel_path(path);
    for (WeightFormat format : {WeightFormat::kF16, WeightFormat::kBF16}) {
      StoredMatrix m;
      m.shape = MatrixShape{format, 256, 256, 0};
      m.data.resize(m.shape.data_bytes());
      for (uint32_t i = 0; i < 65536; ++i) {
        const auto bits = static_cast<uint16_t>(i);
        std::memcpy(m.data.data() + 2 * i, &bits, 2);
      }
      for (size_t rows : {1, 3}) {
        CAPTURE(std::string(kernel_path_name(path)));
        CAPTURE(std::string(weight_format_name(format)));
        const std::vector<float> x = random_vector(rows * 256, 5);
        const std::vector<float> got = run_matmul(m.view(), x, rows, nullptr);
        CHECK(same_bits_or_both_nan(got, reference(m.view(), x, rows, nullptr)));
      }
      // Each pattern alone in its output row (the rest +0), at every lane and in the tail
      // (9 columns: one chunk of 8, then one): one NaN at most per sum, so even NaN
      // payloads must agree bit for bit.
      StoredMatrix alone;
      alone.shape = MatrixShape{format, 65536, 9, 0};
      alone.data.assign(alone.shape.data_bytes(), 0);
      for (uint32_t i = 0; i < 65536; ++i) {
        const auto bits = static_cast<uint16_t>(i);
        std::memcpy(alone.data.data() + 2 * (i * 9 + i % 9), &bits, 2);
      }
      for (size_t rows : {1, 3}) {
        CAPTURE(rows);
        const std::vector<float> x = random_vector(rows * 9, 11);
        CHECK(same_bits(run_matmul(alone.view(), x, rows, nullptr), reference(alone.view(), x, rows, nullptr)));
      }
    }
  }
}

TEST_CASE("CHARM_KERNELS: auto, portable and avx2 parse; anything else is a clear error") {
  CHECK(parse_kernel_path(nullptr) == (cpu_supports_avx2() ? KernelPath::kAvx2 : KernelPath::kPortable));
  CHECK(parse_kernel_path("auto") == parse_kernel_path(nullptr));
  CHECK(parse_kernel_path("portable") == KernelPath::kPortable);
  if (cpu_supports_avx2()) {
    CHECK(parse_kernel_path("avx2") == KernelPath::kAvx2);
  } else {
    CHECK_THROWS_AS(parse_kernel_path("avx2"), Error);
    CHECK_THROWS_AS(set_kernel_path(KernelPath::kAvx2), Error);
  }
  for (const char* bad : {"AVX2", "fast", "avx512", " portable"}) {
    CAPTURE(bad);
    test::expect_error([&] { parse_kernel_path(bad); }, ErrorCategory::kInvalidInput, {"CHARM_KERNELS", bad});
  }
  const char* saved = std::getenv("CHARM_KERNELS");
  const std::string saved_value = saved ? saved : "";
  setenv("CHARM_KERNELS", "turbo", 1);
  CHECK_THROWS_AS(kernel_path_from_env(), Error);
  setenv("CHARM_KERNELS", "portable", 1);
  CHECK(kernel_path_from_env() == KernelPath::kPortable);
  if (saved) {
    setenv("CHARM_KERNELS", saved_value.c_str(), 1);
  } else {
    unsetenv("CHARM_KERNELS");
  }
}

TEST_CASE("matmul rejects views it cannot read") {
  float x = 1, y = 0;
  const uint8_t byte = 0;
  MatrixView no_scales{MatrixShape{WeightFormat::kInt8, 1, 1, 32}, &byte, nullptr};
  CHECK_THROWS_AS(matmul(no_scales, &x, 1, nullptr, &y), Error);
  MatrixView no_group{MatrixShape{WeightFormat::kInt4, 1, 1, 0}, &byte, &x};
  CHECK_THROWS_AS(matmul(no_group, &x, 1, nullptr, &y), Error);
  MatrixView f8{MatrixShape{WeightFormat::kF8E4M3Block, 1, 1, 0}, &byte, &x};
  CHECK_THROWS_AS(matmul_serial(f8, &x, 1, nullptr, &y), Error);
  MatrixView ok{MatrixShape{WeightFormat::kF32, 1, 1, 0}, reinterpret_cast<const uint8_t*>(&x), nullptr};
  CHECK_THROWS_AS(matmul_tile(ok, &x, 1, nullptr, &y, 0, 2), Error);
}

namespace {

const GgmlType kGgmlTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0, GgmlType::kQ4_1,
                               GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K,
                               GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kMXFP4};

/// The contract on the portable path: dot over dequantize_row's portable row.
std::vector<float> portable_reference(const MatrixView& w, const std::vector<float>& x, size_t rows,
                                      const float* bias) {
  const KernelPath saved = active_kernel_path();
  set_kernel_path(KernelPath::kPortable);
  std::vector<float> y = reference(w, x, rows, bias);
  set_kernel_path(saved);
  return y;
}

}  // namespace

TEST_CASE("GGML blocks: matmul equals dot over the portable dequantize_row bit for bit, every type, rows 1..9") {
  PathGuard guard;
  for (KernelPath path : paths_to_check()) {
    for (GgmlType type : kGgmlTypes) {
      const int64_t block = ggml_traits(type).block_elements;
      const int64_t unit = block == 1 ? 32 : block;
      for (int64_t blocks : {1, 2, 3, 9}) {
        const int64_t in = unit * blocks;
        if (block == 256 && blocks == 9) continue;  // three 256-blocks are enough
        for (int64_t out : {1, 3, 4, 5, 9}) {
          const StoredMatrix m = make_ggml_matrix(type, out, in, static_cast<uint32_t>(out * 100 + in));
          const std::vector<float> bias = random_vector(static_cast<size_t>(out), 17);
          for (size_t rows = 1; rows <= 9; ++rows) {
            const auto seed = static_cast<uint32_t>(rows + 40);
            const std::vector<float> x = random_vector(rows * static_cast<size_t>(in), seed);
            for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
              CAPTURE(std::string(kernel_path_name(path)));
              CAPTURE(std::string(ggml_traits(type).name));
              CAPTURE(out);
              CAPTURE(in);
              CAPTURE(rows);
              CAPTURE(b != nullptr);
              const std::vector<float> want = portable_reference(m.view(), x, rows, b);
              set_kernel_path(path);
              CHECK(same_bits(run_matmul(m.view(), x, rows, b), want));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("GGML blocks: 1 and 2 threads, matmul_serial and matmul_tile give the portable bits") {
  PathGuard guard;
  const int saved_threads = omp_get_max_threads();
  for (KernelPath path : paths_to_check()) {
    for (GgmlType type : kGgmlTypes) {
      const int64_t out = 300, in = 512;  // several tiles, the parallel branch; whole blocks of 32 and 256
      const StoredMatrix m = make_ggml_matrix(type, out, in, 5);
      for (size_t rows : {1, 5}) {
        CAPTURE(std::string(kernel_path_name(path)));
        CAPTURE(std::string(ggml_traits(type).name));
        CAPTURE(rows);
        const std::vector<float> x = random_vector(rows * static_cast<size_t>(in), 8);
        const std::vector<float> want = portable_reference(m.view(), x, rows, nullptr);
        set_kernel_path(path);
        omp_set_num_threads(1);
        CHECK(same_bits(run_matmul(m.view(), x, rows, nullptr), want));
        omp_set_num_threads(2);
        CHECK(same_bits(run_matmul(m.view(), x, rows, nullptr), want));
        std::vector<float> serial(want.size()), tiles(want.size());
        matmul_serial(m.view(), x.data(), rows, nullptr, serial.data());
        CHECK(same_bits(serial, want));
        for (int64_t o0 = 0; o0 < out; o0 += 13) {  // odd tile edges: 4-row groups and the single rows
          matmul_tile(m.view(), x.data(), rows, nullptr, tiles.data(), o0, std::min(out, o0 + 13));
        }
        CHECK(same_bits(tiles, want));
      }
    }
  }
  omp_set_num_threads(saved_threads);
}

TEST_CASE("GGML blocks: gguf-py's fixture blocks (edge scales: zero, subnormal, max) as matrix rows") {
  PathGuard guard;
  for (KernelPath path : paths_to_check()) {
    for (GgmlType type : kGgmlTypes) {
      const GgmlTypeTraits t = ggml_traits(type);
      const auto file = std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/ggml_quants" /
                        (std::string(t.name) + ".blocks");
      std::ifstream f(file, std::ios::binary);
      REQUIRE_MESSAGE(f.good(), "cannot open " << file.string());
      const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
      // Rows of 8 elements' worth of blocks for the unquantised types, else of one block.
      const int64_t per_row = t.block_elements == 1 ? 32 : 1;
      StoredMatrix m;
      m.shape = MatrixShape{WeightFormat::kGgml, 0, t.block_elements * per_row, 0};
      m.shape.ggml_type = type;
      m.shape.rows = static_cast<int64_t>(bytes.size()) / (t.block_bytes * per_row);
      REQUIRE(m.shape.rows > 0);
      m.data.assign(bytes.begin(), bytes.begin() + static_cast<long>(m.shape.data_bytes()));
      for (size_t rows : {1, 3}) {
        CAPTURE(std::string(kernel_path_name(path)));
        CAPTURE(std::string(t.name));
        CAPTURE(rows);
        const std::vector<float> x = random_vector(rows * static_cast<size_t>(m.shape.cols), 21);
        const std::vector<float> want = portable_reference(m.view(), x, rows, nullptr);
        set_kernel_path(path);
        // Edge blocks overflow to Inf, and Inf - Inf to NaN: only there may payloads differ.
        CHECK(same_bits_or_both_nan(run_matmul(m.view(), x, rows, nullptr), want));
      }
    }
  }
}
