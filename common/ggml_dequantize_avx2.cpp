// AVX2 kernels of common/ggml_dequantize_detail.h: placeholder until written.
#include "common/ggml_dequantize_detail.h"

namespace charm {

bool dequantize_row_avx2(GgmlType, const uint8_t*, float*, int64_t) { return false; }

}  // namespace charm
