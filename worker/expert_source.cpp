#include "worker/expert_source.h"

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
    return MatrixShape{weight_format_of(s.tensor->dtype), s.rows, s.cols, 0, s.block_rows, s.block_cols};
  };
  return ExpertLayout::make(shape(slices.gate), shape(slices.up), shape(slices.down));
}

CheckpointSource::CheckpointSource(const Checkpoint& checkpoint, const ExpertTensorNames& names,
                                   const std::vector<ExpertKey>& owned, int64_t hidden_size,
                                   int64_t intermediate_size)
    : checkpoint_(checkpoint) {
  for (const ExpertKey& key : owned) {
    ExpertSlices slices = checkpoint.locate_expert(names, static_cast<int>(key.first), static_cast<int>(key.second),
                                                   hidden_size, intermediate_size);
    experts_.emplace(key, Entry{slices, layout_of(slices)});
  }
}

const ExpertLayout* CheckpointSource::layout(const ExpertKey& key) const {
  const auto it = experts_.find(key);
  return it == experts_.end() ? nullptr : &it->second.layout;
}

uint64_t CheckpointSource::read(const ExpertKey& key, uint8_t* dst) const {
  const auto it = experts_.find(key);
  if (it == experts_.end()) {
    fail_internal(describe() + ": layer " + std::to_string(key.first) + " expert " + std::to_string(key.second) +
                  " was not located at start");
  }
  const Entry& e = it->second;
  uint64_t bytes = 0;
  for (auto [slice, part] : {std::pair{&e.slices.gate, &e.layout.gate}, {&e.slices.up, &e.layout.up},
                             {&e.slices.down, &e.layout.down}}) {
    checkpoint_.read_slice(*slice, dst + part->data_offset);
    bytes += slice->bytes;
    if (slice->scale) {  // fp8: its block scales go after the data, as f32
      checkpoint_.read_slice_scales(*slice, reinterpret_cast<float*>(dst + part->scale_offset));
      bytes += slice->scale->nbytes;
    }
  }
  return bytes;
}

}  // namespace charm
