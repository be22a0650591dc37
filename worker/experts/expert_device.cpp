#include "worker/experts/expert_device.h"

#include <string>
#include <vector>

#include "common/error.h"
#include "common/gpu_runtime.h"

namespace charm {

bool ExpertDevice::computes(WeightFormat format) {
  return format == WeightFormat::kF32 || format == WeightFormat::kF16 || format == WeightFormat::kBF16;
}

void ExpertDevice::swiglu_batch(const std::vector<DeviceJob>& jobs, const float* x, size_t x_rows, float* y,
                                const ExpertActivation& activation) const {
  if (jobs.empty()) return;
  const auto inter = static_cast<size_t>(jobs.front().expert->view().gate.shape.rows);
  size_t rows = 0;
  std::vector<DeviceProduct> gate_up, down;
  for (const DeviceJob& j : jobs) {
    const ExpertView& w = j.expert->view();
    gate_up.push_back({&w.gate, w.gate_bias, j.x_row, j.rows});
    gate_up.push_back({&w.up, w.up_bias, j.x_row, j.rows});
    down.push_back({&w.down, w.down_bias, rows, j.rows});  // its rows of `act`
    rows += j.rows;
  }
  // Job by job: its rows of gate, then of up ([rows, inter] each).
  std::vector<float> gu(2 * rows * inter), act(rows * inter);
  matmul_batch(gate_up, x, x_rows, gu.data());
  size_t at = 0;
  for (const DeviceJob& j : jobs) {
    const float* g = gu.data() + 2 * at * inter;
    const float* u = g + j.rows * inter;
    // The CPU's activation, element by element as swiglu_batch applies it: the same bits.
    for (size_t i = 0; i < j.rows * inter; ++i) act[at * inter + i] = activation(g[i], u[i]);
    at += j.rows;
  }
  matmul_batch(down, act.data(), rows, y);
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
        fail_unsupported("the VRAM tier computes F32, F16 and BF16 experts; these are " + matrix_dtype_name(m->shape) +
                         " (serve them from RAM: leave vram_gb out)");
      }
    }
    GpuBuffer buffer(layout.bytes, "an expert in VRAM");
    buffer.upload(blob, layout.bytes);
    return std::make_unique<GpuExpert>(std::move(buffer), layout);
  }
  void matmul_batch(const std::vector<DeviceProduct>& products, const float* x, size_t x_rows,
                    float* y) const override {
    std::vector<GpuProduct> batch;
    batch.reserve(products.size());
    for (const DeviceProduct& p : products) batch.push_back({*p.w, p.bias, p.x_row, p.rows});
    gpu_matmul_batch(batch, x, x_rows, y);
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
