// A Hugging Face model directory: config.json, one model.safetensors or many shards named
// by model.safetensors.index.json ("weight_map": tensor -> file), tokenizer files and
// generation_config.json. Gives tensors by name, converted to f32, and the routed
// experts' weights in both hub layouts. fp8 checkpoints (DeepSeek-V3's
// quantization_config {"quant_method": "fp8", "weight_block_size": [128, 128]}) store a
// Linear weight W [out, in] as F8_E4M3 with "<name>_scale_inv" f32
// [ceil(out/b0), ceil(in/b1)]; they are dequantised on load: W[r][c] * scale_inv[r/b0][c/b1].
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/expert_tensor_names.h"
#include "common/gguf_model.h"
#include "common/load_progress.h"
#include "common/safetensors.h"
#include "common/user_path.h"
#include "common/weight_format.h"

namespace charm {

/// One routed expert's SwiGLU weights in f32, row-major.
struct ExpertWeights {
  std::vector<float> gate;  ///< [moe_intermediate_size, hidden_size]
  std::vector<float> up;    ///< [moe_intermediate_size, hidden_size]
  std::vector<float> down;  ///< [hidden_size, moe_intermediate_size]
};

/// Where one projection of one routed expert lives: `bytes` bytes starting `offset` bytes
/// into `tensor`, holding a [rows, cols] row-major matrix of tensor->dtype. An F8_E4M3
/// slice (a whole per-expert 2-D tensor) also names its block-scale tensor `scale`
/// ([ceil(rows / block_rows), ceil(cols / block_cols)], any float dtype).
struct ExpertSlice {
  const TensorInfo* tensor = nullptr;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  const TensorInfo* scale = nullptr;  ///< F8_E4M3 only
  int64_t block_rows = 0;             ///< F8_E4M3 only
  int64_t block_cols = 0;
};

/// The three projections of one routed expert: gate and up [I, H], down [H, I]. In
/// gpt-oss's layout (`transposed`, ExpertTensorNames::gpt_oss_layout) gate is instead the
/// expert's whole gate_up_proj block [H, 2I] (gate in the even columns, up in the odd),
/// up is empty (no tensor) and down is its down_proj block [I, H]: readers transpose them
/// into the [out, in] matrices above (worker/experts/expert_source.h), which only moves
/// values. gate_up_bias [2I] (interleaved as gate_up) and down_bias [H] are set only for
/// experts with biases. With `mxfp4` (the hub's gpt-oss checkpoints as shipped) gate and
/// down are instead the expert's `*_blocks` (U8 [2I, H/32 * 16] and [H, I/32 * 16]: rows
/// are output features, so no transpose) and gate_up_scales / down_scales its `*_scales`
/// (U8 [2I, H/32] and [H, I/32]); readers decode them with common/mxfp4.h. gpt-oss's
/// experts as llama.cpp's converter writes them (a GGUF file; gate and up in tensors of
/// their own or, with --fuse-gate-up-exps, one after the other in one) are instead plain
/// [out, in] gate, up [I, H] and down [H, I] slices in any stored type (not `transposed`,
/// GGML MXFP4 blocks included) with gate_bias and up_bias [I] apart and down_bias [H].
struct ExpertSlices {
  ExpertSlice gate, up, down;
  bool transposed = false;
  ExpertSlice gate_up_bias, down_bias;
  bool mxfp4 = false;
  ExpertSlice gate_up_scales, down_scales;
  ExpertSlice gate_bias, up_bias;  ///< llama.cpp's gpt-oss experts only (gate_up_bias unset)
  /// True when the expert has biases (gpt-oss), in either form.
  bool has_biases() const { return down_bias.tensor != nullptr; }
};

/// An open checkpoint directory. Thread-safety: const methods are safe concurrently.
class Checkpoint {
 public:
  /// Opens `dir`: parses config.json and either model.safetensors.index.json (every file
  /// it names must exist and hold the tensors it claims) or the single *.safetensors.
  /// Throws Error(kInvalidInput) naming the file for missing config.json, JSON that does
  /// not parse, a key given twice in config.json, generation_config.json or the index
  /// (e.g. a tensor mapped twice), an index whose weight_map is missing or names a tensor
  /// absent from its file, a tensor present in two files, and every SafetensorsFile::open
  /// failure (a tensor listed twice in one header included). A `dir` that does not exist
  /// or is not a directory is named as described (UserPath::describe: the resolved path
  /// and, for one written relative, what it was resolved against), and every error about
  /// a file inside a relative `dir` ends with that origin too (rethrow_in).
  ///
  /// `dir` may also name a GGUF file (llama.cpp's format; the first of a gguf-split set):
  /// its metadata becomes config.json and generation_config.json and its tensors appear
  /// under their Hugging Face names (common/gguf_model.h); every GgufModelFiles::open
  /// and map_gguf_to_hf error is thrown as they document.
  static std::unique_ptr<Checkpoint> open(const UserPath& dir);

