// GGUF reader: validates the whole header (metadata and tensor infos) at open, so later
// reads can trust every offset, maps the file read-only and serves on-demand reads with
// pread. Format: ggml docs/gguf.md; llama.cpp's ggml/src/gguf.cpp is the reference
// reader whose checks (alignment a u32 power of two, n_dims <= 4, non-negative dims whose
// product fits int64, ne[0] a multiple of the block size) this follows, with stricter
// limits on lengths and counts (hostile files must not make us allocate).
#include "common/gguf.h"


#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/error.h"

namespace charm {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader copies little-endian fields as they are");

/// Where a value was read: for messages.
struct GgufValueOrigin {
  std::string file;
  std::string key;
};

/// An array value's elements. Numeric and bool elements stay as their file bytes (one
/// copy, no per-element object); strings and inner arrays are decoded.
struct GgufArray {
  GgufValueType element_type = GgufValueType::kU8;
  uint64_t count = 0;
  std::vector<uint8_t> raw;  ///< count * element size bytes, little-endian
  std::vector<std::string> strings;
  std::vector<GgufValue> arrays;
};

namespace {


/// Bytes of one scalar of `type`, 0 for string and array (variable).
uint64_t scalar_bytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kU16:
    case GgufValueType::kI16: return 2;
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kF32: return 4;
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kF64: return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray: return 0;
  }
  return 0;
}

bool known_value_type(uint32_t id) { return id <= static_cast<uint32_t>(GgufValueType::kF64); }

bool is_signed_integer(GgufValueType t) {
  return t == GgufValueType::kI8 || t == GgufValueType::kI16 || t == GgufValueType::kI32 || t == GgufValueType::kI64;
}

bool is_integer_type(GgufValueType t) {
  return is_signed_integer(t) || t == GgufValueType::kU8 || t == GgufValueType::kU16 || t == GgufValueType::kU32 ||
         t == GgufValueType::kU64;
}

/// The smallest number of file bytes one element of `type` takes: what a count is checked
/// against before anything is allocated for it.
uint64_t min_value_bytes(GgufValueType type) {
  if (type == GgufValueType::kString) return 8;  // u64 length
  if (type == GgufValueType::kArray) return 12;  // u32 type + u64 count
  return scalar_bytes(type);
}

