// The model families charm serves, in one table (families.cpp; vLLM's registry does the
// same): one line per family, each defined whole in its own file,
// coordinator/models/<family>.cpp (architectures, config fields, expert tensor names,
// builder). Nothing else in the tree lists families: whoever reads a checkpoint resolves
// its family here, and passes checkpoint_families() to what lives below the coordinator
// (ModelConfig::parse in common/, the worker process).
#pragma once

#include <memory>
#include <span>
#include <string>

#include "common/checkpoint.h"
#include "common/model_config.h"
#include "common/model_family.h"
#include "coordinator/dispatch/expert_dispatch.h"
#include "coordinator/models/checkpoint_families.h"
#include "coordinator/models/model.h"

namespace charm {

/// Builds a family's model: resident weights read from the checkpoint, routed experts
/// reached through the dispatcher (which must outlive the model). Throws what
/// Checkpoint::load_f32 / load_matrix throw for a missing or mis-shaped tensor.
using ModelBuilder = std::unique_ptr<Model> (*)(const Checkpoint& checkpoint, const ModelConfig& config,
                                                ExpertDispatcher& dispatcher);

/// The ModelBuilder of a family whose model class M has the constructor
/// M(const Checkpoint&, const ModelConfig&, ExpertDispatcher&).
template <typename M>
std::unique_ptr<Model> build_model(const Checkpoint& checkpoint, const ModelConfig& config,
                                   ExpertDispatcher& dispatcher) {
  return std::make_unique<M>(checkpoint, config, dispatcher);
}

/// One model family: how its checkpoints read, and how its model is built.
struct ModelFamily {
  CheckpointFamily checkpoint;
  ModelBuilder build = nullptr;
};

/// Every family, in the table's order (the order error messages list them in).
std::span<const ModelFamily* const> model_families();

/// The family that serves `architecture` (config.json's architectures[0]). Throws
/// Error(kUnsupported) naming it when no family does.
const ModelFamily& model_family(const std::string& architecture);

/// Loads the model of the family `config.architecture` names (model_family): resident
/// weights are read from `checkpoint` at its precision; routed experts stay with
/// `dispatcher`, which must outlive the model. Throws Error(kUnsupported) for an
/// architecture without a family, and what the family's builder throws.
std::unique_ptr<Model> load_model(const Checkpoint& checkpoint, const ModelConfig& config,
                                  ExpertDispatcher& dispatcher);

}  // namespace charm
