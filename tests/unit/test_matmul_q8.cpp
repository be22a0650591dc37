// common/matmul_q8.h (`activations: q8`): the portable and AVX2 kernels give the same
// bits for every supported type, a row's result does not depend on the rest of the batch
// or the thread count, the error against the exact f32 path stays within the measured
// bound, hand-made blocks give llama.cpp's own arithmetic, and the types without a q8
// kernel (GGML F32 / F16 / BF16) keep the exact path.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/ggml_type.h"
#include "common/matmul.h"
#include "common/matmul_q8.h"
#include "common/topology.h"
#include "coordinator/engine.h"
#include "tests/support/expect_error.h"

using namespace charm;

namespace {

const GgmlType kQ8Types[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                             GgmlType::kMXFP4, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K,
                             GgmlType::kQ6_K};

uint16_t f16_bits(float v) {  // exact for the values used here (small powers of two)
  for (uint32_t b = 0; b < 0x7C00; ++b) {
    if (f16_to_f32(static_cast<uint16_t>(b)) == std::fabs(v)) return static_cast<uint16_t>(b | (v < 0 ? 0x8000 : 0));
  }
  FAIL("no f16 for " << v);
  return 0;
}

/// Byte offsets of a block's f16 scale fields (d, and dmin where the type has one).
std::vector<int> f16_fields(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0: return {0};
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: return {0, 2};
    case GgmlType::kQ6_K: return {208};
    case GgmlType::kQ2_K: return {80, 82};
    case GgmlType::kQ3_K: return {108};
    case GgmlType::kMXFP4: return {};  // its scale is the e8m0 byte 0
    default: FAIL("no layout for the test"); return {};
  }
}

/// Bytes of a block that hold its scales: the f16 fields, and MXFP4's e8m0 byte.
std::vector<int> scale_bytes(GgmlType type) {
  if (type == GgmlType::kMXFP4) return {0};
  std::vector<int> out;
  for (int f : f16_fields(type)) out.insert(out.end(), {f, f + 1});
  return out;
}

/// A [rows, cols] GGML matrix of random blocks whose scales (f16, or MXFP4's e8m0) are
/// finite, between 2^-10 and 2^-4 in magnitude (weights of a usual size); every other
/// byte random.
StoredMatrix random_ggml(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  StoredMatrix m;
  m.shape.format = WeightFormat::kGgml;
  m.shape.ggml_type = type;
  m.shape.rows = rows;
  m.shape.cols = cols;
  m.data.resize(m.shape.data_bytes());
  for (uint8_t& b : m.data) b = static_cast<uint8_t>(rng());
  const GgmlTypeTraits t = ggml_traits(type);
  for (size_t off = 0; off < m.data.size(); off += static_cast<size_t>(t.block_bytes)) {
    if (type == GgmlType::kMXFP4) m.data[off] = static_cast<uint8_t>(118 + rng() % 7);  // 2^-10 .. 2^-4
    for (int field : f16_fields(type)) {
      // exponent 5..11 (2^-10 .. 2^-4), random mantissa and sign
      const auto bits = static_cast<uint16_t>(((5 + rng() % 7) << 10) | (rng() & 0x3FF) | ((rng() & 1) << 15));
      std::memcpy(&m.data[off + static_cast<size_t>(field)], &bits, 2);
    }
  }
  return m;
}

/// Activations: uniform in [-1, 1], with an outlier of 8 now and then (as real hidden
/// states have), so that blocks have different scales.
std::vector<float> random_x(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(n);
  for (float& v : x) {
    v = static_cast<float>(static_cast<int32_t>(rng() % 2000001) - 1000000) * 1e-6f;
    if (rng() % 97 == 0) v *= 8.0f;
  }
  return x;
}

std::vector<float> q8_tile(KernelPath path, const MatrixView& w, const float* x, size_t rows, const float* bias) {
  std::vector<float> y(rows * static_cast<size_t>(w.shape.rows), -7.0f);
  REQUIRE(matmul_q8_tile(path, w, x, rows, bias, y.data(), 0, w.shape.rows));
  return y;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

/// Columns for a type: 19 blocks (two groups of eight lanes and a tail of 3) of 32 or of 256.
int64_t cols_for(GgmlType type) { return ggml_traits(type).block_elements * 19; }

/// Sets the activation mode for a scope.
struct ModeScope {
  explicit ModeScope(ActivationMode m) { set_activation_mode(m); }
  ~ModeScope() { set_activation_mode(ActivationMode::kF32); }
};

}  // namespace

