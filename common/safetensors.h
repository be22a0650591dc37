// Reader for one .safetensors file (https://github.com/huggingface/safetensors, format
// spec in its README): 8-byte little-endian header length N, N bytes of JSON mapping
// tensor name -> {dtype, shape, data_offsets: [begin, end)} plus optional
// "__metadata__", then the byte buffer the offsets index.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/ggml_type.h"
#include "common/mapped_file.h"

namespace charm {

/// One tensor's entry in a safetensors header.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  ///< row-major, outermost first
  uint64_t data_begin = 0;     ///< absolute byte offset in the file (header included)
  uint64_t nbytes = 0;         ///< product(shape) * dtype_size(dtype)
  std::filesystem::path file;  ///< the file that holds it
  /// GGUF only (common/gguf_model.h): the GGML block type of a quantised tensor (Q8_0,
  /// Q4_K, MXFP4 ...). `dtype` is then unused; nbytes is whole blocks of it.
  std::optional<GgmlType> block_type;

  /// Number of elements (product of shape; 1 for a scalar).
  uint64_t numel() const;
};

/// An open, validated safetensors file. The header is parsed and checked at open; the
/// file is memory-mapped read-only so resident tensors cost no copy, while `read`
/// uses pread so on-demand (expert) reads do not fault in the mapping.
/// Thread-safety: const methods may be called from any thread concurrently.
class SafetensorsFile {
 public:
  /// Opens and validates `path`. Throws Error(kInvalidInput) naming the file and, where
  /// one is at fault, the tensor, for: a file shorter than 8 bytes, a header length past
  /// the end of the file or over 100 MB, header JSON that does not parse or is not an
  /// object, a tensor name (or any key of an entry) given twice, an entry missing dtype/shape/data_offsets or with wrong JSON types, an
  /// unknown dtype, negative dims, offsets with end < begin, offsets past the end of the
  /// data buffer, a byte count that does not match shape*dtype, or two tensors whose
  /// byte ranges overlap. Throws Error(kIo) when the file cannot be opened or mapped.
  static std::unique_ptr<SafetensorsFile> open(const std::filesystem::path& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// All tensors, keyed by name.
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  /// The `__metadata__` string map (empty if absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Pointer to the tensor's bytes inside the read-only mapping (valid while *this lives).
  const uint8_t* mapped(const TensorInfo& info) const;
  /// Reads `count` bytes starting `offset` bytes into the tensor into `dst` with pread.
  /// Throws Error(kInvalidInput) if the range is outside the tensor, Error(kIo) on a
  /// short or failed read.
  void read(const TensorInfo& info, uint64_t offset, uint64_t count, void* dst) const;

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  MappedFile file_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace charm
