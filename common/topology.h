// The YAML cluster description (configs/*.yaml, documented in docs/configuration.md):
// which model to serve, where the API listens, which workers exist and which experts
// each one owns.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/ggml_type.h"
#include "common/matmul_q8.h"
#include "common/secret.h"
#include "common/user_path.h"

namespace charm {

/// A worker's expert tiers (docs/configuration.md, "Expert tiers"). Relative paths are
/// resolved against the YAML file's folder (made absolute); each remembers what the YAML
/// said, for messages (UserPath::describe).
struct StoreSpec {
  std::optional<double> ram_gb;       ///< GiB for expert slots; nullopt = every owned expert resident
  /// GiB of GPU memory for the hottest experts (the VRAM tier, issue 19): refused at start
  /// for now, with the GPU's absence named when there is none (open_store).
  std::optional<double> vram_gb;
  std::string pin = "auto";           ///< "auto", "none", or a usage-format file (pin_file)
  UserPath pin_file;                  ///< set when pin names a file
  UserPath container;                 ///< expert container dir; empty = read the checkpoint
  std::string io = "pread";           ///< "pread" or "odirect" (containers only)
  int64_t io_threads = 4;             ///< bounded async read pool
  std::string cache_policy = "lru";   ///< the LRU slots' eviction: "lru" or "lrfu"
  UserPath usage_file;                ///< "" = the default place, "none" = do not record, else a path
};

/// The coordinator's serving limits (`serving:`; docs/configuration.md, "Serving").
/// The command line's --max-batch-tokens, --max-num-seqs, --max-waiting and --kv-cache-gb
/// override them.
struct ServingSpec {
  int64_t max_batch_tokens = 256;  ///< tokens per engine step (decodes and prompt chunks)
  int64_t max_num_seqs = 32;       ///< sequences running at once
  int64_t max_waiting = 128;       ///< requests queued beyond those; more get 429
  std::optional<double> kv_cache_gb;  ///< GiB for the paged KV cache; nullopt = the default share
  /// Ping-pong micro-batches per step: 1, 2, or 0 = automatic (1: two halves have not won
  /// where measured, docs/benchmarks.md). Never changes an output (Model::set_micro_batches).
  int64_t micro_batches = 0;
  /// Reuse the KV blocks of earlier prompts' full blocks (vLLM's automatic prefix
  /// caching). Off, every prompt is computed whole: for measuring prefill, as
  /// `charm run --repeat` does. Never changes an output.
  bool prefix_cache = true;
};

/// The largest serving.kv_cache_gb / --kv-cache-gb accepted (GiB): 1 PiB.
inline constexpr double kMaxKvCacheGb = 1 << 20;

/// One worker entry of the topology.
/// Two workers that list the same (layer, expert) both hold it: they are replicas of it,
/// and the coordinator sends that expert's rows to one live replica (failover to another).
struct WorkerSpec {
  std::string name;
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  /// Experts this worker owns. Empty `layers` means every MoE layer.
  /// `experts` are expert ids; an entry may be a range "a-b" in YAML.
  std::vector<int64_t> experts;
  std::vector<int64_t> layers;
  StoreSpec store;  ///< ram_gb, vram_gb, pin, container, io, io_threads, cache_policy, usage_file
};

/// placement[layer][expert] = indices into Topology::workers of every worker holding that
/// expert (its replicas), ascending; never empty.
using Placement = std::map<int64_t, std::vector<std::vector<int>>>;

/// The whole configuration file.
struct Topology {
  std::filesystem::path source;      ///< the YAML file it came from
  UserPath model;                    ///< HF checkpoint directory (a relative path resolved
                                     ///< against the YAML file's folder, made absolute)
  std::string model_name;            ///< id reported by /v1/models (default: folder name)
  std::string api_host = "127.0.0.1";
  uint16_t api_port = 8080;
  bool single_node = false;          ///< mode: single-node (no workers, in-process experts)
  std::vector<WorkerSpec> workers;
  // Deadlines and health checks (timeouts: in the YAML), all milliseconds. Defaults suit a
  // LAN: a connect that takes 2 s is a machine that is off or asleep.
  int64_t connect_timeout_ms = 2000;    ///< TCP connect to a worker
  int64_t handshake_timeout_ms = 5000;  ///< hello sent and helloReply received
  int64_t request_timeout_ms = 60000;   ///< one worker's reply to one layer request
  int64_t startup_timeout_ms = 120000;  ///< how long `charm serve` waits for workers that are
                                        ///< not listening yet (still loading) at start
  int64_t heartbeat_ms = 1000;          ///< healthRequest to an idle up worker this often
                                        ///< (the reply deadline too, while no layer waits on
                                        ///< it); 0 = no heartbeats
  int64_t rejoin_min_ms = 250;          ///< first reconnect attempt after a worker goes down
  int64_t rejoin_max_ms = 10000;        ///< back-off cap (doubling from rejoin_min_ms)
  int64_t slow_ms = 0;                  ///< layer RTT p50 above this reports a worker "slow"
                                        ///< (0 = only the relative test: 4x the others' median)
  // Silent workers (docs/architecture.md, "Silent workers"): a layer reply later than 4x
  // that worker's p99 for requests of its size, clamped to [hedge_floor_ms, hedge_cap_ms],
  // gets the worker probed on its own connection; a probe unanswered after 4x its probe
  // p99, clamped to [probe_floor_ms, probe_cap_ms], marks it down and fails its share over.
  int64_t hedge_floor_ms = 50;
  int64_t hedge_cap_ms = 1000;
  int64_t probe_floor_ms = 100;
  int64_t probe_cap_ms = 1000;
  int64_t threads = 0;               ///< OpenMP threads; 0 = library default
  /// The cluster's shared secret (`cluster: {secret_file | secret_env}`), read at load;
  /// empty: workers are open to anyone who reaches their port (common/cluster_auth.h).
  std::string cluster_secret;
  /// The HTTP API key (`api: {api_key_file | api_key_env}`), read at load; empty: none.
  std::string api_key;
  /// `cluster.insecure: true`: workers may listen beyond loopback without a shared secret
  /// (common/listen_check.h; otherwise they refuse to start). Never set with a secret.
  bool cluster_insecure = false;
  /// `api.insecure: true`: the HTTP API may listen beyond loopback without an API key.
  /// Never set with a key.
  bool api_insecure = false;
  bool prefetch = false;             ///< send prefetch hints (next layer's router applied to
                                     ///< this layer's state) to the expert store / workers
  /// `activations: f32 | q8`: how GGML-block weights meet activations (common/matmul_q8.h);
  /// q8 is lossy and opt-in. `--activations` on serve / run / worker overrides it.
  ActivationMode activations = ActivationMode::kF32;
  /// `quant_dense: q8_0 | q4_0 | none`: the coordinator quantises the dense matrices of the
  /// checkpoint (attention, dense / shared-expert MLPs, embeddings, lm_head; not routers)
  /// to these GGML blocks at load (common/ggml_quantize.h). Lossy and opt-in; nullopt (the
  /// default, `none`) keeps them as stored. `--quant-dense` on serve / run overrides it.
  std::optional<GgmlType> quant_dense;
  StoreSpec store;                   ///< single-node mode: the in-process worker's tiers (`store:`)
  ServingSpec serving;               ///< batching limits and the KV cache size (`serving:`)

