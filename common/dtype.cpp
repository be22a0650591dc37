#include "common/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/error.h"

namespace charm {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF8E4M3: return 1;
    case DType::kU8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kU8: return "U8";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  if (name == "U8") return DType::kU8;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {  // inf or NaN
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // signed zero
    bits = sign;
  } else {  // subnormal: normalise
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

float f8e4m3_to_f32(uint8_t bits) {
  const bool negative = (bits & 0x80u) != 0;
  const int exponent = (bits >> 3) & 0xf;
  const int mantissa = bits & 0x7;
  float magnitude;
  if (exponent == 0xf && mantissa == 0x7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // M/8 * 2^(1-7)
  } else {
    magnitude = std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);  // (1 + M/8) * 2^(E-7)
  }
  return negative ? -magnitude : magnitude;
}

uint16_t f32_to_f16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t x = bits & 0x7FFFFFFFu;
  if (x > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  if (x >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: Inf
  if (x < 0x38800000u) {  // below 2^-14: an f16 subnormal, q * 2^-24 (exact scaling)
    float magnitude;
    std::memcpy(&magnitude, &x, sizeof magnitude);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(magnitude * 16777216.0f)));
  }
  const uint32_t rounded = x + 0xFFFu + ((x >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

uint16_t f32_to_bf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

void convert_to_f32(DType dtype, const void* src, float* dst, size_t count) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, count * 4);
      return;
    case DType::kBF16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, bytes + 2 * i, 2);
        dst[i] = bf16_to_f32(bits);
      }
      return;
    case DType::kF16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, bytes + 2 * i, 2);
        dst[i] = f16_to_f32(bits);
      }
      return;
    case DType::kF8E4M3:
      for (size_t i = 0; i < count; ++i) dst[i] = f8e4m3_to_f32(bytes[i]);
      return;
    case DType::kU8:
      fail_unsupported("a U8 tensor holds packed data (MXFP4 blocks or scales), not float values to read");
  }
}

namespace {

/// The first index in [0, count) whose `Bits`-wide element has every bit of `mask` set
/// (an all-ones exponent: Inf or NaN; for e4m3, the NaN code), else `count`. Scans
/// blocks with a branch-free OR the compiler vectorises, and looks for the element only
/// in a block that has one; any alignment (elements are read with memcpy).
template <typename Bits>
uint64_t first_with_mask(const uint8_t* bytes, uint64_t count, Bits mask) {
  constexpr uint64_t kBlock = 2048;
  for (uint64_t begin = 0; begin < count; begin += kBlock) {
    const uint64_t end = std::min(count, begin + kBlock);
    Bits any = 0;  // an integer OR-reduction (a bool one does not vectorise)
    for (uint64_t i = begin; i < end; ++i) {
      Bits v;
      std::memcpy(&v, bytes + i * sizeof(Bits), sizeof(Bits));
      any |= static_cast<Bits>((v & mask) == mask);
    }
    if (any == 0) continue;
    for (uint64_t i = begin; i < end; ++i) {
      Bits v;
      std::memcpy(&v, bytes + i * sizeof(Bits), sizeof(Bits));
      if ((v & mask) == mask) return i;
    }
  }
  return count;
}

}  // namespace

uint64_t first_non_finite(DType dtype, const void* data, uint64_t count) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  switch (dtype) {
    case DType::kF32: return first_with_mask<uint32_t>(bytes, count, 0x7f800000u);
    case DType::kF16: return first_with_mask<uint16_t>(bytes, count, 0x7c00u);
    case DType::kBF16: return first_with_mask<uint16_t>(bytes, count, 0x7f80u);
    case DType::kF8E4M3: return first_with_mask<uint8_t>(bytes, count, 0x7fu);  // S 1111 111: NaN
    case DType::kU8: return count;  // integers: never NaN or infinite
  }
  return count;
}

std::string non_finite_name(float value) {
  if (std::isnan(value)) return "NaN";
  return value > 0 ? "+Inf" : "-Inf";
}

}  // namespace charm
