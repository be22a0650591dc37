// The coordinator's generation engine: tokenizer, chat template, model family, KV cache,
// expert dispatch and sampling behind one object that the HTTP API and `charm run` use.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/topology.h"
#include "coordinator/dispatch/expert_dispatch.h"
#include "coordinator/dispatch/routing_observer.h"
#include "coordinator/engine_load.h"
#include "coordinator/sampler.h"
#include "coordinator/sampling_params.h"
#include "coordinator/text/chat_template.h"
#include "coordinator/text/tokenizer.h"

namespace charm {

/// The outcome of one generation.
struct GenerationResult {
  std::vector<int32_t> tokens;       ///< generated ids (an EOS id is not included)
  std::string text;                  ///< decoded text, cut before any stop string
  std::string finish_reason;         ///< "stop" (EOS or stop string), "length" (max_tokens) or
                                     ///< "abort" (on_text returned false)
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double ttft_ms = 0;                ///< time to first token
  double decode_tokens_per_s = 0;
  /// Per sampled token after the first: milliseconds since the previous one (for the
  /// per-token latency histogram of /metrics).
  std::vector<double> token_latencies_ms;
  int64_t kv_bytes_per_token = 0;    ///< KV cache bytes per token over all layers (KvCache::bytes_per_token)
  /// One per entry of `tokens` when params.logprobs (an EOS that ended the generation is
  /// not included, as it is not in `tokens`); empty otherwise.
  std::vector<TokenLogprob> logprobs;
};

/// Receives each newly completed piece of text of a generation (whole UTF-8 characters,
/// stop strings withheld) and the logprobs of the tokens sampled since the previous call
/// (empty unless params.logprobs; a piece may carry several tokens, or none while text is
/// withheld). Returning false cancels the generation. An empty piece with no logprobs is
/// a heartbeat: the engine calls it now and then while nothing is produced (during a long
/// prefill or while queued), so the caller can cancel.
using TextCallback = std::function<bool(std::string_view text, std::span<const TokenLogprob> logprobs)>;

class Metrics;

/// Per-run choices that are not part of the cluster description. The batching limits
/// and the KV cache size are the topology's `serving:` (Topology::serving).
struct EngineOptions {
  std::string routing_trace;  ///< write every MoE layer's routing here (JSON lines, see
                              ///< coordinator/dispatch/routing_observer.h); empty = no trace
  /// Receives the workers' RPC latencies, errors, failovers and expert tier counts, and
  /// the scheduler's steps, queue times and preemptions (may be null); must outlive the
  /// engine.
  Metrics* metrics = nullptr;
  /// The memory the default KV cache size is a share of (bytes); 0 = MemAvailable of
  /// /proc/meminfo at start. Tests set it so that nothing depends on the host.
  uint64_t available_memory_bytes = 0;
};

/// A generation the engine has accepted (Engine::start).
class Generation {
 public:
  /// Cancels the generation unless wait() has returned.
  virtual ~Generation() = default;
  /// Streams the generation through `on_text` (may be empty; it runs on the calling
  /// thread) until it ends; returns the result. Call once. Throws what the model and the
  /// workers threw for its steps (Error), or Error(kUnavailable) when the engine shut
  /// down first.
  virtual GenerationResult wait(const TextCallback& on_text) = 0;
};

class Engine {
 public:
  /// Loads the model the topology names and connects to its workers (or builds the
  /// in-process expert store in single-node mode), reporting to options.metrics when
  /// set. Throws Error on any failure; Error(kInvalidInput) naming tokenizer.json and
  /// config.json when the tokenizer has more ids than the model's vocab_size.
  /// The ids of the model's vocabulary that the tokenizer has no token for (padding
  /// past its last id, holes) are masked before every sampling step, greedy included
  /// (coordinator/sampler.h, unsampleable_ids); the EOS ids are never masked.
  static std::unique_ptr<Engine> create(const Topology& topology, const EngineOptions& options = {});
  virtual ~Engine() = default;

  virtual const Tokenizer& tokenizer() const = 0;
  /// The model's chat template; throws Error(kInvalidInput) if the model has none (the
  /// message names the model, not its files: it reaches HTTP clients; the reason was
  /// logged at load).
  virtual const ChatTemplate& chat_template() const = 0;
  virtual const std::string& model_name() const = 0;
  virtual int64_t max_context() const = 0;
  /// Sampling for what a request leaves out: the checkpoint's generation_config.json
  /// (temperature, top_p, top_k, do_sample), else temperature 1 with no top-k/top-p.
  virtual const SamplingParams& default_sampling() const {
    static const SamplingParams kNone;
    return kNone;
  }

  /// Accepts a continuation of `prompt` (token ids) for generation and returns at once;
  /// the text arrives through Generation::wait. Thread-safe: concurrent generations are
  /// batched together (continuous batching), and a sequence's tokens do not depend on
  /// the others. When `first_logits` is not null it receives the logits [vocab_size] f32
  /// the first token was sampled from, before any penalty or mask (it must outlive the
  /// generation). Throws Error(kInvalidInput) for an empty prompt, one longer than
  /// max_context(), or prompt plus max_tokens larger than the KV cache (the message
  /// gives both sizes); Error(kBusy) when max_num_seqs + max_waiting requests are in
  /// flight already; Error(kUnavailable) while shutting down.
  virtual std::unique_ptr<Generation> start(const std::vector<int32_t>& prompt, const SamplingParams& params,
                                            std::vector<float>* first_logits = nullptr) = 0;

  /// start() then Generation::wait(on_text): the whole generation on this thread.
  GenerationResult generate(const std::vector<int32_t>& prompt, const SamplingParams& params,
                            const TextCallback& on_text) {
    return start(prompt, params)->wait(on_text);
  }

  /// Logits [vocab_size] f32 for the token after `prompt` (a fresh sequence), as the model
  /// computes them: the unsampleable ids are not masked here. For tests and
  /// `charm run --logits-out`.
  std::vector<float> prompt_logits(const std::vector<int32_t>& prompt) {
    SamplingParams params;
    params.max_tokens = 0;
    std::vector<float> logits;
    start(prompt, params, &logits)->wait({});
    return logits;
  }

  /// The scheduler's and the KV cache's state now (never waits for a step).
  virtual EngineLoad load() const { return {}; }

  /// Whether prompts reuse earlier prompts' KV blocks: serving.prefix_cache, and never for
  /// a model with per-sequence state (linear attention).
  virtual bool prefix_cache() const { return false; }

  /// Per-worker status, as the coordinator sees it.
  virtual std::vector<WorkerStatus> cluster_status() const = 0;

  /// How well the prefetch hints predicted each MoE layer (empty unless prefetch is on or
  /// a routing trace is written). Call between generations.
  virtual std::map<uint32_t, PrefetchLayerStats> prefetch_stats() const { return {}; }

  /// Per MoE layer, every routed expert's assignments since start, indexed by expert id
  /// (RoutingCounts; every MoE layer present from the start). Thread-safe, never waits
  /// for a step. Empty for an engine that does not count.
  virtual std::map<uint32_t, std::vector<uint64_t>> routing_counts() const { return {}; }
};

}  // namespace charm
