// Safetensors reader: validates the header completely at open (so later reads can trust
// every offset), maps the file read-only, and serves on-demand reads with pread.
// Format: https://github.com/huggingface/safetensors (README, "Format").
#include "common/safetensors.h"


#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/json_reader.h"

namespace charm {
namespace {

// The reference implementation refuses headers over 100 MB; a larger length field is a
// corrupt (or hostile) file, not a real header.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;



/// Parses one tensor entry of the header; `data_size` is the byte buffer's length and
/// `data_start` its absolute offset. Throws Error(kInvalidInput) naming file and tensor.
TensorInfo parse_entry(const std::string& file, const std::string& name,
                       const nlohmann::json& entry, uint64_t data_start, uint64_t data_size) {
  const std::string where = file + ": tensor '" + name + "'";
  if (!entry.is_object()) fail_invalid(where + ": entry is not a JSON object");
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) fail_invalid(where + ": missing '" + key + "'");
  }
  const auto& dtype = entry["dtype"];
  const auto& shape = entry["shape"];
  const auto& offsets = entry["data_offsets"];
  if (!dtype.is_string()) fail_invalid(where + ": 'dtype' is not a string");
  if (!shape.is_array()) fail_invalid(where + ": 'shape' is not an array");
  if (!offsets.is_array() || offsets.size() != 2) {
    fail_invalid(where + ": 'data_offsets' is not an array of two integers");
  }

  TensorInfo info;
  info.name = name;
  const auto parsed = parse_dtype(dtype.get<std::string>());
  if (!parsed) fail_invalid(where + ": unknown dtype '" + dtype.get<std::string>() + "'");
  info.dtype = *parsed;

  uint64_t numel = 1;
  for (const auto& dim : shape) {
    if (!dim.is_number_integer()) fail_invalid(where + ": shape " + shape.dump() + " holds a non-integer");
    // nlohmann parses non-negative integers as unsigned, negative ones as signed.
    if (!dim.is_number_unsigned()) fail_invalid(where + ": negative dimension in shape " + shape.dump());
    const uint64_t d = dim.get<uint64_t>();
    if (d > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, d, &numel)) {
      fail_invalid(where + ": shape " + shape.dump() + " overflows");
    }
    info.shape.push_back(static_cast<int64_t>(d));
  }
  for (const auto& off : offsets) {
    if (!off.is_number_unsigned()) {
      fail_invalid(where + ": 'data_offsets' " + offsets.dump() + " must be non-negative integers");
    }
  }
  const uint64_t begin = offsets[0].get<uint64_t>();
  const uint64_t end = offsets[1].get<uint64_t>();
  if (end < begin) fail_invalid(where + ": data_offsets " + offsets.dump() + " end before begin");
  if (end > data_size) {
    fail_invalid(where + ": data_offsets " + offsets.dump() + " run past the end of the data buffer (" +
                 std::to_string(data_size) + " bytes)");
  }
  uint64_t expected = 0;
  if (__builtin_mul_overflow(numel, dtype_size(info.dtype), &expected) || expected != end - begin) {
    fail_invalid(where + ": data_offsets " + offsets.dump() + " hold " + std::to_string(end - begin) +
                 " bytes but shape " + shape.dump() + " of " + dtype_name(info.dtype) + " needs " +
                 std::to_string(numel) + " x " + std::to_string(dtype_size(info.dtype)));
  }
  info.data_begin = data_start + begin;
  info.nbytes = end - begin;
  return info;
}

/// Throws naming both tensors if any two non-empty byte ranges overlap.
void check_no_overlap(const std::string& file, const std::map<std::string, TensorInfo>& tensors) {
  std::vector<const TensorInfo*> sorted;
  for (const auto& [name, info] : tensors) {
    if (info.nbytes > 0) sorted.push_back(&info);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->data_begin < b->data_begin; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    const TensorInfo& prev = *sorted[i - 1];
    const TensorInfo& cur = *sorted[i];
    if (cur.data_begin < prev.data_begin + prev.nbytes) {
      fail_invalid(file + ": tensors '" + prev.name + "' and '" + cur.name + "' have overlapping byte ranges");
    }
  }
}

/// Parses "__metadata__": a JSON object of string values.
std::map<std::string, std::string> parse_metadata(const std::string& file, const nlohmann::json& meta) {
  if (!meta.is_object()) fail_invalid(file + ": '__metadata__' is not a JSON object");
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : meta.items()) {
    if (!value.is_string()) fail_invalid(file + ": '__metadata__' value of '" + key + "' is not a string");
    out[key] = value.get<std::string>();
  }
  return out;
}

}  // namespace

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  std::unique_ptr<SafetensorsFile> self(new SafetensorsFile());  // RAII: closes on throw
  self->path_ = path;
  const std::string file = path.string();

  self->file_ = MappedFile::open(path);
  const uint64_t size = self->file_.size();

  if (size < 8) {
    fail_invalid(file + ": file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  }
  uint8_t len_bytes[8];
  self->file_.pread(0, 8, len_bytes, file);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];  // little-endian
  if (header_len > kMaxHeaderBytes) {
    fail_invalid(file + ": header length " + std::to_string(header_len) + " is over the 100 MB limit");
  }
  if (header_len > size - 8) {
    fail_invalid(file + ": header length " + std::to_string(header_len) + " runs past the end of the file (" +
                 std::to_string(size) + " bytes)");
  }

  std::string header(header_len, '\0');
  self->file_.pread(8, header_len, header.data(), file);
  nlohmann::json json;
  try {
    json = parse_json(header, file + ": header", kSafetensorsHeaderLimits);
  } catch (const JsonDuplicateKeyError& e) {
    // nlohmann would keep the last of two equal keys: a tensor listed twice would load one
    // of its two entries silently.
    const DuplicateKey& dup = e.duplicate();
    if (!dup.path.empty()) throw;
    fail_invalid(file + ": " + (dup.key == "__metadata__" ? "'__metadata__'" : "tensor '" + dup.key + "'") +
                 " appears twice in the header; charm refuses the file rather than pick one");
  }
  if (!json.is_object()) fail_invalid(file + ": header JSON is not an object");

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size - data_start;
  for (const auto& [name, entry] : json.items()) {
    if (name == "__metadata__") {
      self->metadata_ = parse_metadata(file, entry);
      continue;
    }
    TensorInfo info = parse_entry(file, name, entry, data_start, data_size);
    info.file = path;
    self->tensors_.emplace(name, std::move(info));
  }
  check_no_overlap(file, self->tensors_);

  return self;
}

SafetensorsFile::~SafetensorsFile() = default;

const uint8_t* SafetensorsFile::mapped(const TensorInfo& info) const {
  return file_.region(info.data_begin, info.nbytes, path_.string() + ": tensor '" + info.name + "'");
}

void SafetensorsFile::read(const TensorInfo& info, uint64_t offset, uint64_t count, void* dst) const {
  file_.read_region(info.data_begin, info.nbytes, offset, count, dst, path_.string() + ": tensor '" + info.name + "'");
}

}  // namespace charm
