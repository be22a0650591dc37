// common/attention.h through its two users, causal_gqa_attention
// (coordinator/models/blocks.h) and MlaAttention (coordinator/models/mla_attention.h):
// the bit contract (a row's output does not depend on the other rows of the call, the
// chunking, the thread count or the kernel path) and closeness to plain softmax
// attention in double precision.
#include <doctest/doctest.h>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "common/attention.h"
#include "common/checkpoint.h"
#include "common/matmul.h"
#include "common/model_config.h"
#include "coordinator/models/blocks.h"
#include "coordinator/models/families.h"
#include "coordinator/models/kv_cache.h"
#include "coordinator/models/mla_attention.h"

using namespace charm;

namespace {

// Lengths on both sides of the 16-position tiles.
const size_t kLengths[] = {1, 15, 16, 17, 100, 300};

std::vector<float> random_floats(size_t n, unsigned seed, float range = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-range, range);
  std::vector<float> v(n);
  for (float& x : v) x = uniform(rng);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Chunk sizes covering n: uneven, and not aligned to the tiles.
std::vector<size_t> uneven_chunks(size_t n) {
  const size_t pattern[] = {7, 1, 13, 16, 3, 33};
  std::vector<size_t> chunks;
  for (size_t done = 0, i = 0; done < n; ++i) {
    chunks.push_back(std::min(pattern[i % 6], n - done));
    done += chunks.back();
  }
  return chunks;
}

/// A GQA case: a cache of n positions and queries for all of them, random.
struct GqaCase {
  GqaCase(size_t n, size_t heads, size_t kv_heads, size_t head_dim)
      : n(n), heads(heads), kv_heads(kv_heads), head_dim(head_dim), cache(1, n, kv_heads * head_dim),
        q(random_floats(n * heads * head_dim, static_cast<unsigned>(n * 31 + head_dim), 2.0f)) {
    const std::vector<float> k = random_floats(n * kv_heads * head_dim, static_cast<unsigned>(n + 7), 2.0f);
    const std::vector<float> v = random_floats(n * kv_heads * head_dim, static_cast<unsigned>(n + 8));
    store_kv(cache, 0, 0, n, kv_heads * head_dim, k.data(), v.data());
  }
  /// Rows given by `chunks` (sizes, in order from position 0), one call each, within a
  /// sliding window (0: none) and with sinks [heads] (nullptr: none).
  std::vector<float> run(const std::vector<size_t>& chunks, size_t window = 0, const float* sinks = nullptr) const {
    std::vector<float> out(n * heads * head_dim);
    size_t pos = 0;
    for (size_t rows : chunks) {
      const size_t at = pos * heads * head_dim;
      causal_gqa_attention(q.data() + at, rows, pos, cache, 0, heads, kv_heads, head_dim, out.data() + at, window,
                           sinks);
      pos += rows;
    }
    return out;
  }
  /// The largest difference of `got` from attention in double precision, as transformers'
  /// eager_attention_forward writes it: keys r-window+1..r (all of 0..r when window is 0),
  /// the head's sink (when given) joining the softmax's max and sum, then dropped.
  double worst_error(const std::vector<float>& got, size_t window = 0, const float* sinks = nullptr) const {
    const size_t group = heads / kv_heads;
    double worst = 0;
    for (size_t r = 0; r < n; ++r) {
      const size_t first = window != 0 && r + 1 > window ? r + 1 - window : 0;
      for (size_t h = 0; h < heads; ++h) {
        const float* qh = q.data() + (r * heads + h) * head_dim;
        const size_t off = (h / group) * head_dim;
        std::vector<double> p(r + 1, 0.0);
        double max = sinks ? sinks[h] : -INFINITY, sum = 0;
        for (size_t t = first; t <= r; ++t) {
          double s = 0;
          for (size_t d = 0; d < head_dim; ++d) s += static_cast<double>(qh[d]) * cache.key(0, t)[off + d];
          p[t] = s / std::sqrt(static_cast<double>(head_dim));
          max = std::max(max, p[t]);
        }
        for (size_t t = first; t <= r; ++t) sum += (p[t] = std::exp(p[t] - max));
        if (sinks) sum += std::exp(sinks[h] - max);
        for (size_t d = 0; d < head_dim; ++d) {
          double want = 0;
          for (size_t t = first; t <= r; ++t) want += p[t] / sum * cache.value(0, t)[off + d];
          worst = std::max(worst, std::abs(want - got[(r * heads + h) * head_dim + d]));
        }
      }
    }
    return worst;
  }
  size_t n, heads, kv_heads, head_dim;
  KvCache cache;
  std::vector<float> q;
};

}  // namespace

