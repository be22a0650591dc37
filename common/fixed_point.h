// The exactly associative form in which routed-expert outputs are summed: each
// router-weighted term t = w * y (one f32 multiply) becomes a 64-bit fixed-point integer
// with kFixedFractionBits fractional bits, and a position's terms are added as integers.
// Integer addition is associative and commutative, so the sum is the same integer however
// the terms are split over workers and in whatever order the partial sums are added; the
// coordinator turns it into one f32 with one rounding (from_fixed). The argument, the
// range and the two special cases are in docs/architecture.md ("Combining expert outputs").
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

namespace charm {

/// Fractional bits of a fixed-point term: resolution 2^-32 (about 2.3e-10).
constexpr int kFixedFractionBits = 32;

/// Most terms one position may sum (top_k, plus nothing else): 8 bits of headroom.
constexpr uint32_t kMaxTermsPerRow = 256;

/// Largest |term| in fixed-point units: 2^55 - 1, i.e. |t| < 2^23 (8388608). With
/// kMaxTermsPerRow terms a sum stays within +-(2^63 - 256): no int64 overflow, and never
/// kFixedNaN.
constexpr int64_t kFixedMaxTerm = (int64_t{1} << 55) - 1;

/// The non-finite marker: a term whose t is NaN or +-Inf. Absorbing under fixed_add, so a
/// sum with any such term is kFixedNaN whatever the order, and from_fixed makes it NaN.
constexpr int64_t kFixedNaN = std::numeric_limits<int64_t>::min();

/// t as a fixed-point term: round-to-nearest-even of t * 2^32 in the default rounding
/// mode (exact in double: a float has 24 significant bits); kFixedNaN for NaN or Inf;
/// +-kFixedMaxTerm, counted in `saturated`, when |t| * 2^32 exceeds kFixedMaxTerm. Pure
/// but for `saturated`.
int64_t to_fixed(float t, uint64_t& saturated);

/// a + b, except that kFixedNaN absorbs. REQUIRES: the finite operands are sums of at
/// most kMaxTermsPerRow terms altogether (no overflow). Associative and commutative.
inline int64_t fixed_add(int64_t a, int64_t b) { return (a == kFixedNaN || b == kFixedNaN) ? kFixedNaN : a + b; }

/// The f32 nearest a sum (one rounding of the exact value), NaN for kFixedNaN.
float from_fixed(int64_t sum);

/// acc[d] = fixed_add(acc[d], to_fixed(weight * y[d])) for d < n: one position's share of
/// one expert. y: [n] f32 unweighted expert output; acc: [n] int64 fixed point.
void add_weighted_term(const float* y, float weight, size_t n, int64_t* acc, uint64_t& saturated);

/// dst[d] = fixed_add(dst[d], src[d]) for d < n: a partial sum added to another.
void add_fixed_rows(int64_t* dst, const int64_t* src, size_t n);

/// Checks a received partial sum of `terms` terms: each value is kFixedNaN or within
/// +-terms * kFixedMaxTerm (so adding it to the other workers' parts cannot overflow).
/// Returns the index of the first value out of range, or n when all are in range.
size_t first_out_of_range(const int64_t* sums, size_t n, uint32_t terms);

/// Logs once per process a warning that `count` terms (more may follow) were saturated
/// at +-2^23 while combining expert outputs on `where` ("layer 3"), naming the range.
void warn_saturated_once(uint64_t count, const std::string& where);

}  // namespace charm
