// matmul_q8_tile of common/matmul_q8.h: the activation quantisers (Q8_0, Q8_1, Q8_K), the
// portable row dots (the reference semantics), and the tile loop both paths share.
#include "common/matmul_q8.h"

#include <atomic>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/dtype.h"
#include "common/error.h"
#include "common/ggml_dequantize_detail.h"
#include "common/matmul_q8_detail.h"

namespace charm {
namespace {

std::atomic<int> g_mode{static_cast<int>(ActivationMode::kF32)};
/// The Q8Form in use; -1 until first asked (then the fastest the CPU has).
std::atomic<int> g_form{-1};

constexpr int64_t kQ80 = 32;   // Q8_0 / Q4_0 block
constexpr int64_t kQK = 256;   // K-quant super-block

float load_f16(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return f16_to_f32(bits);
}

/// A block holding a NaN or Inf: quants and sums 0, scale NaN, so that every product
/// with it is NaN (the exact path gives NaN or Inf there; a quant cannot hold either).
void poison(int8_t* qs, float* d, int16_t* sums, int64_t elements, int nsums) {
  std::memset(qs, 0, static_cast<size_t>(elements));
  *d = std::numeric_limits<float>::quiet_NaN();
  for (int j = 0; j < nsums; ++j) sums[j] = 0;
}

/// One row as Q8_0 blocks (quantize_row_q8_0_ref), plus each block's sum of quants; with
/// `s` also Q8_1's s = f16(d * sum) (quantize_row_q8_1_ref, the same d and quants; the
/// unrounded d). The AVX2 helpers on kAvx2 (the same bits).
void quantize_q8_0(KernelPath path, const float* x, int64_t cols, int8_t* qs, float* d, int16_t* sums, float* s) {
#if defined(__x86_64__) || defined(__i386__)
  const bool avx2 = path == KernelPath::kAvx2;
#else
  const bool avx2 = false;
  (void)path;
#endif
  for (int64_t b = 0; b < cols / kQ80; ++b) {
    const float* xb = x + b * kQ80;
    float amax = 0.0f;
    bool finite = true;
    if (avx2) {
      finite = abs_max_avx2(xb, kQ80, &amax);
    } else {
      for (int j = 0; j < kQ80; ++j) {
        amax = std::fmax(amax, std::fabs(xb[j]));
        finite = finite && std::isfinite(xb[j]);
      }
    }
    if (!finite) {  // a NaN / Inf activation: the block's products are NaN, as in f32
      poison(qs + b * kQ80, d + b, sums + b, kQ80, 1);
      if (s) s[b] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const float dd = amax / 127.0f;
    d[b] = f16_to_f32(f32_to_f16(dd));  // the block stores d as f16; the dot reads it back
    // A d that rounds to f16 zero makes the block's products zero whatever its quants, and
    // 1 / dd may overflow there (amax below 2^-120): quants 0, not an Inf cast to int8.
    const float id = d[b] != 0.0f ? 1.0f / dd : 0.0f;
    int32_t sum = 0;
    if (avx2) {
      sum = quantize_q8_0_block_avx2(xb, id, qs + b * kQ80);
    } else {
      for (int j = 0; j < kQ80; ++j) {
        const auto q = static_cast<int8_t>(std::round(xb[j] * id));
        qs[b * kQ80 + j] = q;
        sum += q;
      }
    }
    sums[b] = static_cast<int16_t>(sum);
    if (s) s[b] = f16_to_f32(f32_to_f16(static_cast<float>(sum) * dd));
  }
}

/// One Q8_K block (quantize_row_q8_K_ref), the portable way.
Q8KBlock quantize_q8_k_block(const float* xb, int8_t* q, float* d, int16_t* sums) {
  float amax = 0.0f, max = 0.0f;
  bool finite = true;
  for (int j = 0; j < kQK; ++j) {
    const float ax = std::fabs(xb[j]);
    finite = finite && std::isfinite(xb[j]);
    if (ax > amax) {
      amax = ax;
      max = xb[j];
    }
  }
  if (!finite) return Q8KBlock::kNonFinite;
  // -127 / max overflows for a max below 2^-119 (ggml's nearest_int would then read an
  // Inf): such a block is taken as zeros.
  if (amax == 0.0f || !std::isfinite(-127.0f / max)) return Q8KBlock::kZero;
  const float iscale = -127.0f / max;
  for (int j = 0; j < kQK; ++j) {
    const float v = std::nearbyint(iscale * xb[j]);  // ggml's nearest_int: half to even
    q[j] = static_cast<int8_t>(v < 127.0f ? v : 127.0f);
  }
  for (int j = 0; j < 16; ++j) {
    int32_t sum = 0;
    for (int l = 0; l < 16; ++l) sum += q[16 * j + l];
    sums[j] = static_cast<int16_t>(sum);
  }
  *d = 1.0f / iscale;
  return Q8KBlock::kQuantised;
}

/// One row as Q8_K blocks: bsums per 16 into `sums`; the block quantiser of `path`.
void quantize_q8_k(KernelPath path, const float* x, int64_t cols, int8_t* qs, float* d, int16_t* sums) {
  for (int64_t b = 0; b < cols / kQK; ++b) {
    int8_t* q = qs + b * kQK;
    int16_t* s = sums + b * 16;
    Q8KBlock found;
#if defined(__x86_64__) || defined(__i386__)
    if (path == KernelPath::kAvx2) {
      found = quantize_q8_k_block_avx2(x + b * kQK, q, d + b, s);
    } else {
      found = quantize_q8_k_block(x + b * kQK, q, d + b, s);
    }
#else
    found = quantize_q8_k_block(x + b * kQK, q, d + b, s);
#endif
    if (found == Q8KBlock::kNonFinite) {
      poison(q, d + b, s, kQK, 16);
    } else if (found == Q8KBlock::kZero) {
      d[b] = 0.0f;
      std::memset(q, 0, kQK);
      for (int j = 0; j < 16; ++j) s[j] = 0;
    }
  }
}

// --- portable row dots (the reference semantics) ---------------------------------------

/// Q8_0 {f16 d; i8 qs[32]}.
float dot_q8_0(const uint8_t* w, const Q8Row& a) {
  return lane_sum(a.blocks, [&](int64_t b) {
    const uint8_t* wb = w + b * 34;
    const int8_t* ab = a.qs + b * kQ80;
    int32_t isum = 0;
    for (int j = 0; j < kQ80; ++j) isum += static_cast<int8_t>(wb[2 + j]) * ab[j];
    return (load_f16(wb) * a.d[b]) * static_cast<float>(isum);
  });
}

/// Q4_0 {f16 d; u8 qs[16]} (kMin false, against Q8_0: element j is lo(qs[j]) - 8, j + 16
/// is hi(qs[j]) - 8) and Q4_1 {f16 d, m; u8 qs[16]} (kMin, against Q8_1: the nibbles as
/// they are, plus the block's min times the activations' s)
/// (ggml_vec_dot_q4_0_q8_0_generic, ..._q4_1_q8_1_generic).
template <bool kMin>
float dot_q4(const uint8_t* w, const Q8Row& a) {
  constexpr int64_t kBytes = kMin ? 20 : 18;
  constexpr int kQs = kMin ? 4 : 2;
  return lane_sum(a.blocks, [&](int64_t b) {
    const uint8_t* wb = w + b * kBytes;
    const int8_t* ab = a.qs + b * kQ80;
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) isum += (wb[kQs + j] & 0x0F) * ab[j] + (wb[kQs + j] >> 4) * ab[j + 16];
    if constexpr (kMin) return (load_f16(wb) * a.d[b]) * static_cast<float>(isum) + load_f16(wb + 2) * a.s[b];
    isum -= 8 * a.sums[b];
    return (load_f16(wb) * a.d[b]) * static_cast<float>(isum);
  });
}

/// Q5_0 {f16 d; u8 qh[4]; u8 qs[16]} (kMin false, against Q8_0: quants minus 16) and Q5_1
/// {f16 d, m; u8 qh[4]; u8 qs[16]} (kMin, against Q8_1: plus m times s): element e's
/// fifth bit is bit e of qh (ggml_vec_dot_q5_0_q8_0_generic, ..._q5_1_q8_1_generic).
template <bool kMin>
float dot_q5(const uint8_t* w, const Q8Row& a) {
  constexpr int64_t kBytes = kMin ? 24 : 22;
  constexpr int kQh = kMin ? 4 : 2;
  return lane_sum(a.blocks, [&](int64_t b) {
    const uint8_t* wb = w + b * kBytes;
    const int8_t* ab = a.qs + b * kQ80;
    uint32_t qh;
    std::memcpy(&qh, wb + kQh, 4);
    const uint8_t* qs = wb + kQh + 4;
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += static_cast<int>((qs[j] & 0x0F) | ((qh >> j) & 1) << 4) * ab[j] +
              static_cast<int>((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) * ab[j + 16];
    }
    if constexpr (kMin) return (load_f16(wb) * a.d[b]) * static_cast<float>(isum) + load_f16(wb + 2) * a.s[b];
    isum -= 16 * a.sums[b];
    return (load_f16(wb) * a.d[b]) * static_cast<float>(isum);
  });
}

/// MXFP4 {u8 e; u8 qs[16]} against Q8_0: quants are kMxfp4Values of the nibbles, the
/// scale 2^(e - 128) (ggml_vec_dot_mxfp4_q8_0_generic).
float dot_mxfp4(const uint8_t* w, const Q8Row& a) {
  return lane_sum(a.blocks, [&](int64_t b) {
    const uint8_t* wb = w + b * 17;
    const int8_t* ab = a.qs + b * kQ80;
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) isum += kMxfp4Values[wb[1 + j] & 0x0F] * ab[j] + kMxfp4Values[wb[1 + j] >> 4] * ab[j + 16];
    return (e8m0_half_to_f32(wb[0]) * a.d[b]) * static_cast<float>(isum);
  });
}

/// Q4_K / Q5_K (kFifthBit): d, dmin, scales[12], [qh[32],] qs[128]; element 32 s + l of
/// sub-block s has quant (nibble s % 2 of qs[32 (s / 2) + l]) | bit s of qh[l] << 4.
template <bool kFifthBit>
float dot_q45_k(const uint8_t* w, const Q8Row& a) {
  constexpr int64_t kBytes = kFifthBit ? 176 : 144;
  return lane_sum(a.blocks, [&](int64_t b) {
    const uint8_t* wb = w + b * kBytes;
    const uint8_t* scales = wb + 4;
    const uint8_t* qh = wb + 16;
    const uint8_t* qs = wb + (kFifthBit ? 48 : 16);
    const int8_t* ab = a.qs + b * kQK;
    const int16_t* bsums = a.sums + b * 16;
    int32_t isum = 0, msum = 0;
    for (int s = 0; s < 8; ++s) {
      const ScaleMin sm = get_scale_min_k4(s, scales);
      int32_t sub = 0;
      for (int l = 0; l < 32; ++l) {
        int q = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0F;
        if constexpr (kFifthBit) q |= ((qh[l] >> s) & 1) << 4;
        sub += q * ab[32 * s + l];
      }
      isum += sm.scale * sub;
      msum += sm.min * (bsums[2 * s] + bsums[2 * s + 1]);
    }
    const float d = load_f16(wb) * a.d[b];
    const float dmin = load_f16(wb + 2) * a.d[b];
    return d * static_cast<float>(isum) - dmin * static_cast<float>(msum);
  });
}

/// Q2_K {u8 scales[16]; u8 qs[64]; f16 d, dmin}: element 16 s + l of sub-block s = 8 h +
/// 2 k + half has quant bits 2k..2k+1 of qs[32 h + 16 half + l], scale lo(scales[s]) and
/// min hi(scales[s]) (ggml_vec_dot_q2_K_q8_K_generic: the mins against the bsums).
float dot_q2_k(const uint8_t* w, const Q8Row& a) {
  return lane_sum(a.blocks, [&](int64_t b) {
    const uint8_t* wb = w + b * 84;
    const int8_t* ab = a.qs + b * kQK;
    const int16_t* bsums = a.sums + b * 16;
    int32_t isum = 0, msum = 0;
    for (int s = 0; s < 16; ++s) {
      const uint8_t* q = wb + 16 + 32 * (s / 8) + 16 * (s % 2);
      const int shift = 2 * ((s % 8) / 2);
      int32_t sub = 0;
      for (int l = 0; l < 16; ++l) sub += ((q[l] >> shift) & 3) * ab[16 * s + l];
      isum += (wb[s] & 0x0F) * sub;
      msum += (wb[s] >> 4) * bsums[s];
    }
    const float d = load_f16(wb + 80) * a.d[b];
    const float dmin = load_f16(wb + 82) * a.d[b];
    return d * static_cast<float>(isum) - dmin * static_cast<float>(msum);
  });
}

/// Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: element 16 s + l of sub-block s =
/// 8 h + 2 k + half has quant bits 2k..2k+1 of qs[32 h + 16 half + l], minus 4 unless bit
/// 4 h + k of hmask[16 half + l] is set, and scale q3_k_scale(s) (common/ggml_dequantize.cpp
/// q3_k; ggml_vec_dot_q3_K_q8_K_generic takes the same exact integers).
float dot_q3_k(const uint8_t* w, const Q8Row& a) {
  return lane_sum(a.blocks, [&](int64_t b) {
    const uint8_t* wb = w + b * 110;
    const uint8_t* scales = wb + 96;
    const int8_t* ab = a.qs + b * kQK;
    int32_t isum = 0;
    for (int s = 0; s < 16; ++s) {
      const int h = s / 8, k = (s % 8) / 2, half = s % 2;
      const uint8_t* q = wb + 32 + 32 * h + 16 * half;
      const uint8_t* hm = wb + 16 * half;
      int32_t sub = 0;
      for (int l = 0; l < 16; ++l) {
        const int quant = ((q[l] >> (2 * k)) & 3) - (((hm[l] >> (4 * h + k)) & 1) ? 0 : 4);
        sub += quant * ab[16 * s + l];
      }
      isum += q3_k_scale(s, scales) * sub;
    }
    return (load_f16(wb + 108) * a.d[b]) * static_cast<float>(isum);
  });
}

/// Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: element 128 h + 32 c + 16 half + l
/// has quant (nibble c / 2 of ql[64 h + 32 (c % 2) + 16 half + l]) | (bits 2c of
/// qh[32 h + 16 half + l]) << 4, minus 32, and scale scales[8 h + 2 c + half].
float dot_q6_k(const uint8_t* w, const Q8Row& a) {
  return lane_sum(a.blocks, [&](int64_t b) {
    const uint8_t* wb = w + b * 210;
    const auto* scales = reinterpret_cast<const int8_t*>(wb + 192);
    const int8_t* ab = a.qs + b * kQK;
    const int16_t* bsums = a.sums + b * 16;
    int32_t isum = 0;
    for (int h = 0; h < 2; ++h) {
      for (int c = 0; c < 4; ++c) {
        for (int half = 0; half < 2; ++half) {
          const uint8_t* lo = wb + 64 * h + 32 * (c % 2) + 16 * half;
          const uint8_t* hi = wb + 128 + 32 * h + 16 * half;
          const int8_t* as = ab + 128 * h + 32 * c + 16 * half;
          int32_t sub = 0;
          for (int l = 0; l < 16; ++l) sub += (((lo[l] >> (4 * (c / 2))) & 0x0F) | (((hi[l] >> (2 * c)) & 3) << 4)) * as[l];
          const int sb = 8 * h + 2 * c + half;
          isum += scales[sb] * (sub - 32 * bsums[sb]);
        }
      }
    }
    return (load_f16(wb + 208) * a.d[b]) * static_cast<float>(isum);
  });
}

/// Which activation blocks a weight type takes (ggml's vec_dot_type): Q8_1 is Q8_0 plus
/// each block's s.
enum class Q8Kind { kQ8_0, kQ8_K, kQ8_1 };

Q8RowDot portable_dot(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0: return dot_q8_0;
    case GgmlType::kQ4_0: return dot_q4<false>;
    case GgmlType::kQ4_1: return dot_q4<true>;
    case GgmlType::kQ5_0: return dot_q5<false>;
    case GgmlType::kQ5_1: return dot_q5<true>;
    case GgmlType::kMXFP4: return dot_mxfp4;
    case GgmlType::kQ2_K: return dot_q2_k;
    case GgmlType::kQ3_K: return dot_q3_k;
    case GgmlType::kQ4_K: return dot_q45_k<false>;
    case GgmlType::kQ5_K: return dot_q45_k<true>;
    case GgmlType::kQ6_K: return dot_q6_k;
    default: return nullptr;
  }
}

