// MXFP4 as gpt-oss's Hugging Face checkpoints ship its experts (OCP Microscaling Formats
// v1.0: FP4 E2M1 elements in groups of 32 sharing one E8M0 scale), decoded exactly as
// transformers' integrations/mxfp4.py convert_moe_packed_tensors does. The layout differs
// from GGUF's MXFP4 blocks (common/ggml_dequantize.h): the scales are a tensor of their
// own, and byte j of a group holds its elements 2j (low nibble) and 2j + 1 (high nibble).
#pragma once

#include <cstddef>
#include <cstdint>

namespace charm {

/// Bytes of one group in a `*_blocks` tensor (32 FP4 elements), and its element count.
inline constexpr size_t kMxfp4GroupBytes = 16;
inline constexpr size_t kMxfp4GroupSize = 32;

/// Decodes `rows` rows of `groups` groups: blocks [rows, groups, 16] uint8, scales [rows,
/// groups] uint8 (E8M0: 2^(s - 127)), out [rows, groups * 32] f32 with
/// out[r][32g + 2j] = FP4(low nibble of blocks[r][g][j]) * 2^(s - 127) and
/// out[r][32g + 2j + 1] = FP4(high nibble) * 2^(s - 127); FP4 = {0, 0.5, 1, 1.5, 2, 3, 4,
/// 6}, the nibble's bit 3 its sign. Every product is exact in f32 (2 significant bits,
/// subnormals included) except past f32's range, where it is infinite; s = 255 is E8M0's
/// NaN. Callers refuse both (not weights). Pure, thread-safe.
void decode_mxfp4_rows(const uint8_t* blocks, const uint8_t* scales, size_t rows, size_t groups, float* out);

}  // namespace charm
