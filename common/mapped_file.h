// A regular file opened read-only and memory-mapped whole: what the tensor-file readers
// (common/safetensors.h, common/gguf.h) share. Resident tensors are read through the
// mapping (no copy); on-demand reads (a worker's expert misses) use pread, so they do not
// fault the mapping in.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace charm {

/// An open, mapped file. Move-only; unmaps and closes when destroyed. Thread-safety:
/// const methods may be called from any thread concurrently. The file must not be
/// truncated while open (the mapping would fault, as for any mmap reader).
class MappedFile {
 public:
  /// Opens and maps `path`. Throws Error(kIo) naming it when it cannot be opened, is not
  /// a regular file, or cannot be mapped. An empty file is opened with no mapping.
  static MappedFile open(const std::filesystem::path& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  /// File size in bytes.
  uint64_t size() const { return size_; }
  /// The whole file's bytes (size() of them; null for an empty file).
  const uint8_t* data() const { return map_; }

  /// The bytes [begin, begin + nbytes) of the mapping. Throws Error(kInvalidInput)
  /// "<what> is not inside this file" when the range leaves the file.
  const uint8_t* region(uint64_t begin, uint64_t nbytes, const std::string& what) const;

  /// Reads `count` bytes at `offset` into the region [begin, begin + nbytes) of the file
  /// into `dst` with pread (looping over short reads). Throws Error(kInvalidInput) naming
  /// `what` when the read leaves the region or the region leaves the file, Error(kIo) on a
  /// failed or short read.
  void read_region(uint64_t begin, uint64_t nbytes, uint64_t offset, uint64_t count, void* dst,
                   const std::string& what) const;

  /// pread of exactly `count` bytes at absolute `offset`; Error(kIo) naming `what`.
  void pread(uint64_t offset, uint64_t count, void* dst, const std::string& what) const;

 private:
  int fd_ = -1;
  const uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace charm