  /// The checkpoint directory; for a GGUF model, the folder holding its file(s).
  const std::filesystem::path& dir() const { return dir_; }
  /// The GGUF files of a GGUF model (their tokenizer.* metadata included), else nullptr.
  const GgufModelFiles* gguf() const { return gguf_.get(); }
  /// Where config_json() came from, for messages: "<dir>/config.json", or for GGUF
  /// "<file>.gguf (GGUF metadata)".
  std::string config_origin() const;
  /// Throws Error(kInvalidInput): "<dir>: tensor '<name>' not found"; for a GGUF model,
  /// naming the file and saying that `name` is the Hugging Face name no GGUF tensor mapped
  /// to (common/gguf_model.h), since the file's own names are llama.cpp's.
  [[noreturn]] void fail_missing_tensor(const std::string& name) const;
  /// config.json as parsed JSON.
  const nlohmann::json& config_json() const { return config_; }
  /// generation_config.json, or an empty object when the file is absent.
  const nlohmann::json& generation_config_json() const { return generation_config_; }

  /// The tensor's entry, or nullptr if no file holds it.
  const TensorInfo* find(const std::string& name) const;
  /// All tensor names, sorted.
  std::vector<std::string> tensor_names() const;
  /// Every tensor that is not a routed expert's under `names` (a name "<prefix with a
  /// layer number>.<anything>"), sorted by name.
  std::vector<const TensorInfo*> non_expert_tensors(const ExpertTensorNames& names) const;
  /// Their bytes as stored: what the coordinator's load_matrix and load_f32 calls read, for
  /// LoadProgress's total.
  uint64_t non_expert_bytes(const ExpertTensorNames& names) const;
  /// While set, every load_f32 / load_matrix adds its tensor's stored bytes to `progress`
  /// (not owned; it must outlive the loads; nullptr stops it). Not thread-safe with loads.
  void set_load_progress(LoadProgress* progress) { progress_ = progress; }
  /// The `quant_dense` setting (common/ggml_quantize.h) the coordinator's dense-weight
  /// loads apply (coordinator/models/blocks.h Linear::load): nullopt keeps every matrix at
  /// its stored precision (the default). Set before loading; not thread-safe with loads.
  void set_dense_quant(std::optional<GgmlType> type) { dense_quant_ = type; }
  std::optional<GgmlType> dense_quant() const { return dense_quant_; }

  /// Loads a whole tensor as f32 and checks its shape; an F8_E4M3 tensor is dequantised
  /// with its block scales. Throws Error(kInvalidInput) naming the tensor and both shapes
  /// when it is missing or its shape differs, and naming the tensor for an F8_E4M3 tensor
  /// that is not 2-D, lacks "<name>_scale_inv", has a scale of the wrong shape, or comes
  /// without quantization_config.weight_block_size. Every weight charm loads must be
  /// finite: throws Error(kInvalidInput) naming the file, the tensor and the element for a
  /// NaN or Inf (after dequantisation), and naming the scale tensor for a scale that is
  /// not finite or so large that an fp8 value times it overflows f32.
  std::vector<float> load_f32(const std::string& name, const std::vector<int64_t>& shape) const;

  /// Loads a 2-D weight [rows, cols] at the checkpoint's own precision (f32 / f16 / bf16
  /// kept as stored: half the memory and bandwidth of f32 for bf16 checkpoints, and the
  /// same values). F8_E4M3 is dequantised to f32 as load_f32 does. Same errors as load_f32,
  /// NaN and Inf included.
  StoredMatrix load_matrix(const std::string& name, int64_t rows, int64_t cols) const;

  /// Reads one routed expert (layer, expert) with pread, in whichever layout the file
  /// uses (see ExpertTensorNames), and checks shapes against hidden/intermediate sizes.
  /// Per-expert F8_E4M3 tensors are dequantised as load_f32 does (fused 3-D fp8 tensors
  /// are refused, kUnsupported). Throws Error(kInvalidInput) naming the tensor if missing
  /// or mis-shaped.
  ExpertWeights load_expert(const ExpertTensorNames& names, int layer, int expert,
                            int64_t hidden_size, int64_t intermediate_size) const;

