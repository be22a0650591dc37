// The byte layout of one routed expert as a single blob: gate, up and down stored
// adjacent, each matrix's data followed by its group scales (quantised forms only), then
// the experts' biases where the family has them (gpt-oss), every part starting on a
// 64-byte boundary. The same layout is a cache slot's content in RAM
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

/// One bias vector's place in a blob: `size` f32 values at `offset` (size 0: none).
struct BiasPart {
  uint64_t offset = 0;
  int64_t size = 0;
  bool operator==(const BiasPart&) const = default;
};

/// The three matrices of a SwiGLU expert (Qwen3MoeMLP / OlmoeMLP):
/// gate, up [moe_intermediate_size, hidden_size]; down [hidden_size, moe_intermediate_size];
/// and its biases (GptOssExperts' gate_up_proj_bias split, down_proj_bias): gate_bias and
/// up_bias [moe_intermediate_size], down_bias [hidden_size] f32, or nullptr when it has none.
struct ExpertView {
  MatrixView gate, up, down;
  const float* gate_bias = nullptr;
  const float* up_bias = nullptr;
  const float* down_bias = nullptr;
};

/// Where each part of one expert lives in its blob, and the blob's size.
struct ExpertLayout {
  MatrixPart gate, up, down;
  BiasPart gate_bias, up_bias, down_bias;  ///< size 0 unless the expert has biases
  uint64_t bytes = 0;  ///< whole blob, a multiple of kBlobPartAlignment

  /// The canonical layout for these shapes (each shape's format, rows, cols, group_size
  /// already set): gate data, gate scales, up data, up scales, down data, down scales,
  /// then, when `biases`, gate_bias [gate.rows], up_bias [up.rows], down_bias [down.rows] f32.
  static ExpertLayout make(const MatrixShape& gate, const MatrixShape& up, const MatrixShape& down,
                           bool biases = false);

  /// True when the expert has biases.
  bool has_biases() const { return down_bias.size != 0; }

  /// Views into `blob` (which holds `bytes` bytes, 64-byte aligned). Non-owning.
  ExpertView view(const uint8_t* blob) const;

  bool operator==(const ExpertLayout& other) const;
};

/// "gate holds NaN at [r, c]" for the first non-finite weight of the expert blob `blob`
/// in `layout` (find_non_finite per matrix, scales included; "down_bias holds inf at [i]"
/// for a bias); nullopt when all are finite.
std::optional<std::string> describe_non_finite(const ExpertLayout& layout, const uint8_t* blob);

}  // namespace charm