/// Decodes a scalar of `type` at `p` into GgufValue's bits: integers sign- or
/// zero-extended to 64 bits, floats as the bits of the f64 they widen to exactly.
uint64_t decode_scalar_bits(GgufValueType type, const uint8_t* p) {
  auto load = [p](auto v) {
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (type) {
    case GgufValueType::kU8: return load(uint8_t{});
    case GgufValueType::kI8: return static_cast<uint64_t>(static_cast<int64_t>(load(int8_t{})));
    case GgufValueType::kU16: return load(uint16_t{});
    case GgufValueType::kI16: return static_cast<uint64_t>(static_cast<int64_t>(load(int16_t{})));
    case GgufValueType::kU32: return load(uint32_t{});
    case GgufValueType::kI32: return static_cast<uint64_t>(static_cast<int64_t>(load(int32_t{})));
    case GgufValueType::kU64: return load(uint64_t{});
    case GgufValueType::kI64: return static_cast<uint64_t>(load(int64_t{}));
    case GgufValueType::kBool: return load(uint8_t{});
    case GgufValueType::kF32: return std::bit_cast<uint64_t>(static_cast<double>(load(float{})));
    case GgufValueType::kF64: return load(uint64_t{});
    case GgufValueType::kString:
    case GgufValueType::kArray: break;
  }
  return 0;
}

std::string value_text(GgufValueType type, uint64_t bits) {
  if (is_signed_integer(type)) return std::to_string(static_cast<int64_t>(bits));
  if (is_integer_type(type)) return std::to_string(bits);
  if (type == GgufValueType::kBool) return bits ? "true" : "false";
  return std::to_string(std::bit_cast<double>(bits));
}

/// A bounds-checked little-endian reader over the mapped file. Every read names what it
/// reads, so a truncation error says where the file ends.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size, const std::string& file) : data_(data), size_(size), file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  /// Throws unless `n` more bytes remain.
  void need(uint64_t n, const std::string& what) const {
    if (n > left()) {
      fail_invalid(file_ + ": truncated: " + what + " needs " + std::to_string(n) + " bytes at byte " +
                   std::to_string(pos_) + " but the file has " + std::to_string(left()) + " left");
    }
  }
  const uint8_t* take(uint64_t n, const std::string& what) {
    need(n, what);
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  template <typename T>
  T read(const std::string& what) {
    T v;
    std::memcpy(&v, take(sizeof v, what), sizeof v);
    return v;
  }
  /// A u64 length then that many bytes; the length is checked against `max` and the bytes
  /// left before the string is allocated.
  std::string read_string(const std::string& what, uint64_t max) {
    const uint64_t n = read<uint64_t>(what + " length");
    if (n > max) {
      fail_invalid(file_ + ": " + what + " is " + std::to_string(n) + " bytes, over the " + std::to_string(max) +
                   "-byte limit");
    }
    const uint8_t* p = take(n, what);
    return std::string(reinterpret_cast<const char*>(p), n);
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& file_;
};

}  // namespace

// ---- GgufValue ------------------------------------------------------------------

std::string gguf_value_type_name(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8: return "u8";
    case GgufValueType::kI8: return "i8";
    case GgufValueType::kU16: return "u16";
    case GgufValueType::kI16: return "i16";
    case GgufValueType::kU32: return "u32";
    case GgufValueType::kI32: return "i32";
    case GgufValueType::kF32: return "f32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kU64: return "u64";
    case GgufValueType::kI64: return "i64";
    case GgufValueType::kF64: return "f64";
  }
  return "type " + std::to_string(static_cast<uint32_t>(type));
}

/// Builds values; the one place that sets GgufValue's private fields.
class GgufValueBuilder {
 public:
  static GgufValue scalar(GgufValueType type, uint64_t bits, std::shared_ptr<const GgufValueOrigin> origin,
                          int64_t index) {
    GgufValue v;
    v.type_ = type;
    v.bits_ = bits;
    v.origin_ = std::move(origin);
    v.index_ = index;
    return v;
  }
  static GgufValue string(std::string s, std::shared_ptr<const GgufValueOrigin> origin, int64_t index) {
    GgufValue v;
    v.type_ = GgufValueType::kString;
    v.string_ = std::move(s);
    v.origin_ = std::move(origin);
    v.index_ = index;
    return v;
  }
  static GgufValue array(std::shared_ptr<const GgufArray> a, std::shared_ptr<const GgufValueOrigin> origin,
                         int64_t index) {
    GgufValue v;
    v.type_ = GgufValueType::kArray;
    v.array_ = std::move(a);
    v.origin_ = std::move(origin);
    v.index_ = index;
    return v;
  }
};

std::string GgufValue::name() const {
  const std::string key = origin_ ? origin_->key : std::string("(unnamed)");
  return index_ < 0 ? key : key + "[" + std::to_string(index_) + "]";
}

void GgufValue::fail_type(const std::string& wanted) const {
  std::string is = gguf_value_type_name(type_);
  if (is_integer() || is_float() || type_ == GgufValueType::kBool) is += " " + value_text(type_, bits_);
  if (is_array()) is = "an array of " + std::to_string(array_->count) + " " + gguf_value_type_name(array_->element_type);
  fail_invalid((origin_ ? origin_->file : std::string("(no file)")) + ": metadata '" + name() + "' is " + is +
               ", not " + wanted);
}

bool GgufValue::is_integer() const { return is_integer_type(type_); }

uint64_t GgufValue::as_u64() const {
  if (!is_integer() || (is_signed_integer(type_) && static_cast<int64_t>(bits_) < 0)) fail_type("a u64");
  return bits_;
}

