#include "worker/experts/expert_manifest.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "common/cache_root.h"
#include "common/durable_file.h"
#include "common/error.h"
#include "common/load_progress.h"
#include "common/fingerprint.h"
#include "common/json_reader.h"
#include "worker/experts/expert_source.h"

namespace charm {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kFormat = "charm-expert-manifest";
constexpr int kVersion = 1;
constexpr const char* kHash = "xxh3-128";

std::string key_text(const ExpertKey& key) {
  return "layer " + std::to_string(key.first) + " expert " + std::to_string(key.second);
}

/// j[key] as T; throws naming `where` and the key when absent or of the wrong type.
template <typename T>
T field(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) fail_invalid(where + ": '" + key + "' is missing");
  const json& v = j.at(key);
  const bool ok = std::is_same_v<T, std::string> ? v.is_string()
                  : std::is_unsigned_v<T>        ? v.is_number_unsigned()
                                                 : v.is_number_integer();
  if (!ok) fail_invalid(where + ": '" + key + "' has the wrong type (" + v.type_name() + ")");
  return v.get<T>();
}

/// Every shard file of the checkpoint by its name relative to the directory.
std::map<std::string, fs::path> shard_files(const Checkpoint& checkpoint) {
  std::map<std::string, fs::path> out;
  for (const std::string& name : checkpoint.tensor_names()) {
    const fs::path& file = checkpoint.find(name)->file;
    out.emplace(file.lexically_relative(checkpoint.dir()).string(), file);
  }
  return out;
}

std::map<std::string, FileIdentity> current_shards(const Checkpoint& checkpoint) {
  std::map<std::string, FileIdentity> out;
  for (const auto& [name, path] : shard_files(checkpoint)) out[name] = file_identity(path);
  return out;
}

/// Why `recorded` does not describe the shards as they are now, or "" when it does.
std::string shard_change(const std::map<std::string, FileIdentity>& recorded,
                         const std::map<std::string, FileIdentity>& now) {
  for (const auto& [name, identity] : now) {
    const auto it = recorded.find(name);
    if (it == recorded.end()) return "shard " + name + " is not in it";
    if (!(it->second == identity)) return "shard " + name + " changed since (size, mtime, ctime or inode)";
  }
  for (const auto& [name, identity] : recorded) {
    if (!now.count(name)) return "it lists shard " + name + ", which the checkpoint no longer has";
  }
  return "";
}

