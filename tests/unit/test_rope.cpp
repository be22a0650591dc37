// RoPE variants (coordinator/models/blocks.h Rope, coordinator/models/rope_scaling.h): YaRN frequencies
// and attention factor against transformers' _compute_yarn_parameters, DeepSeek-V3's
// softmax-scale correction, and the interleaved layout against its definition.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "coordinator/models/blocks.h"
#include "coordinator/models/rope_scaling.h"

using namespace charm;

namespace {

// Produced by transformers 5.24 (python3, CPU):
//   c = DeepseekV3Config(rope_scaling={...}, rope_theta=10000.0, ...)
//   inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](c)
// for deepseek-ai/DeepSeek-V3's rope_scaling (factor 40, original 4096, beta 32/1,
// mscale 1, mscale_all_dim 1, dim 64) and for the deepseek-v3-tiny fixture's (factor 4,
// original 64, mscale 1, mscale_all_dim 0.8, dim 8).
const std::vector<float> kDeepseekV3InvFreq = {
    1.0f, 0.749894202f, 0.562341332f, 0.421696514f, 0.316227764f, 0.237137362f, 0.177827939f, 0.133352146f,
    0.100000001f, 0.0749894157f, 0.0562341288f, 0.0390069261f, 0.0268793609f, 0.0183781441f, 0.012447956f,
    0.0083345091f, 0.00550000044f, 0.00356199732f, 0.00224936521f, 0.00137051346f, 0.000790569407f,
    0.000414990413f, 0.00017782794f, 3.3338034e-05f, 2.49999994e-05f, 1.87473543e-05f, 1.40585325e-05f,
    1.05424124e-05f, 7.90569447e-06f, 5.92843435e-06f, 4.44569832e-06f, 3.33380353e-06f};
const std::vector<float> kTinyInvFreq = {1.0f, 0.0625f, 0.00249999994f, 0.000250000012f};
constexpr double kTinyAttentionFactor = 1.0249579607969668;

void check_close(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-6));
  }
}

}  // namespace

TEST_CASE("YaRN frequencies and attention factor match transformers for DeepSeek-V3 and the tiny fixture") {
  YarnRopeScaling v3;
  v3.factor = 40;
  v3.original_max_position_embeddings = 4096;
  v3.mscale = 1.0;
  v3.mscale_all_dim = 1.0;
  const YarnFrequencies big = yarn_frequencies(64, 10000.0, v3);
  check_close(big.inv_freq, kDeepseekV3InvFreq);
  CHECK(big.attention_factor == 1.0);  // mscale == mscale_all_dim

  YarnRopeScaling tiny;
  tiny.factor = 4;
  tiny.original_max_position_embeddings = 64;
  tiny.mscale = 1.0;
  tiny.mscale_all_dim = 0.8;
  const YarnFrequencies small = yarn_frequencies(8, 10000.0, tiny);
  check_close(small.inv_freq, kTinyInvFreq);
  CHECK(small.attention_factor == doctest::Approx(kTinyAttentionFactor).epsilon(1e-12));

  tiny.attention_factor = 0.5;  // an explicit attention_factor wins
  CHECK(yarn_frequencies(8, 10000.0, tiny).attention_factor == 0.5);
}

TEST_CASE("DeepSeek-V3's softmax scale grows by yarn_get_mscale(factor, mscale_all_dim)^2") {
  ModelConfig c;
  CHECK(yarn_softmax_scale_factor(c) == 1.0);  // no YaRN
  c.yarn = YarnRopeScaling{};
  c.yarn->factor = 40;
  c.yarn->mscale_all_dim = 1.0;
  const double m = 0.1 * std::log(40.0) + 1.0;
  CHECK(yarn_softmax_scale_factor(c) == doctest::Approx(m * m).epsilon(1e-15));
  c.yarn->mscale_all_dim = 0;  // absent: no correction
  CHECK(yarn_softmax_scale_factor(c) == 1.0);
  CHECK(yarn_get_mscale(1.0, 1.0) == 1.0);  // factor <= 1: no scaling
}

