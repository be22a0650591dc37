// CPU kernels (f32, OpenMP) the model blocks are built from. They know nothing of models.
// Every kernel computes each output element with one fixed summation order, independent
// of thread count and of which other rows are in the batch, so results are reproducible
// bit for bit (the placement invariant of DESIGN.md relies on this).
#pragma once

#include <cstddef>
#include <cstdint>

namespace charm {

/// Dot product of two f32 vectors of length n, summed in a fixed blocked order.
float dot(const float* a, const float* b, size_t n);

/// Y = X W^T: x [rows, in], w [out, in] f32 (row-major, as nn.Linear stores weight),
/// y [rows, out]; single-threaded. Stored-form weights go through common/matmul.h.
void linear_serial(const float* x, size_t rows, const float* w, size_t in, size_t out, float* y);

/// RMSNorm over the last dim (T5LayerNorm / Qwen3MoeRMSNorm):
/// y = x / sqrt(mean(x^2) + eps) * weight, for `rows` rows of width n. In place allowed.
void rms_norm(const float* x, const float* weight, size_t rows, size_t n, float eps, float* y);

/// SiLU(x) = x / (1 + exp(-x)), elementwise.
inline float silu(float x);
/// sigmoid(x) = 1 / (1 + exp(-x)).
inline float sigmoid(float x);

/// Numerically stable softmax of n values in place (max-subtracted, f32).
void softmax(float* x, size_t n);

/// Index of the largest of n values; the first one on ties (torch.argmax's rule). NaNs
/// are passed over, unless x[0] is one (then 0). n = 0 gives 0.
size_t argmax(const float* x, size_t n);

/// The largest of n >= 1 values: what the chain m = (x[i] > m ? x[i] : m) from m = x[0]
/// gives (NaNs after x[0] passed over), in sixteen independent lanes so that it
/// vectorises (a chain runs at the compare's latency: ~150 us over a 50k vocabulary).
/// When the largest values are zeros of both signs, either may come back.
float max_value(const float* x, size_t n);

}  // namespace charm

#include <cmath>
inline float charm::silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float charm::sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
