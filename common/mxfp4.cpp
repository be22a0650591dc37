// MXFP4 rows as gpt-oss's checkpoints store them (see mxfp4.h).
#include "common/mxfp4.h"

#include <cmath>
#include <limits>

namespace charm {
namespace {

// FP4 E2M1 by nibble (transformers' FP4_VALUES): bit 3 is the sign.
constexpr float kFp4[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

}  // namespace

void decode_mxfp4_rows(const uint8_t* blocks, const uint8_t* scales, size_t rows, size_t groups, float* out) {
  for (size_t r = 0; r < rows; ++r) {
    for (size_t g = 0; g < groups; ++g) {
      const uint8_t s = scales[r * groups + g];
      const int exponent = static_cast<int>(s) - 127;
      const uint8_t* b = blocks + (r * groups + g) * kMxfp4GroupBytes;
      float* y = out + (r * groups + g) * kMxfp4GroupSize;
      for (size_t j = 0; j < kMxfp4GroupBytes; ++j) {
        if (s == 255) {  // E8M0 NaN
          y[2 * j] = y[2 * j + 1] = std::numeric_limits<float>::quiet_NaN();
          continue;
        }
        // ldexp is exact here, as torch.ldexp's multiply by 2^(s - 127).
        y[2 * j] = std::ldexp(kFp4[b[j] & 0x0F], exponent);
        y[2 * j + 1] = std::ldexp(kFp4[b[j] >> 4], exponent);
      }
    }
  }
}

}  // namespace charm