Q8Kind kind_for(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1: return Q8Kind::kQ8_1;
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: return Q8Kind::kQ8_K;
    default: return Q8Kind::kQ8_0;
  }
}

/// This thread's quantised activation rows, with a copy of the f32 rows they came from:
/// a later tile of the same product (same bits in x) reuses them instead of quantising
/// again. Comparing the bits, not the pointer, keeps a reused buffer from ever meeting a
/// stale quantisation.
struct ActivationCache {
  std::vector<float> x;
  Q8Activations q;
  KernelPath path = KernelPath::kPortable;  ///< whose quantiser made q (all give the same
                                            ///< bits; keyed so that tests see each one work)
  bool valid = false;

  const Q8Activations& prepare(KernelPath p, const MatrixView& w, const float* src, size_t n) {
    const size_t elements = n * static_cast<size_t>(w.shape.cols);
    if (valid && path == p && q.type_kind == static_cast<int>(kind_for(w.shape.ggml_type)) && q.cols == w.shape.cols &&
        q.rows == n && std::memcmp(x.data(), src, elements * 4) == 0) {
      return q;
    }
    valid = false;
    x.assign(src, src + elements);
    quantize_activations(p, w, src, n, q);
    path = p;
    valid = true;
    return q;
  }
};

Q8Row row_of(const Q8Activations& q, size_t r) {
  const bool k_blocks = q.type_kind == static_cast<int>(Q8Kind::kQ8_K);
  const auto per_row = static_cast<size_t>(q.cols / (k_blocks ? kQK : kQ80));
  const size_t sums_per_row = k_blocks ? per_row * 16 : per_row;
  return Q8Row{q.qs.data() + r * static_cast<size_t>(q.cols), q.d.data() + r * per_row, q.sums.data() + r * sums_per_row,
               static_cast<int64_t>(per_row), q.s.empty() ? nullptr : q.s.data() + r * per_row};
}

