#include "worker/experts/expert_source.h"

#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "common/error.h"
#include "common/mxfp4.h"

namespace charm {

AlignedBuffer::AlignedBuffer(uint64_t bytes) : size_(align_up(bytes, kRecordAlignment)) {
  if (size_ == 0) return;
  void* p = std::aligned_alloc(kRecordAlignment, size_);
  if (p == nullptr) throw std::bad_alloc();
  data_.reset(static_cast<uint8_t*>(p));
}

ExpertLayout layout_of(const ExpertSlices& slices) {
  auto shape = [](const ExpertSlice& s) {
    if (s.tensor->block_type) {  // GGUF blocks as stored: the kernels dequantise them row by row
      MatrixShape shape{WeightFormat::kGgml, s.rows, s.cols};
      shape.ggml_type = *s.tensor->block_type;
      return shape;
    }
    return MatrixShape{weight_format_of(s.tensor->dtype), s.rows, s.cols, 0, s.block_rows, s.block_cols};
  };
  if (slices.transposed) {  // gpt-oss: gate [H, 2I] and down [I, H] become [I, H] x 2 and [H, I]
    // MXFP4 experts are decoded into bf16, which holds every MXFP4 value exactly.
    const DType dtype = slices.mxfp4 ? DType::kBF16 : slices.gate.tensor->dtype;
    const int64_t H = slices.mxfp4 ? slices.down.rows : slices.gate.rows;
    const int64_t I = slices.mxfp4 ? slices.gate.rows / 2 : slices.gate.cols / 2;
    const MatrixShape in_to_inter{weight_format_of(dtype), I, H}, inter_to_in{weight_format_of(dtype), H, I};
    return ExpertLayout::make(in_to_inter, in_to_inter, inter_to_in, slices.down_bias.tensor != nullptr);
  }
  // llama.cpp's gpt-oss experts (GGUF): the [out, in] matrices as stored, with biases.
  return ExpertLayout::make(shape(slices.gate), shape(slices.up), shape(slices.down), slices.has_biases());
}

namespace {

/// The biases of a gpt-oss expert, widened to f32: gate_up's split into gate (even) and up
/// (odd) as the weights are, or llama.cpp's gate and up biases as they are. Returns the
/// bytes read.
uint64_t read_gpt_oss_biases(const Checkpoint& checkpoint, const ExpertSlices& slices, const ExpertLayout& layout,
                             size_t I, uint8_t* dst) {
  auto* gate_bias = reinterpret_cast<float*>(dst + layout.gate_bias.offset);
  auto* up_bias = reinterpret_cast<float*>(dst + layout.up_bias.offset);
  uint64_t bytes = slices.down_bias.bytes;
  if (slices.up_bias.tensor != nullptr) {  // llama.cpp's form: gate's and up's apart
    const std::vector<float> gate = checkpoint.slice_f32(slices.gate_bias);
    const std::vector<float> up = checkpoint.slice_f32(slices.up_bias);
    std::memcpy(gate_bias, gate.data(), I * sizeof(float));
    std::memcpy(up_bias, up.data(), I * sizeof(float));
    bytes += slices.gate_bias.bytes + slices.up_bias.bytes;
  } else {
    const std::vector<float> gate_up_bias = checkpoint.slice_f32(slices.gate_up_bias);
    for (size_t i = 0; i < I; ++i) {
      gate_bias[i] = gate_up_bias[2 * i];
      up_bias[i] = gate_up_bias[2 * i + 1];
    }
    bytes += slices.gate_up_bias.bytes;
  }
  const std::vector<float> down_bias = checkpoint.slice_f32(slices.down_bias);
  std::memcpy(dst + layout.down_bias.offset, down_bias.data(), down_bias.size() * sizeof(float));
  return bytes;
}

/// An MXFP4 tensor's rows [rows, in] (blocks and scales of one expert) decoded to bf16 bits;
/// throws naming the tensor for a value bf16 cannot hold exactly or that is not finite.
std::vector<uint16_t> decode_mxfp4_bf16(const Checkpoint& checkpoint, const ExpertSlice& blocks,
                                        const ExpertSlice& scales) {
  std::vector<uint8_t> packed(blocks.bytes), e8m0(scales.bytes);
  checkpoint.read_slice(blocks, packed.data());
  checkpoint.read_slice(scales, e8m0.data());
  const auto rows = static_cast<size_t>(scales.rows), groups = static_cast<size_t>(scales.cols);
  std::vector<float> values(rows * groups * kMxfp4GroupSize);
  decode_mxfp4_rows(packed.data(), e8m0.data(), rows, groups, values.data());
  std::vector<uint16_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], sizeof bits);
    if (!std::isfinite(values[i]) || (bits & 0xFFFFu) != 0) {
      fail_invalid(blocks.tensor->file.string() + ": tensor '" + scales.tensor->name + "' scales a value of row " +
                   std::to_string(i / (groups * kMxfp4GroupSize)) + " out of range (E8M0 " +
                   std::to_string(e8m0[i / kMxfp4GroupSize]) + ")");
    }
    out[i] = static_cast<uint16_t>(bits >> 16);
  }
  return out;
}

