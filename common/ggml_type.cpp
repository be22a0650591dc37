// The GGML type table: ids, names and block geometry (common/ggml_type.h). Data from
// gguf-py 0.19.0's gguf.constants.GGML_QUANT_SIZES and GGMLQuantizationType, which follow
// ggml/include/ggml.h `enum ggml_type` and ggml.c's type_traits; tests/unit/test_gguf.cpp
// checks the table against tests/fixtures/gguf/expected.json, which
// scripts/gen_gguf_reader_cases.py writes from that module.
#include "common/ggml_type.h"

#include <array>
#include <string>

namespace charm {
namespace {

/// Every ggml type gguf-py knows, by id. `charm_reads` marks the ones GgmlType names
/// (charm has a dequantiser for them); the rest are named in errors only.
struct KnownType {
  uint32_t id;
  const char* name;
  int64_t block_elements;
  int64_t block_bytes;
  bool charm_reads;
};

constexpr std::array<KnownType, 36> kKnownTypes = {{
    {0, "F32", 1, 4, true},
    {1, "F16", 1, 2, true},
    {2, "Q4_0", 32, 18, true},
    {3, "Q4_1", 32, 20, true},
    // 4 (Q4_2) and 5 (Q4_3) were removed from ggml.
    {6, "Q5_0", 32, 22, true},
    {7, "Q5_1", 32, 24, true},
    {8, "Q8_0", 32, 34, true},
    {9, "Q8_1", 32, 40, false},
    {10, "Q2_K", 256, 84, true},
    {11, "Q3_K", 256, 110, true},
    {12, "Q4_K", 256, 144, true},
    {13, "Q5_K", 256, 176, true},
    {14, "Q6_K", 256, 210, true},
    {15, "Q8_K", 256, 292, false},
    {16, "IQ2_XXS", 256, 66, false},
    {17, "IQ2_XS", 256, 74, false},
    {18, "IQ3_XXS", 256, 98, false},
    {19, "IQ1_S", 256, 50, false},
    {20, "IQ4_NL", 32, 18, false},
    {21, "IQ3_S", 256, 110, false},
    {22, "IQ2_S", 256, 82, false},
    {23, "IQ4_XS", 256, 136, false},
    {24, "I8", 1, 1, false},
    {25, "I16", 1, 2, false},
    {26, "I32", 1, 4, false},
    {27, "I64", 1, 8, false},
    {28, "F64", 1, 8, false},
    {29, "IQ1_M", 256, 56, false},
    {30, "BF16", 1, 2, true},
    // 31-33 (Q4_0_4_4, Q4_0_4_8, Q4_0_8_8) were removed from ggml.
    {34, "TQ1_0", 256, 54, false},
    {35, "TQ2_0", 256, 66, false},
    // 36-38 (IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8) were removed from ggml.
    {39, "MXFP4", 32, 17, true},
    {40, "NVFP4", 64, 36, false},
    {41, "Q1_0", 128, 18, false},
}};

const KnownType* find_known(uint32_t id) {
  for (const KnownType& t : kKnownTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t id) {
  const KnownType* t = find_known(id);
  if (t == nullptr || !t->charm_reads) return std::nullopt;
  return GgmlTypeTraits{static_cast<GgmlType>(t->id), t->name, t->block_elements, t->block_bytes};
}

GgmlTypeTraits ggml_traits(GgmlType type) {
  // Every GgmlType enumerator is in the table with charm_reads set (the test checks it).
  return *ggml_type_traits(static_cast<uint32_t>(type));
}

std::string_view ggml_type_name_of_id(uint32_t id) {
  // The fallback text lives in a per-thread buffer so the view stays valid until this
  // thread's next call with an unknown id; error messages copy it at once.
  const KnownType* t = find_known(id);
  if (t != nullptr) return t->name;
  thread_local std::string unknown;
  unknown = "type " + std::to_string(id);
  return unknown;
}

std::optional<uint64_t> ggml_row_bytes(GgmlType type, int64_t elements) {
  // Also nullopt for a negative count or a byte count past u64, so a caller sizing a
  // row from file input never sees a wrapped number.
  const GgmlTypeTraits traits = ggml_traits(type);
  if (elements < 0 || elements % traits.block_elements != 0) return std::nullopt;
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(elements / traits.block_elements),
                             static_cast<uint64_t>(traits.block_bytes), &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

std::vector<int> ggml_f16_scale_offsets(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0: return {0};
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: return {0, 2};
    case GgmlType::kQ2_K: return {80, 82};
    case GgmlType::kQ3_K: return {108};
    case GgmlType::kQ6_K: return {208};
    default: return {};
  }
}

}  // namespace charm
