// Test helper: writes small .safetensors files (valid or deliberately malformed), to be
// put in a test::TempDir (tests/support/temp_dir.h). Used by the reader tests;
// header-only on purpose so any test_*.cpp can include it.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/dtype.h"

namespace charm::testing {

/// Writes `bytes` to `path` verbatim.
inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

/// The 8-byte little-endian length prefix for a header of `n` bytes.
inline std::string length_prefix(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

/// Writes a file whose header is exactly `header` (any text, valid or not) followed by
/// `data`, so tests can craft every malformed case.
inline void write_raw_safetensors(const std::filesystem::path& path, const std::string& header,
                                  const std::string& data) {
  write_bytes(path, length_prefix(header.size()) + header + data);
}

/// One tensor to write: name, dtype, shape and f32 values converted to that dtype.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<float> values;  ///< product(shape) values, row-major
};

/// f32 -> IEEE half bits, round to nearest even (test-side reference conversion).
inline uint16_t f32_to_f16_bits(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int32_t exp = static_cast<int32_t>((u >> 23) & 0xff) - 127 + 15;
  uint32_t mant = u & 0x7fffffu;
  if (((u >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {  // subnormal or zero
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) ++half;  // may carry into exponent: correct
  return static_cast<uint16_t>(sign | half);
}

/// The float8_e4m3fn code of `value`, which must be exactly representable (tests write
/// only such values) or NaN (code 0x7f); throws otherwise.
inline uint8_t f8e4m3_code(float value) {
  if (value != value) return 0x7f;
  for (int code = 0; code < 256; ++code) {
    if (f8e4m3_to_f32(static_cast<uint8_t>(code)) == value) return static_cast<uint8_t>(code);
  }
  throw std::runtime_error("value " + std::to_string(value) + " is not exact in float8_e4m3fn");
}

/// Encodes `values` in `dtype` (little-endian bytes).
inline std::string encode(DType dtype, const std::vector<float>& values) {
  std::string out;
  for (float v : values) {
    if (dtype == DType::kF8E4M3) {
      out.push_back(static_cast<char>(f8e4m3_code(v)));
    } else if (dtype == DType::kU8) {  // raw bytes: values 0..255
      if (!(v >= 0 && v <= 255 && v == static_cast<float>(static_cast<int>(v)))) throw std::runtime_error("U8 value");
      out.push_back(static_cast<char>(static_cast<uint8_t>(v)));
    } else if (dtype == DType::kF32) {
      out.append(reinterpret_cast<const char*>(&v), 4);
    } else {
      const uint16_t bits = dtype == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16_bits(v);
      out.push_back(static_cast<char>(bits & 0xff));
      out.push_back(static_cast<char>(bits >> 8));
    }
  }
  return out;
}

/// Writes a valid safetensors file holding `tensors` in the given order.
inline void write_safetensors(const std::filesystem::path& path, const std::vector<TensorSpec>& tensors,
                              const nlohmann::json& metadata = nullptr) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& t : tensors) {
    const std::string bytes = encode(t.dtype, t.values);
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + bytes.size()}}};
    data += bytes;
  }
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the reference writer pads to 8 bytes
  write_raw_safetensors(path, text, data);
}

/// `count` distinct values start, start+step, ... exactly representable in bf16 and f16
/// for small counts (multiples of 1/8 up to 32).
inline std::vector<float> ramp(size_t count, float start = 0.0f, float step = 0.125f) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

}  // namespace charm::testing
