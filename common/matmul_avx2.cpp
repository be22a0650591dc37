#include "common/matmul_avx2.h"

#include <immintrin.h>

#include <cstring>

#include "common/dtype.h"
#include "common/ggml_decode_avx2.h"

// Everything from here on is compiled for AVX2 + FMA + F16C; matmul.cpp calls it only
// after cpuid said yes. The dot never fuses: the bit contract is a rounded multiply then
// a rounded add (common/kernels.h `dot`), and the whole project builds with
// -ffp-contract=off so that the compiler does not fuse them either (only the GGML
// decoders write an FMA, where the product is exact: common/ggml_decode_avx2.h). On AMD
// Zen a separate vmulps and vaddps issue to separate pipes, so this costs little there.
// The standard headers above are parsed before the pragma, so none of their inline
// functions is compiled for AVX2 and picked by the linker for a CPU without it.
#include "common/avx2_target_begin.inc"

namespace charm {
namespace {

/// The element forms the kernels widen in registers; kRowWise (block-scaled fp8, GGML
/// blocks) widens whole rows through matrix_row_to_f32 into the GEMM panel (GGML blocks
/// with a decoder in common/ggml_decode_avx2.h have a fused GEMV of their own, gemv_ggml).
enum class Form { kF32, kF16, kBF16, kI8, kI4, kRowWise };
/// Where a full chunk of 8 columns finds its scales: none (not quantised), one scale
/// for the chunk (group_size % 8 == 0), or one per lane (any other group_size: gather).
enum class Scale { kNone, kPerChunk, kPerLane };

/// One stored matrix, as the kernels read it.
struct Source {
  MatrixView view;
  uint64_t row_bytes = 0;
  int64_t cols = 0;
  int64_t group_size = 0;
  int64_t groups_per_row = 0;
  const int32_t* column_group = nullptr;

  const uint8_t* row(int64_t o) const { return view.data + static_cast<uint64_t>(o) * row_bytes; }
  const float* scales(int64_t o) const { return view.scales ? view.scales + o * groups_per_row : nullptr; }
};

/// Columns [i, i + 8) of a stored row as f32, before the group scale.
template <Form F>
inline __m256 load_raw(const uint8_t* row, int64_t i) {
  if constexpr (F == Form::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else if constexpr (F == Form::kBF16) {  // bf16 is the top half of an f32
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else if constexpr (F == Form::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
  } else if constexpr (F == Form::kI8) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + i));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
  } else {  // kI4: 4 bytes, low nibble first, each nibble q + 8 (i is a multiple of 8)
    // Lane k shifts the 4 bytes right by 4k and keeps a nibble; the nibble OR'd into
    // the bits of 2^23 is the float 2^23 + q + 8, and subtracting 2^23 + 8 leaves q
    // exactly. No shuffles: int4 GEMV is bound by this integer work, not by memory.
    uint32_t packed;
    std::memcpy(&packed, row + i / 2, sizeof packed);
    const __m256i shifted = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(packed)),
                                              _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    const __m256i nibbles = _mm256_and_si256(shifted, _mm256_set1_epi32(0x0f));
    const __m256 biased = _mm256_castsi256_ps(_mm256_or_si256(nibbles, _mm256_set1_epi32(0x4b000000)));
    return _mm256_sub_ps(biased, _mm256_set1_ps(8388616.0f));  // 2^23 + 8
  }
}

/// raw * the scales of columns [i, i + 8): float(q) * scale, one rounded product, as
/// matrix_row_to_f32. `group` is i / group_size (kPerChunk only).
template <Scale S>
inline __m256 apply_scales(const Source& s, __m256 raw, const float* scales, int64_t group, int64_t i) {
  if constexpr (S == Scale::kPerChunk) {
    return _mm256_mul_ps(raw, _mm256_set1_ps(scales[group]));
  } else if constexpr (S == Scale::kPerLane) {
    const __m256i lanes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.column_group + i));
    return _mm256_mul_ps(raw, _mm256_i32gather_ps(scales, lanes, 4));
  } else {
    return raw;
  }
}

/// Columns [i, i + 8) widened exactly as matrix_row_to_f32.
template <Form F, Scale S>
inline __m256 widen8(const Source& s, const uint8_t* row, const float* scales, int64_t group, int64_t i) {
  return apply_scales<S>(s, load_raw<F>(row, i), scales, group, i);
}

