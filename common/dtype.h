// Element types of checkpoint tensors and their conversion to f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace charm {

/// Element type of a stored tensor. Compute is always f32 (issue 2); storage may be any.
/// kF8E4M3 is float8_e4m3fn (OCP FP8 E4M3: bias 7, no infinities, one NaN pattern per
/// sign), stored block-scaled in DeepSeek-V3 checkpoints (see Checkpoint::load_f32).
/// kU8: raw bytes that are no float values (gpt-oss's MXFP4 `*_blocks` / `*_scales`,
/// common/mxfp4.h); convert_to_f32 and weight_format_of refuse it.
enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kF8E4M3 = 3, kU8 = 4 };

/// Bytes per element of `dtype`.
size_t dtype_size(DType dtype);

/// The safetensors spelling ("F32", "F16", "BF16", "F8_E4M3").
const char* dtype_name(DType dtype);

/// Parses a safetensors dtype string; nullopt for anything charm does not read.
std::optional<DType> parse_dtype(std::string_view name);

/// bfloat16 bits -> f32 (exact: bf16 is the top half of an f32).
inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

/// IEEE half bits -> f32 (exact, handles subnormals, inf and NaN).
float f16_to_f32(uint16_t bits);

/// float8_e4m3fn bits -> f32 (exact: every e4m3 value is an f32). Layout S EEEE MMM,
/// exponent bias 7; exponent 0 is subnormal (M/8 * 2^-6); S 1111 111 is NaN; there are
/// no infinities, so S 1111 110 = +-448 is the largest finite value (OCP FP8 spec, as
/// torch.float8_e4m3fn).
float f8e4m3_to_f32(uint8_t bits);

/// f32 -> IEEE half bits, round to nearest even in the default rounding mode (ggml's
/// GGML_FP32_TO_FP16, F16C's _cvtss_sh(x, 0), numpy's astype(float16)): magnitudes from
/// 65520 up become Inf, NaN stays a (quiet) NaN, subnormals are rounded as such.
uint16_t f32_to_f16(float value);

/// f32 -> bfloat16 bits, round to nearest even (as torch does); NaN stays NaN.
uint16_t f32_to_bf16(float value);

/// Converts `count` elements of `dtype` at `src` (any alignment) to f32 at `dst`. Throws
/// Error(kUnsupported) for kU8 (packed data, not numbers to widen).
void convert_to_f32(DType dtype, const void* src, float* dst, size_t count);

/// The index of the first NaN or infinity among `count` elements of `dtype` at `data`
/// (any alignment), or `count` when every one is finite. float8_e4m3fn has no
/// infinities: its NaN codes (S 1111 111) are the only non-finite values. One pass over
/// the bytes, vectorised; thread-safe. kU8 bytes are always finite (`count`).
uint64_t first_non_finite(DType dtype, const void* data, uint64_t count);

/// "NaN", "+Inf" or "-Inf" for a non-finite `value`, for error messages.
std::string non_finite_name(float value);

}  // namespace charm