int64_t GgufValue::as_i64() const {
  if (!is_integer() || (!is_signed_integer(type_) && bits_ > static_cast<uint64_t>(INT64_MAX))) fail_type("an i64");
  return static_cast<int64_t>(bits_);
}

uint32_t GgufValue::as_u32() const {
  if (!is_integer() || (is_signed_integer(type_) && static_cast<int64_t>(bits_) < 0) || bits_ > UINT32_MAX) {
    fail_type("a u32");
  }
  return static_cast<uint32_t>(bits_);
}

int32_t GgufValue::as_i32() const {
  const bool fits = is_signed_integer(type_)
                        ? static_cast<int64_t>(bits_) >= INT32_MIN && static_cast<int64_t>(bits_) <= INT32_MAX
                        : bits_ <= static_cast<uint64_t>(INT32_MAX);
  if (!is_integer() || !fits) fail_type("an i32");
  return static_cast<int32_t>(static_cast<int64_t>(bits_));
}

double GgufValue::as_f64() const {
  if (!is_float()) fail_type("an f32 or f64");
  return std::bit_cast<double>(bits_);
}

float GgufValue::as_f32() const { return static_cast<float>(as_f64()); }

bool GgufValue::as_bool() const {
  if (type_ != GgufValueType::kBool) fail_type("a bool");
  return bits_ != 0;
}

const std::string& GgufValue::as_string() const {
  if (type_ != GgufValueType::kString) fail_type("a string");
  return string_;
}

const GgufArray& GgufValue::array() const {
  if (!is_array()) fail_type("an array");
  return *array_;
}

GgufValueType GgufValue::element_type() const { return array().element_type; }

uint64_t GgufValue::size() const { return array().count; }

GgufValue GgufValue::at(uint64_t i) const {
  const GgufArray& a = array();
  if (i >= a.count) {
    fail_invalid((origin_ ? origin_->file : std::string("(no file)")) + ": metadata '" + name() + "' has " +
                 std::to_string(a.count) + " elements; element " + std::to_string(i) + " asked for");
  }
  const auto index = static_cast<int64_t>(i);
  if (a.element_type == GgufValueType::kArray) return a.arrays[i];
  // The element's own origin names its path ("key[2]"), so its errors say "key[2][i]"
  // when this value is itself an inner array.
  auto origin = index_ < 0 ? origin_ : std::make_shared<const GgufValueOrigin>(GgufValueOrigin{origin_->file, name()});
  if (a.element_type == GgufValueType::kString) return GgufValueBuilder::string(a.strings[i], origin, index);
  const uint64_t width = scalar_bytes(a.element_type);
  return GgufValueBuilder::scalar(a.element_type, decode_scalar_bits(a.element_type, a.raw.data() + i * width),
                                  origin, index);
}

std::vector<int64_t> GgufValue::as_i64_array() const {
  const GgufArray& a = array();
  if (!is_integer_type(a.element_type)) fail_type("an array of integers");
  std::vector<int64_t> out;
  out.reserve(a.count);
  for (uint64_t i = 0; i < a.count; ++i) out.push_back(at(i).as_i64());
  return out;
}

std::vector<double> GgufValue::as_f64_array() const {
  const GgufArray& a = array();
  if (a.element_type != GgufValueType::kF32 && a.element_type != GgufValueType::kF64) {
    fail_type("an array of f32 or f64");
  }
  std::vector<double> out(a.count);
  const uint64_t width = scalar_bytes(a.element_type);
  for (uint64_t i = 0; i < a.count; ++i) {
    out[i] = std::bit_cast<double>(decode_scalar_bits(a.element_type, a.raw.data() + i * width));
  }
  return out;
}

std::vector<float> GgufValue::as_f32_array() const {
  const std::vector<double> wide = as_f64_array();
  return std::vector<float>(wide.begin(), wide.end());
}

const std::vector<std::string>& GgufValue::as_string_array() const {
  const GgufArray& a = array();
  if (a.element_type != GgufValueType::kString) fail_type("an array of strings");
  return a.strings;
}

