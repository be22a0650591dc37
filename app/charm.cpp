// `charm`: the one command-line program (DESIGN.md). Subcommands:
//   serve   coordinator + OpenAI-compatible HTTP API (in-process experts in single-node mode)
//   worker  an expert worker of a cluster topology
//   status  the health of every worker of a topology
//   run     one generation without HTTP, streamed to stdout, stats to stderr
//   convert write an expert container (one worker's shard or every expert) from a checkpoint
//   bench   microbenchmarks of this machine (kernels: matmul per weight format; memory: STREAM-like bandwidth;
//           wire: a layer request round trip on loopback)
//   plan    before loading: placement, RAM fit, hit rate, rates, predicted decode tok/s (--check: vs measured)
//   secret  `secret new FILE`: a random shared secret or API key, mode 0600
// Exit status: 0 success, 1 failure, 2 invalid input (bad flags, config or prompt).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <omp.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "app/bench_attention.h"
#include "app/bench_kernels.h"
#include "app/bench_memory.h"
#include "app/bench_wire.h"
#include "app/openmp_wait.h"
#include "app/plan.h"
#include "common/error.h"
#include "common/ggml_quantize.h"
#include "common/secret.h"
#include "common/stop_signals.h"
#include "common/topology.h"
#include "common/wire.h"
#include "coordinator/api/http_api.h"
#include "coordinator/api/metrics.h"
#include "coordinator/engine.h"
#include "coordinator/models/checkpoint_families.h"

#include "app/status_report.h"
#include "common/checkpoint.h"
#include "common/cpu_threads.h"
#include "common/matmul.h"
#include "common/matmul_q8.h"
#include "common/model_config.h"
#include "worker/experts/expert_convert.h"
#include "worker/worker_main.h"

