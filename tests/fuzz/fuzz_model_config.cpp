// libFuzzer target: bytes as a checkpoint's config.json, through nlohmann's parser and
// ModelConfig::parse, then moe_layer_ids(). Only charm::Error may escape (a JSON syntax
// error is rejected before ModelConfig sees it).
#include <cstdint>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json json = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return 0;
  try {
    const charm::ModelConfig config = charm::ModelConfig::parse(json, "config.json");
    config.moe_layer_ids();
  } catch (const charm::Error&) {
  }
  return 0;
}