  /// Finds where load_expert would read from, without reading: same checks, same errors.
  ExpertSlices locate_expert(const ExpertTensorNames& names, int layer, int expert, int64_t hidden_size,
                             int64_t intermediate_size) const;

  /// Same as locate_expert for ExpertTensorNames::gpt_oss_layout: the hub's fused
  /// gate_up_proj (bf16 or MXFP4 *_blocks / *_scales) or, from a GGUF file, llama.cpp's
  /// "<prefix>.{gate,up,down}_proj.{weight,bias}", gate and up possibly fused as
  /// "<prefix>.gate_up_proj.{weight,bias}" (ExpertSlices).
  ExpertSlices locate_gpt_oss_expert(const std::string& prefix, const ExpertTensorNames& names, int expert,
                                     int64_t hidden_size, int64_t intermediate_size) const;

  /// Reads a slice's raw bytes (its tensor's dtype, no conversion) into `dst` [slice.bytes]
  /// with one pread, then checks them: every expert read (a worker's pinned load, an LRU
  /// fill, charm convert) passes here. Throws Error(kIo) on a short or failed read, and
  /// Error(kInvalidInput) naming the file, tensor and element for a NaN or Inf (the scan
  /// costs a few percent of the read; docs/architecture.md, "Bad checkpoints").
  void read_slice(const ExpertSlice& slice, void* dst) const;
  /// An F8_E4M3 slice's block scales as f32 into `dst` [scale->numel()] (pread); throws
  /// as load_f32 does for a non-finite or overflowing scale.
  void read_slice_scales(const ExpertSlice& slice, float* dst) const;
  /// The slice as f32 values [rows * cols], F8_E4M3 dequantised exactly as load_f32 does.
  std::vector<float> slice_f32(const ExpertSlice& slice) const;

 private:
  Checkpoint() = default;
  /// open() once `dir` is known to be a directory.
  static std::unique_ptr<Checkpoint> open_directory(const std::filesystem::path& dir);
  /// open() for a GGUF file.
  static std::unique_ptr<Checkpoint> open_gguf(const std::filesystem::path& file);
  std::filesystem::path dir_;
  nlohmann::json config_;
  nlohmann::json generation_config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> index_;
  std::optional<std::pair<int64_t, int64_t>> fp8_block_;  ///< quantization_config.weight_block_size
  // GGUF models: the files, the HF-named entries (TensorInfo of each mapped tensor, its
  // GGUF original), Mixtral's rotary row order, DeepSeek's split kv_b_proj.
  std::unique_ptr<GgufModelFiles> gguf_;
  std::vector<std::unique_ptr<TensorInfo>> gguf_infos_;
  std::map<const TensorInfo*, const GgufTensorInfo*> gguf_source_;
  std::map<std::string, int64_t> unpermute_heads_;
  std::map<std::string, GgufKvB> kv_b_;
  LoadProgress* progress_ = nullptr;  // see set_load_progress
  std::optional<GgmlType> dense_quant_;  // see set_dense_quant
  /// The tensor's bytes in its file's read-only mapping.
  const uint8_t* mapped(const TensorInfo& info) const;
  /// pread of `count` bytes from `offset` bytes into the tensor.
  void read_bytes(const TensorInfo& info, uint64_t offset, uint64_t count, void* dst) const;
  const SafetensorsFile& file_of(const TensorInfo& info) const;
  /// f32 values of GGUF's kv_b pieces assembled into kv_b_proj [heads * (nope + v), rank].
  std::vector<float> assemble_kv_b(const GgufKvB& kv_b) const;
  /// Undoes llama.cpp's rotary row order of `name` (Mixtral q/k) in `rows` rows of
  /// `row_bytes` bytes each, in place; nothing for other tensors.
  void unpermute_rows(const std::string& name, uint8_t* data, int64_t rows, size_t row_bytes) const;
  /// Multiplies `weight` (the f32 values of F8_E4M3 tensor `info`, [rows, cols]) by its
  /// block scales; throws as load_f32 documents.
  void dequantise_fp8(const TensorInfo& info, std::vector<float>& weight) const;
  /// The checked block-scale tensor of F8_E4M3 tensor `info`; throws as load_f32 documents.
  const TensorInfo& fp8_scale_of(const TensorInfo& info) const;
};

}  // namespace charm
