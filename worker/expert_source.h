// The disk tier: where a worker reads an expert it does not hold in RAM. Two sources
// implement it: the Hugging Face checkpoint itself (three preads of the expert's tensor
// slices, in the checkpoint's dtype) and an expert container written by `charm convert`
// (one pread of a 4 KiB-aligned record; worker/expert_container.h). Both fill a blob in
// the ExpertLayout, so the cache and the executor do not care which one served.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "worker/expert_layout.h"

namespace charm {

/// (layer, expert) ids.
using ExpertKey = std::pair<uint32_t, uint32_t>;

/// How a source reads: plain pread through the page cache, or O_DIRECT (bypasses it;
/// containers only, since checkpoint tensors are not 4 KiB aligned).
enum class IoMode { kPread, kODirect };

/// A heap buffer aligned to kRecordAlignment (RAII; move-only).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  /// Allocates align_up(bytes, kRecordAlignment) bytes. Throws std::bad_alloc.
  explicit AlignedBuffer(uint64_t bytes);
  uint8_t* data() const { return data_.get(); }
  uint64_t size() const { return size_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data_;
  uint64_t size_ = 0;
};

/// Reads expert blobs. Thread-safety: read() may be called from many threads at once.
class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  /// The expert's blob layout; nullptr when this source does not hold it.
  virtual const ExpertLayout* layout(const ExpertKey& key) const = 0;
  /// Reads the expert's blob into `dst`, which holds align_up(layout.bytes,
  /// kRecordAlignment) bytes and is kRecordAlignment-aligned. Returns the bytes read from
  /// disk. Throws Error(kIo) naming the file, layer and expert on a failed or short read
  /// or a corrupt record; Error(kInternal) for an expert the source does not hold.
  virtual uint64_t read(const ExpertKey& key, uint8_t* dst) const = 0;
  /// "checkpoint <dir>" or "container <dir>", for logs and errors.
  virtual std::string describe() const = 0;
};

/// The checkpoint as the disk tier: each owned expert's three tensor slices, located at
/// construction (headers only, no data read) and read with pread on demand.
class CheckpointSource final : public ExpertSource {
 public:
  /// Locates every expert of `owned` (Checkpoint::locate_expert; throws what it throws).
  /// `checkpoint` must outlive the source. Blobs keep each tensor's dtype (f32/f16/bf16).
  CheckpointSource(const Checkpoint& checkpoint, const ExpertTensorNames& names, const std::vector<ExpertKey>& owned,
                   int64_t hidden_size, int64_t intermediate_size);

  const ExpertLayout* layout(const ExpertKey& key) const override;
  uint64_t read(const ExpertKey& key, uint8_t* dst) const override;
  std::string describe() const override { return "checkpoint " + checkpoint_.dir().string(); }

 private:
  struct Entry {
    ExpertSlices slices;
    ExpertLayout layout;
  };
  const Checkpoint& checkpoint_;
  std::map<ExpertKey, Entry> experts_;
};

/// The layout a checkpoint expert's slices give (each matrix in its tensor's dtype).
ExpertLayout layout_of(const ExpertSlices& slices);

}  // namespace charm