TEST_CASE("q8: the AVX2 path's kernels (the GEMV and both GEMMs, every form) give the portable bits, every type, rows 1..11") {
  if (!cpu_supports_avx2()) {
    MESSAGE("this CPU lacks avx2/fma/f16c: the AVX2 path was NOT checked");
    return;
  }
  std::vector<Q8Form> forms;
  for (Q8Form f : kQ8Forms) {
    if (cpu_supports_q8_form(f)) {
      forms.push_back(f);
    } else {
      MESSAGE("this CPU lacks " << std::string(q8_form_name(f)) << ": that form of the q8 kernels was NOT checked");
    }
  }
  const Q8Form saved_form = active_q8_form();
  for (Q8Form form : forms) {
    CAPTURE(std::string(q8_form_name(form)));
    set_q8_form(form);
    uint32_t seed = 1;
    for (GgmlType type : kQ8Types) {
      CAPTURE(std::string(ggml_traits(type).name));
      REQUIRE(has_q8_kernel(type));
      const int64_t cols = cols_for(type);
      const StoredMatrix w = random_ggml(type, 9, cols, seed++);  // two rows ahead of each prefetch, and a tail
      std::vector<float> bias = random_x(9, seed++);
      // From 8 rows every type takes the eight-row GEMM (rows 8 .. 11: four at a time,
      // then 0 .. 3), its last weight row rows_dot; a tile from output 1 puts its panel at
      // an odd row, and leaves output 0 alone.
      for (size_t rows = 1; rows <= 11; ++rows) {
        CAPTURE(rows);
        const std::vector<float> x = random_x(rows * static_cast<size_t>(cols), seed++);
        const float* b = rows % 2 ? bias.data() : nullptr;
        const auto portable = q8_tile(KernelPath::kPortable, w.view(), x.data(), rows, b);
        const auto avx2 = q8_tile(KernelPath::kAvx2, w.view(), x.data(), rows, b);
        CHECK(same_bits(portable, avx2));
        for (float v : portable) CHECK(std::isfinite(v));
        std::vector<float> shifted(portable.size(), -7.0f);
        REQUIRE(matmul_q8_tile(KernelPath::kAvx2, w.view(), x.data(), rows, b, shifted.data(), 1, 9));
        for (size_t r = 0; r < rows; ++r) {
          CHECK(std::memcmp(shifted.data() + 9 * r + 1, portable.data() + 9 * r + 1, 8 * 4) == 0);
          CHECK(shifted[9 * r] == -7.0f);
        }
      }
    }
  }
  set_q8_form(saved_form);
}

TEST_CASE("q8: the AVX2 kernels stay exact at the integers' extremes (every quant and scale at its largest)") {
  // The kernels add i16 products before widening (Q4_K / Q5_K pairs, the i16 bsums of
  // madd): a bound missed there would saturate or wrap, and differ from the portable
  // int32 arithmetic. Weight bytes all 0xFF (every quant, scale and min at its top; Q6_K's
  // scales -1), all 0x80 (Q6_K's scales -128) or all 0x7F, activations all +1 or all -1
  // (every quant +-127, every bsum +-2032).
  if (!cpu_supports_avx2()) {
    MESSAGE("this CPU lacks avx2/fma/f16c: the AVX2 path was NOT checked");
    return;
  }
  for (GgmlType type : kQ8Types) {
    CAPTURE(std::string(ggml_traits(type).name));
    for (uint8_t fill : {uint8_t{0xFF}, uint8_t{0x80}, uint8_t{0x7F}}) {
      CAPTURE(int{fill});
      StoredMatrix w = random_ggml(type, 9, cols_for(type), 5);  // eight-row GEMM panels and a tail row
      const auto block = static_cast<size_t>(ggml_traits(type).block_bytes);
      for (size_t off = 0; off < w.data.size(); off += block) {
        std::vector<uint8_t> scales(w.data.begin() + static_cast<std::ptrdiff_t>(off),
                                    w.data.begin() + static_cast<std::ptrdiff_t>(off + block));
        std::fill_n(w.data.begin() + static_cast<std::ptrdiff_t>(off), block, fill);
        for (int at : scale_bytes(type)) w.data[off + static_cast<size_t>(at)] = scales[static_cast<size_t>(at)];
      }
      for (float sign : {1.0f, -1.0f}) {
        for (size_t rows : {size_t{1}, size_t{4}, size_t{5}, size_t{9}}) {
          CAPTURE(sign);
          CAPTURE(rows);
          const std::vector<float> x(rows * static_cast<size_t>(w.shape.cols), sign);
          const auto portable = q8_tile(KernelPath::kPortable, w.view(), x.data(), rows, nullptr);
          CHECK(same_bits(portable, q8_tile(KernelPath::kAvx2, w.view(), x.data(), rows, nullptr)));
        }
      }
    }
  }
}

