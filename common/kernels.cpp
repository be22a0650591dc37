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
  size_t best = 0;
  for (size_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

}  // namespace charm
