// Element types of checkpoint tensors and their conversion to f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace charm {

/// Element type of a stored tensor. Compute is always f32 (issue 2); storage may be any.
enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

/// Bytes per element of `dtype`.
size_t dtype_size(DType dtype);

/// The safetensors spelling ("F32", "F16", "BF16").
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

/// f32 -> bfloat16 bits, round to nearest even (as torch does); NaN stays NaN.
uint16_t f32_to_bf16(float value);

/// Converts `count` elements of `dtype` at `src` (any alignment) to f32 at `dst`.
void convert_to_f32(DType dtype, const void* src, float* dst, size_t count);

}  // namespace charm
