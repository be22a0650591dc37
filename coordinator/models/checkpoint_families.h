// charm's family table (coordinator/models/families.h) as the checkpoint readers take it:
// for code that parses a config or reads experts but builds no model (the worker process,
// `charm convert`, `charm status`), without the model types.
#pragma once

#include "common/model_family.h"

namespace charm {

/// Every family's CheckpointFamily record, in the table's order (the order error messages
/// list them in), for ModelConfig::parse and run_worker. Valid for the program's lifetime.
CheckpointFamilies checkpoint_families();

}  // namespace charm
