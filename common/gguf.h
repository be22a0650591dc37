// Reader for GGUF files, versions 2 and 3 (ggml's docs/gguf.md; llama.cpp's
// ggml/src/gguf.cpp is the reference reader): "GGUF", u32 version, u64 tensor_count,
// u64 kv_count, the metadata key-value pairs, the tensor infos, then the tensor data
// section at the next multiple of `general.alignment` (default 32). Little-endian only.
// A model in several files (gguf-split) is common/gguf_split.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/ggml_type.h"
#include "common/mapped_file.h"

namespace charm {

/// GGUF metadata value types (the u32 before each value). File format ids: never renumber.
enum class GgufValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

/// gguf's spelling of `type` ("u32", "f32", "string", "array"); "type <n>" for others.
std::string gguf_value_type_name(GgufValueType type);

struct GgufArray;
struct GgufValueOrigin;

/// One metadata value: a scalar (integer, float, bool, string) or an array of one element
/// type (arrays of arrays allowed, two levels deep at most). Every accessor throws
/// Error(kInvalidInput) naming the key (and the element, "key[3]") when the value does
/// not have the type asked for. Immutable once read; thread-safe to read concurrently.
class GgufValue {
 public:
  GgufValue() = default;

  GgufValueType type() const { return type_; }
  /// The key it was read under; an array element's is "key[i]".
  std::string name() const;

  bool is_integer() const;  ///< u8 .. i64
  bool is_float() const { return type_ == GgufValueType::kF32 || type_ == GgufValueType::kF64; }
  bool is_array() const { return type_ == GgufValueType::kArray; }

  /// The value of any integer type, when it fits the result type (a u16 7 reads as
  /// as_i32 7; an i32 -1 as as_u64 throws).
  uint64_t as_u64() const;
  int64_t as_i64() const;
  uint32_t as_u32() const;
  int32_t as_i32() const;
  /// An f32 or f64 (an f64 rounds to nearest for as_f32). Integers are refused.
  float as_f32() const;
  double as_f64() const;
  bool as_bool() const;
  const std::string& as_string() const;

  /// For an array: its element type and element count. Throws for a scalar.
  GgufValueType element_type() const;
  uint64_t size() const;
  /// Element `i` (< size(), else kInvalidInput) as a value of its own.
  GgufValue at(uint64_t i) const;
  /// An array of any integer type as int64 (an element past INT64_MAX throws naming it).
  std::vector<int64_t> as_i64_array() const;
  /// An array of f32 or f64 (f64 elements round to nearest for the f32 form).
  std::vector<float> as_f32_array() const;
  std::vector<double> as_f64_array() const;
  /// An array of strings (no copy).
  const std::vector<std::string>& as_string_array() const;
  /// An array of arrays: the inner arrays (no copy).
  const std::vector<GgufValue>& as_array_array() const;

 private:
  friend class GgufValueBuilder;
  [[noreturn]] void fail_type(const std::string& wanted) const;
  const GgufArray& array() const;

  GgufValueType type_ = GgufValueType::kU8;
  uint64_t bits_ = 0;  ///< integers (as two's complement), bool, f32/f64 (as f64 bits)
  std::string string_;
  std::shared_ptr<const GgufArray> array_;
  std::shared_ptr<const GgufValueOrigin> origin_;  ///< file and key, for messages
  int64_t index_ = -1;  ///< position in its parent array, or -1 for a top-level value
};

/// A file's metadata by key. Keys are unique (a repeated one is refused at open), so the
/// map loses nothing but the file order; std::less<> allows lookups by string_view.
using GgufMetadata = std::map<std::string, GgufValue, std::less<>>;

/// One tensor's entry in a GGUF file.
struct GgufTensorInfo {
  std::string name;
  uint32_t type_id = 0;           ///< the ggml type id as stored
  GgmlType type = GgmlType::kF32;  ///< the same, as a type charm reads
  std::vector<int64_t> ne;        ///< ggml order: ne[0] varies fastest (a row), 1..4 dims
  uint64_t offset = 0;            ///< as stored: bytes from the start of the data section
  uint64_t data_begin = 0;        ///< absolute byte offset in its file
  uint64_t nbytes = 0;            ///< rows() * row_bytes()
  uint32_t split = 0;             ///< index of its file in a GgufModelFiles (0 for one file)

