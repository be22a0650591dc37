// common/fixed_point.h: the exactly associative combine of routed-expert outputs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/fixed_point.h"

using namespace charm;

TEST_CASE("to_fixed rounds t * 2^32 to nearest even; from_fixed rounds the sum once") {
  uint64_t sat = 0;
  CHECK(to_fixed(1.0f, sat) == int64_t{1} << 32);
  CHECK(to_fixed(-0.5f, sat) == -(int64_t{1} << 31));
  CHECK(to_fixed(0.0f, sat) == 0);
  CHECK(to_fixed(-0.0f, sat) == 0);
  // Ties to even: 2^-33 is half a unit (-> 0), 3 * 2^-33 is one and a half (-> 2).
  CHECK(to_fixed(std::ldexp(1.0f, -33), sat) == 0);
  CHECK(to_fixed(std::ldexp(3.0f, -33), sat) == 2);
  CHECK(to_fixed(std::ldexp(-3.0f, -33), sat) == -2);
  CHECK(to_fixed(std::ldexp(1.0f, -40), sat) == 0);  // below the resolution
  CHECK(sat == 0);
  CHECK(from_fixed(int64_t{3} << 31) == 1.5f);
  CHECK(from_fixed(-1) == -std::ldexp(1.0f, -32));
  // One rounding of the exact sum: 1 + 2^-30 (not representable in f32) rounds to 1.
  CHECK(from_fixed((int64_t{1} << 32) + 4) == 1.0f);
  // Every f32 with |t| in [2^-8, 2^23) round-trips exactly (its bits all fit).
  for (float t : {0.00390625f, 0.1f, -3.14159f, 1234.5678f, -8388607.0f}) CHECK(from_fixed(to_fixed(t, sat)) == t);
}

TEST_CASE("saturated terms are clamped to +-kFixedMaxTerm and counted; a full row cannot overflow") {
  uint64_t sat = 0;
  CHECK(to_fixed(8388607.0f, sat) < kFixedMaxTerm);  // 2^23 - 1: in range
  CHECK(sat == 0);
  CHECK(to_fixed(8388608.0f, sat) == kFixedMaxTerm);  // 2^23
  CHECK(to_fixed(-1e30f, sat) == -kFixedMaxTerm);
  CHECK(to_fixed(std::numeric_limits<float>::max(), sat) == kFixedMaxTerm);
  CHECK(sat == 3);
  int64_t sum = 0;
  for (uint32_t i = 0; i < kMaxTermsPerRow; ++i) sum = fixed_add(sum, kFixedMaxTerm);
  CHECK(sum == static_cast<int64_t>(kMaxTermsPerRow) * kFixedMaxTerm);
  CHECK(sum != kFixedNaN);
  int64_t neg = 0;
  for (uint32_t i = 0; i < kMaxTermsPerRow; ++i) neg = fixed_add(neg, -kFixedMaxTerm);
  CHECK(neg > kFixedNaN);  // the most negative sum still is not the marker
  CHECK(std::isfinite(from_fixed(neg)));
}

TEST_CASE("a non-finite term makes the sum NaN whatever else is in it and in any order") {
  uint64_t sat = 0;
  const float inf = std::numeric_limits<float>::infinity();
  for (float t : {std::numeric_limits<float>::quiet_NaN(), inf, -inf}) CHECK(to_fixed(t, sat) == kFixedNaN);
  CHECK(sat == 0);
  CHECK(std::isnan(from_fixed(kFixedNaN)));
  const std::vector<int64_t> terms = {5, kFixedNaN, -kFixedMaxTerm, kFixedMaxTerm, -7};
  int64_t fwd = 0, back = 0;
  for (int64_t t : terms) fwd = fixed_add(fwd, t);
  for (auto it = terms.rbegin(); it != terms.rend(); ++it) back = fixed_add(back, *it);
  CHECK(fwd == kFixedNaN);
  CHECK(back == kFixedNaN);
  CHECK(fixed_add(kFixedNaN, kFixedNaN) == kFixedNaN);
  // Through the row helpers too: 1e30 * 1e30 overflows f32 to Inf.
  std::vector<int64_t> acc(2, 0);
  const float y[] = {1e30f, 1.0f};
  add_weighted_term(y, 1e30f, 2, acc.data(), sat);
  CHECK(acc[0] == kFixedNaN);
  CHECK(acc[1] == kFixedMaxTerm);  // 1e30 saturates
  CHECK(sat == 1);
}

