#include "worker/experts/expert_layout.h"

#include <cmath>

namespace charm {
namespace {

MatrixPart place(const MatrixShape& shape, uint64_t& cursor) {
  MatrixPart part;
  part.shape = shape;
  part.data_offset = cursor;
  part.scale_offset = align_up(cursor + shape.data_bytes(), kBlobPartAlignment);
  cursor = align_up(part.scale_offset + shape.scale_bytes(), kBlobPartAlignment);
  if (shape.scale_bytes() == 0) part.scale_offset = part.data_offset + shape.data_bytes();
  return part;
}

BiasPart place_bias(int64_t size, uint64_t& cursor) {
  const BiasPart part{cursor, size};
  cursor = align_up(cursor + static_cast<uint64_t>(size) * sizeof(float), kBlobPartAlignment);
  return part;
}

const float* bias_of(const BiasPart& part, const uint8_t* blob) {
  return part.size == 0 ? nullptr : reinterpret_cast<const float*>(blob + part.offset);
}

MatrixView view_of(const MatrixPart& part, const uint8_t* blob) {
  MatrixView v;
  v.shape = part.shape;
  v.data = blob + part.data_offset;
  if (has_scales(part.shape.format)) v.scales = reinterpret_cast<const float*>(blob + part.scale_offset);
  return v;
}

bool same(const MatrixPart& a, const MatrixPart& b) {
  return a.shape.format == b.shape.format && a.shape.rows == b.shape.rows && a.shape.cols == b.shape.cols &&
         a.shape.group_size == b.shape.group_size && a.shape.block_rows == b.shape.block_rows &&
         a.shape.ggml_type == b.shape.ggml_type &&
         a.shape.block_cols == b.shape.block_cols && a.data_offset == b.data_offset &&
         a.scale_offset == b.scale_offset;
}

}  // namespace

ExpertLayout ExpertLayout::make(const MatrixShape& gate, const MatrixShape& up, const MatrixShape& down,
                                bool biases) {
  ExpertLayout layout;
  uint64_t cursor = 0;
  layout.gate = place(gate, cursor);
  layout.up = place(up, cursor);
  layout.down = place(down, cursor);
  if (biases) {
    layout.gate_bias = place_bias(gate.rows, cursor);
    layout.up_bias = place_bias(up.rows, cursor);
    layout.down_bias = place_bias(down.rows, cursor);
  }
  layout.bytes = cursor;
  return layout;
}

ExpertView ExpertLayout::view(const uint8_t* blob) const {
  return ExpertView{view_of(gate, blob),          view_of(up, blob),           view_of(down, blob),
                    bias_of(gate_bias, blob), bias_of(up_bias, blob), bias_of(down_bias, blob)};
}

std::optional<std::string> describe_non_finite(const ExpertLayout& layout, const uint8_t* blob) {
  const ExpertView v = layout.view(blob);
  for (auto [name, m] : {std::pair{"gate", &v.gate}, {"up", &v.up}, {"down", &v.down}}) {
    if (const auto bad = find_non_finite(*m)) return std::string(name) + " holds " + bad->describe(m->shape);
  }
  for (auto [name, part] : {std::pair{"gate_bias", &layout.gate_bias}, {"up_bias", &layout.up_bias},
                            {"down_bias", &layout.down_bias}}) {
    const float* b = bias_of(*part, blob);
    for (int64_t i = 0; i < part->size; ++i) {
      if (!std::isfinite(b[i])) return std::string(name) + " holds " + std::to_string(b[i]) + " at [" + std::to_string(i) + "]";
    }
  }
  return std::nullopt;
}

bool ExpertLayout::operator==(const ExpertLayout& other) const {
  return same(gate, other.gate) && same(up, other.up) && same(down, other.down) && gate_bias == other.gate_bias &&
         up_bias == other.up_bias && down_bias == other.down_bias && bytes == other.bytes;
}

}  // namespace charm
