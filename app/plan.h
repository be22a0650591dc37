// `charm plan --config FILE`: before loading a model, what each worker will hold, what
// fits in its RAM, what it will hit, the rates it measures, and the predicted decode
// speed of one stream with its bottleneck (the arithmetic: app/plan_model.h). Reads only
// the checkpoint's headers and config, never the weights (the disk probe reads the start
// of one shard to time the disk). The report's JSON is documented in docs/configuration.md,
// "charm plan".
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "app/plan_model.h"
#include "app/plan_probes.h"
#include "common/topology.h"

namespace charm {

/// Where one worker's or the coordinator's machine rates came from.
struct MachineReport {
  MachineRates rates;
  std::string memory_source;  ///< "measured", "cached", "assumed (...)"
  std::string disk_source;
  std::string disk_kind;      ///< DiskProbe::kind(): "disk" or "cached read"
  std::string disk_file;
};

/// The link to a worker as measured (or assumed).
struct LinkReport {
  bool reachable = false;
  LinkRates rates;
  std::string rtt_source;        ///< "measured (median of N health round trips)" or "assumed ..."
  std::string bandwidth_source;  ///< always "assumed (--link-gbps)": not measured
  std::string error;             ///< why not reachable
};

/// One worker's row of the plan.
struct WorkerReport {
  std::string name;
  std::string address;          ///< host:port; "in-process" in single-node mode
  uint64_t experts = 0;         ///< (layer, expert) pairs the placement assigns it
  uint64_t expert_bytes = 0;    ///< their bytes (blob layout, as RAM slots hold them)
  uint64_t slot_bytes = 0;      ///< one RAM slot (its largest expert, 4 KiB aligned)
  std::optional<uint64_t> ram_bytes;  ///< its ram_gb budget; nullopt = every expert resident
  uint64_t ram_slots = 0;       ///< experts that fit: pinned + LRU slots (plan_slots)
  uint64_t pinned = 0;
  std::string usage_source;     ///< which usage file set its pins and routing mass, or "uniform"
  MachineReport machine;
  std::optional<LinkReport> link;  ///< nullopt in single-node mode
};

/// The whole plan.
struct PlanReport {
  std::string model;            ///< the checkpoint path
  int64_t top_k = 0;
  size_t moe_layers = 0;
  int64_t num_experts = 0;
  int64_t hidden_size = 0;
  uint64_t dense_bytes = 0;
  MachineReport coordinator;
  std::vector<WorkerReport> workers;
  PlanInput input;              ///< what the prediction was computed from
  PlanResult prediction;
  std::vector<std::string> notes;  ///< assumptions and checks skipped, one line each
};

/// How to measure.
struct PlanOptions {
  std::string usage_file;       ///< --usage: routing mass for every worker ("" = as configured)
  bool reprobe = false;         ///< ignore the probe cache
  int timeout_ms = 2000;        ///< per worker connect + handshake + health
  int pings = 7;                ///< timed health round trips per worker (median taken), after one untimed
  double link_gbps = 1.0;       ///< assumed link bandwidth, Gbit/s
  double default_rtt_ms = 1.0;  ///< assumed RTT of an unreachable worker
  std::string host_identity;    ///< the probe cache key ("" = this_host_identity())
};

/// The rates the probes return, injectable so tests can run build_plan without probing.
struct Probes {
  std::function<double()> memory;                                   ///< GB/s
  std::function<DiskProbe(const std::filesystem::path&)> disk;      ///< one file
  /// One worker's link: reachable + median RTT, or not reachable with why.
  std::function<LinkReport(const WorkerSpec&, const std::string& fingerprint)> link;
};

/// The real probes: probe_memory, probe_disk, and `options.pings` health round trips
/// (with the cluster secret's handshake when set) within options.timeout_ms.
Probes real_probes(const Topology& topology, const PlanOptions& options);

/// Builds the plan of `topology`: Checkpoint::open + ModelConfig::parse (headers only),
/// placement, each worker's expert bytes (from its container's index when it has one,
/// else the checkpoint's tensor headers) and plan_slots, the routing mass from
/// options.usage_file or, without it, the merged usage files the workers are configured
/// with (uniform on layers none of them counts), the machine rates (cached per host in
/// `cache_file` unless options.reprobe; "" = no cache), each worker's link, then predict.
/// Throws Error(kInvalidInput) for what Topology::placement, plan_slots and the checkpoint
/// readers reject, and for an options.usage_file that is missing or malformed (naming it);
/// Error(kIo) for an unreadable checkpoint.
PlanReport build_plan(const Topology& topology, const PlanOptions& options, const Probes& probes,
                      const std::filesystem::path& cache_file);

/// The report as a table in the style of `charm status`, then the prediction and notes.
std::string format_plan(const PlanReport& report);

/// The report as JSON (docs/configuration.md, "charm plan --json"); "format":
/// "charm-plan", "version": 1.
nlohmann::json plan_json(const PlanReport& report);

/// Registers `plan` on the program (`charm plan --config FILE [--json] [--usage FILE]
/// [--check] ...`); it runs in the subcommand's callback, printing to stdout. Errors
/// throw charm::Error (exit 2 for invalid input, as every command).
void add_plan(CLI::App& app);

}  // namespace charm
