// `charm convert`: writes an expert container (worker/experts/expert_container.h) from a
// checkpoint, streaming one expert at a time (peak memory: one expert, plus its f32 copy
// when quantising), with progress on stderr, resumable after a crash, and publishing
// index.json last so an interrupted conversion never looks like a container.
//
// Resume: while converting, `<out>/convert.journal` holds a header line (the same fields
// as index.json's header) and one JSON line per expert written, in plan order ((layer,
// expert) ascending). A rerun with the same options reads the journal, re-reads each
// journaled record and checks its checksum and that its source_hash is the checkpoint's
// content identity of that expert now (worker/experts/expert_manifest.h: a journal written from
// other weights of the same shape is not kept), keeps the verified prefix, truncates
// experts.bin after it and goes on from the next expert. Records are placed
// deterministically, so a resumed conversion writes the same bytes as an uninterrupted one.
//
// Each record's source_hash is hashed from the very bytes it is converted from (one read
// of the checkpoint per expert).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/model_config.h"
#include "worker/experts/expert_source.h"

namespace charm {

/// What to convert.
struct ConvertOptions {
  UserPath out;                               ///< container directory (created if absent)
  std::string quant = "none";                 ///< "none" (keep the checkpoint's dtype), "int8", "int4"
  int64_t group_size = 0;                     ///< elements per scale; 0 = the default (32)
  std::string worker;                         ///< recorded in the index; empty = every expert
  bool progress = true;                       ///< progress lines on stderr
};

/// What a conversion did.
struct ConvertResult {
  uint64_t experts = 0;           ///< records in the finished container
  uint64_t experts_resumed = 0;   ///< records kept from an earlier, interrupted run
  uint64_t data_bytes = 0;        ///< size of experts.bin
  bool already_complete = false;  ///< index.json existed with the same header: nothing done
};

/// Default group size for int8 and int4 (elements per f32 scale).
constexpr int64_t kDefaultGroupSize = 32;

/// Converts `experts` (any order; written in ascending order) of `checkpoint`, whose
/// config is `config` (expert tensor names and sizes).
/// Throws Error(kInvalidInput) for an unknown quant, a group size < 1 or above the row
/// width, an `out` that already holds a different container, or one converted from
/// other weights (naming the layer, expert and both content hashes), or a journal written
/// with other options (naming the differing field), and what Checkpoint::locate_expert
/// throws; Error(kIo) for write failures and an `out` that cannot be created (named as
/// UserPath::describe prints it). Prints a warning naming the precision lost
/// when quantising.
ConvertResult convert_experts(const Checkpoint& checkpoint, const ModelConfig& config,
                              const std::vector<ExpertKey>& experts, const ConvertOptions& options);

}  // namespace charm