const std::vector<GgufValue>& GgufValue::as_array_array() const {
  const GgufArray& a = array();
  if (a.element_type != GgufValueType::kArray) fail_type("an array of arrays");
  return a.arrays;
}

// ---- GgufTensorInfo -----------------------------------------------------------

std::vector<int64_t> GgufTensorInfo::shape() const { return std::vector<int64_t>(ne.rbegin(), ne.rend()); }

uint64_t GgufTensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : ne) n *= static_cast<uint64_t>(d);
  return n;
}

uint64_t GgufTensorInfo::rows() const {
  uint64_t n = 1;
  for (size_t i = 1; i < ne.size(); ++i) n *= static_cast<uint64_t>(ne[i]);
  return n;
}

uint64_t GgufTensorInfo::row_bytes() const {
  const auto bytes = ggml_row_bytes(type, row_elements());
  if (!bytes) {
    fail_invalid("tensor '" + name + "': ne[0] = " + std::to_string(row_elements()) + " is not whole blocks of " +
                 ggml_traits(type).name);
  }
  return *bytes;
}

// ---- parsing ------------------------------------------------------------------

/// Parses the mapped bytes of one file into a GgufFile's fields.
class GgufParser {
 public:
  GgufParser(GgufFile& out, const std::string& file) : out_(out), file_(file), in_(out.file_.data(), out.file_.size(), file) {}

  void parse() {
    parse_header();
    for (uint64_t i = 0; i < kv_count_; ++i) parse_kv(i);
    read_alignment();
    for (uint64_t i = 0; i < tensor_count_; ++i) parse_tensor_info(i);
    place_data();
  }

 private:
  void parse_header() {
    if (out_.size() < 4 || std::memcmp(out_.file_.data(), "GGUF", 4) != 0) {
      fail_invalid(file_ + ": not a GGUF file (the first 4 bytes are not \"GGUF\")");
    }
    in_.take(4, "magic");
    const uint32_t version = in_.read<uint32_t>("version");
    // gguf-py's own test: a big-endian file's small version number reads with its low
    // 16 bits zero here.
    if ((version & 0xffffu) == 0 && version != 0) {
      fail_invalid(file_ + ": GGUF version field reads " + std::to_string(version) + " (byte-swapped " +
                   std::to_string(__builtin_bswap32(version)) +
                   "): a big-endian GGUF file; charm reads little-endian GGUF only");
    }
    if (version != 2 && version != 3) {
      fail_invalid(file_ + ": GGUF version " + std::to_string(version) +
                   " is not supported (charm reads versions 2 and 3" +
                   (version == 1 ? std::string("; version 1 files predate 64-bit counts: reconvert the model")
                                 : std::string()) +
                   ")");
    }
    out_.version_ = version;
    tensor_count_ = in_.read<uint64_t>("tensor_count");
    kv_count_ = in_.read<uint64_t>("kv_count");
    // A key-value pair takes at least 8 + 1 + 4 + 1 bytes, a tensor info 8 + 1 + 4 + 8 + 4 + 8:
    // a count past what the rest of the file could hold is refused before any parsing.
    constexpr uint64_t kMinKvBytes = 14, kMinTensorBytes = 33;
    if (kv_count_ > GgufFile::kMaxKeyValues) {
      fail_invalid(file_ + ": kv_count " + std::to_string(kv_count_) + " is over charm's limit of " +
                   std::to_string(GgufFile::kMaxKeyValues) + " key-value pairs");
    }
    if (tensor_count_ > GgufFile::kMaxTensors) {
      fail_invalid(file_ + ": tensor_count " + std::to_string(tensor_count_) + " is over charm's limit of " +
                   std::to_string(GgufFile::kMaxTensors) + " tensors");
    }
    const uint64_t left = in_.left();
    if (kv_count_ > left / kMinKvBytes) {
      fail_invalid(file_ + ": kv_count " + std::to_string(kv_count_) + " is larger than the file could hold (" +
                   std::to_string(left) + " bytes after the header)");
    }
    if (tensor_count_ > (left - kv_count_ * kMinKvBytes) / kMinTensorBytes) {
      fail_invalid(file_ + ": tensor_count " + std::to_string(tensor_count_) +
                   " is larger than the file could hold (" + std::to_string(left) + " bytes after the header)");
    }
  }

