// `charm`: the one command-line program (DESIGN.md). Subcommands:
//   serve   coordinator + OpenAI-compatible HTTP API (in-process experts in single-node mode)
//   worker  an expert worker of a cluster topology
//   status  the health of every worker of a topology
//   run     one generation without HTTP, streamed to stdout, stats to stderr
// Exit status: 0 success, 1 failure, 2 invalid input (bad flags, config or prompt).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <omp.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/stop_signals.h"
#include "common/topology.h"
#include "coordinator/engine.h"
#include "coordinator/http_api.h"

#include "coordinator/status_report.h"
#include "worker/worker_main.h"

namespace charm {
namespace {

/// Loads the topology and applies its process-wide settings (OpenMP thread count).
Topology load_config(const std::string& path) {
  Topology topology = Topology::load(path);
  if (topology.threads > 0) omp_set_num_threads(static_cast<int>(topology.threads));
  return topology;
}

/// --prefetch / --no-prefetch: overrides the topology's `prefetch` key when given.
void apply_prefetch_flag(Topology& topology, const std::optional<bool>& prefetch) {
  if (prefetch) topology.prefetch = *prefetch;
}

/// Prints how well the prefetch hints predicted each layer's experts (stderr).
void print_prefetch_stats(const Engine& engine) {
  const auto stats = engine.prefetch_stats();
  if (stats.empty()) return;
  PrefetchLayerStats total;
  std::string per_layer;
  for (const auto& [layer, s] : stats) {
    total.steps += s.steps;
    total.actual += s.actual;
    total.predicted += s.predicted;
    total.correct += s.correct;
    per_layer += " " + std::to_string(layer) + ":" + std::to_string(static_cast<int>(100 * s.recall() + 0.5));
  }
  std::fprintf(stderr, "prefetch recall: %.1f%% (%llu of %llu experts), precision %.1f%%; per layer %%:%s\n",
               100 * total.recall(), static_cast<unsigned long long>(total.correct),
               static_cast<unsigned long long>(total.actual), 100 * total.precision(), per_layer.c_str());
}

struct ServeArgs {
  std::string config;
  std::optional<std::string> host;
  std::optional<uint16_t> port;
  std::optional<bool> prefetch;
};

int serve(const ServeArgs& args) {
  Topology topology = load_config(args.config);
  apply_prefetch_flag(topology, args.prefetch);
  std::string host = args.host.value_or(topology.api_host);
  uint16_t port = args.port.value_or(topology.api_port);
  spdlog::info("charm serve: loading {} from {}", topology.model_name, topology.model.string());
  // Until the engine is up, SIGINT/SIGTERM keep their default action, so Ctrl-C ends a
  // start-up that is still waiting for workers at once. Engine::create starts no threads,
  // so blocking the signals afterwards still covers every thread (HTTP, OpenMP) started
  // later.
  std::unique_ptr<Engine> engine = Engine::create(topology);
  sigset_t signals = block_stop_signals();
  HttpApi api(*engine, host, port);
  api.start();
  spdlog::info("charm serve: {} listening on http://{}:{}", engine->model_name(), host, api.port());
  int sig = wait_for_stop_signal(signals);
  spdlog::info("charm serve: {} received, stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
  api.stop();
  return 0;
}

int worker(const std::string& config, const std::string& name) {
  Topology topology = load_config(config);
  return run_worker(topology, name);
}

/// Prints the cluster table; exit 1 when a worker did not answer.
int status(const std::string& config, int timeout_ms) {
  Topology topology = load_config(config);
  ClusterStatus report = collect_status(topology, timeout_ms);
  std::cout << format_status(report) << std::flush;
  return report.all_up ? 0 : 1;
}

struct RunArgs {
  std::string config;
  std::string prompt;
  int64_t max_tokens = 256;
  double temperature = 1.0;
  std::optional<uint64_t> seed;
  bool chat = false;
  std::optional<bool> prefetch;
  std::string routing_trace;
  std::string stats_json;
};

/// The prefetch counters of one layer (or all) as JSON.
nlohmann::json prefetch_json(const PrefetchLayerStats& s) {
  return {{"steps", s.steps}, {"actual", s.actual}, {"predicted", s.predicted}, {"correct", s.correct}};
}

/// `charm run --stats-json`: the run's numbers for scripts (scripts/bench_tiers.py):
/// tokens, timings, prefetch recall per layer and each worker's view.
void write_run_stats(const std::string& path, const Topology& topology, const Engine& engine,
                     const GenerationResult& result) {
  nlohmann::json j = {{"prompt_tokens", result.prompt_tokens},
                      {"completion_tokens", result.completion_tokens},
                      {"finish_reason", result.finish_reason},
                      {"ttft_ms", result.ttft_ms},
                      {"decode_tokens_per_s", result.decode_tokens_per_s},
                      {"prefetch_enabled", topology.prefetch}};
  PrefetchLayerStats total;
  nlohmann::json layers = nlohmann::json::object();
  for (const auto& [layer, s] : engine.prefetch_stats()) {
    layers[std::to_string(layer)] = prefetch_json(s);
    total.steps += s.steps;
    total.actual += s.actual;
    total.predicted += s.predicted;
    total.correct += s.correct;
  }
  j["prefetch"] = prefetch_json(total);
  j["prefetch"]["layers"] = layers;
  j["workers"] = nlohmann::json::array();
  for (const WorkerStatus& w : engine.cluster_status()) {
    j["workers"].push_back({{"name", w.name}, {"state", w.state}, {"requests", w.requests},
                            {"bytes_out", w.bytes_out}, {"bytes_in", w.bytes_in}});
  }
  std::ofstream out(path, std::ios::trunc);
  out << j.dump(1) << '\n';
  if (!out) fail_io("cannot write run statistics to " + path);
}

int run(const RunArgs& args) {
  Topology topology = load_config(args.config);
  apply_prefetch_flag(topology, args.prefetch);
  EngineOptions options;
  options.routing_trace = args.routing_trace;
  std::unique_ptr<Engine> engine = Engine::create(topology, options);
  std::string text = args.prompt;
  if (args.chat) text = engine->chat_template().render({{"user", args.prompt}}, /*add_generation_prompt=*/true);
  std::vector<int32_t> prompt = engine->tokenizer().encode(text, /*parse_special=*/true);
  SamplingParams params;
  params.max_tokens = args.max_tokens;
  params.temperature = args.temperature;
  params.seed = args.seed;
  GenerationResult result = engine->generate(prompt, params, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);  // the stats line goes to stderr after the text, not inside it
  std::fprintf(stderr,
               "prompt tokens: %lld, generated tokens: %lld, finish: %s, TTFT: %.1f ms, decode: %.2f tok/s\n",
               static_cast<long long>(result.prompt_tokens), static_cast<long long>(result.completion_tokens),
               result.finish_reason.c_str(), result.ttft_ms, result.decode_tokens_per_s);
  print_prefetch_stats(*engine);
  if (!args.stats_json.empty()) write_run_stats(args.stats_json, topology, *engine, result);
  return 0;
}

/// `charm workers`: the names scripts/serve.sh starts a `charm worker` for.
int list_workers(const std::string& config) {
  for (const WorkerSpec& w : Topology::load(config).workers) std::printf("%s\n", w.name.c_str());
  return 0;
}

/// Re-executes charm with OMP_WAIT_POLICY=passive unless the user chose a policy.
/// libgomp reads the variable when it loads, before main, hence the exec. Several charm
/// processes share a machine in a local cluster, and spin-waiting OpenMP threads steal
/// each other's cores: a layer round trip took ~21 ms instead of ~0.1 ms on 2 cores.
void prefer_passive_openmp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: carry on with the default
}

int run_cli(int argc, char** argv) {
  CLI::App app{"charm: serves mixture-of-experts models over a cluster of expert workers"};
  app.require_subcommand(1);

  ServeArgs serve_args;
  CLI::App* serve_cmd = app.add_subcommand("serve", "Run the coordinator and the OpenAI-compatible HTTP API");
  serve_cmd->add_option("--config", serve_args.config, "Topology YAML")->required();
  serve_cmd->add_option("--host", serve_args.host, "Listen address (default: the config's api host)");
  serve_cmd->add_option("--port", serve_args.port, "Listen port (default: the config's api port; 0 = any free)");
  serve_cmd->add_flag("--prefetch,!--no-prefetch", serve_args.prefetch,
                      "Send prefetch hints (overrides the config's prefetch key)");

  std::string worker_config, worker_name;
  CLI::App* worker_cmd = app.add_subcommand("worker", "Run one expert worker of a cluster topology");
  worker_cmd->add_option("--config", worker_config, "Topology YAML")->required();
  worker_cmd->add_option("--name", worker_name, "This worker's name in the topology")->required();

  std::string status_config;
  int status_timeout_ms = 2000;
  CLI::App* status_cmd = app.add_subcommand("status", "Show the health of every worker; exit 1 if one is down");
  status_cmd->add_option("--config", status_config, "Topology YAML")->required();
  status_cmd->add_option("--timeout-ms", status_timeout_ms, "Per-worker timeout")->check(CLI::Range(1, 3600000));

  RunArgs run_args;
  CLI::App* run_cmd = app.add_subcommand("run", "Generate one continuation without HTTP");
  run_cmd->add_option("--config", run_args.config, "Topology YAML")->required();
  run_cmd->add_option("--max-tokens", run_args.max_tokens, "Tokens to generate")->check(CLI::Range(1, 1 << 30));
  run_cmd->add_option("--temperature", run_args.temperature, "0 = greedy")->check(CLI::Range(0.0, 100.0));
  run_cmd->add_option("--seed", run_args.seed, "Sampling seed");
  run_cmd->add_flag("--chat", run_args.chat, "Wrap the prompt as one user message in the chat template");
  run_cmd->add_flag("--prefetch,!--no-prefetch", run_args.prefetch,
                    "Send prefetch hints (overrides the config's prefetch key); prints their recall");
  run_cmd->add_option("--routing-trace", run_args.routing_trace,
                      "Write every MoE layer's routing to this file (JSON lines; docs/benchmarks.md)");
  run_cmd->add_option("--stats-json", run_args.stats_json,
                      "Write the run's numbers (tok/s, prefetch recall, expert-tier counters) to this JSON file");
  run_cmd->add_option("prompt", run_args.prompt, "Prompt text")->required();

  std::string workers_config;
  CLI::App* workers_cmd = app.add_subcommand("workers", "List the worker names of a topology, one per line");
  workers_cmd->add_option("--config", workers_config, "Topology YAML")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "charm: %s\nRun with --help for more information.\n", e.what());
    return 2;
  }
  if (*serve_cmd) return serve(serve_args);
  if (*worker_cmd) return worker(worker_config, worker_name);
  if (*status_cmd) return status(status_config, status_timeout_ms);
  if (*workers_cmd) return list_workers(workers_config);
  return run(run_args);
}

}  // namespace
}  // namespace charm

int main(int argc, char** argv) {
  charm::prefer_passive_openmp(argv);
  try {
    return charm::run_cli(argc, argv);
  } catch (const charm::Error& e) {
    std::fprintf(stderr, "charm: %s\n", e.message().c_str());
    return e.category() == charm::ErrorCategory::kInvalidInput ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "charm: internal error: %s\n", e.what());
    return 1;
  }
}