TEST_CASE("add_weighted_term gives to_fixed's bits for every magnitude, on both sides of its fast path") {
  // The fast path (every |t| < 2^19 in a call) rounds by adding 1.5 * 2^52; one term at
  // or past 2^19, or non-finite, sends the call to to_fixed. Both must agree with
  // to_fixed term by term: ties, tiny terms, the 2^19 edge, saturation.
  std::mt19937 rng(77);
  std::uniform_int_distribution<int> exponent(-60, 24);
  std::vector<float> y;
  for (int i = 0; i < 20000; ++i) {
    const float mantissa = 1.0f + static_cast<float>(rng() % 8388608) / 8388608.0f;
    y.push_back(std::ldexp((rng() & 1) ? -mantissa : mantissa, exponent(rng)));
  }
  for (float t : {std::ldexp(1.0f, -33), std::ldexp(3.0f, -33), std::ldexp(-5.0f, -33), std::ldexp(1.0f, 19),
                  std::nextafter(std::ldexp(1.0f, 19), 0.0f), -std::ldexp(1.0f, 19), 0.0f, -0.0f}) {
    y.push_back(t);
  }
  const float weights[] = {1.0f, 0.3f, -1.7f};
  for (float w : weights) {
    // One value per call (each takes the path its own magnitude picks), then runs of 64
    // (a run with one large value takes to_fixed for all of it).
    for (size_t n : {size_t{1}, size_t{64}}) {
      for (size_t at = 0; at + n <= y.size(); at += n) {
        std::vector<int64_t> got(n, 5), want(n, 5);
        uint64_t sat_got = 0, sat_want = 0;
        add_weighted_term(&y[at], w, n, got.data(), sat_got);
        for (size_t d = 0; d < n; ++d) want[d] = fixed_add(want[d], to_fixed(w * y[at + d], sat_want));
        REQUIRE(got == want);
        REQUIRE(sat_got == sat_want);
      }
    }
  }
  // An accumulator already NaN stays NaN on the fast path.
  std::vector<int64_t> acc = {kFixedNaN, 0};
  uint64_t sat = 0;
  const float small[] = {0.25f, 0.5f};
  add_weighted_term(small, 1.0f, 2, acc.data(), sat);
  CHECK(acc[0] == kFixedNaN);
  CHECK(acc[1] == int64_t{1} << 31);
}

TEST_CASE("split invariance: any split of a row's terms over 1..4 workers, in any order, gives the same bits") {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f), weight(0.0f, 1.0f);
  std::uniform_int_distribution<int> scale(-20, 8);
  const size_t rows = 5, hidden = 33, top_k = 8;
  // Outputs with magnitudes spread over 2^-20..2^8, so the terms are not all alike.
  std::vector<float> y(rows * top_k * hidden), w(rows * top_k);
  for (float& v : y) v = std::ldexp(value(rng), scale(rng));
  for (float& v : w) v = weight(rng);
  auto term_of = [&](size_t r, size_t k) { return y.data() + (r * top_k + k) * hidden; };
  std::vector<int64_t> want(rows * hidden, 0);
  uint64_t sat = 0;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t k = 0; k < top_k; ++k) add_weighted_term(term_of(r, k), w[r * top_k + k], hidden, &want[r * hidden], sat);
  }
  std::vector<float> want_f(want.size());
  for (size_t i = 0; i < want.size(); ++i) want_f[i] = from_fixed(want[i]);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t workers = 1 + trial % 4;
    // Each (row, rank) goes to a random worker, which sums its share in a random order.
    std::vector<std::vector<std::pair<size_t, size_t>>> share(workers);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t k = 0; k < top_k; ++k) share[rng() % workers].emplace_back(r, k);
    }
    std::vector<std::vector<int64_t>> partial(workers, std::vector<int64_t>(rows * hidden, 0));
    for (size_t v = 0; v < workers; ++v) {
      std::shuffle(share[v].begin(), share[v].end(), rng);
      for (auto [r, k] : share[v]) add_weighted_term(term_of(r, k), w[r * top_k + k], hidden, &partial[v][r * hidden], sat);
    }
    // The coordinator adds the partial rows as the replies arrive: a random order too.
    std::vector<size_t> order(workers);
    for (size_t v = 0; v < workers; ++v) order[v] = v;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int64_t> got(rows * hidden, 0);
    for (size_t v : order) add_fixed_rows(got.data(), partial[v].data(), got.size());
    REQUIRE(got == want);
    std::vector<float> got_f(got.size());
    for (size_t i = 0; i < got.size(); ++i) got_f[i] = from_fixed(got[i]);
    REQUIRE(std::memcmp(got_f.data(), want_f.data(), got_f.size() * sizeof(float)) == 0);
  }
  CHECK(sat == 0);
  // And it is close to the f64 sum: within the rounding of each term plus one f32 rounding.
  for (size_t r = 0; r < rows; ++r) {
    for (size_t d = 0; d < hidden; ++d) {
      double exact = 0;
      for (size_t k = 0; k < top_k; ++k) exact += double(w[r * top_k + k] * term_of(r, k)[d]);
      const double tol = top_k * std::ldexp(1.0, -33) + std::abs(exact) * std::ldexp(1.0, -24);
      CHECK(std::abs(double(want_f[r * hidden + d]) - exact) <= tol);
    }
  }
}

TEST_CASE("first_out_of_range bounds a received partial sum by its number of terms") {
  const std::vector<int64_t> ok = {0, kFixedMaxTerm, -kFixedMaxTerm, kFixedNaN};
  CHECK(first_out_of_range(ok.data(), ok.size(), 1) == ok.size());
  const std::vector<int64_t> two = {2 * kFixedMaxTerm, 0};
  CHECK(first_out_of_range(two.data(), two.size(), 1) == 0);
  CHECK(first_out_of_range(two.data(), two.size(), 2) == two.size());
  const std::vector<int64_t> none = {0, 1};
  CHECK(first_out_of_range(none.data(), none.size(), 0) == 1);  // a row with no terms must be 0
  const std::vector<int64_t> huge = {std::numeric_limits<int64_t>::max()};
  CHECK(first_out_of_range(huge.data(), 1, 100000) == 0);  // never more than kMaxTermsPerRow terms
}
