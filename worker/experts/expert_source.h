// The disk tier: where a worker reads an expert it does not hold in RAM. Two sources
// implement it: the Hugging Face checkpoint itself (three preads of the expert's tensor
// slices, in the checkpoint's dtype) and an expert container written by `charm convert`
// (one pread of a 4 KiB-aligned record; worker/experts/expert_container.h). Both fill a blob in
// the ExpertLayout, so the cache and the executor do not care which one served.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/expert_identity.h"
#include "common/moe_types.h"
#include "worker/experts/expert_layout.h"

namespace charm {

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
  /// disk. Throws Error(kIo) naming the file, layer and expert on a failed or short read,
  /// a corrupt record or bytes whose content identity is not the expected one;
  /// Error(kInternal) for an expert the source does not hold.
  virtual uint64_t read(const ExpertKey& key, uint8_t* dst) const = 0;
  /// The content identity (common/expert_identity.h) of the checkpoint bytes this source
  /// serves for the expert: what the coordinator compares with its own at the handshake.
  /// nullopt for an expert the source does not hold. A source that has read bytes with
  /// another identity than it expected reports the one it read from then on.
  virtual std::optional<ContentHash> identity(const ExpertKey& key) const = 0;
  /// Empty when the blobs are the checkpoint's values exactly; else the lossy form they
  /// were converted to ("int8 group_size 32"), for the handshake and the logs.
  virtual std::string lossy_form() const { return {}; }
  /// "checkpoint <dir>" or "container <dir>", for logs and errors.
  virtual std::string describe() const = 0;
};

/// The content identity of an expert blob: XXH3-128 over, for gate, up and down in that
/// order, the matrix's element bytes and then its f32 scales (scale_bytes(); none unless
/// quantised or block-scaled fp8), then the f32 biases gate_bias, up_bias, down_bias
/// where the expert has them (none: nothing, so identities without biases are as they
/// were). Padding between parts is not hashed. For a blob in
/// the checkpoint's own layout (layout_of, filled by read_checkpoint_expert) these are
/// the checkpoint's stored bytes (fp8 block scales widened to f32, an injective
/// widening), which is what an expert's identity is defined over.
ContentHash blob_identity(const ExpertLayout& layout, const uint8_t* blob);

/// Reads one expert's three slices into `dst` in `layout` (layout_of(slices)): each
/// matrix's bytes as stored, fp8 block scales as f32; gpt-oss's transposed blocks
/// (ExpertSlices::transposed) moved element by element into the [out, in] matrices, the
/// gate/up columns de-interleaved, and its biases as f32 (llama.cpp's gpt-oss slices: the
/// matrices as stored, the biases as f32). Returns the bytes read from disk.
/// Throws what Checkpoint::read_slice throws.
uint64_t read_checkpoint_expert(const Checkpoint& checkpoint, const ExpertSlices& slices, const ExpertLayout& layout,
                                uint8_t* dst);

/// The checkpoint as the disk tier: each owned expert's three tensor slices, located at
/// construction (headers only, no data read) and read with pread on demand. Every read
/// is checked against the expert's expected content identity (worker/experts/expert_manifest.h),
/// so bytes changed on disk after the manifest was made (an edited file, disk corruption)
/// are refused, never served.
class CheckpointSource final : public ExpertSource {
 public:
  /// Locates every expert of `owned` (Checkpoint::locate_expert; throws what it throws).
  /// `checkpoint` must outlive the source. Blobs keep each tensor's dtype (f32/f16/bf16).
  /// `expected` holds the content identity of every owned expert (Error(kInternal)
  /// naming the first one it lacks).
  CheckpointSource(const Checkpoint& checkpoint, const ExpertTensorNames& names, const std::vector<ExpertKey>& owned,
                   int64_t hidden_size, int64_t intermediate_size, ExpertIdentities expected);

  const ExpertLayout* layout(const ExpertKey& key) const override;
  /// Reads the slices, then hashes them (blob_identity): bytes whose identity is not the
  /// expected one throw Error(kIo) naming the shard file, layer, expert and both hashes,
  /// and from then on identity() reports the hash read.
  uint64_t read(const ExpertKey& key, uint8_t* dst) const override;
  std::optional<ContentHash> identity(const ExpertKey& key) const override;
  std::string describe() const override { return "checkpoint " + checkpoint_.dir().string(); }

 private:
  struct Entry {
    ExpertSlices slices;
    ExpertLayout layout;
    ContentHash expected;
  };
  const Checkpoint& checkpoint_;
  std::map<ExpertKey, Entry> experts_;
  mutable std::mutex mutex_;
  mutable ExpertIdentities read_mismatches_;  // guarded by mutex_: the identities actually read
};

/// The layout a checkpoint expert's slices give (each matrix in its tensor's dtype; for
/// gpt-oss's transposed slices, gate and up [I, H] and down [H, I], with biases; for
/// llama.cpp's gpt-oss slices, the matrices as stored, with biases).
ExpertLayout layout_of(const ExpertSlices& slices);

}  // namespace charm
