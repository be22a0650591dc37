// A short identity of a checkpoint that coordinator and workers compare at the handshake,
// so a cluster never mixes two models (or two conversions of one model).
#pragma once

#include <string>

#include "common/checkpoint.h"

namespace charm {

/// Hex (16 lower-case digits) XXH3-64 over, in order: config.json dumped canonically
/// (nlohmann's dump(): keys sorted, no whitespace), then for every tensor in
/// Checkpoint::tensor_names() order its name, dtype name ("BF16") and shape, each field
/// followed by a NUL byte. Tensor *data is not hashed*: that would read the whole
/// checkpoint (hundreds of GB) at every start; two checkpoints with equal config, names,
/// dtypes and shapes but different weights get the same fingerprint. Throws nothing.
std::string model_fingerprint(const Checkpoint& checkpoint);

}  // namespace charm
