// Builds a worker's ExpertStore from its tier settings (StoreSpec, the YAML keys): the
// disk tier (checkpoint or expert container), the RAM budget, pinning and the usage file.
// Shared by `charm worker` and the in-process worker of single-node mode.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/model_config.h"
#include "common/topology.h"
#include "worker/experts/expert_store.h"

namespace charm {

/// Where usage is recorded when `usage_file` is not set: `<container>/usage.json` when
/// serving a container, else `$XDG_CACHE_HOME/charm/<fingerprint>/usage.json` (default
/// `$HOME/.cache`), so a read-only checkpoint directory is never written. "none" or no
/// cache directory: empty (not recorded).
std::filesystem::path usage_file_for(const StoreSpec& spec, const std::string& fingerprint);

/// Opens the store for `owned` experts of `checkpoint` (which must outlive it) as `spec`
/// says. `fingerprint` is model_fingerprint(checkpoint). Serving from the checkpoint, it
/// loads the owned experts' content identities (worker/experts/expert_manifest.h: the cached
/// manifest, else hashed now) for CheckpointSource to check every read against; a
/// container carries its own (ExpertContainer::identity). Throws what
/// ExpertContainer::open (ending with what a relative container path was resolved from),
/// load_expert_manifest, CheckpointSource and ExpertStore throw, and
/// Error(kInvalidInput) for io: odirect without a container and for a `pin:` file that
/// does not exist or a `usage_file` whose folder does not (each named as
/// UserPath::describe prints it).
std::unique_ptr<ExpertStore> open_store(const StoreSpec& spec, const Checkpoint& checkpoint, const ModelConfig& config,
                                        const std::vector<ExpertKey>& owned, const std::string& worker_name,
                                        const std::string& fingerprint);

}  // namespace charm