TEST_CASE("q8: MXFP4's every scale byte (subnormal 2^-128, 2^-127 .. 2^127) gives the portable bits on AVX2") {
  if (!cpu_supports_avx2()) {
    MESSAGE("this CPU lacks avx2/fma/f16c: the AVX2 path was NOT checked");
    return;
  }
  // 259 blocks per row (32 groups of eight and a tail of three): row 0's scale bytes are
  // 0 and 1 only (f32 subnormals, whose products a larger block would absorb), row 1's
  // 254 and 255 (products that overflow to Inf), row 2's every value b % 256; both the
  // eight-block scale reader and the tail's one-block reader meet each; rows 3 .. 7 (random
  // scales) complete a panel of the eight-row GEMM, which reads one block's scale at a time.
  StoredMatrix w = random_ggml(GgmlType::kMXFP4, 8, 32 * 259, 41);
  for (int64_t b = 0; b < 259; ++b) {
    w.data[static_cast<size_t>(b * 17)] = static_cast<uint8_t>(b % 2);
    w.data[static_cast<size_t>((259 + b) * 17)] = static_cast<uint8_t>(254 + b % 2);
    w.data[static_cast<size_t>((2 * 259 + b) * 17)] = static_cast<uint8_t>(b % 256);
  }
  for (size_t rows : {size_t{1}, size_t{4}, size_t{9}}) {
    CAPTURE(rows);
    const std::vector<float> x = random_x(rows * static_cast<size_t>(w.shape.cols), 42);
    const auto portable = q8_tile(KernelPath::kPortable, w.view(), x.data(), rows, nullptr);
    CHECK(same_bits(portable, q8_tile(KernelPath::kAvx2, w.view(), x.data(), rows, nullptr)));
    CHECK(portable[0] != 0.0f);  // the subnormal scales' products survive in row 0
  }
}

TEST_CASE("q8: a row's result does not depend on the other rows, the tiling or the thread count") {
  const int saved_threads = omp_get_max_threads();
  const ModeScope mode(ActivationMode::kQ8);
  std::vector<KernelPath> paths = {KernelPath::kPortable};
  if (cpu_supports_avx2()) paths.push_back(KernelPath::kAvx2);
  const KernelPath saved_path = active_kernel_path();
  uint32_t seed = 100;
  for (GgmlType type : kQ8Types) {
    CAPTURE(std::string(ggml_traits(type).name));
    const int64_t cols = 512;
    const int64_t out = 164;  // several tiles of panel_rows(512) = 64: matmul goes parallel;
                              // the last tile ends in 4 rows beside the eight-row GEMM
    const StoredMatrix w = random_ggml(type, out, cols, seed++);
    const size_t rows = 11;  // the eight-row GEMM in the batch, other kernels alone and among 3
    const std::vector<float> x = random_x(rows * static_cast<size_t>(cols), seed++);
    for (KernelPath path : paths) {
      set_kernel_path(path);
      omp_set_num_threads(1);
      std::vector<float> batch(rows * static_cast<size_t>(out));
      matmul(w.view(), x.data(), rows, nullptr, batch.data());
      omp_set_num_threads(3);
      std::vector<float> threaded(batch.size());
      matmul(w.view(), x.data(), rows, nullptr, threaded.data());
      CHECK(same_bits(batch, threaded));
      for (size_t r = 0; r < rows; ++r) {
        // alone, and beside other rows (the same row among different neighbours)
        std::vector<float> alone(static_cast<size_t>(out));
        matmul(w.view(), x.data() + r * static_cast<size_t>(cols), 1, nullptr, alone.data());
        std::vector<float> mixed = random_x(3 * static_cast<size_t>(cols), seed++);
        std::copy(x.begin() + static_cast<ptrdiff_t>(r * static_cast<size_t>(cols)),
                  x.begin() + static_cast<ptrdiff_t>((r + 1) * static_cast<size_t>(cols)),
                  mixed.begin() + cols);
        std::vector<float> among(3 * static_cast<size_t>(out));
        matmul_tile(w.view(), mixed.data(), 3, nullptr, among.data(), 0, out);
        CHECK(std::memcmp(alone.data(), batch.data() + r * static_cast<size_t>(out), alone.size() * 4) == 0);
        CHECK(std::memcmp(alone.data(), among.data() + static_cast<size_t>(out), alone.size() * 4) == 0);
      }
    }
  }
  set_kernel_path(saved_path);
  omp_set_num_threads(saved_threads);
}