/// gpt-oss's MXFP4 expert into the blob's bf16 [out, in] matrices: gate_up's decoded rows
/// [2I, H] are its output features (GptOssExperts' gate_up_proj is their transpose), gate
/// the even ones and up the odd ones; down's decoded [H, I] is the blob's down as it is.
uint64_t read_mxfp4_expert(const Checkpoint& checkpoint, const ExpertSlices& slices, const ExpertLayout& layout,
                           uint8_t* dst) {
  const auto I = static_cast<size_t>(slices.gate.rows / 2), H = static_cast<size_t>(slices.down.rows);
  const std::vector<uint16_t> gate_up = decode_mxfp4_bf16(checkpoint, slices.gate, slices.gate_up_scales);
  auto* gate = reinterpret_cast<uint16_t*>(dst + layout.gate.data_offset);
  auto* up = reinterpret_cast<uint16_t*>(dst + layout.up.data_offset);
  for (size_t i = 0; i < I; ++i) {
    std::memcpy(gate + i * H, gate_up.data() + (2 * i) * H, H * sizeof(uint16_t));
    std::memcpy(up + i * H, gate_up.data() + (2 * i + 1) * H, H * sizeof(uint16_t));
  }
  const std::vector<uint16_t> down = decode_mxfp4_bf16(checkpoint, slices.down, slices.down_scales);
  std::memcpy(dst + layout.down.data_offset, down.data(), down.size() * sizeof(uint16_t));
  uint64_t bytes = slices.gate.bytes + slices.gate_up_scales.bytes + slices.down.bytes + slices.down_scales.bytes;
  if (layout.has_biases()) bytes += read_gpt_oss_biases(checkpoint, slices, layout, I, dst);
  return bytes;
}

/// gpt-oss's expert blocks into the blob's [out, in] matrices, element bytes moved as
/// they are: gate[i][h] = gate_up[h][2i], up[i][h] = gate_up[h][2i + 1] (GptOssExperts:
/// gate_up[..., ::2], gate_up[..., 1::2]), down[h][i] = down_proj[i][h]; the biases
/// widened to f32 and split the same way. Returns the bytes read.
uint64_t read_transposed_expert(const Checkpoint& checkpoint, const ExpertSlices& slices, const ExpertLayout& layout,
                                uint8_t* dst) {
  const size_t esize = dtype_size(slices.gate.tensor->dtype);
  const auto H = static_cast<size_t>(slices.gate.rows), I = static_cast<size_t>(slices.gate.cols / 2);
  std::vector<uint8_t> block(slices.gate.bytes);
  checkpoint.read_slice(slices.gate, block.data());
  uint8_t* gate = dst + layout.gate.data_offset;
  uint8_t* up = dst + layout.up.data_offset;
  for (size_t h = 0; h < H; ++h) {
    for (size_t i = 0; i < I; ++i) {
      std::memcpy(gate + (i * H + h) * esize, block.data() + (h * 2 * I + 2 * i) * esize, esize);
      std::memcpy(up + (i * H + h) * esize, block.data() + (h * 2 * I + 2 * i + 1) * esize, esize);
    }
  }
  block.resize(slices.down.bytes);
  checkpoint.read_slice(slices.down, block.data());
  uint8_t* down = dst + layout.down.data_offset;
  for (size_t i = 0; i < I; ++i) {
    for (size_t h = 0; h < H; ++h) std::memcpy(down + (h * I + i) * esize, block.data() + (i * H + h) * esize, esize);
  }
  uint64_t bytes = slices.gate.bytes + slices.down.bytes;
  if (layout.has_biases()) bytes += read_gpt_oss_biases(checkpoint, slices, layout, I, dst);
  return bytes;
}

}  // namespace

