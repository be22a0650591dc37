// The expert manifest: every routed expert's content identity (common/expert_identity.h)
// of one checkpoint, hashed once and cached so a restart does not read the checkpoint
// again. The coordinator loads it for every expert (the identities workers must report),
// a worker for the experts it serves from the checkpoint (what each read is checked
// against), `charm status` only what is cached.
//
// Cache file: <cache root>/<model fingerprint>/experts-<16 hex of the checkpoint
// directory's path>.manifest.json (common/cache_root.h), never inside the checkpoint
// directory (it may be read-only, shared, or a test fixture):
//
//   {"format": "charm-expert-manifest", "version": 1, "hash": "xxh3-128",
//    "model_fingerprint": "<16 hex>", "checkpoint": "<dir>",
//    "shards": [{"file": "<name in dir>", "size": N, "mtime_ns": N, "ctime_ns": N,
//                "inode": N}, ...],                           every .safetensors file
//    "experts": [[layer, expert, "<32 hex>"], ...]}           one line each
//
// It is used only while the model fingerprint and every shard file's (size, mtime,
// ctime, inode) are those recorded; any change re-hashes the experts asked for. Written
// atomically (temp + fsync + rename) under a flock, merged with what other processes of
// the same checkpoint wrote (a worker's experts, the coordinator's), so concurrent starts
// only add entries.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/expert_identity.h"
#include "common/model_config.h"

namespace charm {

/// A file's identity for the cache: any write, truncate, rename-over, copy or utime
/// changes one of these (ctime cannot be set back by a user).
struct FileIdentity {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  uint64_t inode = 0;
  bool operator==(const FileIdentity&) const = default;
};

/// stat() of `path` (symlinks followed). Throws Error(kIo) naming it.
FileIdentity file_identity(const std::filesystem::path& path);

/// A parsed manifest file.
struct ManifestFile {
  std::string model_fingerprint;
  std::string checkpoint;                        ///< the directory it was made from (informative)
  std::map<std::string, FileIdentity> shards;    ///< shard file name (relative to the dir) -> identity
  ExpertIdentities experts;
};

/// Upper bound on a manifest file's size for a model of this shape with `shard_files`
/// shards: 64 KiB + 1 KiB per shard + 64 bytes per (MoE layer, expert).
uint64_t max_manifest_bytes(const ModelConfig& config, size_t shard_files);

/// Parses and checks a manifest file's text. Throws Error(kInvalidInput) "<where>: ..."
/// naming the field for: more than `max_bytes` bytes, JSON that does not parse or is not
/// an object, another format / version / hash, a missing or mistyped field, a shard named
/// twice or with an absolute or ".." name, an expert entry that is not [layer, expert,
/// "<32 hex>"], a layer that is not an MoE layer of `config`, an expert id >= num_experts,
/// an expert listed twice.
ManifestFile parse_manifest(const std::string& text, const std::string& where, const ModelConfig& config,
                            uint64_t max_bytes);

/// The text parse_manifest reads (one expert per line).
std::string manifest_text(const ManifestFile& manifest);

/// Hashes `keys` of `checkpoint` now, without any cache: each expert's slices are read
/// (read_checkpoint_expert, pread) and hashed (blob_identity), `threads` experts at a time
/// in file order. Adds the bytes read to *bytes_read when given. Throws what
/// Checkpoint::locate_expert and read_slice throw. Thread-safe.
ExpertIdentities hash_expert_identities(const Checkpoint& checkpoint, const ExpertTensorNames& names,
                                        const std::vector<ExpertKey>& keys, int64_t hidden_size,
                                        int64_t intermediate_size, int threads = 4, uint64_t* bytes_read = nullptr);

/// Where load_expert_manifest caches `checkpoint`'s manifest; empty when there is no
/// cache root (then every start hashes).
std::filesystem::path manifest_cache_file(const Checkpoint& checkpoint, const std::string& fingerprint);

struct ManifestOptions {
  std::filesystem::path cache_file;  ///< manifest_cache_file(); empty: no cache
  bool hash_missing = true;          ///< false: return only what the cache holds (charm status)
  int threads = 4;                   ///< experts read and hashed at once
};

/// What load_expert_manifest did (for logs and tests).
struct ManifestStats {
  size_t from_cache = 0;         ///< identities taken from the cache file
  size_t hashed = 0;             ///< identities computed from the checkpoint's bytes
  uint64_t bytes_hashed = 0;     ///< bytes read to compute them
  double hash_seconds = 0;       ///< wall time of that hashing
  std::string not_reused;        ///< why an existing cache file was not used ("" when it was, or none existed)
  bool written = false;          ///< the cache file was (re)written
};

/// The identities of `keys` (MoE layers of `config`): from the cache file when it is
/// valid for this checkpoint (same fingerprint, every shard's FileIdentity unchanged),
/// else hashed (when options.hash_missing) and merged into the cache file. A malformed,
/// oversized or stale cache file is named in stats.not_reused and a warning, and
/// replaced. A cache that cannot be written is a warning, not an error. Throws what
/// hash_expert_identities throws.
ExpertIdentities load_expert_manifest(const Checkpoint& checkpoint, const ModelConfig& config,
                                      const std::vector<ExpertKey>& keys, const ManifestOptions& options,
                                      ManifestStats* stats = nullptr);

}  // namespace charm