namespace charm {
namespace {

/// The compute thread count (charm's --threads, else the topology's `threads`, else
/// OMP_NUM_THREADS, else one per physical core) and the kernel path, logged; a bad
/// CHARM_KERNELS fails here, before any parallel region.
void configure_compute(std::optional<int> threads, const Topology& topology) {
  if (threads == 0) threads.reset();  // --threads 0: the default, as the YAML's 0
  if (!threads && topology.threads > 0) threads = static_cast<int>(topology.threads);
  const int n = configure_threads(threads);
  spdlog::info("compute: {} OpenMP threads ({} physical cores), {} kernels", n, physical_core_count(),
               kernel_path_name(active_kernel_path()));
}

/// Loads the topology of a command that computes (serve, worker, run) and applies its
/// process-wide settings: threads (`--threads` given as `threads`) and the kernel path;
/// `--activations` (given as `activations`) overrides the YAML's (applied by the engine and
/// the worker at start).
Topology load_compute_config(const std::string& path, std::optional<int> threads,
                             const std::optional<std::string>& activations) {
  Topology topology = Topology::load(UserPath::from_command_line(path));
  if (activations) topology.activations = parse_activation_mode(*activations, "--activations");
  configure_compute(threads, topology);
  return topology;
}

/// `--ram-gb` on the command line overrides the YAML's budget for the process it starts.
void override_ram(StoreSpec& store, const std::optional<double>& ram_gb) {
  if (ram_gb) store.ram_gb = *ram_gb;
}

/// --quant-dense: overrides the topology's `quant_dense` key when given.
void apply_quant_dense_flag(Topology& topology, const std::optional<std::string>& quant_dense) {
  if (quant_dense) topology.quant_dense = parse_dense_quant(*quant_dense, "--quant-dense");
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

/// The command line's overrides of the topology's `serving:` section.
struct ServingFlags {
  std::optional<int64_t> max_batch_tokens, max_num_seqs, max_waiting, micro_batches;
  std::optional<double> kv_cache_gb;
  bool prefix_cache = true;
  CLI::Option* prefix_cache_flag = nullptr;  // given or not: absent keeps the config's key

  /// Adds --max-batch-tokens, --max-num-seqs, --max-waiting, --kv-cache-gb,
  /// --micro-batches and --prefix-cache / --no-prefix-cache to `cmd`.
  void add_to(CLI::App& cmd) {
    prefix_cache_flag = cmd.add_flag("--prefix-cache,!--no-prefix-cache", prefix_cache,
                                     "Reuse earlier prompts' KV blocks (default: serving.prefix_cache, on); off, every "
                                     "prompt is computed whole");
    cmd.add_option("--max-batch-tokens", max_batch_tokens,
                   "Tokens per engine step, decodes and prompt chunks together (default: serving.max_batch_tokens, 256)")
        ->check(CLI::Range(1, 1 << 20));
    cmd.add_option("--max-num-seqs", max_num_seqs, "Sequences running at once (default: serving.max_num_seqs, 32)")
        ->check(CLI::Range(1, 4096));
    cmd.add_option("--max-waiting", max_waiting,
                   "Requests queued beyond the running ones before 429 (default: serving.max_waiting, 128)")
        ->check(CLI::Range(0, 1 << 16));
    cmd.add_option("--kv-cache-gb", kv_cache_gb,
                   "GiB for the paged KV cache (default: serving.kv_cache_gb, else 20 % of available memory, at most "
                   "max_num_seqs full contexts)");
    cmd.add_option("--micro-batches", micro_batches,
                   "Ping-pong micro-batches per step: 1, 2, or 0 = automatic, now 1 (default: "
                   "serving.micro_batches, 0); never changes an output")
        ->check(CLI::Range(0, 2));
  }
  /// Writes the flags given over `serving`; Error(kInvalidInput) when the result has
  /// max_batch_tokens < max_num_seqs, or --kv-cache-gb is not in (0, kMaxKvCacheGb].
  void apply(ServingSpec& serving) const {
    if (max_batch_tokens) serving.max_batch_tokens = *max_batch_tokens;
    if (max_num_seqs) serving.max_num_seqs = *max_num_seqs;
    if (max_waiting) serving.max_waiting = *max_waiting;
    if (micro_batches) serving.micro_batches = *micro_batches;
    if (prefix_cache_flag && prefix_cache_flag->count() > 0) serving.prefix_cache = prefix_cache;
    if (kv_cache_gb) {
      if (!(*kv_cache_gb > 0 && *kv_cache_gb <= kMaxKvCacheGb)) {  // NaN fails too
        fail_invalid("--kv-cache-gb: must be a number of GiB in (0, " + std::to_string(int64_t(kMaxKvCacheGb)) +
                     "], got " + fmt::format("{}", *kv_cache_gb));
      }
      serving.kv_cache_gb = *kv_cache_gb;
    }
    if (serving.max_batch_tokens < serving.max_num_seqs) {
      fail_invalid("--max-batch-tokens (" + std::to_string(serving.max_batch_tokens) +
                   ") must be at least --max-num-seqs (" + std::to_string(serving.max_num_seqs) + ")");
    }
  }
};

struct ServeArgs {
  std::string config;
  std::optional<double> ram_gb;
  std::optional<std::string> host;
  std::optional<uint16_t> port;
  std::optional<bool> prefetch;
  ServingFlags serving;
  std::optional<int> threads;
  std::optional<std::string> activations;
  std::optional<std::string> quant_dense;
};

int serve(const ServeArgs& args) {
  Topology topology = load_compute_config(args.config, args.threads, args.activations);
  apply_quant_dense_flag(topology, args.quant_dense);
  if (args.ram_gb && !topology.single_node) {
    fail_invalid("--ram-gb applies to the in-process experts of mode: single-node; set ram_gb on each worker entry, "
                 "or pass --ram-gb to charm worker");
  }
  override_ram(topology.store, args.ram_gb);
  apply_prefetch_flag(topology, args.prefetch);
  args.serving.apply(topology.serving);
  std::string host = args.host.value_or(topology.api_host);
  uint16_t port = args.port.value_or(topology.api_port);
  check_api_listen(topology, host, port);  // before minutes of loading, not after
  spdlog::info("charm serve: loading {} from {}", topology.model_name, topology.model.string());
  // Until the engine is up, SIGINT/SIGTERM keep their default action, so Ctrl-C ends a
  // start-up that is still waiting for workers at once. The one thread Engine::create
  // starts (the engine loop, which starts the OpenMP threads) blocks them itself, so
  // blocking them here afterwards still covers every thread (HTTP) started later.
  Metrics metrics;  // outlives the engine and the API (declared first)
  EngineOptions engine_options;
  engine_options.metrics = &metrics;
  std::unique_ptr<Engine> engine = Engine::create(topology, engine_options);
  sigset_t signals = block_stop_signals();
  HttpGuardOptions guard;
  // A thread per generation in flight (running or queued) and a margin, so that /health
  // and /metrics never wait for a thread behind generations.
  guard.threads = static_cast<size_t>(topology.serving.max_num_seqs + topology.serving.max_waiting) + 16;
  HttpApi api(*engine, host, port, &metrics, guard);
  api.set_api_key(topology.api_key);
  api.start();
  spdlog::info("charm serve: {} listening on http://{}:{}", engine->model_name(), host, api.port());
  int sig = wait_for_stop_signal(signals);
  spdlog::info("charm serve: {} received, stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
  api.stop();
  return 0;
}

int worker(const std::string& config, const std::string& name, const std::optional<double>& ram_gb,
           std::optional<int> threads, const std::optional<std::string>& activations, int64_t debug_delay_ms) {
  Topology topology = load_compute_config(config, threads, activations);
  topology.worker(name);  // an unknown name fails here, naming the known ones
  for (WorkerSpec& w : topology.workers) {
    if (w.name == name) override_ram(w.store, ram_gb);
  }
  return run_worker(topology, name, checkpoint_families(), debug_delay_ms);
}

struct ConvertArgs {
  std::string checkpoint;
  std::string out;
  std::string config;
  std::string worker;
  std::string quant = "none";
  int64_t group_size = 0;
};

/// `charm convert`: every MoE layer's experts, or only those the topology gives --worker.
int convert(const ConvertArgs& args) {
  std::optional<Topology> topology;
  if (!args.config.empty()) topology = Topology::load(UserPath::from_command_line(args.config));
  if (!args.worker.empty() && !topology) fail_invalid("--worker needs --config (the topology that places the experts)");
  if (args.checkpoint.empty() && !topology) fail_invalid("give --checkpoint DIR (or --config, whose model is used)");
  const UserPath model = args.checkpoint.empty() ? topology->model : UserPath::from_command_line(args.checkpoint);
  std::unique_ptr<Checkpoint> checkpoint = Checkpoint::open(model);
  const ModelConfig config =
      ModelConfig::parse(checkpoint->config_json(), checkpoint->config_origin(), checkpoint_families());
  std::vector<ExpertKey> experts;
  if (!args.worker.empty()) {
    const WorkerSpec& spec = topology->worker(args.worker);
    experts = owned_experts(*topology, config, static_cast<int>(&spec - topology->workers.data()));
  } else {
    for (int64_t layer : config.moe_layer_ids()) {
      for (int64_t e = 0; e < config.num_experts; ++e) experts.emplace_back(layer, e);
    }
  }
  ConvertOptions options;
  options.out = UserPath::from_command_line(args.out);
  options.quant = args.quant;
  options.group_size = args.group_size;
  options.worker = args.worker;
  const ConvertResult result =
      convert_experts(*checkpoint, config, experts, options);
  if (result.already_complete) {
    std::fprintf(stderr, "charm convert: %s is already a complete container of these %llu experts; nothing to do\n",
                 options.out.c_str(), static_cast<unsigned long long>(result.experts));
  }
  return 0;
}

/// Prints the cluster table; exit 1 when a worker did not answer.
int status(const std::string& config, int timeout_ms, bool layers) {
  Topology topology = Topology::load(UserPath::from_command_line(config));
  ClusterStatus report = collect_status(topology, timeout_ms);
  std::cout << format_status(report, layers) << std::flush;
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
  std::string logits_out;  // first-step logits, raw little-endian f32 [vocab_size]
  std::string ids_out;     // {"prompt_ids": [...], "new_ids": [...]} as JSON
  int64_t repeat = 1;      // runs of the request in this process; the last one's text and files
  ServingFlags serving;
  std::optional<int> threads;
  std::optional<std::string> activations;
  std::optional<std::string> quant_dense;
};

/// The prefetch counters of one layer (or all) as JSON.
nlohmann::json prefetch_json(const PrefetchLayerStats& s) {
  return {{"steps", s.steps}, {"actual", s.actual}, {"predicted", s.predicted}, {"correct", s.correct}};
}

/// One worker's tier counters as JSON (names as in TierCounters).
nlohmann::json tier_json(const TierCounters& t) {
  return {{"hits", t.hits},         {"misses", t.misses},   {"bytes_read", t.bytes_read},
          {"io_wait_ns", t.io_wait_ns}, {"disk_ns", t.disk_ns}, {"prefetch_issued", t.prefetch_issued},
          {"prefetch_hits", t.prefetch_hits}, {"vram_hits", t.vram_hits}};
}

/// The tier counters of one worker: the in-process store's, or a remote worker's own
/// (a healthRequest; nothing when it does not answer within 5 s).
std::map<uint32_t, TierCounters> worker_tier_layers(const Topology& topology, const WorkerStatus& w) {
  if (topology.single_node) return w.tier_layers;
  for (const WorkerSpec& spec : topology.workers) {
    if (spec.name != w.name) continue;
    try {
      auto conn = FrameConnection::connect(spec.host, spec.port, std::chrono::seconds(5), spec.name);
      conn->send(encode_health_request(), std::chrono::seconds(5));
      return decode_as<HealthReplyMsg>(conn->receive(std::chrono::seconds(5))).tier_layers;
    } catch (const Error& e) {
      spdlog::warn("charm run: no tier counters from worker '{}': {}", spec.name, e.message());
    }
  }
  return {};
}

/// `charm run --stats-json`: the run's numbers for scripts (scripts/bench_tiers.py):
/// tokens and timings of the last of `runs` (and of each, under "runs"), prefetch recall
/// per layer and each worker's view and tier counters.
void write_run_stats(const UserPath& path, const Topology& topology, const Engine& engine,
                     const std::vector<GenerationResult>& runs) {
  const GenerationResult& result = runs.back();
  nlohmann::json j = {{"prompt_tokens", result.prompt_tokens},
                      {"completion_tokens", result.completion_tokens},
                      {"finish_reason", result.finish_reason},
                      {"ttft_ms", result.ttft_ms},
                      {"decode_tokens_per_s", result.decode_tokens_per_s},
                      {"prefetch_enabled", topology.prefetch},
                      {"prefix_cache", engine.prefix_cache()},
                      {"runs", nlohmann::json::array()}};
  for (const GenerationResult& r : runs) {
    j["runs"].push_back({{"prompt_tokens", r.prompt_tokens}, {"completion_tokens", r.completion_tokens},
                         {"ttft_ms", r.ttft_ms}, {"decode_tokens_per_s", r.decode_tokens_per_s}});
  }
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
    nlohmann::json worker = {{"name", w.name}, {"state", worker_state_name(w.state)}, {"requests", w.requests},
                             {"bytes_out", w.bytes_out}, {"bytes_in", w.bytes_in},
                             {"layer_bytes_out", w.layer_bytes_out}, {"layer_bytes_in", w.layer_bytes_in},
                             {"token_layers", w.token_layers},
                             {"bytes_out_per_token_layer", bytes_per_token_layer(w.layer_bytes_out, w)},
                             {"bytes_in_per_token_layer", bytes_per_token_layer(w.layer_bytes_in, w)}};
    TierCounters total;
    nlohmann::json per_layer = nlohmann::json::object();
    for (const auto& [layer, t] : worker_tier_layers(topology, w)) {
      per_layer[std::to_string(layer)] = tier_json(t);
      total += t;
    }
    worker["tier"] = tier_json(total);
    worker["tier_layers"] = per_layer;
    j["workers"].push_back(worker);
  }
  std::ofstream out(path, std::ios::trunc);
  out << j.dump(1) << '\n';
  if (!out) fail_io("cannot write run statistics to " + path.describe());
}

/// Writes `data` to `path`, throwing Error(kIo) naming the path on failure.
void write_file(const UserPath& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) charm::fail_io("cannot write " + path.describe());
}

/// An output file named by `flag`, resolved against the current directory and checked
/// before the model loads: its folder must exist (a typo fails now, not after the run).
/// Empty when not given.
UserPath output_path(const std::string& given, const char* flag) {
  UserPath path = UserPath::from_command_line(given);
  std::error_code ec;
  if (!path.empty() && !std::filesystem::is_directory(path.parent_path(), ec)) {
    fail_invalid(std::string(flag) + " " + path.describe() + ": its folder " + path.parent_path().string() +
                 " does not exist");
  }
  return path;
}

/// One run's numbers on stderr, after `label`.
void print_run_line(const GenerationResult& result, const std::string& label) {
  std::fprintf(stderr,
               "%sprompt tokens: %lld, generated tokens: %lld, finish: %s, TTFT: %.1f ms, decode: %.2f tok/s, "
               "KV cache: %lld bytes/token\n",
               label.c_str(), static_cast<long long>(result.prompt_tokens),
               static_cast<long long>(result.completion_tokens), result.finish_reason.c_str(), result.ttft_ms,
               result.decode_tokens_per_s, static_cast<long long>(result.kv_bytes_per_token));
}

int run(const RunArgs& args) {
  const UserPath routing_trace = output_path(args.routing_trace, "--routing-trace");
  const UserPath stats_json = output_path(args.stats_json, "--stats-json");
  const UserPath logits_out = output_path(args.logits_out, "--logits-out");
  const UserPath ids_out = output_path(args.ids_out, "--ids-out");
  Topology topology = load_compute_config(args.config, args.threads, args.activations);
  apply_quant_dense_flag(topology, args.quant_dense);
  apply_prefetch_flag(topology, args.prefetch);
  args.serving.apply(topology.serving);
  EngineOptions options;
  options.routing_trace = routing_trace.string();
  std::unique_ptr<Engine> engine = Engine::create(topology, options);
  std::string text = args.prompt;
  if (args.chat) text = engine->chat_template().render({{"user", args.prompt}}, /*add_generation_prompt=*/true);
  // A chat template writes its own special tokens; a raw prompt gets the tokenizer's (BOS).
  std::vector<int32_t> prompt =
      args.chat ? engine->tokenizer().encode(text, /*parse_special=*/true) : engine->tokenizer().encode_prompt(text);
  SamplingParams params;
  params.max_tokens = args.max_tokens;
  params.temperature = args.temperature;
  params.seed = args.seed;
  if (args.repeat > 1 && engine->prefix_cache()) {
    spdlog::warn("charm run: --repeat {} with the prefix cache on: the runs after the first reuse the prompt's full "
                 "16-token KV blocks (--no-prefix-cache computes the whole prompt every time)",
                 args.repeat);
  }
  // Earlier runs (--repeat) print their numbers only; the last one its text too.
  std::vector<GenerationResult> runs;
  for (int64_t i = 1; i < args.repeat; ++i) {
    runs.push_back(
        engine->generate(prompt, params, [](std::string_view, std::span<const TokenLogprob>) { return true; }));
    print_run_line(runs.back(), fmt::format("run {} of {}: ", i, args.repeat));
  }
  runs.push_back(engine->generate(prompt, params, [](std::string_view piece, std::span<const TokenLogprob>) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  }));
  const GenerationResult& result = runs.back();
  std::fputc('\n', stdout);
  std::fflush(stdout);  // the stats line goes to stderr after the text, not inside it
  // For comparisons with a reference implementation (scripts/check_demo.py).
  if (!logits_out.empty()) {
    const std::vector<float> logits = engine->prompt_logits(prompt);
    write_file(logits_out, logits.data(), logits.size() * sizeof(float));
  }
  if (!ids_out.empty()) {
    const std::string ids = nlohmann::json{{"prompt_ids", prompt}, {"new_ids", result.tokens}}.dump() + "\n";
    write_file(ids_out, ids.data(), ids.size());
  }
  print_run_line(result, "");
  print_prefetch_stats(*engine);
  if (!stats_json.empty()) write_run_stats(stats_json, topology, *engine, runs);
  return 0;
}

/// `charm secret new FILE`: a fresh shared secret or API key (common/secret.h).
int new_secret(const std::string& file) {
  create_secret_file(file);
  std::fprintf(stderr,
               "charm: wrote a new secret to %s (mode 0600). Name it as cluster.secret_file (the same file on every "
               "machine of the cluster) or api.api_key_file in the topology.\n",
               file.c_str());
  return 0;
}

/// `charm workers`: the names scripts/serve.sh starts a `charm worker` for.
int list_workers(const std::string& config) {
  for (const WorkerSpec& w : Topology::load(UserPath::from_command_line(config)).workers) std::printf("%s\n", w.name.c_str());
  return 0;
}

/// Re-executes charm with the OpenMP wait its command line calls for (app/openmp_wait.h)
/// unless the user chose a policy. libgomp reads the variables when it loads, before
/// main, hence the exec. A GOMP_SPINCOUNT the user set is kept.
void choose_openmp_wait(int argc, char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || argc < 1) return;
  for (const auto& [name, value] : openmp_wait_env(openmp_wait_for(std::vector<std::string>(argv + 1, argv + argc)))) {
    setenv(name.c_str(), value.c_str(), 0);
  }
  // The resolved path, not /proc/self/exe: the process is named after what is executed,
  // and users find theirs with `pgrep charm` (a binary replaced meanwhile reads
  // "... (deleted)": then /proc/self/exe, the running one).
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec && std::filesystem::exists(self, ec)) execv(self.c_str(), argv);
  execv("/proc/self/exe", argv);  // returns only on failure: carry on with the default
}