std::string read_text(const fs::path& path, uint64_t max_bytes) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) fail_io(path.string() + ": cannot stat: " + ec.message());
  if (size > max_bytes) {
    fail_invalid(path.string() + ": " + std::to_string(size) + " bytes, over the limit of " +
                 std::to_string(max_bytes) + " for this model's manifest");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_io(path.string() + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// The cache file parsed, or nullopt with `why` set when it is absent or unusable.
std::optional<ManifestFile> read_cache(const fs::path& path, const ModelConfig& config, size_t shards,
                                       std::string& why) {
  std::error_code ec;
  if (path.empty() || !fs::exists(path, ec)) return std::nullopt;
  try {
    const uint64_t limit = max_manifest_bytes(config, shards);
    return parse_manifest(read_text(path, limit), path.string(), config, limit);
  } catch (const Error& e) {
    why = e.message();
    return std::nullopt;
  }
}

/// Merges `ours` into the cache file under its lock and writes it atomically.
void write_cache(const fs::path& path, const ModelConfig& config, ManifestFile ours) {
  fs::create_directories(path.parent_path());
  FileLock lock(path.string() + ".lock");
  std::string ignored;
  // Another process of this checkpoint (a worker beside the coordinator) may have added
  // entries since we read it: keep them when they describe the same files.
  if (auto theirs = read_cache(path, config, ours.shards.size(), ignored)) {
    if (theirs->model_fingerprint == ours.model_fingerprint && theirs->shards == ours.shards) {
      for (const auto& [key, hash] : theirs->experts) ours.experts.emplace(key, hash);  // ours win
    }
  }
  write_file_atomically(path, manifest_text(ours));
}

}  // namespace

FileIdentity file_identity(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail_io(path.string() + ": cannot stat: " + std::strerror(errno));
  auto ns = [](const timespec& t) { return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec; };
  return FileIdentity{static_cast<uint64_t>(st.st_size), ns(st.st_mtim), ns(st.st_ctim),
                      static_cast<uint64_t>(st.st_ino)};
}

uint64_t max_manifest_bytes(const ModelConfig& config, size_t shard_files) {
  const uint64_t experts = config.moe_layer_ids().size() * static_cast<uint64_t>(std::max<int64_t>(config.num_experts, 0));
  return 64 * 1024 + 1024 * static_cast<uint64_t>(shard_files) + 64 * experts;
}

ManifestFile parse_manifest(const std::string& text, const std::string& where, const ModelConfig& config,
                            uint64_t max_bytes) {
  // The manifest nests 3 levels (file, list, entry); its size bound comes from the model.
  const json j = parse_json(text, where, JsonLimits{max_bytes, 4});
  if (!j.is_object()) fail_invalid(where + ": the top-level JSON value is not an object");
  if (field<std::string>(j, "format", where) != kFormat) fail_invalid(where + ": 'format' is not '" + std::string(kFormat) + "'");
  if (field<int64_t>(j, "version", where) != kVersion) {
    fail_invalid(where + ": manifest version " + j["version"].dump() + ", this charm reads version " +
                 std::to_string(kVersion));
  }
  if (field<std::string>(j, "hash", where) != kHash) fail_invalid(where + ": 'hash' is not '" + std::string(kHash) + "'");
  ManifestFile m;
  m.model_fingerprint = field<std::string>(j, "model_fingerprint", where);
  m.checkpoint = field<std::string>(j, "checkpoint", where);
  if (!j.contains("shards") || !j["shards"].is_array()) fail_invalid(where + ": 'shards' must be a list");
  for (size_t i = 0; i < j["shards"].size(); ++i) {
    const json& s = j["shards"][i];
    const std::string at = where + ": shards[" + std::to_string(i) + "]";
    const std::string file = field<std::string>(s, "file", at);
    const fs::path rel(file);
    if (file.empty() || rel.is_absolute() ||
        std::any_of(rel.begin(), rel.end(), [](const auto& part) { return part == ".."; })) {
      fail_invalid(at + ": 'file' '" + file + "' is not a file inside the checkpoint directory");
    }
    const FileIdentity identity{field<uint64_t>(s, "size", at), field<int64_t>(s, "mtime_ns", at),
                                field<int64_t>(s, "ctime_ns", at), field<uint64_t>(s, "inode", at)};
    if (!m.shards.emplace(file, identity).second) fail_invalid(at + ": shard '" + file + "' is listed twice");
  }
  const std::vector<int64_t> layers = config.moe_layer_ids();
  const std::set<int64_t> moe_layers(layers.begin(), layers.end());
  if (!j.contains("experts") || !j["experts"].is_array()) fail_invalid(where + ": 'experts' must be a list");
  for (size_t i = 0; i < j["experts"].size(); ++i) {
    const json& e = j["experts"][i];
    const std::string at = where + ": experts[" + std::to_string(i) + "]";
    if (!e.is_array() || e.size() != 3 || !e[0].is_number_unsigned() || !e[1].is_number_unsigned() || !e[2].is_string()) {
      fail_invalid(at + ": not [layer, expert, \"<32 hex digits>\"]");
    }
    const uint64_t layer = e[0].get<uint64_t>();
    const uint64_t expert = e[1].get<uint64_t>();
    if (!moe_layers.count(static_cast<int64_t>(layer)) || layer > UINT32_MAX) {
      fail_invalid(at + ": layer " + std::to_string(layer) + " is not an MoE layer of the model");
    }
    if (expert >= static_cast<uint64_t>(config.num_experts)) {
      fail_invalid(at + ": expert " + std::to_string(expert) + " is out of range (num_experts " +
                   std::to_string(config.num_experts) + ")");
    }
    const auto hash = ContentHash::from_hex(e[2].get<std::string>());
    if (!hash) fail_invalid(at + ": content hash '" + e[2].get<std::string>() + "' is not 32 lower-case hex digits");
    const ExpertKey key{static_cast<uint32_t>(layer), static_cast<uint32_t>(expert)};
    if (!m.experts.emplace(key, *hash).second) fail_invalid(at + ": " + key_text(key) + " is listed twice");
  }
  return m;
}

std::string manifest_text(const ManifestFile& m) {
  json head{{"format", kFormat}, {"version", kVersion}, {"hash", kHash}, {"model_fingerprint", m.model_fingerprint},
            {"checkpoint", m.checkpoint}, {"shards", json::array()}};
  for (const auto& [file, s] : m.shards) {
    head["shards"].push_back(
        {{"file", file}, {"size", s.size}, {"mtime_ns", s.mtime_ns}, {"ctime_ns", s.ctime_ns}, {"inode", s.inode}});
  }
  std::string text = head.dump();
  text.pop_back();  // the closing brace: the experts follow, one per line
  text += ",\n\"experts\": [\n";
  size_t i = 0;
  for (const auto& [key, hash] : m.experts) {
    text += json::array({key.first, key.second, hash.hex()}).dump() + (++i < m.experts.size() ? ",\n" : "\n");
  }
  return text + "]}\n";
}

ExpertIdentities hash_expert_identities(const Checkpoint& checkpoint, const ExpertTensorNames& names,
                                        const std::vector<ExpertKey>& keys, int64_t hidden_size,
                                        int64_t intermediate_size, int threads, uint64_t* bytes_read) {
  struct Item {
    ExpertKey key;
    ExpertSlices slices;
    ExpertLayout layout;
    ContentHash hash;
  };
  std::vector<Item> items;
  items.reserve(keys.size());
  uint64_t largest = 0;
  for (const ExpertKey& key : keys) {
    const ExpertSlices slices = checkpoint.locate_expert(names, static_cast<int>(key.first),
                                                         static_cast<int>(key.second), hidden_size, intermediate_size);
    items.push_back({key, slices, layout_of(slices), {}});
    largest = std::max(largest, items.back().layout.bytes);
  }
  // File order, so each thread's share is one mostly sequential sweep of the disk.
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    const ExpertSlice& x = a.slices.gate;
    const ExpertSlice& y = b.slices.gate;
    if (x.tensor->file != y.tensor->file) return x.tensor->file < y.tensor->file;
    return x.tensor->data_begin + x.offset < y.tensor->data_begin + y.offset;
  });
  const size_t workers = std::clamp<size_t>(static_cast<size_t>(std::max(threads, 1)), 1, std::max<size_t>(items.size(), 1));
  uint64_t total = 0;
  for (const Item& item : items) total += item.layout.bytes;
  // Hashing a large checkpoint the first time reads every expert: minutes, worth a bar.
  LoadProgress progress(checkpoint.dir().string() + ": hashing experts' content identities", total);
  std::vector<uint64_t> bytes(workers, 0);
  std::vector<std::exception_ptr> errors(workers);
  std::vector<std::thread> pool;
  for (size_t t = 0; t < workers; ++t) {
    pool.emplace_back([&, t] {
      try {
        AlignedBuffer buffer(largest);
        const size_t begin = items.size() * t / workers, end = items.size() * (t + 1) / workers;
        for (size_t i = begin; i < end; ++i) {
          const uint64_t n = read_checkpoint_expert(checkpoint, items[i].slices, items[i].layout, buffer.data());
          bytes[t] += n;
          items[i].hash = blob_identity(items[i].layout, buffer.data());
          progress.add(n);
        }
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  }
  for (std::thread& thread : pool) thread.join();
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  ExpertIdentities out;
  for (const Item& item : items) out.emplace(item.key, item.hash);
  if (bytes_read) {
    for (uint64_t b : bytes) *bytes_read += b;
  }
  return out;
}

fs::path manifest_cache_file(const Checkpoint& checkpoint, const std::string& fingerprint) {
  const fs::path root = cache_root();
  if (root.empty()) return {};
  // Per directory, so two copies of one model (same fingerprint, maybe other bytes) do
  // not keep invalidating each other's file.
  std::error_code ec;
  fs::path dir = fs::weakly_canonical(checkpoint.dir(), ec);
  if (ec) dir = fs::absolute(checkpoint.dir());
  const std::string text = dir.string();
  char tag[17];
  std::snprintf(tag, sizeof tag, "%016llx", static_cast<unsigned long long>(XXH3_64bits(text.data(), text.size())));
  return root / fingerprint / ("experts-" + std::string(tag) + ".manifest.json");
}

ExpertIdentities load_expert_manifest(const Checkpoint& checkpoint, const ModelConfig& config,
                                      const std::vector<ExpertKey>& keys, const ManifestOptions& options,
                                      ManifestStats* stats) {
  ManifestStats local;
  ManifestStats& st = stats ? *stats : local;
  st = ManifestStats{};
  const std::string fingerprint = model_fingerprint(checkpoint);
  // Stat before hashing: a file that changes while it is hashed is re-hashed next time.
  const std::map<std::string, FileIdentity> shards = current_shards(checkpoint);
  ExpertIdentities cached;
  if (auto file = read_cache(options.cache_file, config, shards.size(), st.not_reused)) {
    if (file->model_fingerprint != fingerprint) {
      st.not_reused = options.cache_file.string() + ": made for model fingerprint " + file->model_fingerprint +
                      ", not " + fingerprint;
    } else if (const std::string change = shard_change(file->shards, shards); !change.empty()) {
      st.not_reused = options.cache_file.string() + ": " + change;
    } else {
      cached = std::move(file->experts);
    }
  }
  if (!st.not_reused.empty()) spdlog::warn("expert manifest not reused, re-hashing: {}", st.not_reused);

  ExpertIdentities out;
  std::vector<ExpertKey> missing;
  for (const ExpertKey& key : keys) {
    const auto it = cached.find(key);
    if (it != cached.end()) {
      out.emplace(key, it->second);
      ++st.from_cache;
    } else {
      missing.push_back(key);
    }
  }
  if (missing.empty() || !options.hash_missing) return out;

  const auto start = std::chrono::steady_clock::now();
  ExpertIdentities hashed =
      hash_expert_identities(checkpoint, config.expert_tensors, missing, config.hidden_size,
                             config.moe_intermediate_size, options.threads, &st.bytes_hashed);
  st.hash_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  st.hashed = hashed.size();
  spdlog::info("{}: hashed {} experts' content identities ({:.2f} GiB in {:.2f} s, {:.2f} GB/s); {} from the cache",
               checkpoint.dir().string(), st.hashed, static_cast<double>(st.bytes_hashed) / (1ull << 30),
               st.hash_seconds, st.hash_seconds > 0 ? static_cast<double>(st.bytes_hashed) / st.hash_seconds / 1e9 : 0.0,
               st.from_cache);
  out.insert(hashed.begin(), hashed.end());
  if (options.cache_file.empty()) return out;
  try {
    ManifestFile file{fingerprint, checkpoint.dir().string(), shards, cached};
    for (const auto& [key, hash] : out) file.experts[key] = hash;
    write_cache(options.cache_file, config, std::move(file));
    st.written = true;
  } catch (const std::exception& e) {
    spdlog::warn("expert manifest not cached (the next start hashes again): {}", e.what());
  }
  return out;
}

}  // namespace charm
