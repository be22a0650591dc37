#include "common/weight_format.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

#include "common/error.h"

namespace charm {

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32: return "F32";
    case WeightFormat::kF16: return "F16";
    case WeightFormat::kBF16: return "BF16";
    case WeightFormat::kInt8: return "I8G";
    case WeightFormat::kInt4: return "I4G";
    case WeightFormat::kF8E4M3Block: return "F8_E4M3B";
    case WeightFormat::kGgml: return "GGML";
  }
  return "?";
}

std::string matrix_dtype_name(const MatrixShape& shape) {
  return shape.format == WeightFormat::kGgml ? ggml_traits(shape.ggml_type).name : weight_format_name(shape.format);
}

bool parse_matrix_dtype(std::string_view name, MatrixShape& shape) {
  if (const auto format = parse_weight_format(name); format && *format != WeightFormat::kGgml) {
    shape.format = *format;
    return true;
  }
  for (uint32_t id = 0; id < 64; ++id) {
    const auto traits = ggml_type_traits(id);
    if (traits && name == traits->name && traits->block_elements > 1) {  // F32/F16/BF16 have their own forms
      shape.format = WeightFormat::kGgml;
      shape.ggml_type = traits->type;
      return true;
    }
  }
  return false;
}

std::optional<WeightFormat> parse_weight_format(std::string_view name) {
  for (WeightFormat f : {WeightFormat::kF32, WeightFormat::kF16, WeightFormat::kBF16, WeightFormat::kInt8,
                         WeightFormat::kInt4, WeightFormat::kF8E4M3Block, WeightFormat::kGgml}) {
    if (name == weight_format_name(f)) return f;
  }
  return std::nullopt;
}

WeightFormat weight_format_of(DType dtype) {
  switch (dtype) {
    case DType::kF32: return WeightFormat::kF32;
    case DType::kF16: return WeightFormat::kF16;
    case DType::kBF16: return WeightFormat::kBF16;
    case DType::kF8E4M3: return WeightFormat::kF8E4M3Block;
    case DType::kU8: fail_unsupported("a U8 tensor (packed MXFP4 data) is no weight matrix of its own");
  }
  return WeightFormat::kF32;
}

bool is_quantized(WeightFormat format) { return format == WeightFormat::kInt8 || format == WeightFormat::kInt4; }

bool has_scales(WeightFormat format) { return is_quantized(format) || format == WeightFormat::kF8E4M3Block; }

namespace {

uint64_t row_bytes(const MatrixShape& s) {
  const auto cols = static_cast<uint64_t>(s.cols);
  switch (s.format) {
    case WeightFormat::kF32: return cols * 4;
    case WeightFormat::kF16:
    case WeightFormat::kBF16: return cols * 2;
    case WeightFormat::kInt8:
    case WeightFormat::kF8E4M3Block: return cols;
    case WeightFormat::kInt4: return (cols + 1) / 2;
    case WeightFormat::kGgml: return ggml_row_bytes(s.ggml_type, s.cols).value_or(0);
  }
  return 0;
}

}  // namespace

uint64_t MatrixShape::data_bytes() const { return static_cast<uint64_t>(rows) * row_bytes(*this); }

int64_t MatrixShape::groups_per_row() const {
  if (!is_quantized(format) || group_size <= 0) return 0;
  return (cols + group_size - 1) / group_size;
}

uint64_t MatrixShape::scale_bytes() const {
  if (format == WeightFormat::kF8E4M3Block) {
    if (block_rows <= 0 || block_cols <= 0) return 0;
    return static_cast<uint64_t>((rows + block_rows - 1) / block_rows) *
           static_cast<uint64_t>((cols + block_cols - 1) / block_cols) * sizeof(float);
  }
  return static_cast<uint64_t>(rows) * static_cast<uint64_t>(groups_per_row()) * sizeof(float);
}

StoredMatrix StoredMatrix::from_f32(const std::vector<float>& values, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0 || values.size() != static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols)) {
    fail_invalid("StoredMatrix::from_f32: " + std::to_string(values.size()) + " values for a [" + std::to_string(rows) +
                 ", " + std::to_string(cols) + "] matrix");
  }
  StoredMatrix m;
  m.shape.format = WeightFormat::kF32;
  m.shape.rows = rows;
  m.shape.cols = cols;
  const auto* bytes = reinterpret_cast<const uint8_t*>(values.data());
  m.data.assign(bytes, bytes + values.size() * sizeof(float));
  return m;
}

float max_finite_scale(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF8E4M3Block: return FLT_MAX / 448.0f;  // largest finite e4m3 magnitude
    case WeightFormat::kInt8: return FLT_MAX / 128.0f;         // int8 stores -128..127
    case WeightFormat::kInt4: return FLT_MAX / 8.0f;           // q + 8 in a nibble: -8..7
    default: return std::numeric_limits<float>::infinity();
  }
}