// The error bound. With e = y_q8 - y_f32 (the exact f32 path on the same weights) and
// rel = max |e| / (||x|| * ||w_o||) over every output of 40 random [16, 1024] matrices
// per type (x as random_x: uniform in [-1, 1] with 1-in-97 outliers x8), measured on this
// code: Q8_0 8.3e-4, Q4_0 1.04e-3, Q4_1 1.02e-3, Q5_0 9.6e-4, Q5_1 8.1e-4, MXFP4 1.07e-3,
// Q2_K 1.73e-3, Q3_K 2.37e-3, Q4_K 1.70e-3, Q5_K 1.88e-3, Q6_K 1.74e-3 (Q8_K's blocks of
// 256 meet an outlier more often, so their step amax / 127 is larger; the seeds follow
// kQ8Types' order, so adding a type moved the K-quants' numbers). Bounds checked: 1.5e-3 for the types with
// blocks of 32 (Q8_0 / Q8_1 activations), 3e-3 for the Q8_K ones. Checked once by
// hand-editing common/matmul_q8.cpp: dropping the activation scale (d = 1) gives rel 7..11
// and rounding toward zero instead of to nearest 2.1e-3 / 3.7e-3..4.5e-3; both fail here.
TEST_CASE("q8: error against the exact f32 path within the measured bound") {
  uint32_t seed = 1000;
  for (GgmlType type : kQ8Types) {
    CAPTURE(std::string(ggml_traits(type).name));
    const double bound = ggml_traits(type).block_elements == 32 ? 1.5e-3 : 3e-3;
    const int64_t cols = 1024;
    const int64_t out = 16;
    double worst = 0;
    for (int trial = 0; trial < 40; ++trial) {
      const StoredMatrix w = random_ggml(type, out, cols, seed++);
      const std::vector<float> x = random_x(static_cast<size_t>(cols), seed++);
      std::vector<float> exact(static_cast<size_t>(out)), q8(static_cast<size_t>(out));
      {
        const ModeScope mode(ActivationMode::kF32);
        matmul(w.view(), x.data(), 1, nullptr, exact.data());
      }
      {
        const ModeScope mode(ActivationMode::kQ8);
        matmul(w.view(), x.data(), 1, nullptr, q8.data());
      }
      double xn = 0;
      for (float v : x) xn += static_cast<double>(v) * v;
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t o = 0; o < out; ++o) {
        matrix_row_to_f32(w.view(), o, row.data());
        double wn = 0;
        for (float v : row) wn += static_cast<double>(v) * v;
        const double rel = std::fabs(static_cast<double>(q8[static_cast<size_t>(o)]) - exact[static_cast<size_t>(o)]) /
                           std::sqrt(xn * wn);
        worst = std::max(worst, rel);
      }
    }
    MESSAGE(std::string(ggml_traits(type).name) << ": max |y_q8 - y_f32| / (||x|| ||w_o||) = " << worst);
    CHECK(worst < bound);
    CHECK(worst > 0);  // it is the lossy path: something rounded
  }
}

// llama.cpp's arithmetic on hand-made blocks (ggml_vec_dot_q8_0_q8_0_generic after
// quantize_row_q8_0_ref): y = sum over blocks of isum * (d_w * d_x), d_x = amax / 127
// (to f16), q_x = roundf(x / d_x), half away from zero. Four blocks (all in the tail:
// summed in order, as ggml does), every value exact:
//  block 0: w d 0.5,  qs all 1;        x 127, -27, 0...   d_x 1, isum 100      -> 50
//  block 1: w d 0.25, qs[j] = j - 16;  x 2..., x[31] 127   isum 2 * (-16) + 15 * 125 = 1843 -> 460.75
//  block 2: w d 1,    qs 0, 1, 2, 0..; x 127, 2.5, -2.5    q 127, 3, -3 (half away: not 2, -2)
//                                                          isum 3 - 6 = -3     -> -3
//  block 3: w d 0.5,  qs 1, 3, 0...;   x 254, -10          d_x 2, q 127, -5, isum 112 -> 112
// Sum 619.75 (half-to-even rounding would give 620.75; dropping block 3's d_x, 563.75).
TEST_CASE("q8: Q8_0 x Q8_0 on hand-made blocks gives llama.cpp's value") {
  StoredMatrix w;
  w.shape.format = WeightFormat::kGgml;
  w.shape.ggml_type = GgmlType::kQ8_0;
  w.shape.rows = 1;
  w.shape.cols = 128;
  w.data.assign(4 * 34, 0);
  auto set_d = [&](int b, float d) {
    const uint16_t bits = f16_bits(d);
    std::memcpy(&w.data[static_cast<size_t>(b) * 34], &bits, 2);
  };
  auto q = [&](int b, int j) -> uint8_t& { return w.data[static_cast<size_t>(b) * 34 + 2 + static_cast<size_t>(j)]; };
  std::vector<float> x(128, 0.0f);
  set_d(0, 0.5f);
  for (int j = 0; j < 32; ++j) q(0, j) = 1;
  x[0] = 127;
  x[1] = -27;
  set_d(1, 0.25f);
  for (int j = 0; j < 32; ++j) q(1, j) = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
  for (int j = 0; j < 32; ++j) x[32 + j] = 2;
  x[63] = 127;
  set_d(2, 1.0f);
  q(2, 1) = 1;
  q(2, 2) = 2;
  x[64] = 127;
  x[65] = 2.5f;
  x[66] = -2.5f;
  set_d(3, 0.5f);
  q(3, 0) = 1;
  q(3, 1) = 3;
  x[96] = 254;
  x[97] = -10;
  std::vector<KernelPath> paths = {KernelPath::kPortable};
  if (cpu_supports_avx2()) paths.push_back(KernelPath::kAvx2);
  for (KernelPath path : paths) {
    CAPTURE(kernel_path_name(path));
    CHECK(q8_tile(path, w.view(), x.data(), 1, nullptr)[0] == 619.75f);
    const float bias = 0.25f;
    CHECK(q8_tile(path, w.view(), x.data(), 1, &bias)[0] == 620.0f);
  }
}

