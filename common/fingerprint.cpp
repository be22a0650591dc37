#include "common/fingerprint.h"

#include <cstdio>
#include <memory>

#include <xxhash.h>

namespace charm {
namespace {

struct StateDeleter {
  void operator()(XXH3_state_t* state) const { XXH3_freeState(state); }
};

// Appends `text` and a NUL separator, so ("ab","c") and ("a","bc") hash differently.
void add_field(XXH3_state_t* state, const std::string& text) {
  XXH3_64bits_update(state, text.data(), text.size());
  XXH3_64bits_update(state, "", 1);
}

}  // namespace

std::string model_fingerprint(const Checkpoint& checkpoint) {
  std::unique_ptr<XXH3_state_t, StateDeleter> state(XXH3_createState());
  XXH3_64bits_reset(state.get());
  add_field(state.get(), checkpoint.config_json().dump());
  for (const std::string& name : checkpoint.tensor_names()) {
    const TensorInfo* info = checkpoint.find(name);
    add_field(state.get(), name);
    add_field(state.get(), !info ? "?" : info->block_type ? ggml_traits(*info->block_type).name : dtype_name(info->dtype));
    std::string shape;
    if (info) {
      for (int64_t dim : info->shape) shape += std::to_string(dim) + ",";
    }
    add_field(state.get(), shape);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits_digest(state.get())));
  return hex;
}

}  // namespace charm