/// Column i of a stored row, widened as matrix_row_to_f32 does (the tails).
template <Form F>
inline float widen_one(const Source& s, const uint8_t* row, const float* scales, int64_t i) {
  if constexpr (F == Form::kF32) {
    float v;
    std::memcpy(&v, row + 4 * i, sizeof v);
    return v;
  } else if constexpr (F == Form::kBF16 || F == Form::kF16) {
    uint16_t bits;
    std::memcpy(&bits, row + 2 * i, sizeof bits);
    return F == Form::kBF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
  } else if constexpr (F == Form::kI8) {
    return static_cast<float>(static_cast<int8_t>(row[i])) * scales[i / s.group_size];
  } else {
    const int nibble = (i & 1) ? (row[i / 2] >> 4) : (row[i / 2] & 0x0f);
    return static_cast<float>(nibble - 8) * scales[i / s.group_size];
  }
}

/// dot's reduction of its 8 lane accumulators: ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)).
inline float reduce_lanes(__m256 acc) {
  const __m128 pairs = _mm_hadd_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 quads = _mm_hadd_ps(pairs, pairs);  // (a0+a1)+(a2+a3), (a4+a5)+(a6+a7), ..
  return _mm_cvtss_f32(quads) + _mm_cvtss_f32(_mm_shuffle_ps(quads, quads, 1));
}

/// dot's result (reduced lanes + tail), then + bias[o] when there is a bias.
inline float finish(__m256 acc, float tail, const float* bias, int64_t o) {
  const float v = reduce_lanes(acc) + tail;
  return bias ? v + bias[o] : v;
}

/// Tracks i / group_size over full chunks when group_size % 8 == 0, without dividing.
struct GroupCounter {
  int64_t chunks_per_group;
  int64_t group = 0, in_group = 0;
  void next() {
    if (++in_group == chunks_per_group) {
      in_group = 0;
      ++group;
    }
  }
};

/// Columns of a stored row in one 64-byte cache line.
template <Form F>
constexpr int64_t columns_per_line() {
  if constexpr (F == Form::kF32) return 16;
  if constexpr (F == Form::kI8) return 64;
  if constexpr (F == Form::kI4) return 128;
  return 32;  // f16, bf16
}

/// GEMV, decode: y[o + k] for k < N, widening N stored rows in registers per chunk of x
/// (N rows in flight hide the latency of streaming them from memory).
template <Form F, Scale S, int N>
void gemv_rows(const Source& s, const float* x, const float* bias, float* y, int64_t o) {
  const uint8_t* row[N];
  const float* scales[N];
  __m256 acc[N];
  for (int k = 0; k < N; ++k) {
    row[k] = s.row(o + k);
    scales[k] = s.scales(o + k);
    acc[k] = _mm256_setzero_ps();
  }
  const int64_t full = s.cols / 8 * 8;
  GroupCounter g{S == Scale::kPerChunk ? s.group_size / 8 : 1};
  // Software prefetch of the next N rows, a cache line at a time as this block reaches
  // the same column: the hardware prefetcher alone left a core at 3-6 G columns/s from
  // RAM; with this, about twice that (measured on the 2-core Zen 3 box).
  constexpr int64_t kLineColumns = columns_per_line<F>();
  const uint64_t ahead = N * s.row_bytes;
  for (int64_t i = 0; i < full; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    if (i % kLineColumns == 0) {
      const uint64_t at = ahead + static_cast<uint64_t>(i) * 64 / kLineColumns;
      for (int k = 0; k < N; ++k) _mm_prefetch(reinterpret_cast<const char*>(row[k] + at), _MM_HINT_T0);
    }
    for (int k = 0; k < N; ++k) {
      acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(xv, widen8<F, S>(s, row[k], scales[k], g.group, i)));
    }
    g.next();
  }
  for (int k = 0; k < N; ++k) {
    float tail = 0;
    for (int64_t i = full; i < s.cols; ++i) tail += x[i] * widen_one<F>(s, row[k], scales[k], i);
    y[o + k] = finish(acc[k], tail, bias, o + k);
  }
}