  void parse_kv(uint64_t i) {
    const std::string what = "metadata key " + std::to_string(i);
    std::string key = in_.read_string(what, GgufFile::kMaxKeyBytes);
    if (key.empty()) fail_invalid(file_ + ": " + what + " is empty");
    if (out_.metadata_.count(key) != 0) {
      fail_invalid(file_ + ": metadata key '" + key + "' is given twice; charm refuses the file rather than pick one");
    }
    auto origin = std::make_shared<const GgufValueOrigin>(GgufValueOrigin{file_, key});
    const GgufValueType type = read_value_type("metadata '" + key + "'");
    GgufValue value = parse_value(type, origin, -1, 0);
    out_.metadata_.emplace(std::move(key), std::move(value));
  }

  GgufValueType read_value_type(const std::string& what) {
    const uint32_t id = in_.read<uint32_t>(what + " value type");
    if (!known_value_type(id)) fail_invalid(file_ + ": " + what + " has unknown value type " + std::to_string(id));
    return static_cast<GgufValueType>(id);
  }

  /// One value of `type`; `depth` is how many arrays enclose it.
  GgufValue parse_value(GgufValueType type, const std::shared_ptr<const GgufValueOrigin>& origin, int64_t index,
                        int depth) {
    const std::string what = "metadata '" + origin->key + "'";
    if (type == GgufValueType::kString) {
      return GgufValueBuilder::string(in_.read_string(what + " string", GgufFile::kMaxStringBytes), origin, index);
    }
    if (type == GgufValueType::kArray) return parse_array(origin, index, depth + 1);
    const uint8_t* p = in_.take(scalar_bytes(type), what);
    const uint64_t bits = decode_scalar_bits(type, p);
    if (type == GgufValueType::kBool && bits > 1) {
      fail_invalid(file_ + ": " + what + " is a bool of byte value " + std::to_string(bits) + ", neither 0 nor 1");
    }
    return GgufValueBuilder::scalar(type, bits, origin, index);
  }

  /// An array at nesting `depth` (1 for a key's own array).
  GgufValue parse_array(const std::shared_ptr<const GgufValueOrigin>& origin, int64_t index, int depth) {
    const std::string what = "metadata '" + origin->key + "'";
    auto a = std::make_shared<GgufArray>();
    a->element_type = read_value_type(what + " array element");
    if (a->element_type == GgufValueType::kArray && depth == GgufFile::kMaxArrayDepth) {
      fail_invalid(file_ + ": " + what + " nests arrays " + std::to_string(depth + 1) + " deep; charm reads at most " +
                   std::to_string(GgufFile::kMaxArrayDepth));
    }
    a->count = in_.read<uint64_t>(what + " array count");
    const uint64_t min_bytes = min_value_bytes(a->element_type);
    if (a->count > in_.left() / min_bytes) {
      fail_invalid(file_ + ": truncated: " + what + " holds " + std::to_string(a->count) + " " +
                   gguf_value_type_name(a->element_type) + " elements but the file has only " +
                   std::to_string(in_.left()) + " bytes left");
    }
    if (a->element_type == GgufValueType::kString) {
      a->strings.reserve(a->count);
      for (uint64_t j = 0; j < a->count; ++j) {
        a->strings.push_back(in_.read_string(what + " element " + std::to_string(j), GgufFile::kMaxStringBytes));
      }
    } else if (a->element_type == GgufValueType::kArray) {
      inner_arrays_ += a->count;  // cannot overflow: count <= left() / 12
      if (inner_arrays_ > GgufFile::kMaxInnerArrays) {
        fail_invalid(file_ + ": " + what + " brings the file's inner arrays to " + std::to_string(inner_arrays_) +
                     ", over charm's limit of " + std::to_string(GgufFile::kMaxInnerArrays));
      }
      a->arrays.reserve(a->count);
      for (uint64_t j = 0; j < a->count; ++j) {
        a->arrays.push_back(parse_array(origin, static_cast<int64_t>(j), depth + 1));
      }
    } else {
      const uint64_t n = a->count * min_bytes;  // cannot overflow: checked against left()
      const uint8_t* p = in_.take(n, what);
      if (a->element_type == GgufValueType::kBool) {
        const auto* bad = std::find_if(p, p + n, [](uint8_t b) { return b > 1; });
        if (bad != p + n) {
          fail_invalid(file_ + ": " + what + " element " + std::to_string(bad - p) + " is a bool of byte value " +
                       std::to_string(*bad) + ", neither 0 nor 1");
        }
      }
      a->raw.assign(p, p + n);
    }
    return GgufValueBuilder::array(std::move(a), origin, index);
  }