/// Activation rows from which the eight-row GEMM takes over from rows_dot: building its
/// panel costs a few rows' products (one core, [256 x 2048] from cache, min TSC ticks:
/// Q4_K breaks even at 5 rows, Q8_0 at 4, Q6_K at 8).
constexpr size_t kGemm8MinRows = 8;

/// Outputs [o0, o1) (a multiple of eight rows) of the product with the prepared rows `a`
/// through a Q8Gemm8, eight weight rows at a time; the panel in this thread's scratch.
void gemm8_tile(Q8Gemm8 gemm8, const MatrixView& w, const Q8Activations& a, uint64_t row_bytes, const float* bias,
                float* y, int64_t o0, int64_t o1) {
  thread_local std::vector<uint8_t> scratch;
  thread_local std::vector<Q8Row> rows;
  scratch.resize(static_cast<size_t>(w.shape.cols) * kPanel8BytesPerColumn + 32);
  auto* panel = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(scratch.data()) + 31) & ~uintptr_t{31});
  rows.resize(a.rows);
  for (size_t r = 0; r < a.rows; ++r) rows[r] = row_of(a, r);
  const auto out = static_cast<size_t>(w.shape.rows);
  for (int64_t o = o0; o < o1; o += 8) {
    gemm8(w.data + static_cast<uint64_t>(o) * row_bytes, row_bytes, rows.data(), a.rows, bias ? bias + o : nullptr,
          y + o, out, panel);
  }
}

}  // namespace

