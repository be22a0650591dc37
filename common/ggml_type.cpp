// TEMPORARY (branch ggml-quants): a minimal traits table so common/ggml_dequantize.cpp and
// its test link before the GGUF reader's helper lands its own common/ggml_type.cpp; the
// merge takes that version. Sizes are gguf.constants.GGML_QUANT_SIZES (gguf 0.19.0).
#include "common/ggml_type.h"

#include <array>
#include <string>

namespace charm {
namespace {

constexpr std::array<GgmlTypeTraits, 14> kTraits = {{
    {GgmlType::kF32, "F32", 1, 4},       {GgmlType::kF16, "F16", 1, 2},
    {GgmlType::kQ4_0, "Q4_0", 32, 18},   {GgmlType::kQ4_1, "Q4_1", 32, 20},
    {GgmlType::kQ5_0, "Q5_0", 32, 22},   {GgmlType::kQ5_1, "Q5_1", 32, 24},
    {GgmlType::kQ8_0, "Q8_0", 32, 34},   {GgmlType::kQ2_K, "Q2_K", 256, 84},
    {GgmlType::kQ3_K, "Q3_K", 256, 110}, {GgmlType::kQ4_K, "Q4_K", 256, 144},
    {GgmlType::kQ5_K, "Q5_K", 256, 176}, {GgmlType::kQ6_K, "Q6_K", 256, 210},
    {GgmlType::kBF16, "BF16", 1, 2},     {GgmlType::kMXFP4, "MXFP4", 32, 17},
}};

}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t id) {
  for (const GgmlTypeTraits& t : kTraits) {
    if (static_cast<uint32_t>(t.type) == id) return t;
  }
  return std::nullopt;
}

GgmlTypeTraits ggml_traits(GgmlType type) { return *ggml_type_traits(static_cast<uint32_t>(type)); }

std::string_view ggml_type_name_of_id(uint32_t id) {
  if (auto t = ggml_type_traits(id)) return t->name;
  thread_local std::string name;
  name = "type " + std::to_string(id);
  return name;
}

std::optional<uint64_t> ggml_row_bytes(GgmlType type, int64_t elements) {
  const GgmlTypeTraits t = ggml_traits(type);
  if (elements < 0 || elements % t.block_elements != 0) return std::nullopt;
  return static_cast<uint64_t>(elements / t.block_elements) * static_cast<uint64_t>(t.block_bytes);
}

}  // namespace charm
