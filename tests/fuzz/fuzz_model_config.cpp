// libFuzzer target: bytes as a checkpoint's config.json, through parse_json with the
// config limits (as Checkpoint::open reads it) and ModelConfig::parse, then
// moe_layer_ids(). Only charm::Error may escape.
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/json_reader.h"
#include "common/model_config.h"
#include "coordinator/models/checkpoint_families.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const nlohmann::json json = charm::parse_json(
        std::string_view(reinterpret_cast<const char*>(data), size), "config.json", charm::kConfigJsonLimits);
    const charm::ModelConfig config = charm::ModelConfig::parse(json, "config.json", charm::checkpoint_families());
    config.moe_layer_ids();
  } catch (const charm::Error&) {
  }
  return 0;
}
