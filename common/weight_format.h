// How a routed expert's weight matrix is stored in memory and on disk, and how a row
// widens to f32 (the kernels that compute from these forms are common/matmul.h).
//
// Stored forms: the checkpoint's own f32 / f16 / bf16 (lossless: charm's default), or
// int8 / int4 with one f32 scale per group of `group_size` consecutive elements of a row
// (lossy, opt-in by name at `charm convert`). Quantisation is symmetric absmax per group
// (q = round(w / scale), scale = absmax / 127 for int8, absmax / 7 for int4; int4 packs
// two values per byte, low nibble first, each stored as q + 8). A row's last group may
// be shorter. Rows start on a byte boundary (an odd-width int4 row pads half a byte).
// A fifth form holds a DeepSeek-V3 fp8 checkpoint's experts as stored: F8_E4M3 values
// with one f32 scale per [block_rows, block_cols] block (W = value * scale, exactly as
// Checkpoint::load_f32 dequantises). A sixth holds a GGUF tensor's GGML blocks as the file
// stores them (Q8_0, Q4_K, MXFP4 ...; common/ggml_type.h): a row is whole blocks, each with
// its own scales inside, widened by dequantize_row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/ggml_type.h"

namespace charm {

/// Element form of a stored weight matrix.
enum class WeightFormat : uint8_t { kF32, kF16, kBF16, kInt8, kInt4, kF8E4M3Block, kGgml };

/// The index spelling: "F32", "F16", "BF16" (as safetensors), "I8G", "I4G" (grouped),
/// "F8_E4M3B" (block-scaled fp8; RAM only, containers widen it to F32), "GGML" (the
/// block type is MatrixShape::ggml_type; matrix_dtype_name spells it).
const char* weight_format_name(WeightFormat format);
/// Parses weight_format_name's spelling; nullopt for anything else.
std::optional<WeightFormat> parse_weight_format(std::string_view name);
/// The lossless form of a safetensors dtype.
WeightFormat weight_format_of(DType dtype);
/// True for int8 / int4 (they carry group scales).
bool is_quantized(WeightFormat format);
/// True for the forms that carry f32 scales (int8, int4, block-scaled fp8).
bool has_scales(WeightFormat format);

/// Shape and storage of one [rows, cols] row-major matrix.
struct MatrixShape {
  WeightFormat format = WeightFormat::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t group_size = 0;  ///< elements per scale; 0 unless quantised
  int64_t block_rows = 0;  ///< kF8E4M3Block only: rows per scale block
  int64_t block_cols = 0;  ///< kF8E4M3Block only: columns per scale block
  GgmlType ggml_type = GgmlType::kF32;  ///< kGgml only: the block type (cols is whole blocks of it)

  /// Bytes of the element data (rows * bytes per row).
  uint64_t data_bytes() const;
  /// Scales per row (ceil(cols / group_size)); 0 unless quantised.
  int64_t groups_per_row() const;
  /// Bytes of the f32 scales: [rows, groups_per_row] when quantised, [ceil(rows /
  /// block_rows), ceil(cols / block_cols)] for block-scaled fp8, else 0.
  uint64_t scale_bytes() const;
};

/// A matrix's element form by one name: weight_format_name's, or for kGgml the block
/// type's ggml name ("Q4_K"). For containers' indexes and messages.
std::string matrix_dtype_name(const MatrixShape& shape);
/// The inverse of matrix_dtype_name: `shape` with format (and ggml_type) set, or false
/// for a name neither spells.
bool parse_matrix_dtype(std::string_view name, MatrixShape& shape);

/// A stored matrix in memory: `data` holds data_bytes(), `scales` scale_bytes() (null
/// unless quantised). Non-owning. f32 data must be 4-byte aligned.
struct MatrixView {
  MatrixShape shape;
  const uint8_t* data = nullptr;
  const float* scales = nullptr;
};

/// A stored matrix that owns its bytes: a dense weight kept at the checkpoint's
/// precision (f32 / f16 / bf16), or a quantised one.
struct StoredMatrix {
  MatrixShape shape;
  std::vector<uint8_t> data;  ///< shape.data_bytes()
  std::vector<float> scales;  ///< shape.scale_bytes() / 4 (empty unless quantised)
  MatrixView view() const { return MatrixView{shape, data.data(), scales.empty() ? nullptr : scales.data()}; }
  bool empty() const { return data.empty(); }
  /// An f32 matrix [rows, cols] holding `values` (row-major). Throws Error(kInvalidInput)
  /// when values.size() != rows * cols.
  static StoredMatrix from_f32(const std::vector<float>& values, int64_t rows, int64_t cols);
};

/// The largest |scale| of `format` that keeps every dequantised value (stored value times
/// scale) finite in f32: FLT_MAX over the largest stored magnitude (448 for e4m3, 128 for
/// int8, 8 for int4); infinity for the unscaled forms.
float max_finite_scale(WeightFormat format);

/// The index of the first of `count` f32 scales of `format` that is NaN, infinite or over
/// max_finite_scale(format), or `count` when there is none. Vectorised; thread-safe.
uint64_t first_bad_scale(WeightFormat format, const float* scales, uint64_t count);

/// The first weight of a stored matrix that is not finite: a NaN / Inf element, or a
/// scale that is itself non-finite or so large that value * scale overflows.
struct NonFiniteWeight {
  bool in_scales = false;  ///< true: a scale; `row`, `col` index the scale grid
  int64_t row = 0;
  int64_t col = 0;
  float value = 0;  ///< the element as f32, or the scale

  /// "NaN at [r, c]" or "scale 3.4e+38 at [r, c] of the scale grid, over ...", for messages.
  std::string describe(const MatrixShape& shape) const;
};

/// Scans `m` (data and scales) for the first non-finite weight; nullopt when every one is
/// finite. Integer forms have finite data by construction, so only their scales are read;
/// so are GGML blocks' f16 scales (but MXFP4's), the rest of a row only where one is bad.
/// Cost: one pass over the matrix's bytes, or over its scales for GGML blocks (measured in
/// docs/architecture.md, "Bad checkpoints"). Thread-safe.
std::optional<NonFiniteWeight> find_non_finite(const MatrixView& m);

/// Writes row `row` of `m` as f32 into `out` [m.shape.cols]. Exact for f32/f16/bf16.
void matrix_row_to_f32(const MatrixView& m, int64_t row, float* out);

/// Quantises `src` [rows, cols] f32 into `shape` (format kInt8 or kInt4, rows/cols/
/// group_size set): `data` receives data_bytes(), `scales` scale_bytes(). Throws
/// Error(kInvalidInput) for a non-quantised format or group_size < 1.
void quantize_matrix(const float* src, const MatrixShape& shape, uint8_t* data, float* scales);

}  // namespace charm