uint64_t first_bad_scale(WeightFormat format, const float* scales, uint64_t count) {
  const float limit = max_finite_scale(format);
  constexpr uint64_t kBlock = 1024;
  for (uint64_t begin = 0; begin < count; begin += kBlock) {
    const uint64_t end = std::min(count, begin + kBlock);
    uint32_t any = 0;  // an integer OR-reduction vectorises; !(|s| <= limit) is also true for NaN
    for (uint64_t i = begin; i < end; ++i) any |= static_cast<uint32_t>(!(std::fabs(scales[i]) <= limit));
    if (any == 0) continue;
    for (uint64_t i = begin; i < end; ++i) {
      if (!(std::fabs(scales[i]) <= limit)) return i;
    }
  }
  return count;
}

std::string NonFiniteWeight::describe(const MatrixShape& shape) const {
  std::ostringstream text;
  const bool finite = std::isfinite(value);
  if (in_scales) text << "a scale of ";
  if (finite) {
    text << value;
  } else {
    text << non_finite_name(value);
  }
  text << " at [" << row << ", " << col << "]";
  if (in_scales) text << " of its scale grid";
  if (in_scales && finite) {
    text << ", over " << max_finite_scale(shape.format) << " (its " << weight_format_name(shape.format)
         << " values times it overflow f32)";
  }
  return text.str();
}

namespace {

/// Row r of a GGML matrix's first non-finite value, by what the row dequantises to.
std::optional<NonFiniteWeight> non_finite_in_row(const MatrixView& m, int64_t r, std::vector<float>& row) {
  matrix_row_to_f32(m, r, row.data());
  if (const uint64_t i = first_non_finite(DType::kF32, row.data(), row.size()); i < row.size()) {
    return NonFiniteWeight{false, r, static_cast<int64_t>(i), row[i]};
  }
  return std::nullopt;
}

/// Whether any block of a GGML row has an f16 scale (at `offsets` in each block) that is
/// NaN or Inf: exponent bits all ones.
bool row_has_bad_f16_scale(const uint8_t* row, int64_t blocks, int64_t block_bytes, const std::vector<int>& offsets) {
  for (int64_t b = 0; b < blocks; ++b) {
    for (int off : offsets) {
      uint16_t bits;
      std::memcpy(&bits, row + b * block_bytes + off, 2);
      if ((bits & 0x7C00) == 0x7C00) return true;
    }
  }
  return false;
}

/// GGML blocks. F32 / F16 / BF16 blocks are single elements, scanned as such. The other
/// types with f16 scales give a non-finite value exactly where a block has a non-finite
/// scale: their quants, sub-scales and mins are small integers (a product of at most
/// 128 * 32, Q6_K's), so with |d|, |dmin| <= 65504 every value is below 2^29 in magnitude, while a NaN / Inf d
/// or dmin makes every value it multiplies NaN / Inf (Inf * 0 is NaN). So only the
/// scales are read (a few bytes per block: pinning a Q4_K_M file ran at 290 MiB/s when
/// every row was dequantised), and a row with a bad one is dequantised to place it.
/// MXFP4 (an e8m0 exponent: 2^127 * 12 overflows) is checked by what it dequantises to.
std::optional<NonFiniteWeight> find_non_finite_ggml(const MatrixView& m) {
  const MatrixShape& s = m.shape;
  const auto numel = static_cast<uint64_t>(s.rows) * static_cast<uint64_t>(s.cols);
  std::optional<DType> element;
  if (s.ggml_type == GgmlType::kF32) element = DType::kF32;
  if (s.ggml_type == GgmlType::kF16) element = DType::kF16;
  if (s.ggml_type == GgmlType::kBF16) element = DType::kBF16;
  if (element) {
    const uint64_t i = first_non_finite(*element, m.data, numel);
    if (i == numel) return std::nullopt;
    float value;
    convert_to_f32(*element, m.data + i * dtype_size(*element), &value, 1);
    const auto cols = static_cast<uint64_t>(s.cols);
    return NonFiniteWeight{false, static_cast<int64_t>(i / cols), static_cast<int64_t>(i % cols), value};
  }
  std::vector<float> row(static_cast<size_t>(s.cols));
  const std::vector<int> offsets = ggml_f16_scale_offsets(s.ggml_type);
  const GgmlTypeTraits t = ggml_traits(s.ggml_type);
  const uint64_t bytes = row_bytes(s);
  for (int64_t r = 0; r < s.rows; ++r) {
    const bool suspect = offsets.empty() ||
                         row_has_bad_f16_scale(m.data + static_cast<uint64_t>(r) * bytes, s.cols / t.block_elements,
                                               t.block_bytes, offsets);
    if (!suspect) continue;
    if (auto bad = non_finite_in_row(m, r, row)) return bad;
  }
  return std::nullopt;
}

}  // namespace