  void read_alignment() {
    const GgufValue* v = out_.find("general.alignment");
    if (v == nullptr) return;
    if (v->type() != GgufValueType::kU32) {
      fail_invalid(file_ + ": metadata 'general.alignment' is " + gguf_value_type_name(v->type()) +
                   ", not u32 (ggml's gguf reader requires u32)");
    }
    const uint32_t a = v->as_u32();
    if (a == 0 || (a & (a - 1)) != 0) {
      fail_invalid(file_ + ": metadata 'general.alignment' is " + std::to_string(a) +
                   ", not a nonzero power of two");
    }
    out_.alignment_ = a;
  }

  void parse_tensor_info(uint64_t i) {
    GgufTensorInfo t;
    t.name = in_.read_string("tensor info " + std::to_string(i) + " name", GgufFile::kMaxNameBytes);
    if (t.name.empty()) fail_invalid(file_ + ": tensor info " + std::to_string(i) + " has an empty name");
    const std::string where = file_ + ": tensor '" + t.name + "'";
    if (out_.by_name_.count(t.name) != 0) fail_invalid(where + " is given twice");

    const uint32_t n_dims = in_.read<uint32_t>("tensor '" + t.name + "' n_dims");
    if (n_dims < 1 || n_dims > 4) fail_invalid(where + " has " + std::to_string(n_dims) + " dims; GGUF allows 1 to 4");
    // The product of the nonzero dims must fit int64 (so numel() and rows() cannot wrap,
    // even when another dim is 0).
    int64_t product = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t raw = in_.read<uint64_t>("tensor '" + t.name + "' ne");
      if (raw > static_cast<uint64_t>(INT64_MAX)) {
        fail_invalid(where + ": ne[" + std::to_string(d) + "] = " + std::to_string(static_cast<int64_t>(raw)) +
                     " is negative");
      }
      t.ne.push_back(static_cast<int64_t>(raw));
      if (raw != 0 && __builtin_mul_overflow(product, static_cast<int64_t>(raw), &product)) {
        fail_invalid(where + ": the product of its dims overflows int64");
      }
    }

    t.type_id = in_.read<uint32_t>("tensor '" + t.name + "' type");
    const auto traits = ggml_type_traits(t.type_id);
    if (!traits) {
      const std::string name(ggml_type_name_of_id(t.type_id));
      if (name.rfind("type ", 0) == 0) {
        fail_invalid(where + " has type id " + std::to_string(t.type_id) + ", which is no ggml type");
      }
      fail_invalid(where + " has ggml type " + name + " (" + std::to_string(t.type_id) +
                   "), which charm does not read");
    }
    t.type = traits->type;
    const auto row = ggml_row_bytes(t.type, t.ne[0]);
    if (!row) {
      fail_invalid(where + ": ne[0] = " + std::to_string(t.ne[0]) + " is not a multiple of " + traits->name +
                   "'s block of " + std::to_string(traits->block_elements) + " values");
    }
    if (__builtin_mul_overflow(*row, t.rows(), &t.nbytes)) fail_invalid(where + ": its byte size overflows u64");