// llama.cpp's arithmetic for the types whose activations are Q8_1 or whose quants take an
// offset or a table (ggml_vec_dot_q4_1_q8_1_generic, ..._q5_0_q8_0_, ..._mxfp4_q8_0_), one
// block each (x zero but where named), every value exact:
//  Q4_1: d 0.5, m 0.25; quants e0 1, e1 3, e16 2; x 100, 3 (e1), -40 (e16): d_x = f16(100 / 127)
//        = 1613 / 2048, q 127, 4, -51, s = f16(80 * 100 / 127) = 63; isum 127 + 12 - 102 = 37
//        -> (0.5 * d_x) * 37 + 0.25 * 63 = 30.320556640625 (15.75 of it is m * s)
//  Q5_0: d 0.5; quants e0 16, e1 15, e17 21, every other 0 (minus 16: 0, -1, 5, -16 ...);
//        x 127, 10 (e1), -20 (e17): d_x 1, isum -10 - 100 = -110 -> -55
//  MXFP4: e 127 (d 0.5); nibbles e0 7 (12), e1 13 (-6), e16 9 (-1); x 127, 10, -20 (e16):
//        isum 1524 - 60 + 20 = 1484 -> 742
TEST_CASE("q8: Q4_1 x Q8_1, Q5_0 x Q8_0 and MXFP4 x Q8_0 on hand-made blocks give llama.cpp's values") {
  struct Case {
    GgmlType type;
    std::vector<uint8_t> block;
    std::vector<std::pair<int, float>> x;
    float want;
  };
  auto f16le = [](float v) {
    const uint16_t b = f16_bits(v);
    return std::vector<uint8_t>{static_cast<uint8_t>(b & 0xFF), static_cast<uint8_t>(b >> 8)};
  };
  std::vector<Case> cases;
  {
    std::vector<uint8_t> b = f16le(0.5f), m = f16le(0.25f);
    b.insert(b.end(), m.begin(), m.end());
    b.resize(20, 0);
    b[4] = 0x21;  // e0 = 1, e16 = 2
    b[5] = 0x03;  // e1 = 3
    cases.push_back({GgmlType::kQ4_1, b, {{0, 100.0f}, {1, 3.0f}, {16, -40.0f}}, 30.320556640625f});
  }
  {
    std::vector<uint8_t> b = f16le(0.5f);
    b.resize(22, 0);
    const uint32_t qh = 1u | 1u << 17;  // fifth bits of e0 and e17
    std::memcpy(&b[2], &qh, 4);
    b[6 + 1] = 0x5F;  // e1 = 15, e17 = 5 (| 16)
    cases.push_back({GgmlType::kQ5_0, b, {{0, 127.0f}, {1, 10.0f}, {17, -20.0f}}, -55.0f});
  }
  {
    std::vector<uint8_t> b(17, 0);
    b[0] = 127;
    b[1] = 0x97;  // e0 nibble 7 (12), e16 nibble 9 (-1)
    b[2] = 0x0D;  // e1 nibble 13 (-6)
    cases.push_back({GgmlType::kMXFP4, b, {{0, 127.0f}, {1, 10.0f}, {16, -20.0f}}, 742.0f});
  }
  std::vector<KernelPath> paths = {KernelPath::kPortable};
  if (cpu_supports_avx2()) paths.push_back(KernelPath::kAvx2);
  for (const Case& c : cases) {
    CAPTURE(std::string(ggml_traits(c.type).name));
    StoredMatrix w;
    w.shape.format = WeightFormat::kGgml;
    w.shape.ggml_type = c.type;
    w.shape.rows = 1;
    w.shape.cols = 32;
    w.data = c.block;
    std::vector<float> x(32, 0.0f);
    for (const auto& [at, v] : c.x) x[static_cast<size_t>(at)] = v;
    for (KernelPath path : paths) {
      CAPTURE(kernel_path_name(path));
      CHECK(q8_tile(path, w.view(), x.data(), 1, nullptr)[0] == c.want);
    }
  }
}