std::optional<NonFiniteWeight> find_non_finite(const MatrixView& m) {
  const MatrixShape& s = m.shape;
  const auto cols = static_cast<uint64_t>(s.cols);
  const uint64_t n = static_cast<uint64_t>(s.rows) * cols;
  std::optional<DType> dtype;
  switch (s.format) {
    case WeightFormat::kF32: dtype = DType::kF32; break;
    case WeightFormat::kF16: dtype = DType::kF16; break;
    case WeightFormat::kBF16: dtype = DType::kBF16; break;
    case WeightFormat::kF8E4M3Block: dtype = DType::kF8E4M3; break;
    case WeightFormat::kInt8:
    case WeightFormat::kInt4: break;  // integers: always finite
    case WeightFormat::kGgml: return find_non_finite_ggml(m);
  }
  if (dtype) {
    if (const uint64_t i = first_non_finite(*dtype, m.data, n); i < n) {
      float value;
      convert_to_f32(*dtype, m.data + i * dtype_size(*dtype), &value, 1);
      return NonFiniteWeight{false, static_cast<int64_t>(i / cols), static_cast<int64_t>(i % cols), value};
    }
  }
  if (!has_scales(s.format) || m.scales == nullptr) return std::nullopt;
  const uint64_t count = s.scale_bytes() / sizeof(float);
  const uint64_t i = first_bad_scale(s.format, m.scales, count);
  if (i == count) return std::nullopt;
  const uint64_t grid_cols = s.format == WeightFormat::kF8E4M3Block
                                 ? static_cast<uint64_t>((s.cols + s.block_cols - 1) / s.block_cols)
                                 : static_cast<uint64_t>(s.groups_per_row());
  return NonFiniteWeight{true, static_cast<int64_t>(i / grid_cols), static_cast<int64_t>(i % grid_cols), m.scales[i]};
}

void matrix_row_to_f32(const MatrixView& m, int64_t row, float* out) {
  const MatrixShape& s = m.shape;
  const uint8_t* src = m.data + static_cast<uint64_t>(row) * row_bytes(s);
  switch (s.format) {
    case WeightFormat::kF32: std::memcpy(out, src, static_cast<size_t>(s.cols) * 4); return;
    case WeightFormat::kF16: convert_to_f32(DType::kF16, src, out, static_cast<size_t>(s.cols)); return;
    case WeightFormat::kBF16: convert_to_f32(DType::kBF16, src, out, static_cast<size_t>(s.cols)); return;
    case WeightFormat::kInt8: {
      const float* scales = m.scales + row * s.groups_per_row();
      for (int64_t i = 0; i < s.cols; ++i) out[i] = static_cast<float>(static_cast<int8_t>(src[i])) * scales[i / s.group_size];
      return;
    }
    case WeightFormat::kF8E4M3Block: {
      // value * block scale, the one rounding Checkpoint::dequantise_fp8 does.
      const int64_t block_cols = (s.cols + s.block_cols - 1) / s.block_cols;
      const float* scales = m.scales + (row / s.block_rows) * block_cols;
      for (int64_t i = 0; i < s.cols; ++i) out[i] = f8e4m3_to_f32(src[i]) * scales[i / s.block_cols];
      return;
    }
    case WeightFormat::kInt4: {
      const float* scales = m.scales + row * s.groups_per_row();
      for (int64_t i = 0; i < s.cols; ++i) {
        const int nibble = (i & 1) ? (src[i / 2] >> 4) : (src[i / 2] & 0x0f);
        out[i] = static_cast<float>(nibble - 8) * scales[i / s.group_size];
      }
      return;
    }
    case WeightFormat::kGgml: dequantize_row(s.ggml_type, src, out, s.cols); return;
  }
}

void quantize_matrix(const float* src, const MatrixShape& shape, uint8_t* data, float* scales) {
  if (!is_quantized(shape.format)) {
    fail_invalid(std::string("quantize_matrix: ") + weight_format_name(shape.format) + " is not a quantised format");
  }
  if (shape.group_size < 1) fail_invalid("quantize_matrix: group_size must be >= 1, got " + std::to_string(shape.group_size));
  const bool int4 = shape.format == WeightFormat::kInt4;
  const float qmax = int4 ? 7.0f : 127.0f;
  const int64_t groups = shape.groups_per_row();
  const uint64_t rb = row_bytes(shape);
  std::memset(data, 0, shape.data_bytes());
  for (int64_t r = 0; r < shape.rows; ++r) {
    const float* row = src + r * shape.cols;
    uint8_t* out = data + static_cast<uint64_t>(r) * rb;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t begin = g * shape.group_size;
      const int64_t end = std::min(shape.cols, begin + shape.group_size);
      float absmax = 0;
      for (int64_t i = begin; i < end; ++i) absmax = std::max(absmax, std::fabs(row[i]));
      const float scale = absmax > 0 ? absmax / qmax : 1.0f;
      scales[r * groups + g] = scale;
      for (int64_t i = begin; i < end; ++i) {
        const int q = static_cast<int>(std::clamp(std::nearbyint(row[i] / scale), -qmax, qmax));
        if (int4) {
          out[i / 2] |= static_cast<uint8_t>((q + 8) << ((i & 1) ? 4 : 0));
        } else {
          out[i] = static_cast<uint8_t>(static_cast<int8_t>(q));
        }
      }
    }
  }
}

}  // namespace charm
