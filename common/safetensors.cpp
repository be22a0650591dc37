// Safetensors reader: validates the header completely at open (so later reads can trust
// every offset), maps the file read-only, and serves on-demand reads with pread.
// Format: https://github.com/huggingface/safetensors (README, "Format").
#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

std::string errno_text() { return std::strerror(errno); }

/// Reads exactly `count` bytes at `offset` of `fd`, looping over short reads.
/// Throws Error(kIo) naming `what` on failure or end of file.
void pread_all(int fd, uint64_t offset, uint64_t count, void* dst, const std::string& what) {
  auto* out = static_cast<uint8_t*>(dst);
  while (count > 0) {
    const ssize_t got = ::pread(fd, out, count, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail_io(what + ": read failed at byte " + std::to_string(offset) + ": " + errno_text());
    }
    if (got == 0) {
      fail_io(what + ": unexpected end of file at byte " + std::to_string(offset) + " (" +
              std::to_string(count) + " bytes still to read)");
    }
    out += got;
    offset += static_cast<uint64_t>(got);
    count -= static_cast<uint64_t>(got);
  }
}

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

  self->fd_ = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (self->fd_ < 0) fail_io(file + ": cannot open: " + errno_text());
  struct stat st {};
  if (::fstat(self->fd_, &st) != 0) fail_io(file + ": cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) fail_io(file + ": not a regular file");
  self->size_ = static_cast<uint64_t>(st.st_size);

  if (self->size_ < 8) {
    fail_invalid(file + ": file is " + std::to_string(self->size_) + " bytes, shorter than the 8-byte header length");
  }
  uint8_t len_bytes[8];
  pread_all(self->fd_, 0, 8, len_bytes, file);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];  // little-endian
  if (header_len > kMaxHeaderBytes) {
    fail_invalid(file + ": header length " + std::to_string(header_len) + " is over the 100 MB limit");
  }
  if (header_len > self->size_ - 8) {
    fail_invalid(file + ": header length " + std::to_string(header_len) + " runs past the end of the file (" +
                 std::to_string(self->size_) + " bytes)");
  }

  std::string header(header_len, '\0');
  pread_all(self->fd_, 8, header_len, header.data(), file);
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
  const uint64_t data_size = self->size_ - data_start;
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

  void* map = ::mmap(nullptr, self->size_, PROT_READ, MAP_PRIVATE, self->fd_, 0);
  if (map == MAP_FAILED) fail_io(file + ": cannot mmap: " + errno_text());
  self->map_ = static_cast<const uint8_t*>(map);
  return self;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), size_);
  if (fd_ >= 0) ::close(fd_);
}

const uint8_t* SafetensorsFile::mapped(const TensorInfo& info) const {
  if (info.data_begin > size_ || info.nbytes > size_ - info.data_begin) {
    fail_invalid(path_.string() + ": tensor '" + info.name + "' is not inside this file");
  }
  return map_ + info.data_begin;
}

void SafetensorsFile::read(const TensorInfo& info, uint64_t offset, uint64_t count, void* dst) const {
  if (offset > info.nbytes || count > info.nbytes - offset) {
    fail_invalid(path_.string() + ": tensor '" + info.name + "': read of " + std::to_string(count) +
                 " bytes at offset " + std::to_string(offset) + " is outside its " +
                 std::to_string(info.nbytes) + " bytes");
  }
  if (info.data_begin > size_ || info.nbytes > size_ - info.data_begin) {
    fail_invalid(path_.string() + ": tensor '" + info.name + "' is not inside this file");
  }
  pread_all(fd_, info.data_begin + offset, count, dst, path_.string() + ": tensor '" + info.name + "'");
}

}  // namespace charm