// llama.cpp's arithmetic for the 2- and 3-bit K-quants against Q8_K
// (ggml_vec_dot_q2_K_q8_K_generic, ..._q3_K_q8_K_generic), one block of 256 each, every
// value exact. x: 127 (e0), 10 (e1), -3 (e5), -4 (e98), 20 (e144), 7 (e150), 1 (e200), else
// 0; Q8_K's max is 127, so iscale = -127 / 127, d_x = -1 and q = -x.
//  Q2_K: d 0.5, dmin 0.25; sub-block 0 scale 3 min 2 (e0 quant 1, e1 3), sub-block 6 scale
//        7 (e98 quant 3), sub-block 9 scale 5 min 1 (e144 quant 2), every other scale and
//        min 0: isum 3 * (-127 - 30) + 7 * 12 + 5 * (-40) = -587, bsums -134 (s0), -27 (s9),
//        msum 2 * -134 + 1 * -27 = -295 -> (0.5 * -1) * -587 - (0.25 * -1) * -295 = 219.75
//  Q3_K: d 0.5; sub-block 0 scale 3 (e0 quant 1, e1 -1, e5 -4), sub-block 6 scale -7 (e98
//        -2), sub-block 9 scale 5 (e144 -1, e150 -4), every other scale 0 (6-bit 32) and
//        every other quant -4: isum 3 * -129 + -7 * -8 + 5 * 48 = -91 -> 45.5
// Both equal x . w of the dequantised weights (the activations are whole numbers here).
TEST_CASE("q8: Q2_K and Q3_K x Q8_K on hand-made blocks give llama.cpp's values") {
  std::vector<float> x(256, 0.0f);
  for (const auto& [at, v] : std::vector<std::pair<int, float>>{{0, 127}, {1, 10}, {5, -3}, {98, -4}, {144, 20},
                                                                {150, 7}, {200, 1}}) {
    x[static_cast<size_t>(at)] = v;
  }
  auto put_f16 = [](std::vector<uint8_t>& b, size_t at, float v) {
    const uint16_t bits = f16_bits(v);
    std::memcpy(&b[at], &bits, 2);
  };
  std::vector<uint8_t> q2(84, 0);
  q2[0] = 0x23;   // sub-block 0: scale 3, min 2
  q2[6] = 0x07;   // sub-block 6: scale 7
  q2[9] = 0x15;   // sub-block 9: scale 5, min 1
  q2[16 + 0] = 0x01;   // e0 = 1 (bits 0..1 of qs[0])
  q2[16 + 1] = 0x03;   // e1 = 3
  q2[16 + 2] = 0xC0;   // e98 = 3 (bits 6..7 of qs[2]: 32 * 3 + 2)
  q2[16 + 48] = 0x02;  // e144 = 2 (bits 0..1 of qs[32 + 16])
  put_f16(q2, 80, 0.5f);
  put_f16(q2, 82, 0.25f);
  std::vector<uint8_t> q3(110, 0);
  q3[0] = 0x01;    // hmask bit 0 of e0: quant 1 - 0
  q3[32 + 0] = 0x01;   // e0's two bits
  q3[32 + 1] = 0x03;   // e1: 3 - 4 = -1
  q3[32 + 2] = 0x80;   // e98 (bits 6..7 of qs[2]): 2 - 4 = -2
  q3[32 + 48] = 0x03;  // e144 (bits 0..1 of qs[48]): 3 - 4 = -1
  for (int i = 8; i < 12; ++i) q3[96 + static_cast<size_t>(i)] = 0xAA;  // every high pair 2: 6-bit scale 32 + low
  q3[96 + 0] = 0x03;   // sub-block 0: low 3 -> 35 - 32 = 3
  q3[96 + 6] = 0x09;   // sub-block 6: low 9 ...
  q3[96 + 10] = 0xA6;  // ... high pair (bits 2..3 of scales[10]) 1: 25 - 32 = -7
  q3[96 + 1] = 0x50;   // sub-block 9: high nibble of scales[1] 5 -> 5
  put_f16(q3, 108, 0.5f);
  std::vector<KernelPath> paths = {KernelPath::kPortable};
  if (cpu_supports_avx2()) paths.push_back(KernelPath::kAvx2);
  for (const auto& [type, block, want] : {std::tuple{GgmlType::kQ2_K, q2, 219.75f}, std::tuple{GgmlType::kQ3_K, q3, 45.5f}}) {
    CAPTURE(std::string(ggml_traits(type).name));
    StoredMatrix w;
    w.shape.format = WeightFormat::kGgml;
    w.shape.ggml_type = type;
    w.shape.rows = 1;
    w.shape.cols = 256;
    w.data = block;
    std::vector<float> exact(1);
    matmul(w.view(), x.data(), 1, nullptr, exact.data());
    CHECK(exact[0] == want);  // the exact path on the dequantised weights agrees
    for (KernelPath path : paths) {
      CAPTURE(kernel_path_name(path));
      CHECK(q8_tile(path, w.view(), x.data(), 1, nullptr)[0] == want);
    }
  }
}

