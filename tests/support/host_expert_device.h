// An ExpertDevice in host memory that computes with common/matmul.h: the stand-in for the
// GPU in the VRAM tier's CPU tests (placement, budget accounting, promotion, the
// executor's split of a request between device and CPU, counters). It takes the formats
// the GPU takes and refuses the others as the GPU does, and counts its memory against a
// capacity. It says nothing about the GPU's own bits: tests/gpu/ checks those.
#pragma once

#include <atomic>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/matmul.h"
#include "worker/experts/expert_device.h"
#include "worker/experts/expert_source.h"

namespace charm::test {

class HostExpertDevice final : public ExpertDevice {
 public:
  explicit HostExpertDevice(uint64_t capacity = std::numeric_limits<uint64_t>::max()) : capacity_(capacity) {}

  std::unique_ptr<DeviceExpert> upload(const ExpertLayout& layout, const uint8_t* blob) override {
    for (const MatrixPart* m : {&layout.gate, &layout.up, &layout.down}) {
      if (!computes(m->shape.format)) fail_unsupported(std::string("host device: ") + weight_format_name(m->shape.format));
    }
    ++attempts_;
    if (refuse_uploads_ || layout.bytes > capacity_ - used_->load()) fail_unavailable("host device: full");
    ++uploads_;
    return std::make_unique<Copy>(layout, blob, used_);
  }
  /// One charm::matmul per product.
  void matmul_batch(const std::vector<DeviceProduct>& products, const float* x, size_t x_rows,
                    float* y) const override {
    size_t at = 0;  // first output row of the current product
    for (const DeviceProduct& p : products) {
      if (p.x_row > x_rows || p.rows > x_rows - p.x_row) fail_internal("host device: a product's rows lie outside x");
      ++products_;
      charm::matmul(*p.w, x + p.x_row * p.w->shape.cols, p.rows, p.bias, y + at * p.w->shape.rows);
      at += p.rows;
    }
  }
  uint64_t free_bytes() const override { return capacity_ - used_->load(); }
  std::string describe() const override { return "host device"; }

  /// Bytes held by live copies (shared with them: a copy outliving the tier still counts).
  uint64_t used() const { return used_->load(); }
  uint64_t uploads() const { return uploads_.load(); }
  /// Uploads asked for, refused ones included.
  uint64_t attempts() const { return attempts_.load(); }
  /// From now on every upload fails as a full device's does.
  void refuse_uploads() { refuse_uploads_ = true; }
  uint64_t products() const { return products_.load(); }

 private:
  class Copy final : public DeviceExpert {
   public:
    Copy(const ExpertLayout& layout, const uint8_t* blob, std::shared_ptr<std::atomic<uint64_t>> used)
        : Copy(layout, blob, std::move(used), AlignedBuffer(layout.bytes)) {}
    ~Copy() override { *used_ -= bytes(); }

   private:
    Copy(const ExpertLayout& layout, const uint8_t* blob, std::shared_ptr<std::atomic<uint64_t>> used,
         AlignedBuffer buffer)
        : DeviceExpert(layout.view(buffer.data()), layout.bytes), buffer_(std::move(buffer)), used_(std::move(used)) {
      std::memcpy(buffer_.data(), blob, layout.bytes);
      *used_ += bytes();
    }
    AlignedBuffer buffer_;
    std::shared_ptr<std::atomic<uint64_t>> used_;
  };

  uint64_t capacity_;
  std::shared_ptr<std::atomic<uint64_t>> used_ = std::make_shared<std::atomic<uint64_t>>(0);
  std::atomic<uint64_t> uploads_{0};
  std::atomic<uint64_t> attempts_{0};
  std::atomic<bool> refuse_uploads_{false};
  mutable std::atomic<uint64_t> products_{0};
};

}  // namespace charm::test