TEST_CASE("the interleaved layout rotates pairs (2i, 2i+1) and writes them de-interleaved") {
  const std::vector<float> inv_freq = {0.5f, 0.25f};
  const float factor = 1.25f;
  const Rope interleaved(inv_freq, factor, RopeLayout::kInterleaved);
  const Rope halves(inv_freq, factor, RopeLayout::kHalves);
  const std::vector<float> x = {1.0f, -2.0f, 0.5f, 3.0f};  // pairs (1, -2) and (0.5, 3)
  for (size_t pos : {0u, 3u}) {
    CAPTURE(pos);
    std::vector<float> a = x;
    interleaved.apply(a.data(), 1, 1, pos);
    // Definition (apply_rotary_pos_emb_interleave): out[i] = x[2i] cos - x[2i+1] sin,
    // out[i + 2] = x[2i+1] cos + x[2i] sin, with cos/sin scaled by the attention factor.
    for (size_t i = 0; i < 2; ++i) {
      const float angle = static_cast<float>(pos) * inv_freq[i];
      const float c = std::cos(angle) * factor, s = std::sin(angle) * factor;
      CHECK(a[i] == x[2 * i] * c - x[2 * i + 1] * s);
      CHECK(a[i + 2] == x[2 * i + 1] * c + x[2 * i] * s);
    }
    // The same as the halves layout on the de-interleaved input.
    std::vector<float> b = {x[0], x[2], x[1], x[3]};
    halves.apply(b.data(), 1, 1, pos);
    CHECK(a == b);
  }
}

// --- Kimi K2 and GLM-4.5 (issue 16) ------------------------------------------------------------

// transformers 5.24: ROPE_INIT_FUNCTIONS["yarn"](DeepseekV3Config(...)) for Kimi K2's
// rope_scaling (factor 32, original 4096, beta_fast = beta_slow = 1, mscale 1,
// mscale_all_dim 1), rope_theta 50000, dim 64. With beta_fast == beta_slow the correction
// range is one dim wide (floor / ceil of the same value): the ramp jumps from
// extrapolation to interpolation between pairs 19 and 20.
TEST_CASE("YaRN frequencies match transformers for Kimi K2's beta_fast = beta_slow = 1") {
  const std::vector<float> want = {
      1.0f, 0.713111103f, 0.508527458f, 0.362636536f, 0.258600146f, 0.184410617f, 0.131505266f, 0.0937778577f,
      0.0668740347f, 0.0476886146f, 0.0340072773f, 0.0242509674f, 0.0172936339f, 0.0123322811f, 0.00879428629f,
      0.00627130363f, 0.00447213603f, 0.00318912975f, 0.00227420381f, 0.00162175996f, 3.61404673e-05f,
      2.57721676e-05f, 1.83784196e-05f, 1.31058541e-05f, 9.34593027e-06f, 6.66468623e-06f, 4.75266143e-06f,
      3.38917562e-06f, 2.41685871e-06f, 1.72348882e-06f, 1.22903896e-06f, 8.76441277e-07f};
  YarnRopeScaling yarn;
  yarn.factor = 32;
  yarn.original_max_position_embeddings = 4096;
  yarn.beta_fast = 1;
  yarn.beta_slow = 1;
  yarn.mscale = 1;
  yarn.mscale_all_dim = 1;
  const YarnFrequencies f = yarn_frequencies(64, 50000, yarn);
  check_close(f.inv_freq, want);
  CHECK(f.attention_factor == 1.0);  // mscale / mscale_all_dim
}

TEST_CASE("partial rotary turns the first dim() dims of each head and passes the rest") {
  // Heads of 8 dims, 4 rotated (GLM-4.5's partial_rotary_factor 0.5): the rotated part is
  // what a Rope over 4-dim heads gives, the other 4 dims are untouched.
  const Rope partial(4, 1e4);
  const size_t rows = 3, heads = 2, width = 8, pos0 = 5;
  std::vector<float> x(rows * heads * width), packed(rows * heads * 4);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i) + 0.1f);
  for (size_t h = 0; h < rows * heads; ++h) std::copy_n(x.begin() + h * width, 4, packed.begin() + h * 4);
  const std::vector<float> before = x;
  partial.apply(x.data(), rows, heads, pos0, width);
  partial.apply(packed.data(), rows, heads, pos0);
  for (size_t h = 0; h < rows * heads; ++h) {
    CAPTURE(h);
    for (size_t d = 0; d < 4; ++d) CHECK(x[h * width + d] == packed[h * 4 + d]);
    for (size_t d = 4; d < width; ++d) CHECK(x[h * width + d] == before[h * width + d]);
    if (h >= heads) CHECK(x[h * width] != before[h * width]);  // positions > 0 really turn
  }
}