template <Form F, Scale S>
void gemv(const Source& s, const float* x, const float* bias, float* y, int64_t o0, int64_t o1) {
  int64_t o = o0;
  for (; o + 4 <= o1; o += 4) gemv_rows<F, S, 4>(s, x, bias, y, o);
  for (; o < o1; ++o) gemv_rows<F, S, 1>(s, x, bias, y, o);
}

/// The sink of a fused GGML GEMV: acc += x[8 j, 8 j + 8) * v, dot's rounded multiply
/// then rounded add, lane by lane. `x` points at the block's first column.
struct DotSink {
  const float* x;
  __m256 acc;
  void operator()(int j, __m256 v) { acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), v)); }
};

/// GEMV of GGML blocks, decode: y[o + k] for k < N. Each block is widened in registers
/// by type B's decoder (common/ggml_decode_avx2.h: the instructions of dequantize_row's
/// AVX2 path, so the values of matrix_row_to_f32) and multiply-added into each row's 8
/// lane accumulators in column order: dot's order, as gemv_rows. The N rows advance one
/// chunk (32 or 64 elements) at a time, so that their N independent add chains overlap:
/// with a whole 256-element block per row, Q4_K ran at about 2/3 of this speed. A row is whole
/// blocks, so there is no tail; dot still adds its zero tail, and so does finish.
template <class B, int N>
void gemv_ggml_rows(const Source& s, const float* x, const float* bias, float* y, int64_t o) {
  const uint8_t* row[N];
  DotSink sink[N];
  for (int k = 0; k < N; ++k) {
    row[k] = s.row(o + k);
    sink[k] = DotSink{x, _mm256_setzero_ps()};
  }
  const int64_t blocks = s.cols / B::kElements;
  // Software prefetch of the next N rows, a line at a time as this block reaches it (as
  // gemv_rows; blocks are not line-aligned, hence the running line offset).
  const uint64_t ahead = N * s.row_bytes;
  uint64_t line = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint64_t at = static_cast<uint64_t>(b) * B::kBytes;
    for (; line < at + B::kBytes; line += 64) {
      for (int k = 0; k < N; ++k) _mm_prefetch(reinterpret_cast<const char*>(row[k] + ahead + line), _MM_HINT_T0);
    }
    typename B::Prep prep[N];
#pragma GCC unroll 4
    for (int k = 0; k < N; ++k) {
      sink[k].x = x + b * B::kElements;
      B::prepare(row[k] + at, prep[k]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < B::kChunks; ++c) {
#pragma GCC unroll 4
      for (int k = 0; k < N; ++k) B::chunk(row[k] + at, prep[k], c, sink[k]);
    }
  }
  for (int k = 0; k < N; ++k) y[o + k] = finish(sink[k].acc, 0.0f, bias, o + k);
}

template <class B>
void gemv_ggml(const Source& s, const float* x, const float* bias, float* y, int64_t o0, int64_t o1) {
  int64_t o = o0;
  for (; o + 4 <= o1; o += 4) gemv_ggml_rows<B, 4>(s, x, bias, y, o);
  for (; o < o1; ++o) gemv_ggml_rows<B, 1>(s, x, bias, y, o);
}

/// The fused GEMV for `type`'s blocks; false (nothing written) for a type without a
/// decoder in common/ggml_decode_avx2.h (F32 / F16 / BF16 / Q4_1 / Q5_0 / Q5_1 as GGML
/// blocks take the row-wise path).
bool gemv_ggml_fused(GgmlType type, const Source& s, const float* x, const float* bias, float* y, int64_t o0,
                     int64_t o1) {
  namespace g = ggml_avx2;
  switch (type) {
    case GgmlType::kQ8_0: gemv_ggml<g::Q8_0>(s, x, bias, y, o0, o1); return true;
    case GgmlType::kQ4_0: gemv_ggml<g::Q4_0>(s, x, bias, y, o0, o1); return true;
    case GgmlType::kMXFP4: gemv_ggml<g::MXFP4>(s, x, bias, y, o0, o1); return true;
    case GgmlType::kQ2_K: gemv_ggml<g::Q2_K>(s, x, bias, y, o0, o1); return true;
    case GgmlType::kQ3_K: gemv_ggml<g::Q3_K>(s, x, bias, y, o0, o1); return true;
    case GgmlType::kQ4_K: gemv_ggml<g::Q4_K>(s, x, bias, y, o0, o1); return true;
    case GgmlType::kQ5_K: gemv_ggml<g::Q5_K>(s, x, bias, y, o0, o1); return true;
    case GgmlType::kQ6_K: gemv_ggml<g::Q6_K>(s, x, bias, y, o0, o1); return true;
    default: return false;
  }
}

