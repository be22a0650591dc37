// Test support: a model's first-step logits computed in this process, single node (every
// expert in RAM through the local dispatcher), for tests that compare checkpoints or
// files bit for bit or against another engine's numbers.
#pragma once

#include <filesystem>
#include <optional>
#include <vector>

#include "common/checkpoint.h"
#include "common/ggml_type.h"
#include "common/model_config.h"
#include "common/topology.h"
#include "coordinator/dispatch/dispatcher_factory.h"
#include "coordinator/models/families.h"

namespace charm::test {

/// The logits [vocab_size] after `prompt` on `model` (a checkpoint directory or a GGUF
/// file), single node; `config_out` receives the parsed config; `quant_dense` as the
/// topology key (nullopt: weights as stored). Throws what loading throws.
inline std::vector<float> first_logits(const std::filesystem::path& model, const std::vector<int32_t>& prompt,
                                       ModelConfig* config_out = nullptr,
                                       std::optional<GgmlType> quant_dense = std::nullopt) {
  const auto ckpt = Checkpoint::open(model);
  ckpt->set_dense_quant(quant_dense);
  const ModelConfig config = ModelConfig::parse(ckpt->config_json(), ckpt->config_origin(), checkpoint_families());
  Topology topology;
  topology.model = model;
  topology.single_node = true;
  LocalExperts local;
  auto dispatcher = make_dispatcher(topology, *ckpt, config, local);
  auto net = load_model(*ckpt, config, *dispatcher);
  KvCache cache = net->new_cache(prompt.size() + 1);
  std::vector<float> logits(static_cast<size_t>(config.vocab_size));
  net->forward(prompt.data(), prompt.size(), cache, logits.data());
  if (config_out) *config_out = config;
  return logits;
}

}  // namespace charm::test