const char* activation_mode_name(ActivationMode mode) { return mode == ActivationMode::kQ8 ? "q8" : "f32"; }

ActivationMode parse_activation_mode(std::string_view value, std::string_view what) {
  if (value == "f32") return ActivationMode::kF32;
  if (value == "q8") return ActivationMode::kQ8;
  fail_invalid(std::string(what) + ": expected 'f32' or 'q8', got '" + std::string(value) + "'");
}

ActivationMode active_activation_mode() { return static_cast<ActivationMode>(g_mode.load(std::memory_order_relaxed)); }

void set_activation_mode(ActivationMode mode) { g_mode.store(static_cast<int>(mode), std::memory_order_relaxed); }

void start_activation_mode(ActivationMode mode, std::string_view who) {
  set_activation_mode(mode);
  if (mode == ActivationMode::kQ8) {
    spdlog::warn("{}: activations: q8 is lossy: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K and MXFP4 weights "
                 "multiply activations rounded to 8 bits (llama.cpp's Q8_0 / Q8_1 / Q8_K), so logits differ from the "
                 "exact default (activations: f32); other weights keep the exact path",
                 who);
  }
}

const char* q8_form_name(Q8Form form) {
  switch (form) {
    case Q8Form::kAvxVnni: return "avx-vnni";
    case Q8Form::kAvx512Vnni: return "avx512-vnni";
    default: return "maddubs";
  }
}