int run_cli(int argc, char** argv) {
  CLI::App app{"charm: serves mixture-of-experts models over a cluster of expert workers"};
  app.require_subcommand(1);

  const char* activations_help =
      "f32 (exact, default) or q8 (LOSSY, llama.cpp's int8 activations for Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/"
      "MXFP4 weights); "
      "overrides the config's activations";
  const char* quant_dense_help =
      "LOSSY: quantise the coordinator's dense matrices (attention, dense and shared-expert MLPs, embeddings, "
      "lm_head; not routers) to q8_0 or q4_0 GGML blocks at load, as llama.cpp's Q8_0 / Q4_0 files hold them; "
      "none keeps them as stored (default); overrides the config's quant_dense";
  const char* threads_help = "Compute threads (0 or absent: the config's threads, else OMP_NUM_THREADS, else one per physical core)";
  ServeArgs serve_args;
  CLI::App* serve_cmd = app.add_subcommand("serve", "Run the coordinator and the OpenAI-compatible HTTP API");
  serve_cmd->add_option("--config", serve_args.config, "Topology YAML")->required();
  serve_cmd->add_option("--host", serve_args.host, "Listen address (default: the config's api host)");
  serve_cmd->add_option("--port", serve_args.port, "Listen port (default: the config's api port; 0 = any free)");
  CLI::Option* serve_prefetch = serve_cmd->add_flag("--prefetch,!--no-prefetch", serve_args.prefetch,
                                                    "Send prefetch hints (overrides the config's prefetch key)");
  serve_cmd->add_option("--threads", serve_args.threads, threads_help)->check(CLI::Range(0, kMaxThreads));
  serve_cmd->add_option("--activations", serve_args.activations, activations_help)->check(CLI::IsMember({"f32", "q8"}));
  serve_cmd->add_option("--quant-dense", serve_args.quant_dense, quant_dense_help)
      ->check(CLI::IsMember({"q8_0", "q4_0", "none"}));
  serve_args.serving.add_to(*serve_cmd);
  serve_cmd->add_option("--ram-gb", serve_args.ram_gb, "Single-node: GiB of RAM for expert slots (default: every expert resident)")
      ->check(CLI::PositiveNumber);

  std::string worker_config, worker_name;
  CLI::App* worker_cmd = app.add_subcommand("worker", "Run one expert worker of a cluster topology");
  worker_cmd->add_option("--config", worker_config, "Topology YAML")->required();
  worker_cmd->add_option("--name", worker_name, "This worker's name in the topology")->required();
  std::optional<double> worker_ram_gb;
  std::optional<int> worker_threads;
  worker_cmd->add_option("--threads", worker_threads, threads_help)->check(CLI::Range(0, kMaxThreads));
  std::optional<std::string> worker_activations;
  worker_cmd->add_option("--activations", worker_activations, activations_help)->check(CLI::IsMember({"f32", "q8"}));
  worker_cmd->add_option("--ram-gb", worker_ram_gb, "GiB of RAM for expert slots (overrides the worker's ram_gb)")
      ->check(CLI::PositiveNumber);
  int64_t worker_delay_ms = 0;
  worker_cmd->add_option("--debug-delay-ms", worker_delay_ms, "TEST ONLY: delay every layer reply (a slow worker)")
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}));

  ConvertArgs convert_args;
  CLI::App* convert_cmd = app.add_subcommand("convert", "Write an expert container from a checkpoint");
  convert_cmd->add_option("--checkpoint", convert_args.checkpoint, "HF checkpoint directory (default: the config's model)");
  convert_cmd->add_option("--out", convert_args.out, "Container directory to write (resumed if interrupted)")->required();
  convert_cmd->add_option("--config", convert_args.config, "Topology YAML (for --worker)");
  convert_cmd->add_option("--worker", convert_args.worker, "Write only this worker's experts");
  convert_cmd->add_option("--quant", convert_args.quant, "LOSSY: int8 or int4 with f32 group scales (default: keep the checkpoint's precision)")
      ->check(CLI::IsMember({"none", "int8", "int4"}));
  convert_cmd->add_option("--group-size", convert_args.group_size, "Elements per scale with --quant (default 32)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));

  std::string status_config;
  int status_timeout_ms = 2000;
  CLI::App* status_cmd = app.add_subcommand("status", "Show the health of every worker; exit 1 if one is down");
  status_cmd->add_option("--config", status_config, "Topology YAML")->required();
  status_cmd->add_option("--timeout-ms", status_timeout_ms, "Per-worker timeout")->check(CLI::Range(1, 3600000));
  bool status_layers = false;
  status_cmd->add_flag("--layers", status_layers, "Also show each worker's expert-tier counters per MoE layer");

  RunArgs run_args;
  CLI::App* run_cmd = app.add_subcommand("run", "Generate one continuation without HTTP");
  run_cmd->add_option("--config", run_args.config, "Topology YAML")->required();
  run_cmd->add_option("--max-tokens", run_args.max_tokens, "Tokens to generate")->check(CLI::Range(1, 1 << 30));
  run_cmd->add_option("--temperature", run_args.temperature, "0 = greedy")->check(CLI::Range(0.0, 100.0));
  run_cmd->add_option("--seed", run_args.seed, "Sampling seed");
  run_cmd->add_flag("--chat", run_args.chat, "Wrap the prompt as one user message in the chat template");
  CLI::Option* run_prefetch = run_cmd->add_flag("--prefetch,!--no-prefetch", run_args.prefetch,
                                                "Send prefetch hints (overrides the config's prefetch key); prints their recall");
  run_cmd->add_option("--routing-trace", run_args.routing_trace,
                      "Write every MoE layer's routing to this file (JSON lines; docs/benchmarks.md)");
  run_cmd->add_option("--stats-json", run_args.stats_json,
                      "Write the run's numbers (tok/s, prefetch recall, expert-tier counters) to this JSON file");
  run_cmd->add_option("--logits-out", run_args.logits_out,
                      "Also write the logits after the prompt (raw little-endian f32, [vocab_size])");
  run_cmd->add_option("--ids-out", run_args.ids_out, "Also write the prompt and generated token ids (JSON)");
  run_cmd->add_option("--repeat", run_args.repeat,
                      "Run the request N times in this process, printing each run's numbers (the last run's text, "
                      "files and --stats-json; every run's under its \"runs\"; the prefetch and worker counters and "
                      "--routing-trace add up every run); "
                      "with --no-prefix-cache each run computes the whole prompt, as llama-bench's runs after its "
                      "warm-up")
      ->check(CLI::Range(1, 1000));
  run_cmd->add_option("--threads", run_args.threads, threads_help)->check(CLI::Range(0, kMaxThreads));
  run_cmd->add_option("--activations", run_args.activations, activations_help)->check(CLI::IsMember({"f32", "q8"}));
  run_cmd->add_option("--quant-dense", run_args.quant_dense, quant_dense_help)
      ->check(CLI::IsMember({"q8_0", "q4_0", "none"}));
  run_args.serving.add_to(*run_cmd);
  run_cmd->add_option("prompt", run_args.prompt, "Prompt text")->required();

  std::string workers_config;
  CLI::App* workers_cmd = app.add_subcommand("workers", "List the worker names of a topology, one per line");
  workers_cmd->add_option("--config", workers_config, "Topology YAML")->required();

  CLI::App* secret_cmd = app.add_subcommand("secret", "Make the cluster's shared secret or an API key");
  secret_cmd->require_subcommand(1);
  std::string secret_file;
  CLI::App* secret_new_cmd =
      secret_cmd->add_subcommand("new", "Write a new random secret to FILE: 64 hex digits, mode 0600; never overwrites");
  secret_new_cmd->add_option("file", secret_file, "The file to create")->required();

  CLI::App* bench_cmd = app.add_subcommand("bench", "Microbenchmarks of this machine");
  bench_cmd->require_subcommand(1);
  add_bench_kernels(*bench_cmd);
  add_bench_attention(*bench_cmd);
  add_bench_memory(*bench_cmd);
  add_bench_wire(*bench_cmd);

  add_plan(app);  // `charm plan`: runs as a parse callback

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "charm: %s\nRun with --help for more information.\n", e.what());
    return 2;
  }
  // CLI11 fills an optional flag with false when it is absent: absent must mean "as the
  // config says".
  if (serve_prefetch->count() == 0) serve_args.prefetch.reset();
  if (run_prefetch->count() == 0) run_args.prefetch.reset();
  if (*serve_cmd) return serve(serve_args);
  if (*worker_cmd) return worker(worker_config, worker_name, worker_ram_gb, worker_threads, worker_activations, worker_delay_ms);
  if (*convert_cmd) return convert(convert_args);
  if (*status_cmd) return status(status_config, status_timeout_ms, status_layers);
  if (*workers_cmd) return list_workers(workers_config);
  if (*secret_new_cmd) return new_secret(secret_file);
  if (*bench_cmd) return 0;  // its subcommand ran as a parse callback
  if (app.got_subcommand("plan")) return 0;
  return run(run_args);
}

}  // namespace
}  // namespace charm

int main(int argc, char** argv) {
  charm::choose_openmp_wait(argc, argv);
  // Logs go to stderr: stdout is the generated text of `charm run` and the tables of
  // `charm status` and `charm bench`, which users redirect and scripts read.
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("", std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
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
