// Where the VRAM tier keeps and computes its experts (issue 19): the GPU through
// common/gpu_runtime.h, or, in tests, a stand-in with the same interface. An expert's
// blob (worker/experts/expert_layout.h) is copied there once; a request's rows for it are
// computed there as y = down(act(gate x, up x)) with the same bits as swiglu_batch on the
// CPU: each projection is a device matmul under common/matmul.h's contract, and the
// activation between them runs on the host, with the very function the CPU path uses
// (common/expert_activation.h), since the device's exp need not round as the host's does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/expert_activation.h"
#include "worker/experts/expert_layout.h"

namespace charm {

/// One expert's blob in device memory, freed when this dies.
class DeviceExpert {
 public:
  virtual ~DeviceExpert() = default;
  /// The expert's matrices and biases in device memory (dereference them only there).
  const ExpertView& view() const { return view_; }
  /// Bytes this copy takes on the device.
  uint64_t bytes() const { return bytes_; }

 protected:
  DeviceExpert(const ExpertView& view, uint64_t bytes) : view_(view), bytes_(bytes) {}

 private:
  ExpertView view_;
  uint64_t bytes_;
};

/// One product of ExpertDevice::matmul_batch: rows [x_row, x_row + rows) of its x times
/// w^T (+ bias when non-null), w and bias in device memory (a DeviceExpert's view).
struct DeviceProduct {
  const MatrixView* w = nullptr;
  const float* bias = nullptr;
  size_t x_row = 0;
  size_t rows = 0;
};

/// One expert's share of ExpertDevice::swiglu_batch: rows [x_row, x_row + rows) of x.
struct DeviceJob {
  const DeviceExpert* expert = nullptr;
  size_t x_row = 0;
  size_t rows = 0;
};

/// A device for resident experts. Thread-safety: every method from any thread.
class ExpertDevice {
 public:
  virtual ~ExpertDevice() = default;

  /// Copies one expert's blob (`layout.bytes` bytes at `blob`, laid out as `layout`) to the
  /// device. Throws Error(kUnsupported) for a matrix in a format the device does not
  /// compute (the GPU: F32, F16, BF16), Error(kUnavailable) when the device is full.
  virtual std::unique_ptr<DeviceExpert> upload(const ExpertLayout& layout, const uint8_t* blob) = 0;

  /// Every product (one shape and format: experts of one model; w and bias in device
  /// memory, a DeviceExpert's view) with x [x_rows, in] on the host in and y [sum of rows,
  /// out] on the host out, their rows one after another: each row common/matmul.h's bits.
  /// The GPU's is one launch.
  virtual void matmul_batch(const std::vector<DeviceProduct>& products, const float* x, size_t x_rows,
                            float* y) const = 0;

  /// Free device memory now, bytes (the budget check at start).
  virtual uint64_t free_bytes() const = 0;

  /// "GPU (CUDA device 0)", for logs and errors.
  virtual std::string describe() const = 0;

  /// For every job, y rows [x_row, x_row + rows) = down(act(gate x + gate_bias,
  /// up x + up_bias)) + down_bias of x's same rows (x, y [rows, hidden] f32 on the host):
  /// swiglu_batch's bits (the projections on the device, two matmul_batch calls for all
  /// jobs, the activation on the host). Throws what matmul_batch throws.
  void swiglu_batch(const std::vector<DeviceJob>& jobs, const float* x, size_t x_rows, float* y,
                    const ExpertActivation& activation) const;

  /// The formats upload() takes, for the message that refuses others.
  static bool computes(WeightFormat format);
};

/// The GPU as an ExpertDevice. Throws Error(kUnavailable) naming `what` (the setting
/// that asked for it: "worker 'w1': vram_gb 8") when no CUDA device is usable.
std::unique_ptr<ExpertDevice> open_gpu_expert_device(const std::string& what);

}  // namespace charm