bool cpu_supports_q8_form(Q8Form form) {
#if defined(__x86_64__) || defined(__i386__)
  if (!cpu_supports_avx2()) return false;
  switch (form) {
    case Q8Form::kMaddubs: return true;
    case Q8Form::kAvxVnni: {
      // CPUID leaf 7 sub-leaf 1, EAX bit 4 (Intel SDM: AVX-VNNI); its VEX form needs only
      // the ymm state AVX2 already needs.
      unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
      return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1u << 4)) != 0;
    }
    case Q8Form::kAvx512Vnni:  // libgcc's checks include the OS's AVX-512 register state (XCR0)
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512vnni");
  }
#else
  (void)form;
#endif
  return false;
}

Q8Form active_q8_form() {
  int form = g_form.load(std::memory_order_relaxed);
  if (form < 0) {
    Q8Form best = Q8Form::kMaddubs;
    for (Q8Form f : {Q8Form::kAvx512Vnni, Q8Form::kAvxVnni}) {
      if (cpu_supports_q8_form(f)) best = f;
    }
    form = static_cast<int>(best);
    g_form.store(form, std::memory_order_relaxed);
  }
  return static_cast<Q8Form>(form);
}

void set_q8_form(Q8Form form) {
  if (!cpu_supports_q8_form(form)) {
    fail_unsupported(std::string("the q8 kernels' ") + q8_form_name(form) + " form needs a CPU that has it");
  }
  g_form.store(static_cast<int>(form), std::memory_order_relaxed);
}

