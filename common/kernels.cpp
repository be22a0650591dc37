#include "common/kernels.h"

#include <cmath>

namespace charm {

float dot(const float* a, const float* b, size_t n) {
  // Eight independent accumulators let the compiler vectorise without -ffast-math while
  // keeping one fixed order of additions.
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  }
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

void linear_serial(const float* x, size_t rows, const float* w, size_t in, size_t out, float* y) {
  for (size_t r = 0; r < rows; ++r) {
    for (size_t o = 0; o < out; ++o) y[r * out + o] = dot(x + r * in, w + o * in, in);
  }
}

void rms_norm(const float* x, const float* weight, size_t rows, size_t n, float eps, float* y) {
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double sum = 0;  // mean of squares in double: cheap, and closer to torch's reduction
    for (size_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float scale = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(n)) + eps);
    for (size_t i = 0; i < n; ++i) yr[i] = weight[i] * (xr[i] * scale);
  }
}

void softmax(float* x, size_t n) {
  float max = x[0];
  for (size_t i = 1; i < n; ++i) max = std::fmax(max, x[i]);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (size_t i = 0; i < n; ++i) x[i] *= inv;
}

size_t argmax(const float* x, size_t n) {
  if (n == 0 || std::isnan(x[0])) return 0;
  const float max = max_value(x, n);
  size_t i = 0;
  while (!(x[i] == max)) ++i;  // the first index equal to it (either zero matches the other)
  return i;
}

float max_value(const float* x, size_t n) {
  constexpr size_t kLanes = 16;
  float lane[kLanes];
  for (float& m : lane) m = x[0];
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
  }
  float max = lane[0];
  for (size_t l = 1; l < kLanes; ++l) max = lane[l] > max ? lane[l] : max;
  for (; i < n; ++i) max = x[i] > max ? x[i] : max;
  return max;
}

}  // namespace charm
