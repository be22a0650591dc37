// The byte layout of one routed expert as a single blob: gate, up and down stored
// adjacent, each matrix's data followed by its group scales (quantised forms only), every
// part starting on a 64-byte boundary. The same layout is a cache slot's content in RAM
// and an expert record in an expert container on disk, so a container miss is one read
// straight into a slot, and a checkpoint miss is three reads into the same places.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/weight_format.h"

namespace charm {

/// Alignment of every part inside a blob (cache-line; keeps f32 data aligned).
constexpr uint64_t kBlobPartAlignment = 64;
/// Alignment of expert records in a container file and of cache slot buffers (a page,
/// and what O_DIRECT needs).
constexpr uint64_t kRecordAlignment = 4096;

/// Rounds `n` up to a multiple of `alignment` (a power of two).
constexpr uint64_t align_up(uint64_t n, uint64_t alignment) { return (n + alignment - 1) & ~(alignment - 1); }

/// One matrix's place in a blob.
struct MatrixPart {
  MatrixShape shape;
  uint64_t data_offset = 0;   ///< bytes from the blob start
  uint64_t scale_offset = 0;  ///< bytes from the blob start; == data end when unquantised
};

/// The three matrices of a SwiGLU expert (Qwen3MoeMLP / OlmoeMLP):
/// gate, up [moe_intermediate_size, hidden_size]; down [hidden_size, moe_intermediate_size].
struct ExpertView {
  MatrixView gate, up, down;
};

/// Where each part of one expert lives in its blob, and the blob's size.
struct ExpertLayout {
  MatrixPart gate, up, down;
  uint64_t bytes = 0;  ///< whole blob, a multiple of kBlobPartAlignment

  /// The canonical layout for these shapes (each shape's format, rows, cols, group_size
  /// already set): gate data, gate scales, up data, up scales, down data, down scales.
  static ExpertLayout make(const MatrixShape& gate, const MatrixShape& up, const MatrixShape& down);

  /// Views into `blob` (which holds `bytes` bytes, 64-byte aligned). Non-owning.
  ExpertView view(const uint8_t* blob) const;

  bool operator==(const ExpertLayout& other) const;
};

/// "gate holds NaN at [r, c]" for the first non-finite weight of the expert blob `blob`
/// in `layout` (find_non_finite per matrix, scales included); nullopt when all are finite.
std::optional<std::string> describe_non_finite(const ExpertLayout& layout, const uint8_t* blob);

}  // namespace charm
