#include "worker/experts/expert_device.h"

#include <string>
#include <vector>

#include "common/error.h"
#include "common/gpu_runtime.h"

namespace charm {

bool ExpertDevice::computes(WeightFormat format) {
  return format == WeightFormat::kF32 || format == WeightFormat::kF16 || format == WeightFormat::kBF16;
}

void ExpertDevice::swiglu(const DeviceExpert& expert, const float* x, size_t rows, float* y,
                          const ExpertActivation& activation) const {
  if (rows == 0) return;
  const ExpertView& w = expert.view();
  const auto inter = static_cast<size_t>(w.gate.shape.rows);
  std::vector<float> gate(rows * inter), up(rows * inter);
  matmul(w.gate, x, rows, w.gate_bias, gate.data());
  matmul(w.up, x, rows, w.up_bias, up.data());
  // The CPU's activation, element by element as swiglu_batch applies it: the same bits.
  for (size_t i = 0; i < gate.size(); ++i) gate[i] = activation(gate[i], up[i]);
  matmul(w.down, gate.data(), rows, w.down_bias, y);
}

namespace {

/// An expert's blob in a GpuBuffer.
class GpuExpert final : public DeviceExpert {
 public:
  GpuExpert(GpuBuffer buffer, const ExpertLayout& layout)
      : DeviceExpert(layout.view(buffer.data()), buffer.size()), buffer_(std::move(buffer)) {}

 private:
  GpuBuffer buffer_;
};

class GpuExpertDevice final : public ExpertDevice {
 public:
  std::unique_ptr<DeviceExpert> upload(const ExpertLayout& layout, const uint8_t* blob) override {
    for (const MatrixPart* m : {&layout.gate, &layout.up, &layout.down}) {
      if (!computes(m->shape.format)) {
        fail_unsupported(std::string("the VRAM tier computes F32, F16 and BF16 experts; these are ") +
                         weight_format_name(m->shape.format) + " (serve them from RAM: leave vram_gb out)");
      }
    }
    GpuBuffer buffer(layout.bytes, "an expert in VRAM");
    buffer.upload(blob, layout.bytes);
    return std::make_unique<GpuExpert>(std::move(buffer), layout);
  }
  void matmul(const MatrixView& w, const float* x, size_t rows, const float* bias, float* y) const override {
    gpu_matmul_resident(w, x, rows, bias, y);
  }
  uint64_t free_bytes() const override { return gpu_memory().free_bytes; }
  std::string describe() const override { return "GPU (CUDA device 0)"; }
};

}  // namespace

std::unique_ptr<ExpertDevice> open_gpu_expert_device(const std::string& what) {
  require_gpu(what);
  return std::make_unique<GpuExpertDevice>();
}

}  // namespace charm
