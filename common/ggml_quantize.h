// Quantising f32 weights into GGML blocks at load: the `quant_dense` option
// (docs/configuration.md) turns a safetensors checkpoint's dense matrices (attention,
// dense and shared-expert MLPs, embeddings, lm_head) into Q8_0 or Q4_0 blocks, as
// llama.cpp's Q8_0 / Q4_0 files hold them. LOSSY and opt-in.
//
// The quantisers are ggml's reference ones (ggml/src/ggml-quants.c quantize_row_q8_0_ref,
// quantize_row_q4_0_ref), which gguf-py's gguf.quants.quantize reproduces bit for bit;
// tests/unit/test_ggml_quantize.cpp checks charm's against gguf-py's output.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/ggml_type.h"
#include "common/weight_format.h"

namespace charm {

/// The GGML types quant_dense can write: Q8_0, Q4_0.
bool can_quantize_ggml(GgmlType type);

/// Quantises `n` f32 values at `x` (n a multiple of 32, every value finite) into n / 32
/// blocks of `type` at `out` (Q8_0: 34 bytes each, {f16 d; i8 q[32]}; Q4_0: 18 bytes,
/// {f16 d; u8 q[16]}, low nibbles elements 0..15):
///  - Q8_0: d = max|x| / 127, q = round-half-away(x * (1 / d)) (0 where d is 0);
///  - Q4_0: m = the first x of largest |x|, d = m / -8, q = min(15, trunc(x * (1 / d) + 8.5)).
/// d is stored rounded to f16. Returns false, with `out` partly written, when a block's d
/// overflows f16 (|x| over about 8.3e6 for Q8_0, 5.2e5 for Q4_0): such a block cannot be
/// represented. Throws Error(kInvalidInput) for a type can_quantize_ggml refuses or n not
/// whole blocks.
bool quantize_ggml(GgmlType type, const float* x, int64_t n, uint8_t* out);

/// The quant_dense setting spelled `value`: "q8_0" or "q4_0" -> the type, "none" -> nullopt.
/// Throws Error(kInvalidInput) naming `what` (the key or flag) for anything else.
std::optional<GgmlType> parse_dense_quant(std::string_view value, std::string_view what);

/// "q8_0", "q4_0" (lower case, as parse_dense_quant spells them), or "none".
std::string dense_quant_name(std::optional<GgmlType> type);

/// The bytes per row quantize_dense makes of a matrix of `cols` columns, or nullopt when
/// it keeps the matrix as stored: already GGML blocks (`ggml_blocks`), or rows that are
/// not whole blocks of `type`.
std::optional<uint64_t> dense_quant_row_bytes(GgmlType type, bool ggml_blocks, int64_t cols);

/// `m` with every row quantised to `type` (can_quantize_ggml), as quantize_ggml does;
/// `m` itself when it is already GGML blocks (a GGUF file's own quantisation stays) or its
/// rows are not whole blocks of 32 (kept at their precision, as llama.cpp's converter
/// keeps such a matrix in F16). Throws Error(kInvalidInput) naming `name` and the row
/// when a block's scale overflows f16.
StoredMatrix quantize_dense(StoredMatrix m, GgmlType type, const std::string& name);

}  // namespace charm
