// An expert container: a directory `charm convert` writes from a checkpoint, holding the
// routed experts one worker (or every worker) serves, laid out for one-read misses.
//
//   <dir>/experts.bin   expert records back to back, each an ExpertLayout blob starting
//                       on a 4 KiB boundary (zero padding between; the file ends on one)
//   <dir>/index.json    written last (temp + fsync + rename): format, version, source
//                       model fingerprint, sizes, quantisation, and per expert {layer,
//                       expert, offset, bytes, checksum (XXH3-64 of the blob),
//                       source_hash (the source expert's content identity, XXH3-128 of
//                       its checkpoint bytes: common/expert_identity.h), gate/up/down
//                       {dtype, shape, group_size, offset, scale_offset}}
//   <dir>/convert.journal  only while a conversion is unfinished (worker/experts/expert_convert.h)
//   <dir>/usage.json    expert usage counts, when a worker serves from it (usage_log.h)
//
// A directory without index.json is not a container, whatever else it holds.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "worker/experts/expert_source.h"

namespace charm {

/// index.json's "format" and "version" values.
constexpr const char* kContainerFormat = "charm-expert-container";
/// 2: every record carries source_hash, the content identity of the checkpoint expert it
/// was converted from (version 1 containers must be converted again).
constexpr int kContainerVersion = 2;

/// The container-wide fields of index.json (and of the conversion journal's header).
struct ContainerHeader {
  std::string model_fingerprint;   ///< model_fingerprint() of the source checkpoint
  int64_t hidden_size = 0;
  int64_t moe_intermediate_size = 0;
  std::string quant = "none";      ///< "none" (checkpoint precision), "int8" or "int4"
  int64_t group_size = 0;          ///< elements per scale when quantised, else 0
  std::string worker;              ///< the worker whose shard this is; empty = every expert

  nlohmann::json to_json() const;
  bool operator==(const ContainerHeader&) const = default;
};

/// One expert's record.
struct ContainerRecord {
  ExpertKey key;
  uint64_t offset = 0;    ///< byte offset in experts.bin, a multiple of 4096
  ExpertLayout layout;    ///< layout.bytes is the record's length
  uint64_t checksum = 0;  ///< XXH3-64 of the layout.bytes bytes at offset
  /// blob_identity of the source expert as the checkpoint stored it, hashed from the very
  /// bytes this record was converted from. Equal to blob_identity of the record itself
  /// when the record keeps the checkpoint's dtypes (quant none, not fp8).
  ContentHash source_hash;

  nlohmann::json to_json() const;
  /// Parses and checks one record (types, dtypes, shapes against the header's sizes, the
  /// layout recomputed from dtype/shape/group_size agreeing with the recorded offsets and
  /// bytes, 4 KiB-aligned offset, source_hash of 32 hex digits). Throws Error(kInvalidInput) "<where>: <field>: ...".
  static ContainerRecord from_json(const nlohmann::json& j, const ContainerHeader& header, const std::string& where);
};

/// XXH3-64 of `bytes` bytes at `data`, as the container's checksums are computed.
uint64_t blob_checksum(const uint8_t* data, uint64_t bytes);
/// 16 lower-case hex digits.
std::string checksum_hex(uint64_t checksum);

/// A container opened for serving. Thread-safety: read() from any thread.
class ExpertContainer final : public ExpertSource {
 public:
  /// Opens `dir` and validates index.json completely. Throws Error(kInvalidInput) naming
  /// the file and field for: no index.json (an unfinished or absent conversion), JSON
  /// that does not parse, a wrong format/version (version 1: convert again), a model fingerprint other than
  /// `expected_fingerprint` (both named), sizes other than hidden_size /
  /// intermediate_size, a missing experts.bin, a data file size other than the index's
  /// data_bytes (truncated), a record past the end of the file, two records that overlap
  /// or name the same expert, and every ContainerRecord::from_json failure. Throws
  /// Error(kIo) when a file cannot be opened. `io` kODirect opens experts.bin O_DIRECT
  /// (Error(kUnsupported) where the file system refuses it).
  static std::unique_ptr<ExpertContainer> open(const std::filesystem::path& dir, const std::string& expected_fingerprint,
                                               int64_t hidden_size, int64_t intermediate_size,
                                               IoMode io = IoMode::kPread);
  ~ExpertContainer() override;

  const ExpertLayout* layout(const ExpertKey& key) const override;
  /// One pread of the record (rounded up to 4 KiB) into `dst`, then its checksum is
  /// checked: a mismatch throws Error(kIo) naming experts.bin, layer, expert and both sums;
  /// then its weights: a NaN, Inf or overflowing scale throws Error(kInvalidInput) naming
  /// experts.bin, layer, expert, matrix and element.
  uint64_t read(const ExpertKey& key, uint8_t* dst) const override;
  /// The record's source_hash: the identity of the checkpoint expert it was converted
  /// from (lossy or not; lossy_form() says which).
  std::optional<ContentHash> identity(const ExpertKey& key) const override;
  /// "" for quant none (the checkpoint's values exactly, fp8 widened to f32), else
  /// "<quant> group_size <n>", e.g. "int8 group_size 32".
  std::string lossy_form() const override;
  std::string describe() const override { return "container " + dir_.string(); }

  const ContainerHeader& header() const { return header_; }
  const std::map<ExpertKey, ContainerRecord>& records() const { return records_; }
  /// Reads every record and checks its checksum; throws as read() at the first bad one.
  void verify_all() const;

 private:
  ExpertContainer() = default;
  std::filesystem::path dir_;
  std::filesystem::path data_path_;
  int fd_ = -1;
  ContainerHeader header_;
  std::map<ExpertKey, ContainerRecord> records_;
};

/// Parses a header from index.json or a journal line; throws Error(kInvalidInput)
/// "<where>: <field>: ..." for a missing field or a wrong type.
ContainerHeader container_header_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace charm
