#include "coordinator/models/families.h"

#include <vector>

#include "common/error.h"

namespace charm {

// Each family's record, defined in its file (coordinator/models/<family>.cpp).
const ModelFamily& qwen3_moe_family();
const ModelFamily& olmoe_family();
const ModelFamily& qwen2_moe_family();
const ModelFamily& mixtral_family();
const ModelFamily& deepseek_v3_family();
const ModelFamily& glm4_moe_family();
const ModelFamily& minimax_m2_family();
const ModelFamily& gpt_oss_family();
const ModelFamily& glm_moe_dsa_family();
const ModelFamily& deepseek_v32_family();
const ModelFamily& qwen3_next_family();
const ModelFamily& qwen3_5_moe_family();

std::span<const ModelFamily* const> model_families() {
  // The table: one line per family. Built on first use, after every family's record.
  static const std::vector<const ModelFamily*> table{
      &qwen3_moe_family(),
      &olmoe_family(),
      &qwen2_moe_family(),
      &mixtral_family(),
      &deepseek_v3_family(),
      &glm4_moe_family(),
      &minimax_m2_family(),
      &gpt_oss_family(),
      &glm_moe_dsa_family(),
      &deepseek_v32_family(),
      &qwen3_next_family(),
      &qwen3_5_moe_family(),
  };
  return table;
}

CheckpointFamilies checkpoint_families() {
  static const std::vector<const CheckpointFamily*> records = [] {
    std::vector<const CheckpointFamily*> out;
    for (const ModelFamily* family : model_families()) out.push_back(&family->checkpoint);
    return out;
  }();
  return records;
}

const ModelFamily& model_family(const std::string& architecture) {
  for (const ModelFamily* family : model_families()) {
    for (const std::string& served : family->checkpoint.architectures) {
      if (served == architecture) return *family;
    }
  }
  fail_unsupported("architecture '" + architecture + "' has no model family in charm");
}

std::unique_ptr<Model> load_model(const Checkpoint& checkpoint, const ModelConfig& config,
                                  ExpertDispatcher& dispatcher) {
  return model_family(config.architecture).build(checkpoint, config, dispatcher);
}

}  // namespace charm
