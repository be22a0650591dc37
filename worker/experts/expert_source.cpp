#include "worker/experts/expert_source.h"

#include <new>

#include "common/error.h"

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
  return ExpertLayout::make(shape(slices.gate), shape(slices.up), shape(slices.down));
}

ContentHash blob_identity(const ExpertLayout& layout, const uint8_t* blob) {
  ContentHasher hasher;
  for (const MatrixPart* part : {&layout.gate, &layout.up, &layout.down}) {
    hasher.update(blob + part->data_offset, part->shape.data_bytes());
    hasher.update(blob + part->scale_offset, part->shape.scale_bytes());
  }
  return hasher.digest();
}

uint64_t read_checkpoint_expert(const Checkpoint& checkpoint, const ExpertSlices& slices, const ExpertLayout& layout,
                                uint8_t* dst) {
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