/// Stored rows [o, o + n) widened to f32 into panel [n, cols].
template <Form F, Scale S>
void widen_rows(const Source& s, int64_t o, int64_t n, float* panel) {
  for (int64_t k = 0; k < n; ++k) {
    float* out = panel + k * s.cols;
    if constexpr (F == Form::kRowWise) {
      matrix_row_to_f32(s.view, o + k, out);
    } else {
      const uint8_t* row = s.row(o + k);
      const float* scales = s.scales(o + k);
      const int64_t full = s.cols / 8 * 8;
      GroupCounter g{S == Scale::kPerChunk ? s.group_size / 8 : 1};
      for (int64_t i = 0; i < full; i += 8) {
        _mm256_storeu_ps(out + i, widen8<F, S>(s, row, scales, g.group, i));
        g.next();
      }
      for (int64_t i = full; i < s.cols; ++i) out[i] = widen_one<F>(s, row, scales, i);
    }
  }
}

/// The GEMM micro-kernel: MX rows of x against MW widened weight rows, one 8-lane
/// accumulator per (row, output). 4 x 2 keeps 8 accumulators, 4 weight vectors, 2 x
/// vectors and the product's temporary in 15 of the 16 ymm registers (without FMA the
/// product needs a register of its own, so 4 x 3 would spill).
/// y points at y[r][o]; ldy = outputs per row.
template <int MW, int MX>
void micro(const float* w, const float* x, int64_t cols, const float* bias, int64_t o, float* y, int64_t ldy) {
  __m256 acc[MX][MW];
  for (int j = 0; j < MX; ++j) {
    for (int k = 0; k < MW; ++k) acc[j][k] = _mm256_setzero_ps();
  }
  const int64_t full = cols / 8 * 8;
  for (int64_t i = 0; i < full; i += 8) {
    __m256 wv[MW];
    for (int k = 0; k < MW; ++k) wv[k] = _mm256_loadu_ps(w + k * cols + i);
    for (int j = 0; j < MX; ++j) {
      const __m256 xv = _mm256_loadu_ps(x + j * cols + i);
      for (int k = 0; k < MW; ++k) acc[j][k] = _mm256_add_ps(acc[j][k], _mm256_mul_ps(xv, wv[k]));
    }
  }
  for (int j = 0; j < MX; ++j) {
    for (int k = 0; k < MW; ++k) {
      float tail = 0;
      for (int64_t i = full; i < cols; ++i) tail += x[j * cols + i] * w[k * cols + i];
      y[j * ldy + k] = finish(acc[j][k], tail, bias, o + k);
    }
  }
}

constexpr int kMicroW = 4;  // weight rows per micro-kernel call
constexpr int kMicroX = 2;  // rows of x per micro-kernel call

template <int MW>
void micro_x(int mx, const float* w, const float* x, int64_t cols, const float* bias, int64_t o, float* y,
             int64_t ldy) {
  static_assert(kMicroX == 2);
  if (mx == 2) {
    micro<MW, 2>(w, x, cols, bias, o, y, ldy);
  } else {
    micro<MW, 1>(w, x, cols, bias, o, y, ldy);
  }
}

/// micro for the edges: mw <= kMicroW weight rows, mx <= kMicroX rows of x.
void micro_any(int mw, int mx, const float* w, const float* x, int64_t cols, const float* bias, int64_t o, float* y,
               int64_t ldy) {
  static_assert(kMicroW == 4);
  switch (mw) {
    case 4: micro_x<4>(mx, w, x, cols, bias, o, y, ldy); return;
    case 3: micro_x<3>(mx, w, x, cols, bias, o, y, ldy); return;
    case 2: micro_x<2>(mx, w, x, cols, bias, o, y, ldy); return;
    default: micro_x<1>(mx, w, x, cols, bias, o, y, ldy); return;
  }
}