TEST_CASE("GQA attention: one call, one row at a time and uneven chunks give the same bits") {
  // head_dim 64 (the demo model) and 20 (a width that is not whole vectors).
  for (size_t head_dim : {size_t{64}, size_t{20}}) {
    for (size_t n : kLengths) {
      CAPTURE(head_dim);
      CAPTURE(n);
      const GqaCase c(n, 6, 2, head_dim);
      const std::vector<float> whole = c.run({n});
      CHECK(same_bits(whole, c.run(std::vector<size_t>(n, 1))));
      CHECK(same_bits(whole, c.run(uneven_chunks(n))));
    }
  }
}

TEST_CASE("GQA attention: the thread count and the kernel path change no bit") {
  const int saved_threads = omp_get_max_threads();
  const KernelPath saved_path = active_kernel_path();
  for (size_t n : {size_t{17}, size_t{300}}) {
    CAPTURE(n);
    const GqaCase c(n, 6, 2, 64);
    omp_set_num_threads(1);
    set_kernel_path(KernelPath::kPortable);
    const std::vector<float> reference = c.run({n});
    omp_set_num_threads(2);
    CHECK(same_bits(reference, c.run({n})));
    CHECK(same_bits(reference, c.run(std::vector<size_t>(n, 1))));
    if (cpu_supports_avx2()) {
      set_kernel_path(KernelPath::kAvx2);
      CHECK(same_bits(reference, c.run({n})));
      omp_set_num_threads(1);
      CHECK(same_bits(reference, c.run(uneven_chunks(n))));
    }
  }
  omp_set_num_threads(saved_threads);
  set_kernel_path(saved_path);
}