ContentHash blob_identity(const ExpertLayout& layout, const uint8_t* blob) {
  ContentHasher hasher;
  for (const MatrixPart* part : {&layout.gate, &layout.up, &layout.down}) {
    hasher.update(blob + part->data_offset, part->shape.data_bytes());
    hasher.update(blob + part->scale_offset, part->shape.scale_bytes());
  }
  for (const BiasPart* part : {&layout.gate_bias, &layout.up_bias, &layout.down_bias}) {  // none: nothing
    hasher.update(blob + part->offset, static_cast<uint64_t>(part->size) * sizeof(float));
  }
  return hasher.digest();
}

uint64_t read_checkpoint_expert(const Checkpoint& checkpoint, const ExpertSlices& slices, const ExpertLayout& layout,
                                uint8_t* dst) {
  if (slices.mxfp4) return read_mxfp4_expert(checkpoint, slices, layout, dst);
  if (slices.transposed) return read_transposed_expert(checkpoint, slices, layout, dst);
  uint64_t bytes = 0;
  for (auto [slice, part] : {std::pair{&slices.gate, &layout.gate}, {&slices.up, &layout.up},
                             {&slices.down, &layout.down}}) {
    checkpoint.read_slice(*slice, dst + part->data_offset);
    bytes += slice->bytes;
    if (slice->scale) {  // fp8: its block scales go after the data, as f32
      checkpoint.read_slice_scales(*slice, reinterpret_cast<float*>(dst + part->scale_offset));
      bytes += slice->scale->nbytes;
    }
  }
  if (layout.has_biases()) {  // llama.cpp's gpt-oss experts
    bytes += read_gpt_oss_biases(checkpoint, slices, layout, static_cast<size_t>(slices.gate.rows), dst);
  }
  return bytes;
}

namespace {

std::string key_text(const ExpertKey& key) {
  return "layer " + std::to_string(key.first) + " expert " + std::to_string(key.second);
}

}  // namespace

CheckpointSource::CheckpointSource(const Checkpoint& checkpoint, const ExpertTensorNames& names,
                                   const std::vector<ExpertKey>& owned, int64_t hidden_size,
                                   int64_t intermediate_size, ExpertIdentities expected)
    : checkpoint_(checkpoint) {
  for (const ExpertKey& key : owned) {
    const auto identity = expected.find(key);
    if (identity == expected.end()) fail_internal(describe() + ": no expected content identity for " + key_text(key));
    ExpertSlices slices = checkpoint.locate_expert(names, static_cast<int>(key.first), static_cast<int>(key.second),
                                                   hidden_size, intermediate_size);
    experts_.emplace(key, Entry{slices, layout_of(slices), identity->second});
  }
}

const ExpertLayout* CheckpointSource::layout(const ExpertKey& key) const {
  const auto it = experts_.find(key);
  return it == experts_.end() ? nullptr : &it->second.layout;
}

std::optional<ContentHash> CheckpointSource::identity(const ExpertKey& key) const {
  const auto it = experts_.find(key);
  if (it == experts_.end()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto read = read_mismatches_.find(key);
  return read == read_mismatches_.end() ? it->second.expected : read->second;
}

uint64_t CheckpointSource::read(const ExpertKey& key, uint8_t* dst) const {
  const auto it = experts_.find(key);
  if (it == experts_.end()) fail_internal(describe() + ": " + key_text(key) + " was not located at start");
  const Entry& e = it->second;
  const uint64_t bytes = read_checkpoint_expert(checkpoint_, e.slices, e.layout, dst);
  // XXH3 hashes far faster than a disk reads, so every read is checked: bytes changed
  // after the manifest was made are refused here rather than computed with.
  const ContentHash got = blob_identity(e.layout, dst);
  if (!(got == e.expected)) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      read_mismatches_[key] = got;
    }
    fail_io(e.slices.gate.tensor->file.string() + ": " + key_text(key) + ": the bytes read have content hash " +
            got.hex() + ", the expert manifest has " + e.expected.hex() +
            ": the checkpoint changed on disk after its manifest was made; refusing to serve it (restart the "
            "worker to re-hash; the coordinator refuses it if the weights then differ from its own)");
  }
  return bytes;
}

}  // namespace charm
