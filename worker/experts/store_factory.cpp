#include "worker/experts/store_factory.h"

#include <algorithm>
#include <cmath>

#include <spdlog/fmt/fmt.h>

#include "common/cache_root.h"
#include "common/error.h"
#include "worker/experts/expert_container.h"
#include "worker/experts/expert_device.h"
#include "worker/experts/expert_manifest.h"

namespace charm {

std::filesystem::path usage_file_for(const StoreSpec& spec, const std::string& fingerprint) {
  if (spec.usage_file == "none") return {};
  if (!spec.usage_file.empty()) return spec.usage_file;
  if (!spec.container.empty()) return spec.container / "usage.json";
  const std::filesystem::path root = cache_root();
  if (root.empty()) return {};
  return root / fingerprint / "usage.json";
}

std::unique_ptr<ExpertStore> open_store(const StoreSpec& spec, const Checkpoint& checkpoint, const ModelConfig& config,
                                        const std::vector<ExpertKey>& owned, const std::string& worker_name,
                                        const std::string& fingerprint) {
  std::shared_ptr<ExpertDevice> vram_device;
  if (spec.vram_gb) {
    // Checked first, so a machine without a GPU is told so before any expert is read.
    vram_device = open_gpu_expert_device("worker '" + worker_name + "': vram_gb " + fmt::format("{:g}", *spec.vram_gb));
  }
  const IoMode io = spec.io == "odirect" ? IoMode::kODirect : IoMode::kPread;
  std::unique_ptr<ExpertSource> source;
  if (!spec.container.empty()) {
    try {
      source = ExpertContainer::open(spec.container, fingerprint, config.hidden_size, config.moe_intermediate_size, io);
    } catch (const Error& e) {
      rethrow_in(e, spec.container);  // its messages print the resolved path; add what it came from
    }
  } else {
    if (io == IoMode::kODirect) {
      fail_invalid("worker '" + worker_name + "': io: odirect needs an expert container (container: DIR); "
                   "checkpoint tensors are not 4 KiB aligned");
    }
    // What each read is checked against: the manifest's identities (cached, else hashed
    // now, which reads every owned expert once).
    ManifestOptions manifest;
    manifest.cache_file = manifest_cache_file(checkpoint, fingerprint);
    manifest.threads = static_cast<int>(std::max<int64_t>(spec.io_threads, 1));
    source = std::make_unique<CheckpointSource>(checkpoint, config.expert_tensors, owned,
                                                config.hidden_size, config.moe_intermediate_size,
                                                load_expert_manifest(checkpoint, config, owned, manifest));
  }
  StoreOptions options;
  options.worker_name = worker_name;
  if (spec.ram_gb) options.ram_bytes = static_cast<uint64_t>(std::llround(*spec.ram_gb * double(1ull << 30)));
  options.pin = spec.pin == "none" ? PinMode::kNone : spec.pin == "auto" ? PinMode::kAuto : PinMode::kFile;
  options.pin_file = spec.pin_file;
  if (options.pin == PinMode::kFile) {
    // A pin file that is not there would pin nothing, silently (read_usage_file reads a
    // missing usage file as "no counts yet", which is right for usage_file only).
    std::error_code ec;
    if (!std::filesystem::is_regular_file(spec.pin_file, ec)) {
      fail_invalid("worker '" + worker_name + "': pin file " + spec.pin_file.describe() +
                   (std::filesystem::exists(spec.pin_file, ec) ? " is not a regular file" : " does not exist"));
    }
  }
  options.usage_file = usage_file_for(spec, fingerprint);
  if (!spec.usage_file.empty() && spec.usage_file != "none") {
    // Written only later (and then only warned about): a typo in its folder shows now.
    std::error_code ec;
    if (!std::filesystem::is_directory(spec.usage_file.parent_path(), ec)) {
      fail_invalid("worker '" + worker_name + "': usage_file " + spec.usage_file.describe() + ": its folder " +
                   spec.usage_file.parent_path().string() + " does not exist");
    }
  }
  options.model_fingerprint = fingerprint;
  options.io_threads = static_cast<int>(spec.io_threads);
  options.eviction = spec.cache_policy == "lrfu" ? EvictionPolicy::kLrfu : EvictionPolicy::kLru;
  options.activation = config.expert_activation;
  if (vram_device) {
    options.vram_bytes = static_cast<uint64_t>(std::llround(*spec.vram_gb * double(1ull << 30)));
    options.vram_device = std::move(vram_device);
  }
  return std::make_unique<ExpertStore>(std::move(source), owned, config.hidden_size, config.moe_intermediate_size,
                                       std::move(options));
}

}  // namespace charm