TEST_CASE("GQA attention is softmax attention: within 1e-5 of a double-precision reference") {
  for (size_t n : kLengths) {
    CAPTURE(n);
    const GqaCase c(n, 4, 2, 64);
    const std::vector<float> got = c.run({n});
    const size_t group = c.heads / c.kv_heads;
    double worst = 0;
    for (size_t r = 0; r < n; ++r) {
      for (size_t h = 0; h < c.heads; ++h) {
        const float* q = c.q.data() + (r * c.heads + h) * c.head_dim;
        const size_t off = (h / group) * c.head_dim;
        std::vector<double> p(r + 1);
        double max = -INFINITY, sum = 0;
        for (size_t t = 0; t <= r; ++t) {
          double s = 0;
          for (size_t d = 0; d < c.head_dim; ++d) s += static_cast<double>(q[d]) * c.cache.key(0, t)[off + d];
          p[t] = s / std::sqrt(static_cast<double>(c.head_dim));
          max = std::max(max, p[t]);
        }
        for (double& x : p) sum += (x = std::exp(x - max));
        for (size_t d = 0; d < c.head_dim; ++d) {
          double want = 0;
          for (size_t t = 0; t <= r; ++t) want += p[t] / sum * c.cache.value(0, t)[off + d];
          worst = std::max(worst, std::abs(want - got[(r * c.heads + h) * c.head_dim + d]));
        }
      }
    }
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("sliding-window attention with sinks: within 1e-5 of the reference; one key fewer or more fails it") {
  // Windows inside a tile, equal to it and across tiles; sinks large enough to take a
  // visible share of the softmax.
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  for (size_t n : {size_t{17}, size_t{100}}) {
    for (size_t window : {size_t{1}, size_t{5}, size_t{16}, size_t{37}}) {
      CAPTURE(n);
      CAPTURE(window);
      const GqaCase c(n, 4, 2, 20);
      CHECK(c.worst_error(c.run({n}, window), window) < 1e-5);
      const std::vector<float> got = c.run({n}, window, sinks.data());
      CHECK(c.worst_error(got, window, sinks.data()) < 1e-5);
      // The broken variants the fixture tests must catch differ here by far more (where
      // the window bites: some query sees more than window - 1 keys).
      if (window > 1 && window < n) CHECK(c.worst_error(got, window - 1, sinks.data()) > 1e-3);
      if (window < n) CHECK(c.worst_error(got, window + 1, sinks.data()) > 1e-3);
      CHECK(c.worst_error(got, window) > 1e-3);  // sinks dropped
    }
  }
  const GqaCase c(40, 4, 2, 20);
  CHECK(c.worst_error(c.run({40}, 0, sinks.data()), 0, sinks.data()) < 1e-5);  // sinks, no window
}

TEST_CASE("sliding-window attention with sinks: chunking, threads and kernel path change no bit") {
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, -3.0f};
  const int saved_threads = omp_get_max_threads();
  const KernelPath saved_path = active_kernel_path();
  for (size_t n : {size_t{17}, size_t{300}}) {
    for (size_t window : {size_t{4}, size_t{16}, size_t{40}}) {
      CAPTURE(n);
      CAPTURE(window);
      const GqaCase c(n, 6, 2, 64);
      omp_set_num_threads(1);
      set_kernel_path(KernelPath::kPortable);
      const std::vector<float> reference = c.run({n}, window, sinks.data());
      CHECK(same_bits(reference, c.run(std::vector<size_t>(n, 1), window, sinks.data())));
      omp_set_num_threads(2);
      CHECK(same_bits(reference, c.run(uneven_chunks(n), window, sinks.data())));
      if (cpu_supports_avx2()) {
        set_kernel_path(KernelPath::kAvx2);
        CHECK(same_bits(reference, c.run({n}, window, sinks.data())));
        CHECK(same_bits(reference, c.run(uneven_chunks(n), window, sinks.data())));
      }
    }
  }
  omp_set_num_threads(saved_threads);
  set_kernel_path(saved_path);
}

TEST_CASE("sliding-window attention reads no position outside the window") {
  // Rows before the window answer nullptr: reading one would crash or poison the output.
  struct WindowRows final : KvRows {
    size_t first = 0, dim = 8;
    std::vector<float> rows = random_floats(64 * 8, 3);
    const float* key(size_t, size_t pos) const override { return pos < first ? nullptr : rows.data() + pos * dim; }
    const float* value(size_t, size_t pos) const override { return pos < first ? nullptr : rows.data() + pos * dim; }
  } kv;
  AttentionShape shape;
  shape.num_heads = shape.num_kv_heads = 1;
  shape.key_dim = shape.value_dim = 8;
  shape.sliding_window = 6;
  const std::vector<float> q = random_floats(3 * 8, 4);
  std::vector<float> out(3 * 8, NAN);
  kv.first = 40 - 6 + 1;  // the first query, at 40, attends 35..40
  causal_attention(q.data(), 3, 40, shape, kv, out.data());
  for (float x : out) CHECK(std::isfinite(x));
}

TEST_CASE("attention_exp is exp within 2 ulp on [-87, 0], 0 below and at -inf") {
  double worst_ulp = 0;
  for (float x = -87.0f; x <= 0.0f; x += 0.0137f) {
    const double want = std::exp(static_cast<double>(x));
    const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    worst_ulp = std::max(worst_ulp, std::abs(attention_exp(x) - want) / ulp);
  }
  CHECK(worst_ulp <= 2.0);
  CHECK(attention_exp(0.0f) == 1.0f);
  CHECK(attention_exp(-90.0f) == 0.0f);
  CHECK(attention_exp(-INFINITY) == 0.0f);
}

TEST_CASE("causal_attention refuses KV heads that do not divide the query heads") {
  struct NoRows final : KvRows {
    const float* key(size_t, size_t) const override { return nullptr; }
    const float* value(size_t, size_t) const override { return nullptr; }
  } rows;
  AttentionShape shape;
  shape.num_heads = 6;
  shape.num_kv_heads = 4;
  shape.key_dim = shape.value_dim = 8;
  float q[48] = {}, out[48] = {};
  CHECK_THROWS_WITH(causal_attention(q, 1, 0, shape, rows, out), doctest::Contains("6 query heads over 4 KV heads"));
}

// MLA through the deepseek-v3-tiny fixture's first attention layer (kv_lora 32, rope 8,
// 4 heads): the whole attention block, so the absorbed queries and the latent cache are
// the real ones.
TEST_CASE("MLA attention: one call, one row at a time, uneven chunks and thread counts give the same bits") {
  const std::filesystem::path dir = std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/models/deepseek-v3-tiny";
  const auto ckpt = Checkpoint::open(dir);
  const ModelConfig config =
      ModelConfig::parse(ckpt->config_json(), (dir / "config.json").string(), checkpoint_families());
  const MlaAttention attention = MlaAttention::load(*ckpt, "model.layers.0.self_attn", config);
  const Rope rope(config.qk_rope_head_dim, config.rope_theta, RopeLayout::kInterleaved);
  const size_t hidden = config.hidden_size;
  const int saved_threads = omp_get_max_threads();
  for (size_t n : kLengths) {
    CAPTURE(n);
    const std::vector<float> x = random_floats(n * hidden, static_cast<unsigned>(n));
    auto run = [&](const std::vector<size_t>& chunks) {
      KvCache cache(1, n, MlaAttention::cache_row_dim(config), 0);
      std::vector<float> out(n * hidden);
      size_t pos = 0;
      for (size_t rows : chunks) {
        const SequenceRows seq{0, rows, pos, &cache};
        attention(rope, x.data() + pos * hidden, rows, {&seq, 1}, 0, out.data() + pos * hidden);
        pos += rows;
      }
      return out;
    };
    const std::vector<float> whole = run({n});
    CHECK(same_bits(whole, run(std::vector<size_t>(n, 1))));
    CHECK(same_bits(whole, run(uneven_chunks(n))));
    omp_set_num_threads(1);
    CHECK(same_bits(whole, run({n})));
    omp_set_num_threads(saved_threads);
  }
}