bool has_q8_kernel(GgmlType type) { return portable_dot(type) != nullptr; }

bool uses_q8(const MatrixView& w) {
  return w.shape.format == WeightFormat::kGgml && active_activation_mode() == ActivationMode::kQ8 &&
         has_q8_kernel(w.shape.ggml_type);
}

void quantize_activations(KernelPath path, const MatrixView& w, const float* x, size_t rows, Q8Activations& out) {
  const Q8Kind kind = kind_for(w.shape.ggml_type);
  const int64_t cols = w.shape.cols;
  const int64_t block = kind == Q8Kind::kQ8_K ? kQK : kQ80;
  if (cols % block != 0) {
    fail_invalid("quantize_activations: " + std::to_string(cols) + " columns are not whole blocks of " +
                 std::to_string(block));
  }
  const size_t elements = rows * static_cast<size_t>(cols);
  const size_t blocks = elements / static_cast<size_t>(block);
  out.qs.resize(elements);
  out.d.resize(blocks);
  out.sums.resize(kind == Q8Kind::kQ8_K ? blocks * 16 : blocks);
  out.s.resize(kind == Q8Kind::kQ8_1 ? blocks : 0);
  const auto per_row = static_cast<size_t>(cols / block);
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * static_cast<size_t>(cols);
    int8_t* q = out.qs.data() + r * static_cast<size_t>(cols);
    if (kind != Q8Kind::kQ8_K) {
      float* s = kind == Q8Kind::kQ8_1 ? out.s.data() + r * per_row : nullptr;
      quantize_q8_0(path, xr, cols, q, out.d.data() + r * per_row, out.sums.data() + r * per_row, s);
    } else {
      quantize_q8_k(path, xr, cols, q, out.d.data() + r * per_row, out.sums.data() + r * per_row * 16);
    }
  }
  out.type_kind = static_cast<int>(kind);
  out.cols = cols;
  out.rows = rows;
}