TEST_CASE("q8: a tile reuses a quantised row only for the same bits, not the same address") {
  const GgmlType type = GgmlType::kQ4_K;
  const int64_t cols = 512;
  const StoredMatrix w = random_ggml(type, 4, cols, 77);
  std::vector<float> original = random_x(static_cast<size_t>(cols), 78);
  std::vector<float> changed = original;
  changed[5] += 0.5f;
  const auto want = q8_tile(KernelPath::kPortable, w.view(), changed.data(), 1, nullptr);
  std::vector<float> buffer = original;
  const auto before = q8_tile(KernelPath::kPortable, w.view(), buffer.data(), 1, nullptr);
  buffer = changed;  // same address, new contents
  const auto after = q8_tile(KernelPath::kPortable, w.view(), buffer.data(), 1, nullptr);
  CHECK(same_bits(after, want));
  CHECK_FALSE(same_bits(before, want));
}

TEST_CASE("q8: types without a q8 kernel keep the exact f32 path; non-finite activations give NaN") {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {  // llama.cpp keeps them unquantised too
    CAPTURE(std::string(ggml_traits(type).name));
    CHECK_FALSE(has_q8_kernel(type));
    StoredMatrix w;
    w.shape.format = WeightFormat::kGgml;
    w.shape.ggml_type = type;
    w.shape.rows = 3;
    w.shape.cols = 256;
    w.data.assign(w.shape.data_bytes(), 0x11);  // small finite values in each of the three
    const std::vector<float> x = random_x(256, 5);
    std::vector<float> exact(3), q8(3, -1.0f);
    matmul(w.view(), x.data(), 1, nullptr, exact.data());
    CHECK_FALSE(matmul_q8_tile(KernelPath::kPortable, w.view(), x.data(), 1, nullptr, q8.data(), 0, 3));
    CHECK(q8[0] == -1.0f);  // wrote nothing
    const ModeScope mode(ActivationMode::kQ8);
    matmul(w.view(), x.data(), 1, nullptr, q8.data());
    CHECK(same_bits(exact, q8));
  }
  for (GgmlType type : kQ8Types) {
    CAPTURE(std::string(ggml_traits(type).name));
    const StoredMatrix w = random_ggml(type, 2, 256, 9);
    std::vector<float> x = random_x(256, 10);
    x[3] = std::numeric_limits<float>::infinity();
    for (float v : q8_tile(KernelPath::kPortable, w.view(), x.data(), 1, nullptr)) CHECK(std::isnan(v));
    // A block of subnormal activations (its scale would overflow 1 / d): zero, not UB.
    std::vector<float> tiny(256, 1e-39f);
    tiny[7] = -3e-39f;
    for (float v : q8_tile(KernelPath::kPortable, w.view(), tiny.data(), 1, nullptr)) CHECK(v == 0.0f);
  }
  if (!cpu_supports_avx2()) {
    MESSAGE("this CPU lacks avx2/fma/f16c: the AVX2 path's non-finite case was NOT checked");
    return;
  }
  for (GgmlType type : kQ8Types) {  // 9 rows: the eight-row GEMM, whose row with an Inf gives NaN
    CAPTURE(std::string(ggml_traits(type).name));
    const StoredMatrix w = random_ggml(type, 9, 512, 12);
    std::vector<float> x = random_x(9 * 512, 13);
    x[300] = -std::numeric_limits<float>::infinity();
    const auto portable = q8_tile(KernelPath::kPortable, w.view(), x.data(), 9, nullptr);
    const auto avx2 = q8_tile(KernelPath::kAvx2, w.view(), x.data(), 9, nullptr);
    for (size_t o = 0; o < 9; ++o) CHECK(std::isnan(avx2[o]));
    CHECK(std::memcmp(avx2.data() + 9, portable.data() + 9, 8 * 9 * 4) == 0);
  }
}

TEST_CASE("q8: activation mode names parse, others are refused naming the key") {
  CHECK(parse_activation_mode("f32", "activations") == ActivationMode::kF32);
  CHECK(parse_activation_mode("q8", "activations") == ActivationMode::kQ8);
  CHECK(std::string(activation_mode_name(ActivationMode::kQ8)) == "q8");
  CHECK(std::string(activation_mode_name(ActivationMode::kF32)) == "f32");
  test::expect_error([] { parse_activation_mode("int8", "--activations"); }, ErrorCategory::kInvalidInput,
                     {"--activations", "int8", "f32", "q8"});
  CHECK(active_activation_mode() == ActivationMode::kF32);  // the default
}