    t.offset = in_.read<uint64_t>("tensor '" + t.name + "' offset");
    if (t.offset % out_.alignment_ != 0) {
      fail_invalid(where + ": offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                   std::to_string(out_.alignment_));
    }
    out_.by_name_.emplace(t.name, out_.tensors_.size());
    out_.tensors_.push_back(std::move(t));
  }

  /// The data section starts at the next multiple of the alignment after the tensor
  /// infos; every tensor must lie inside the file and no two may share a byte.
  void place_data() {
    const uint64_t a = out_.alignment_;
    out_.data_offset_ = (in_.pos() + a - 1) / a * a;  // pos < 2^63 (a file size), a <= 2^31
    for (GgufTensorInfo& t : out_.tensors_) {
      const std::string where = file_ + ": tensor '" + t.name + "'";
      if (__builtin_add_overflow(out_.data_offset_, t.offset, &t.data_begin) || t.data_begin > out_.size() ||
          t.nbytes > out_.size() - t.data_begin) {
        fail_invalid(where + ": its " + std::to_string(t.nbytes) + " bytes at data offset " +
                     std::to_string(t.offset) + " (file byte " + std::to_string(out_.data_offset_) + " + offset) run past the end of the file (" +
                     std::to_string(out_.size()) + " bytes)");
      }
    }
    check_no_overlap();
  }

  void check_no_overlap() const {
    std::vector<const GgufTensorInfo*> sorted;
    for (const GgufTensorInfo& t : out_.tensors_) {
      if (t.nbytes > 0) sorted.push_back(&t);
    }
    std::sort(sorted.begin(), sorted.end(),
              [](const GgufTensorInfo* x, const GgufTensorInfo* y) { return x->data_begin < y->data_begin; });
    for (size_t i = 1; i < sorted.size(); ++i) {
      if (sorted[i]->data_begin < sorted[i - 1]->data_begin + sorted[i - 1]->nbytes) {
        fail_invalid(file_ + ": tensors '" + sorted[i - 1]->name + "' and '" + sorted[i]->name +
                     "' have overlapping byte ranges");
      }
    }
  }

  GgufFile& out_;
  const std::string& file_;
  Cursor in_;
  uint64_t kv_count_ = 0;
  uint64_t tensor_count_ = 0;
  uint64_t inner_arrays_ = 0;  ///< elements of all arrays of arrays so far
};

// ---- GgufFile -----------------------------------------------------------------


std::unique_ptr<GgufFile> GgufFile::open(const std::filesystem::path& path) {
  std::unique_ptr<GgufFile> self(new GgufFile());  // RAII: unmaps and closes on throw
  self->path_ = path;
  const std::string file = path.string();

  self->file_ = MappedFile::open(path);
  constexpr uint64_t kHeaderBytes = 4 + 4 + 8 + 8;
  if (self->size() < kHeaderBytes) {
    fail_invalid(file + ": file is " + std::to_string(self->size()) + " bytes, shorter than the " +
                 std::to_string(kHeaderBytes) + "-byte GGUF header");
  }
  GgufParser(*self, file).parse();
  return self;
}

GgufFile::~GgufFile() = default;

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufValue& GgufFile::get(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) fail_invalid(path_.string() + ": metadata key '" + std::string(key) + "' is missing");
  return *v;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const uint8_t* GgufFile::mapped(const GgufTensorInfo& info) const {
  return file_.region(info.data_begin, info.nbytes, path_.string() + ": tensor '" + info.name + "'");
}

void GgufFile::read(const GgufTensorInfo& info, uint64_t offset, uint64_t count, void* dst) const {
  file_.read_region(info.data_begin, info.nbytes, offset, count, dst, path_.string() + ": tensor '" + info.name + "'");
}

}  // namespace charm