void matmul_q8_tile(KernelPath path, const MatrixView& w, const Q8Activations& a, const float* bias, float* y,
                    int64_t o0, int64_t o1) {
  const GgmlType type = w.shape.ggml_type;
  if (a.type_kind != static_cast<int>(kind_for(type)) || a.cols != w.shape.cols) {
    throw Error(ErrorCategory::kInternal, std::string("matmul_q8_tile: activations quantised for another type or width than ") +
                                              ggml_traits(type).name + " [" + std::to_string(w.shape.cols) + "]");
  }
  const Q8RowDot dot = portable_dot(type);
  if (!dot) throw Error(ErrorCategory::kInternal, std::string("matmul_q8: no kernel for ") + ggml_traits(type).name);
  Q8Kernels k;
#if defined(__x86_64__) || defined(__i386__)
  if (path == KernelPath::kAvx2) {
    switch (active_q8_form()) {
      case Q8Form::kAvxVnni: k = q8_kernels_avx_vnni(type); break;
      case Q8Form::kAvx512Vnni: k = q8_kernels_avx512_vnni(type); break;
      default: k = q8_kernels_avx2(type); break;
    }
  }
#endif
  const Q8RowsDot rows_dot = k.rows_dot;
  const Q8Gemv gemv = k.gemv;
  const size_t rows = a.rows;
  if (rows == 0 || o0 >= o1) return;
  const uint64_t row_bytes = *ggml_row_bytes(type, w.shape.cols);
  const auto out = static_cast<size_t>(w.shape.rows);
  if (rows == 1 && gemv) {  // decode: the GEMV prefetches the rows ahead
    gemv(w.data, row_bytes, row_of(a, 0), o0, o1, w.shape.rows, y + o0);
    if (bias) {
      for (int64_t o = o0; o < o1; ++o) y[o] += bias[o];
    }
    return;
  }
  if (k.gemm8 && rows >= kGemm8MinRows && o1 - o0 >= 8) {  // a GEMM eight weight rows at a time
    const int64_t end = o0 + (o1 - o0) / 8 * 8;
    gemm8_tile(k.gemm8, w, a, row_bytes, bias, y, o0, end);
    o0 = end;  // the last rows (fewer than eight) below
    if (o0 == o1) return;
  }
  if (rows_dot) {  // a GEMM: each weight block decoded once for up to kQ8MaxRows rows
    Q8Row ar[kQ8MaxRows];
    float v[kQ8MaxRows];
    for (size_t r0 = 0; r0 < rows; r0 += kQ8MaxRows) {
      const size_t n = rows - r0 < kQ8MaxRows ? rows - r0 : kQ8MaxRows;
      for (size_t r = 0; r < n; ++r) ar[r] = row_of(a, r0 + r);
      for (int64_t o = o0; o < o1; ++o) {
        rows_dot(w.data + static_cast<uint64_t>(o) * row_bytes, ar, n, v);
        for (size_t r = 0; r < n; ++r) y[(r0 + r) * out + static_cast<size_t>(o)] = bias ? v[r] + bias[o] : v[r];
      }
    }
    return;
  }
  for (int64_t o = o0; o < o1; ++o) {
    const uint8_t* wo = w.data + static_cast<uint64_t>(o) * row_bytes;
    for (size_t r = 0; r < rows; ++r) {
      const float v = dot(wo, row_of(a, r));
      y[r * out + static_cast<size_t>(o)] = bias ? v + bias[o] : v;
    }
  }
}

bool matmul_q8_tile(KernelPath path, const MatrixView& w, const float* x, size_t rows, const float* bias, float* y,
                    int64_t o0, int64_t o1) {
  if (w.shape.format != WeightFormat::kGgml || !has_q8_kernel(w.shape.ggml_type)) return false;
  if (rows == 0 || o0 >= o1) return true;
  thread_local ActivationCache cache;
  matmul_q8_tile(path, w, cache.prepare(path, w, x, rows), bias, y, o0, o1);
  return true;
}

}  // namespace charm