  /// Loads and validates `path`. Throws Error(kInvalidInput) naming the file and the key
  /// for YAML that does not parse, unknown keys, wrong types, duplicate worker names or
  /// ports, ports out of range, bad expert ranges, and a cluster mode with no workers
  /// (also: a missing model key, and workers listed in single-node mode; a secret or API
  /// key given both as a file and an environment variable, or that read_secret cannot
  /// read or refuses; `insecure: true` beside the secret or key it waives). Throws
  /// Error(kIo) naming `path` as described (UserPath::describe: resolved, and what a
  /// relative path was resolved against) when the file cannot be opened.
  static Topology load(const UserPath& path);

  /// The most bytes load() reads: a topology is a few KB; the bound keeps a wrong path
  /// (a model file) from being read whole.
  static constexpr uint64_t kMaxFileBytes = uint64_t{16} << 20;

  /// load() on YAML text already in memory; `source` names it in messages and is the
  /// base for relative paths (its folder, made absolute against the current directory).
  static Topology parse(const std::string& yaml, const std::filesystem::path& source);

  /// The worker named `name`; throws Error(kInvalidInput) listing known names if absent.
  const WorkerSpec& worker(const std::string& name) const;

  /// Placement map: owners[layer][expert] = indices into `workers` holding it (several
  /// = replicas), ascending. Every (MoE layer, expert) needs at least one owner; throws
  /// Error(kInvalidInput) naming every uncovered expert (per layer) and the workers, and
  /// for a worker listing a layer not in `moe_layers` or an expert >= num_experts.
  /// `moe_layers` lists the model's MoE layer ids. In single-node mode every expert maps
  /// to {0}, meaning the in-process worker (`workers` is empty then; do not index it).
  Placement placement(const std::vector<int64_t>& moe_layers, int64_t num_experts) const;
};

/// Ascending ids written compactly for messages: {0,1,2,3,5,8,9} -> "0-3, 5, 8-9".
std::string id_ranges(const std::vector<int64_t>& ids);

}  // namespace charm