/// GEMM, prefill and shared experts: each panel of weight rows is widened once, then
/// every row of x passes over it.
template <Form F, Scale S>
void gemm(const Source& s, const float* x, size_t rows, const float* bias, float* y, int64_t o0, int64_t o1,
          float* panel_buffer) {
  const int64_t cols = s.cols;
  const int64_t out = s.view.shape.rows;
  const int64_t panel_max = panel_rows(cols);
  const auto nrows = static_cast<int64_t>(rows);
  for (int64_t p = o0; p < o1; p += panel_max) {
    const int64_t np = o1 - p < panel_max ? o1 - p : panel_max;
    const float* panel = panel_buffer;
    if constexpr (F == Form::kF32) {
      panel = reinterpret_cast<const float*>(s.row(p));  // already f32: no copy
    } else {
      widen_rows<F, S>(s, p, np, panel_buffer);
    }
    for (int64_t r = 0; r < nrows; r += kMicroX) {
      const int mx = static_cast<int>(nrows - r < kMicroX ? nrows - r : kMicroX);
      for (int64_t q = 0; q < np; q += kMicroW) {
        const int mw = static_cast<int>(np - q < kMicroW ? np - q : kMicroW);
        micro_any(mw, mx, panel + q * cols, x + r * cols, cols, bias, p + q, y + r * out + p + q, out);
      }
    }
  }
}

template <Form F, Scale S>
void run(const Source& s, const float* x, size_t rows, const float* bias, float* y, int64_t o0, int64_t o1,
         float* panel) {
  if constexpr (F != Form::kRowWise) {
    if (rows == 1) return gemv<F, S>(s, x, bias, y, o0, o1);
  }
  gemm<F, S>(s, x, rows, bias, y, o0, o1, panel);
}

template <Form F>
void run_quantised(const Source& s, const float* x, size_t rows, const float* bias, float* y, int64_t o0,
                   int64_t o1, float* panel) {
  if (s.group_size % 8 == 0) {
    run<F, Scale::kPerChunk>(s, x, rows, bias, y, o0, o1, panel);
  } else {
    run<F, Scale::kPerLane>(s, x, rows, bias, y, o0, o1, panel);
  }
}

/// GGML blocks: the fused GEMV where the type has one, else the panel path, whose
/// widening (matrix_row_to_f32 -> dequantize_row) takes dequantize_row's AVX2 kernels.
void run_ggml(const Source& s, const float* x, size_t rows, const float* bias, float* y, int64_t o0, int64_t o1,
              float* panel) {
  if (rows == 1 && gemv_ggml_fused(s.view.shape.ggml_type, s, x, bias, y, o0, o1)) return;
  gemm<Form::kRowWise, Scale::kNone>(s, x, rows, bias, y, o0, o1, panel);
}

uint64_t stored_row_bytes(const MatrixShape& shape) { return shape.rows > 0 ? shape.data_bytes() / shape.rows : 0; }

}  // namespace

void matmul_tile_avx2(const MatrixView& w, const float* x, size_t rows, const float* bias, float* y, int64_t o0,
                      int64_t o1, const Avx2Scratch& scratch) {
  if (rows == 0 || o0 >= o1) return;
  Source s;
  s.view = w;
  s.row_bytes = stored_row_bytes(w.shape);
  s.cols = w.shape.cols;
  s.group_size = w.shape.group_size;
  s.groups_per_row = w.shape.groups_per_row();
  s.column_group = scratch.column_group;
  float* panel = scratch.panel;
  switch (w.shape.format) {
    case WeightFormat::kF32: return run<Form::kF32, Scale::kNone>(s, x, rows, bias, y, o0, o1, panel);
    case WeightFormat::kF16: return run<Form::kF16, Scale::kNone>(s, x, rows, bias, y, o0, o1, panel);
    case WeightFormat::kBF16: return run<Form::kBF16, Scale::kNone>(s, x, rows, bias, y, o0, o1, panel);
    case WeightFormat::kInt8: return run_quantised<Form::kI8>(s, x, rows, bias, y, o0, o1, panel);
    case WeightFormat::kInt4: return run_quantised<Form::kI4>(s, x, rows, bias, y, o0, o1, panel);
    case WeightFormat::kF8E4M3Block: return run<Form::kRowWise, Scale::kNone>(s, x, rows, bias, y, o0, o1, panel);
    case WeightFormat::kGgml: return run_ggml(s, x, rows, bias, y, o0, o1, panel);
  }
}

}  // namespace charm

#include "common/avx2_target_end.inc"
