// `charm plan`'s command line: the options, then build_plan and the table or JSON, or
// with --check the comparison with a running coordinator's measurements.
#include <cstdio>
#include <memory>

#include "app/plan.h"
#include "app/plan_check.h"
#include "app/status_report.h"
#include "common/error.h"
#include "common/user_path.h"

namespace charm {
namespace {

struct PlanArgs {
  std::string config;
  bool json = false;
  bool check = false;
  PlanOptions options;
};

int run_plan(const PlanArgs& args) {
  const UserPath config = UserPath::from_command_line(args.config);
  std::error_code ec;
  // A plan is asked for before anything runs: a mistyped --config is the user's input to fix.
  if (!std::filesystem::exists(config, ec)) fail_invalid("--config " + config.describe() + " does not exist");
  const Topology topology = Topology::load(config);
  const PlanReport plan = build_plan(topology, args.options, real_probes(topology, args.options), probe_cache_file());
  if (!args.check) {
    const std::string out = args.json ? plan_json(plan).dump(1) + "\n" : format_plan(plan);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  require_served_model(fetch_coordinator(topology, "/v1/models", args.options.timeout_ms, kMaxMetricsBytes),
                       topology.model_name, topology.api_host + ":" + std::to_string(topology.api_port));
  const std::string metrics = fetch_coordinator(topology, "/metrics", args.options.timeout_ms, kMaxMetricsBytes);
  const std::string status = fetch_coordinator(topology, "/cluster/status", args.options.timeout_ms,
                                               max_cluster_status_bytes(topology.workers.size()));
  const MeasuredRun run = measured_run(parse_prometheus(metrics), parse_cluster_status(status));
  const std::vector<Comparison> rows = compare_plan(plan, run);
  std::string out;
  if (args.json) {
    out = nlohmann::json{{"plan", plan_json(plan)}, {"check", check_json(rows)}}.dump(1) + "\n";
  } else {
    out = format_plan(plan) + "\nmeasured by the coordinator at " + topology.api_host + ":" +
          std::to_string(topology.api_port) + " (" + std::to_string(run.tokens_timed) +
          " decode tokens timed; with several streams at once each decodes slower than one alone):\n" +
          format_check(rows);
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

void add_plan(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Before loading: each worker's experts, RAM fit, hit rate, rates and the predicted decode tok/s");
  cmd->add_option("--config", args->config, "Topology YAML")->required();
  cmd->add_flag("--json", args->json, "Print JSON (docs/configuration.md, \"charm plan\") instead of the table");
  cmd->add_option("--usage", args->options.usage_file,
                  "Expert usage file (charm-expert-usage JSON) for the routing mass (default: the workers' usage files, "
                  "else uniform)");
  cmd->add_flag("--check", args->check,
                "Compare the prediction with what the running coordinator measured (/metrics, /cluster/status)");
  cmd->add_flag("--reprobe", args->options.reprobe, "Measure memory and disk again instead of using the cached results");
  cmd->add_option("--timeout-ms", args->options.timeout_ms, "Per-worker (and coordinator) timeout")
      ->check(CLI::Range(1, 3600000));
  cmd->add_option("--link-gbps", args->options.link_gbps, "Assumed link bandwidth to each worker, Gbit/s (not measured)")
      ->check(CLI::Range(1e-6, 1e6));
  cmd->add_option("--default-rtt-ms", args->options.default_rtt_ms, "RTT assumed for an unreachable worker, ms")
      ->check(CLI::Range(0.0, 1e6));
  cmd->callback([args] { run_plan(*args); });
}

}  // namespace charm
