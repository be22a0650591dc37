// GGML tensor element types as GGUF files store them (ggml/include/ggml.h `enum ggml_type`,
// sizes as gguf-py's gguf.constants.GGML_QUANT_SIZES): the numeric ids, names, and the
// block geometry every reader needs to size a tensor. A quantised type packs
// `block_elements` consecutive values of a row into `block_bytes` bytes (scales included);
// the unquantised ones are blocks of one element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>
#include <string_view>

namespace charm {

/// ggml_type ids (the u32 in a GGUF tensor info). Values are the file format's: never
/// renumber. Only the types charm reads are named; others are refused by id.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
  kMXFP4 = 39,
};

/// Block geometry of one type.
struct GgmlTypeTraits {
  GgmlType type;
  const char* name;         ///< ggml's spelling: "F32", "Q4_K", "MXFP4"
  int64_t block_elements;   ///< values per block (1 for F32/F16/BF16, 32, or 256)
  int64_t block_bytes;      ///< bytes per block
};

/// The traits of the type with ggml id `id`, or nullopt for an id charm does not read
/// (an unknown id, or a known ggml type without a dequantiser here, e.g. IQ2_XXS).
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t id);

/// The traits of a named type (always present).
GgmlTypeTraits ggml_traits(GgmlType type);

/// ggml's spelling of `id` when it is any ggml type ("IQ2_XXS" included), else "type <id>":
/// for error messages about types charm refuses.
std::string_view ggml_type_name_of_id(uint32_t id);

/// Bytes of a row of `elements` values of `type`; nullopt when `elements` is not a
/// multiple of the type's block_elements (a GGUF row is whole blocks).
std::optional<uint64_t> ggml_row_bytes(GgmlType type, int64_t elements);

/// Byte offsets of the f16 scales in one block of `type` (ggml-common.h's block_* structs:
/// d, and dmin where there is one); empty for types without f16 scales (F32, F16, BF16, and
/// MXFP4, whose scale is the e8m0 byte 0).
std::vector<int> ggml_f16_scale_offsets(GgmlType type);

/// Widens `elements` values of `type` at `src` (whole blocks, any alignment) to f32 at
/// `dst`, bit for bit as gguf-py's reference dequantisers (gguf.quants.dequantize) and
/// ggml's dequantize_row_* compute them. Requires elements % block_elements == 0.
/// Thread-safe.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t elements);

}  // namespace charm