namespace {

/// The greedy first-step logits and 4 tokens of `prompt` on the Q4_K_M fixture (Q4_K,
/// Q6_K and Q8_0 tensors), single node, with `activations` set in the topology.
std::pair<std::vector<float>, std::vector<int32_t>> engine_run(const std::string& activations) {
  const auto model = std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/gguf_models/qwen3moe-k256.q4_k_m.gguf";
  const Topology topology = Topology::parse(
      "model: " + model.string() + "\nmode: single-node\nactivations: " + activations + "\n", "/tmp/q8.yaml");
  auto engine = Engine::create(topology);
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 4;
  std::vector<float> logits;
  const std::vector<int32_t> prompt{1, 5, 17, 300, 42, 7, 511, 0, 256};
  std::vector<int32_t> tokens = engine->start(prompt, params, &logits)->wait({}).tokens;
  return {logits, tokens};
}

}  // namespace

// End to end: the engine applies the topology's key (and puts f32 back), and q8 logits
// are close to the exact ones. Measured on this fixture: max |l_q8 - l_f32| / max |l_f32|
// = 0.026 (a 2-layer model of random weights, whose logits are nearly flat); bound 0.06.
TEST_CASE("q8: the engine applies activations: q8 from the topology, and f32 again after it") {
  const auto exact = engine_run("f32");
  CHECK(active_activation_mode() == ActivationMode::kF32);
  const auto q8 = engine_run("q8");
  CHECK(active_activation_mode() == ActivationMode::kQ8);
  const auto again = engine_run("f32");
  CHECK(active_activation_mode() == ActivationMode::kF32);
  REQUIRE(exact.first.size() == q8.first.size());
  REQUIRE(!exact.first.empty());
  CHECK(same_bits(exact.first, again.first));  // the default never changes the model
  CHECK(exact.second == again.second);
  CHECK_FALSE(same_bits(exact.first, q8.first));  // the q8 kernels ran
  double diff = 0, peak = 0;
  for (size_t i = 0; i < exact.first.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(q8.first[i]) - exact.first[i]));
    peak = std::max(peak, std::fabs(static_cast<double>(exact.first[i])));
  }
  MESSAGE("max |l_q8 - l_f32| / max |l_f32| = " << diff / peak << "; greedy tokens "
                                                   << std::string(q8.second == exact.second ? "equal" : "differ"));
  CHECK(diff / peak < 0.06);
}

TEST_CASE("q8: the AVX2 quantisers (Q8_K and Q8_0) give the portable bits on edge blocks") {
  if (!cpu_supports_avx2()) {
    MESSAGE("this CPU lacks avx2/fma/f16c: the AVX2 quantisers were NOT checked");
    return;
  }
  std::vector<std::vector<float>> blocks;
  blocks.push_back(std::vector<float>(256, 0.0f));    // amax 0
  blocks.push_back(std::vector<float>(256, 1e-39f));  // the scale overflows
  std::vector<float> b = random_x(256, 20);
  b[40] = -2.0f;  // the largest |x| twice, opposite signs: the first one is `max`
  b[90] = 2.0f;
  blocks.push_back(b);
  for (size_t j = 0; j < 256; ++j) b[j] = static_cast<float>(static_cast<int>(j % 64) - 32) + 0.5f;
  for (size_t j = 0; j < 256; j += 32) b[j] = 127.0f;  // scale exactly 1 (Q8_K: -1): exact halves
  blocks.push_back(b);
  for (float& v : b) v = -v;
  blocks.push_back(b);
  b = random_x(256, 22);
  b[200] = std::numeric_limits<float>::quiet_NaN();
  blocks.push_back(b);
  b = random_x(256, 23);
  b[0] = -std::numeric_limits<float>::infinity();
  blocks.push_back(b);
  for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ8_0, GgmlType::kQ4_1}) {  // Q8_K, Q8_0, Q8_1 activations
    CAPTURE(std::string(ggml_traits(type).name));
    const StoredMatrix w = random_ggml(type, 1, 256, 3);
    for (size_t k = 0; k < blocks.size(); ++k) {
      CAPTURE(k);
      Q8Activations portable, avx2;
      quantize_activations(KernelPath::kPortable, w.view(), blocks[k].data(), 1, portable);
      quantize_activations(KernelPath::kAvx2, w.view(), blocks[k].data(), 1, avx2);
      CHECK(portable.qs == avx2.qs);
      CHECK(portable.sums == avx2.sums);
      CHECK(std::memcmp(portable.d.data(), avx2.d.data(), portable.d.size() * 4) == 0);
      REQUIRE(portable.s.size() == avx2.s.size());
      CHECK(std::memcmp(portable.s.data(), avx2.s.data(), portable.s.size() * 4) == 0);
    }
  }
}
