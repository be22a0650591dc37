#include "worker/experts/expert_layout.h"

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

ExpertLayout ExpertLayout::make(const MatrixShape& gate, const MatrixShape& up, const MatrixShape& down) {
  ExpertLayout layout;
  uint64_t cursor = 0;
  layout.gate = place(gate, cursor);
  layout.up = place(up, cursor);
  layout.down = place(down, cursor);
  layout.bytes = cursor;
  return layout;
}

ExpertView ExpertLayout::view(const uint8_t* blob) const {
  return ExpertView{view_of(gate, blob), view_of(up, blob), view_of(down, blob)};
}

std::optional<std::string> describe_non_finite(const ExpertLayout& layout, const uint8_t* blob) {
  const ExpertView v = layout.view(blob);
  for (auto [name, m] : {std::pair{"gate", &v.gate}, {"up", &v.up}, {"down", &v.down}}) {
    if (const auto bad = find_non_finite(*m)) return std::string(name) + " holds " + bad->describe(m->shape);
  }
  return std::nullopt;
}

bool ExpertLayout::operator==(const ExpertLayout& other) const {
  return same(gate, other.gate) && same(up, other.up) && same(down, other.down) && bytes == other.bytes;
}

}  // namespace charm
