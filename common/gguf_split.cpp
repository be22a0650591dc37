// GGUF models in several files: the shard names (llama.cpp llama_split_path /
// llama_split_prefix, gguf-py SHARD_NAME_FORMAT) and the split.* metadata checks
// (llama.cpp src/llama-model-loader.cpp, which reads the same keys).
#include "common/gguf_split.h"

#include <cstdio>
#include <optional>
#include <regex>

#include "common/error.h"

namespace charm {
namespace {

/// "<prefix>-%05d-of-%05d.gguf".
std::filesystem::path split_path(const std::filesystem::path& dir, const std::string& prefix, uint64_t index,
                                 uint64_t count) {
  char tail[64];
  std::snprintf(tail, sizeof tail, "-%05llu-of-%05llu.gguf", static_cast<unsigned long long>(index),
                static_cast<unsigned long long>(count));
  return dir / (prefix + tail);
}

/// The split.* key `key` of `file` as an unsigned value, or -1 when absent. gguf-split
/// writes u16 / i32; any integer type that fits is accepted.
int64_t split_key(const GgufFile& file, const char* key) {
  const GgufValue* v = file.find(key);
  if (v == nullptr) return -1;
  return v->as_u32();  // throws naming the file and key for a non-integer or negative value
}

/// The parts of a split name.
struct SplitName {
  std::string prefix;
  uint64_t index = 0;
  uint64_t count = 0;
};

/// `first`'s file name parsed as "<prefix>-%05d-of-%05d.gguf", or nullopt.
std::optional<SplitName> parse_split_name(const std::filesystem::path& first) {
  // %05d writes at least five digits; split.count is a u16, so five digits is all.
  static const std::regex kSplitName(R"((.*)-([0-9]{5})-of-([0-9]{5})\.gguf)");
  const std::string name = first.filename().string();
  std::smatch m;
  if (!std::regex_match(name, m, kSplitName)) return std::nullopt;
  return SplitName{m[1].str(), std::stoull(m[2].str()), std::stoull(m[3].str())};
}

}  // namespace

std::vector<std::filesystem::path> gguf_split_paths(const std::filesystem::path& first) {
  const std::optional<SplitName> split = parse_split_name(first);
  if (!split) return {first};
  const auto [prefix, index, count] = *split;
  const std::filesystem::path dir = first.parent_path();
  if (index == 0 || count == 0 || index > count) {
    fail_invalid(first.string() + ": a split name whose index " + std::to_string(index) + " or count " +
                 std::to_string(count) + " is out of range (gguf-split counts from 00001)");
  }
  if (index != 1) {
    fail_invalid(first.string() + ": is split " + std::to_string(index) + " of " + std::to_string(count) +
                 "; name the first, " + split_path(dir, prefix, 1, count).string());
  }
  std::vector<std::filesystem::path> paths;
  for (uint64_t i = 1; i <= count; ++i) {
    std::filesystem::path p = split_path(dir, prefix, i, count);
    std::error_code ec;
    if (!std::filesystem::exists(p, ec)) {
      fail_invalid(p.string() + ": split " + std::to_string(i) + " of " + std::to_string(count) + " of " +
                   first.string() + " is missing");
    }
    paths.push_back(std::move(p));
  }
  return paths;
}

std::unique_ptr<GgufModelFiles> GgufModelFiles::open(const std::filesystem::path& first) {
  const std::vector<std::filesystem::path> paths = gguf_split_paths(first);
  const bool split_name = parse_split_name(first).has_value();
  std::unique_ptr<GgufModelFiles> self(new GgufModelFiles());
  uint64_t total_tensors = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    std::unique_ptr<GgufFile> file = GgufFile::open(paths[i]);
    const std::string where = paths[i].string();
    const int64_t no = split_key(*file, "split.no");
    const int64_t count = split_key(*file, "split.count");
    if (no >= 0 && static_cast<size_t>(no) != i) {
      fail_invalid(where + ": metadata 'split.no' is " + std::to_string(no) + " but the file is split " +
                   std::to_string(i + 1) + " of " + std::to_string(paths.size()) + " (split.no counts from 0)");
    }
    if (count > 1 && !split_name) {
      fail_invalid(where + ": metadata 'split.count' is " + std::to_string(count) +
                   ": the model is split, but the file name is not of the form <prefix>-00001-of-0000N.gguf, so "
                   "the other splits cannot be found");
    }
    if (count >= 0 && split_name && static_cast<size_t>(count) != paths.size()) {
      fail_invalid(where + ": metadata 'split.count' is " + std::to_string(count) + " but the file names say " +
                   std::to_string(paths.size()) + " splits");
    }
    for (GgufTensorInfo& t : file->tensors_) t.split = static_cast<uint32_t>(i);
    total_tensors += file->tensors_.size();
    self->files_.push_back(std::move(file));
  }
  for (const auto& file : self->files_) {
    for (const GgufTensorInfo& t : file->tensors()) {
      const auto [it, fresh] = self->by_name_.emplace(t.name, &t);
      if (!fresh) {
        fail_invalid(file->path().string() + ": tensor '" + t.name + "' is also in " +
                     self->files_[it->second->split]->path().string());
      }
    }
  }
  for (const auto& file : self->files_) {
    const int64_t declared = split_key(*file, "split.tensors.count");
    if (declared >= 0 && static_cast<uint64_t>(declared) != total_tensors) {
      fail_invalid(file->path().string() + ": metadata 'split.tensors.count' is " + std::to_string(declared) +
                   " but the " + std::to_string(self->files_.size()) + " file(s) hold " +
                   std::to_string(total_tensors) + " tensors");
    }
  }
  return self;
}

const GgufTensorInfo* GgufModelFiles::find_tensor(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const GgufTensorInfo& GgufModelFiles::tensor(std::string_view name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (t == nullptr) {
    fail_invalid(files_.front()->path().string() + ": tensor '" + std::string(name) + "' is not in the model (" +
                 std::to_string(files_.size()) + " file(s))");
  }
  return *t;
}

std::vector<const GgufTensorInfo*> GgufModelFiles::tensors() const {
  std::vector<const GgufTensorInfo*> out;
  for (const auto& file : files_) {
    for (const GgufTensorInfo& t : file->tensors()) out.push_back(&t);
  }
  return out;
}

const GgufFile& GgufModelFiles::file_of(const GgufTensorInfo& info) const {
  if (info.split >= files_.size()) {
    fail_invalid(files_.front()->path().string() + ": tensor '" + info.name + "' names split " +
                 std::to_string(info.split) + " of a model of " + std::to_string(files_.size()) + " file(s)");
  }
  return *files_[info.split];
}

}  // namespace charm