  /// numpy / Hugging Face order: ne reversed, outermost first ([rows.., ne[0]]).
  std::vector<int64_t> shape() const;
  /// Product of ne.
  uint64_t numel() const;
  /// Values per row: ne[0].
  int64_t row_elements() const { return ne.empty() ? 0 : ne.front(); }
  /// numel() / ne[0] (the product of ne[1..]).
  uint64_t rows() const;
  /// Bytes of one row (whole blocks of `type`). Throws Error(kInvalidInput) for an info
  /// not from a GgufFile whose ne[0] is not whole blocks.
  uint64_t row_bytes() const;
};

/// An open, validated GGUF file. The header, metadata and tensor infos are parsed and
/// checked completely at open, so every offset and size in them can be trusted; the file
/// is memory-mapped read-only (resident tensors cost no copy) and `read` uses pread (an
/// on-demand expert read does not fault in the mapping). Memory held: the metadata and
/// tensor infos, within the caps below at most about 10 times their bytes in the file
/// (an array of empty strings: 4x; tensor infos: 8x).
/// Thread-safety: const methods may be called from any thread concurrently. The file
/// must not be truncated while open (the mapping would fault, as for any mmap reader).
class GgufFile {
 public:
  /// Longest key, string value and tensor name accepted (bytes).
  static constexpr uint64_t kMaxKeyBytes = 64 * 1024;
  static constexpr uint64_t kMaxStringBytes = 64 * 1024 * 1024;
  static constexpr uint64_t kMaxNameBytes = 64 * 1024;
  /// Deepest array nesting accepted: an array of arrays of scalars is 2.
  static constexpr int kMaxArrayDepth = 2;
  /// Most key-value pairs, inner arrays (all arrays of arrays together) and tensors one
  /// file may hold. Real models have a few dozen keys, no or few inner arrays and a few
  /// thousand tensors; the caps bound the memory a hostile file's many tiny entries cost
  /// (each is ~10-20 times its bytes in the file as a map node or object).
  static constexpr uint64_t kMaxKeyValues = 65536;
  static constexpr uint64_t kMaxInnerArrays = 65536;
  static constexpr uint64_t kMaxTensors = 1 << 20;
  static constexpr uint32_t kDefaultAlignment = 32;

  /// Opens and validates `path`. Throws Error(kInvalidInput) naming the file and the key
  /// or tensor at fault for: a file shorter than its header or truncated anywhere (every
  /// length and count is checked against the bytes left before anything is allocated),
  /// a magic other than "GGUF", a version other than 2 or 3 (a big-endian file, whose
  /// version reads byte-swapped, is named as such), kv_count or tensor_count larger than
  /// the file could hold or than kMaxKeyValues / kMaxTensors, more than kMaxInnerArrays
  /// inner arrays, an empty key or one given twice, a key over 64 KiB, a string
  /// over 64 MiB, an unknown value type, a bool other than 0 or 1, arrays nested deeper
  /// than 2, a general.alignment that is not a u32 power of two, an empty tensor name,
  /// a name over 64 KiB or given twice, n_dims outside 1..4, a dim negative as int64 or
  /// dims whose product overflows int64, a ggml type id unknown to ggml or one charm
  /// does not read (named as ggml does: "IQ2_XXS (16)"), ne[0] not a multiple of the
  /// type's block, an offset not a multiple of the alignment, data past the end of the
  /// file, or two tensors whose bytes overlap. Throws Error(kIo) when the file cannot be
  /// opened, is not a regular file, or cannot be mapped.
  static std::unique_ptr<GgufFile> open(const std::filesystem::path& path);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  uint32_t version() const { return version_; }
  /// general.alignment, or 32.
  uint32_t alignment() const { return alignment_; }
  /// Absolute offset of the tensor data section.
  uint64_t data_offset() const { return data_offset_; }
  /// File size in bytes.
  uint64_t size() const { return file_.size(); }

  const GgufMetadata& metadata() const { return metadata_; }
  /// The value of `key`, or nullptr when absent.
  const GgufValue* find(std::string_view key) const;
  /// The value of `key`; throws Error(kInvalidInput) naming the file and key when absent.
  const GgufValue& get(std::string_view key) const;

  /// All tensors in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  /// The tensor named `name`, or nullptr.
  const GgufTensorInfo* find_tensor(std::string_view name) const;

  /// Pointer to the tensor's bytes in the read-only mapping (valid while *this lives).
  /// Throws Error(kInvalidInput) if `info` does not lie inside this file.
  const uint8_t* mapped(const GgufTensorInfo& info) const;
  /// Reads `count` bytes starting `offset` bytes into the tensor into `dst` with pread.
  /// Throws Error(kInvalidInput) if the range is outside the tensor or the tensor outside
  /// this file, Error(kIo) on a failed or short read.
  void read(const GgufTensorInfo& info, uint64_t offset, uint64_t count, void* dst) const;

 private:
  friend class GgufParser;
  friend class GgufModelFiles;  // sets each tensor's `split` (common/gguf_split.h)
  GgufFile() = default;
  std::filesystem::path path_;
  MappedFile file_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  GgufMetadata metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> by_name_;  ///< name -> index in tensors_
};

}  // namespace charm
