// A GGUF model in one file or in the shards llama.cpp's gguf-split writes:
// "<prefix>-00001-of-0000N.gguf" .. "<prefix>-0000N-of-0000N.gguf" (llama.cpp
// llama_split_path, "%s-%05d-of-%05d.gguf"), each a whole GGUF file whose metadata holds
// split.no (u16, 0-based), split.count (u16) and split.tensors.count (i32, the tensors of
// all shards). The first shard carries the model's metadata.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/gguf.h"

namespace charm {

/// The files of a model named by its first file. For a name of llama.cpp's split form
/// "<prefix>-%05d-of-%05d.gguf" with index 00001 and count N (1 <= N), the N paths
/// <prefix>-00001-of-N.gguf .. <prefix>-N-of-N.gguf in order; for any other name, {first}.
/// Throws Error(kInvalidInput) naming the file when a split file is missing, when `first`
/// names a later split (the message names the first to give instead), or when the index
/// or count is 0 or the index is past the count.
std::vector<std::filesystem::path> gguf_split_paths(const std::filesystem::path& first);

/// A model stored as one GGUF file or as gguf-split shards: every file opened and
/// validated, one tensor namespace across them, and the first file's metadata (the
/// model's: gguf-split writes it there). Thread-safety as GgufFile.
class GgufModelFiles {
 public:
  /// Opens gguf_split_paths(first). Beyond GgufFile::open's checks, throws
  /// Error(kInvalidInput) naming the file when, where present, a file's split.no (its
  /// 0-based index) or split.count disagrees with its place in the set, or its
  /// split.tensors.count with the number of tensors in all files; when a file whose name
  /// is not of the split form says split.count > 1 (the other shards were not named;
  /// gguf-split --merge writes 0, which is fine); or when a tensor name appears in two
  /// files (naming both).
  static std::unique_ptr<GgufModelFiles> open(const std::filesystem::path& first);

  /// The files, in split order (at least one).
  const std::vector<std::unique_ptr<GgufFile>>& files() const { return files_; }
  /// The first file's metadata.
  const GgufMetadata& metadata() const { return files_.front()->metadata(); }
  const GgufValue* find(std::string_view key) const { return files_.front()->find(key); }
  const GgufValue& get(std::string_view key) const { return files_.front()->get(key); }

  /// The tensor named `name` in any file (its `split` says which), or nullptr.
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  /// As find_tensor, but throws Error(kInvalidInput) naming the model and the tensor.
  const GgufTensorInfo& tensor(std::string_view name) const;
  /// Every tensor: file by file, in file order.
  std::vector<const GgufTensorInfo*> tensors() const;
  /// The file holding `info`.
  const GgufFile& file_of(const GgufTensorInfo& info) const;
  /// GgufFile::mapped / read on the file holding `info`.
  const uint8_t* mapped(const GgufTensorInfo& info) const { return file_of(info).mapped(info); }
  void read(const GgufTensorInfo& info, uint64_t offset, uint64_t count, void* dst) const {
    file_of(info).read(info, offset, count, dst);
  }

 private:
  GgufModelFiles() = default;
  std::vector<std::unique_ptr<GgufFile>> files_;
  std::map<std::string, const GgufTensorInfo*, std::less<>> by_name_;
};

}  // namespace charm
