// Test helper: writes small GGUF files (ggml docs/gguf.md), valid or deliberately
// malformed: metadata of every value type (nested arrays and raw, unknown types
// included), tensors of any ggml type id with the raw bytes given, any alignment, and
// overrides for every header field. Header-only so any test_*.cpp can include it; put
// the files in a test::TempDir (tests/support/temp_dir.h).
//
//   GgufBuilder b;
//   b.kv("general.architecture", gguf::str("qwen3moe"));
//   b.kv("qwen3moe.block_count", gguf::u32(2));
//   b.tensor("token_embd.weight", 0 /*F32*/, {4, 2}, f32_bytes({...}));
//   b.write(dir / "model.gguf");
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace charm::testing {

namespace gguf {

/// One encoded value: its GGUF type id and its bytes as they follow the type in a file.
struct Value {
  uint32_t type = 0;
  std::string bytes;
};

/// `v`'s little-endian bytes.
template <typename T>
std::string le(T v) {
  std::string s(sizeof v, '\0');
  std::memcpy(s.data(), &v, sizeof v);  // the tests run on little-endian hosts only
  return s;
}

/// A GGUF string: u64 length, then the bytes (no terminator).
inline std::string string_bytes(const std::string& s) { return le<uint64_t>(s.size()) + s; }

inline Value u8(uint8_t v) { return {0, le(v)}; }
inline Value i8(int8_t v) { return {1, le(v)}; }
inline Value u16(uint16_t v) { return {2, le(v)}; }
inline Value i16(int16_t v) { return {3, le(v)}; }
inline Value u32(uint32_t v) { return {4, le(v)}; }
inline Value i32(int32_t v) { return {5, le(v)}; }
inline Value f32(float v) { return {6, le(v)}; }
inline Value boolean(bool v) { return {7, le<uint8_t>(v ? 1 : 0)}; }
inline Value str(const std::string& v) { return {8, string_bytes(v)}; }
inline Value u64(uint64_t v) { return {10, le(v)}; }
inline Value i64(int64_t v) { return {11, le(v)}; }
inline Value f64(double v) { return {12, le(v)}; }
/// Any type id with any bytes (an unknown type, a bool of value 7, a truncated value).
inline Value raw(uint32_t type, std::string bytes) { return {type, std::move(bytes)}; }

/// An array of `element_type` holding `elements` (each must be of that type; not
/// checked, so tests can write inconsistent arrays). Arrays of arrays: element_type 9.
inline Value array(uint32_t element_type, const std::vector<Value>& elements) {
  Value v{9, le(element_type) + le<uint64_t>(elements.size())};
  for (const auto& e : elements) v.bytes += e.bytes;
  return v;
}
/// An array header declaring `count` elements followed by exactly `body` (for counts that
/// lie about what follows).
inline Value array_raw(uint32_t element_type, uint64_t count, const std::string& body) {
  return {9, le(element_type) + le(count) + body};
}

}  // namespace gguf

/// One tensor info, and the bytes to place at its offset.
struct GgufTensorSpec {
  std::string name;
  uint32_t type_id = 0;        ///< ggml type id (0 F32, 1 F16, 8 Q8_0, 30 BF16, ...)
  std::vector<uint64_t> ne;    ///< ggml order, ne[0] fastest; u64 so tests can write "negative" dims
  std::string data;            ///< raw bytes (not checked against ne and type)
  std::optional<uint64_t> offset;  ///< relative to the data section; default: packed, aligned
};

/// Builds a GGUF file in memory. Defaults write a valid version-3 file: tensors packed in
/// order, each at the next multiple of `alignment`, the data section padded likewise.
class GgufBuilder {
 public:
  std::string magic = "GGUF";
  uint32_t version = 3;
  uint32_t alignment = 32;  ///< used for padding; add general.alignment yourself (or set_alignment)
  std::optional<uint64_t> tensor_count;  ///< overrides the count written
  std::optional<uint64_t> kv_count;      ///< overrides the count written

  /// Adds a key-value pair (repeats are written as given).
  GgufBuilder& kv(const std::string& key, const gguf::Value& value) {
    kvs_.push_back({key, value});
    return *this;
  }
  /// Sets the padding and writes general.alignment = `a` (u32).
  GgufBuilder& set_alignment(uint32_t a) {
    alignment = a;
    return kv("general.alignment", gguf::u32(a));
  }
  GgufBuilder& tensor(const std::string& name, uint32_t type_id, std::vector<uint64_t> ne, std::string data,
                      std::optional<uint64_t> offset = std::nullopt) {
    tensors_.push_back({name, type_id, std::move(ne), std::move(data), offset});
    return *this;
  }

  /// Byte offset in the file where the data section starts.
  uint64_t data_offset() const { return pad(header().size()); }

  /// The whole file.
  std::string bytes() const {
    std::string out = header();
    out.resize(pad(out.size()), '\0');
    const std::vector<uint64_t> offsets = tensor_offsets();
    std::string data;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const std::string& d = tensors_[i].data;
      if (offsets[i] > (uint64_t{1} << 24)) continue;  // a deliberately wild offset: nothing to place
      if (data.size() < offsets[i] + d.size()) data.resize(offsets[i] + d.size(), '\0');
      data.replace(offsets[i], d.size(), d);
    }
    data.resize(pad(data.size()), '\0');
    return out + data;
  }

  void write(const std::filesystem::path& path) const { write_to(path, bytes()); }

  /// Writes `bytes` verbatim to `path` (e.g. a truncated bytes()).
  static void write_to(const std::filesystem::path& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error("cannot write " + path.string());
  }

 private:
  uint64_t pad(uint64_t n) const { return alignment == 0 ? n : (n + alignment - 1) / alignment * alignment; }

  std::vector<uint64_t> tensor_offsets() const {
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const auto& t : tensors_) {
      offsets.push_back(t.offset.value_or(next));
      next = pad(offsets.back() + t.data.size());
    }
    return offsets;
  }

  std::string header() const {
    using gguf::le;
    std::string out = magic + le(version) + le<uint64_t>(tensor_count.value_or(tensors_.size())) +
                      le<uint64_t>(kv_count.value_or(kvs_.size()));
    for (const auto& [key, value] : kvs_) out += gguf::string_bytes(key) + le(value.type) + value.bytes;
    const std::vector<uint64_t> offsets = tensor_offsets();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      out += gguf::string_bytes(t.name) + le<uint32_t>(static_cast<uint32_t>(t.ne.size()));
      for (uint64_t d : t.ne) out += le(d);
      out += le(t.type_id) + le(offsets[i]);
    }
    return out;
  }

  std::vector<std::pair<std::string, gguf::Value>> kvs_;
  std::vector<GgufTensorSpec> tensors_;
};

/// `values` as little-endian f32 bytes.
inline std::string f32_bytes(const std::vector<float>& values) {
  std::string s(values.size() * 4, '\0');
  std::memcpy(s.data(), values.data(), s.size());
  return s;
}

}  // namespace charm::testing
