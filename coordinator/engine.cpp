#include "coordinator/engine.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/ggml_quantize.h"
#include "common/load_progress.h"
#include "common/matmul_q8.h"
#include "common/stop_signals.h"
#include "common/model_config.h"
#include "coordinator/dispatch/dispatcher_factory.h"
#include "coordinator/models/families.h"
#include "coordinator/api/metrics.h"
#include "coordinator/models/model.h"
#include "coordinator/sampler.h"
#include "coordinator/scheduler.h"
#include "coordinator/text/stop_strings.h"
#include "coordinator/text/model_text.h"

namespace charm {
namespace {

using Clock = std::chrono::steady_clock;

/// The model's MoE layer ids (RoutingObserver's rows of routing counts).
std::vector<uint32_t> moe_layers(const ModelConfig& config) {
  std::vector<uint32_t> out;
  for (int64_t l : config.moe_layer_ids()) out.push_back(static_cast<uint32_t>(l));
  return out;
}

/// EOS ids: config.json's plus generation_config.json's (int or list), deduplicated.
std::vector<int32_t> eos_ids(const ModelConfig& config, const nlohmann::json& generation_config) {
  std::vector<int64_t> ids = config.eos_token_ids;
  if (generation_config.contains("eos_token_id")) {
    const auto& e = generation_config["eos_token_id"];
    if (e.is_number_integer()) ids.push_back(e.get<int64_t>());
    if (e.is_array()) {
      for (const auto& v : e) {
        if (v.is_number_integer()) ids.push_back(v.get<int64_t>());
      }
    }
  }
  std::vector<int32_t> out;
  for (int64_t id : ids) {
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

/// One generation in flight: the scheduler's Sequence plus what the engine loop samples
/// with and the channel to the thread that called generate().
struct Job final : Sequence {
  Job(KvBlockPool& pool, const Tokenizer& tokenizer, const SamplingParams& p)
      : Sequence(pool), params(p), decoder(tokenizer, /*skip_special=*/true), stops(p.stop) {}

  // Read and written by the engine loop only (the caller reads `result` once done).
  SamplingParams params;
  std::mt19937_64 rng;
  size_t prompt_tokens = 0;
  StreamDecoder decoder;
  StopMatcher stops;
  GenerationResult result;
  std::vector<float>* first_logits = nullptr;
  Clock::time_point submitted, first_token, previous_token;
  bool scheduled = false;  // once: its queue time is recorded

  std::atomic<bool> cancelled{false};  // set by the caller, seen by the loop between steps

  // The channel, under `mu`: text and logprobs not yet handed to the caller, and the end.
  std::mutex mu;
  std::condition_variable cv;
  std::string text;
  std::vector<TokenLogprob> logprobs;
  bool done = false;
  std::exception_ptr error;
};

/// How often a caller with nothing to pass on calls its callback anyway (the heartbeat:
/// it lets a caller whose client hung up cancel during a long prefill or in the queue).
constexpr auto kHeartbeat = std::chrono::milliseconds(100);
/// The default KV cache: this share of the memory available at start.
constexpr double kDefaultKvShare = 0.2;

/// MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read.
uint64_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

/// The caller's side of a job: hands text to on_text as it comes (a heartbeat when none
/// does), cancels when on_text says so or when dropped unwaited.
class JobHandle final : public Generation {
 public:
  explicit JobHandle(std::shared_ptr<Job> job) : job_(std::move(job)) {}
  ~JobHandle() override {
    if (!waited_) job_->cancelled = true;
  }

  GenerationResult wait(const TextCallback& on_text) override {
    waited_ = true;
    Job& job = *job_;
    bool listening = static_cast<bool>(on_text);
    std::unique_lock lock(job.mu);
    while (true) {
      job.cv.wait_for(lock, kHeartbeat, [&] { return job.done || !job.text.empty() || !job.logprobs.empty(); });
      std::string text = std::move(job.text);
      std::vector<TokenLogprob> logprobs = std::move(job.logprobs);
      job.text.clear();
      job.logprobs.clear();
      const bool done = job.done;
      lock.unlock();
      const bool heartbeat = text.empty() && logprobs.empty();
      if (listening && !(done && heartbeat) && !on_text(text, logprobs)) {
        listening = false;
        job.cancelled = true;
      }
      lock.lock();
      if (done && job.text.empty() && job.logprobs.empty()) break;
    }
    if (job.error) std::rethrow_exception(job.error);
    return std::move(job.result);
  }

 private:
  std::shared_ptr<Job> job_;
  bool waited_ = false;
};

class EngineImpl final : public Engine {
 public:
  EngineImpl(const Topology& topology, const EngineOptions& options) : metrics_(options.metrics) {
    start_activation_mode(topology.activations, "coordinator");
    checkpoint_ = Checkpoint::open(topology.model);
    config_ = ModelConfig::parse(checkpoint_->config_json(), checkpoint_->config_origin(),
                                 checkpoint_families());
    ModelText text = load_model_text(*checkpoint_);
    tokenizer_ = std::move(text.tokenizer);
    tokenizer_origin_ = text.tokenizer_origin;
    check_tokenizer_fits();
    chat_template_ = std::move(text.chat_template);
    if (!chat_template_) {
      // Completions still work; chat requests are refused, without the file's path
      // (chat_template()), so the reason is told here, to the operator.
      spdlog::warn("no usable chat template, chat requests will be refused: {}", text.chat_template_error);
    }
    eos_ids_ = eos_ids(config_, checkpoint_->generation_config_json());
    unsampleable_ = unsampleable_ids(*tokenizer_, static_cast<size_t>(config_.vocab_size), eos_ids_);
    if (!unsampleable_.empty()) {
      spdlog::info("{} of the model's {} vocabulary ids have no token in {} ({} tokens); they are never "
                   "sampled", unsampleable_.size(), config_.vocab_size, tokenizer_origin_, tokenizer_->vocab_size());
    }
    sampling_defaults_ =
        sampling_defaults(checkpoint_->generation_config_json(),
                          checkpoint_->gguf() ? checkpoint_->config_origin()
                                              : (topology.model / "generation_config.json").string());
    model_name_ = topology.model_name.empty() ? topology.model.filename().string() : topology.model_name;
    auto observer = std::make_unique<RoutingObserver>(
        make_dispatcher(topology, *checkpoint_, config_, experts_, options.metrics),
        RoutingObserverOptions{topology.prefetch, options.routing_trace}, moe_layers(config_),
        static_cast<uint32_t>(config_.num_experts));
    observer_ = observer.get();
    dispatcher_ = std::move(observer);
    {
      LoadProgress progress("coordinator: dense weights", checkpoint_->non_expert_bytes(config_.expert_tensors));
      checkpoint_->set_load_progress(&progress);
      apply_dense_quant(topology.quant_dense);
      model_ = load_model(*checkpoint_, config_, *dispatcher_);
      checkpoint_->set_load_progress(nullptr);
    }
    spdlog::info("loaded {} ({}, config dtype {}): {} layers, {} experts, top-{}, eos token ids [{}], KV cache {} bytes "
                 "per token", model_name_, config_.architecture, config_.dtype.empty() ? "unset" : config_.dtype,
                 config_.num_hidden_layers, config_.num_experts, config_.num_experts_per_tok,
                 fmt::join(eos_ids_, ", "), model_->kv_layout().bytes_per_token());
    pool_ = std::make_unique<KvBlockPool>(model_->kv_layout(), kv_blocks(topology.serving, options));
    const ServingSpec& serving = topology.serving;
    model_->set_micro_batches(static_cast<size_t>(serving.micro_batches));
    scheduler_ = std::make_unique<Scheduler>(
        *pool_, SchedulerOptions{static_cast<size_t>(serving.max_batch_tokens),
                                 static_cast<size_t>(serving.max_num_seqs), static_cast<size_t>(serving.max_waiting),
                                 serving.prefix_cache});
    publish_load();
    loop_ = std::thread([this] { run_loop(); });
  }

  ~EngineImpl() override {
    {
      std::lock_guard lock(inbox_mutex_);
      stopping_ = true;
    }
    inbox_cv_.notify_all();
    if (loop_.joinable()) loop_.join();
  }

  const Tokenizer& tokenizer() const override { return *tokenizer_; }
  const ChatTemplate& chat_template() const override {
    if (!chat_template_) {
      fail_invalid("model '" + model_name_ + "' has no usable chat template (the server log says why); send the "
                   "prompt to /v1/completions instead");
    }
    return *chat_template_;
  }
  const std::string& model_name() const override { return model_name_; }
  int64_t max_context() const override { return config_.max_position_embeddings; }
  const SamplingParams& default_sampling() const override { return sampling_defaults_; }

  std::unique_ptr<Generation> start(const std::vector<int32_t>& prompt, const SamplingParams& params,
                                    std::vector<float>* first_logits) override {
    check_prompt(prompt, params.max_tokens);
    auto job = std::make_shared<Job>(*pool_, *tokenizer_, params);
    job->tokens = prompt;
    job->prompt_tokens = prompt.size();
    job->rng.seed(params.seed ? *params.seed : std::random_device{}());
    job->first_logits = first_logits;
    job->result.prompt_tokens = static_cast<int64_t>(prompt.size());
    job->result.kv_bytes_per_token = static_cast<int64_t>(pool_->layout().bytes_per_token());
    submit(job);
    return std::make_unique<JobHandle>(std::move(job));
  }

  std::vector<WorkerStatus> cluster_status() const override { return dispatcher_->status(); }

  bool prefix_cache() const override { return scheduler_->prefix_cache_enabled(); }

  EngineLoad load() const override {
    std::lock_guard lock(load_mutex_);
    return load_;
  }

  std::map<uint32_t, PrefetchLayerStats> prefetch_stats() const override {
    std::lock_guard lock(model_mutex_);
    return observer_->prefetch_stats();
  }

  std::map<uint32_t, std::vector<uint64_t>> routing_counts() const override {
    return observer_->routing_counts().snapshot();
  }

 private:
  void check_prompt(const std::vector<int32_t>& prompt, int64_t max_tokens) const {
    if (prompt.empty()) fail_invalid("prompt: must hold at least one token");
    if (max_tokens < 0) fail_invalid("max_tokens: must not be negative");
    // Subtracted, never added: max_tokens may be near INT64_MAX.
    const auto prompt_tokens = static_cast<int64_t>(prompt.size());
    if (prompt_tokens > max_context() || max_tokens > max_context() - prompt_tokens) {
      fail_invalid("prompt (" + std::to_string(prompt.size()) + " tokens) plus max_tokens (" +
                   std::to_string(max_tokens) + ") exceeds the model's context of " + std::to_string(max_context()));
    }
    // Alone in the pool it must fit, or it could never finish.
    const auto pool_tokens = static_cast<int64_t>(pool_->num_blocks() * KvBlockPool::kBlockSize);
    if (prompt_tokens > pool_tokens || max_tokens > pool_tokens - prompt_tokens) {
      fail_invalid("prompt (" + std::to_string(prompt.size()) + " tokens) plus max_tokens (" +
                   std::to_string(max_tokens) + ") does not fit in the KV cache of " + std::to_string(pool_tokens) +
                   " tokens (serving.kv_cache_gb, --kv-cache-gb)");
    }
  }

  /// `quant_dense` (lossy, opt-in): the dense matrices are quantised as they load; says so.
  void apply_dense_quant(std::optional<GgmlType> type) {
    checkpoint_->set_dense_quant(type);
    if (!type) return;
    spdlog::warn("coordinator: quant_dense {} is LOSSY: the dense matrices (attention, dense and shared-expert MLPs, "
                 "embeddings, lm_head; not routers) are quantised to {} blocks at load, so logits differ from the "
                 "checkpoint's",
                 dense_quant_name(type), ggml_traits(*type).name);
  }

  /// Every id the tokenizer produces must have an embedding and lm_head row; a larger
  /// tokenizer (one from another checkpoint) would index past them.
  void check_tokenizer_fits() const {
    if (tokenizer_->vocab_size() <= config_.vocab_size) return;
    fail_invalid(tokenizer_origin_ + " has " + std::to_string(tokenizer_->vocab_size()) +
                 " token ids, more than vocab_size " + std::to_string(config_.vocab_size) + " of " +
                 checkpoint_->config_origin() + ": ids " + std::to_string(config_.vocab_size) + "-" +
                 std::to_string(tokenizer_->vocab_size() - 1) +
                 " have no embedding row (is the tokenizer from another checkpoint?)");
  }

  /// The KV pool's size in blocks: serving.kv_cache_gb, else kDefaultKvShare of the
  /// available memory, but no more than max_num_seqs full contexts. Logged either way.
  size_t kv_blocks(const ServingSpec& serving, const EngineOptions& options) const {
    const size_t block_bytes = KvBlockPool::kBlockSize * model_->kv_layout().bytes_per_token();
    const uint64_t available = options.available_memory_bytes ? options.available_memory_bytes : available_memory();
    std::string why;
    double bytes;
    if (serving.kv_cache_gb) {
      if (!(*serving.kv_cache_gb > 0 && *serving.kv_cache_gb <= kMaxKvCacheGb)) {
        fail_invalid("kv_cache_gb must be in (0, " + std::to_string(int64_t(kMaxKvCacheGb)) + "] GiB");
      }
      bytes = *serving.kv_cache_gb * double(1ull << 30);
      why = "serving.kv_cache_gb or --kv-cache-gb";
    } else {
      const size_t per_context = (static_cast<size_t>(config_.max_position_embeddings) + KvBlockPool::kBlockSize - 1) /
                                 KvBlockPool::kBlockSize * block_bytes;
      const double cap = double(per_context) * double(serving.max_num_seqs);
      bytes = std::min(kDefaultKvShare * double(available), cap);
      why = fmt::format("default: {:.0f} % of the {:.1f} GiB available, at most max_num_seqs ({}) full contexts; set "
                        "serving.kv_cache_gb or --kv-cache-gb", 100 * kDefaultKvShare, double(available) / (1ull << 30),
                        serving.max_num_seqs);
    }
    const auto blocks = static_cast<size_t>(std::max(1.0, bytes / double(block_bytes)));
    spdlog::info("KV cache: {:.2f} GiB, {} blocks of {} tokens ({} tokens) ({})",
                 double(blocks * block_bytes) / (1ull << 30), blocks, KvBlockPool::kBlockSize,
                 blocks * KvBlockPool::kBlockSize, why);
    if (const size_t state_bytes = model_->kv_layout().state_floats * sizeof(float); state_bytes > 0) {
      // Linear attention's per-sequence state lives beside the pool, outside its budget.
      spdlog::info("linear-attention state: {:.2f} MiB per running sequence, up to {:.2f} GiB for max_num_seqs ({}); "
                   "the prefix cache is off for this model",
                   double(state_bytes) / (1ull << 20), double(state_bytes) * double(serving.max_num_seqs) / (1ull << 30),
                   serving.max_num_seqs);
    }
    return blocks;
  }

  /// Queues a job for the loop; Error(kBusy) when max_num_seqs + max_waiting are in flight.
  void submit(const std::shared_ptr<Job>& job) {
    const SchedulerOptions& limits = scheduler_->options();
    {
      std::lock_guard lock(inbox_mutex_);
      if (stopping_) fail_unavailable("the engine is shutting down");
      if (in_flight_ >= limits.max_num_seqs + limits.max_waiting) {
        fail_busy("the server is at capacity: " + std::to_string(in_flight_) + " requests in flight (max_num_seqs " +
                  std::to_string(limits.max_num_seqs) + " + max_waiting " + std::to_string(limits.max_waiting) +
                  "); retry later");
      }
      ++in_flight_;
      job->submitted = Clock::now();
      inbox_.push_back(job);
    }
    inbox_cv_.notify_all();
  }

  /// The engine loop: takes new jobs, runs steps while there is work, sleeps otherwise.
  void run_loop() {
    // Stop signals are for the thread that waits for them (app/charm.cpp), never this
    // one or the OpenMP threads it starts (they inherit its mask).
    block_stop_signals();
    std::unique_lock lock(inbox_mutex_);
    while (true) {
      while (!inbox_.empty()) {
        active_.push_back(std::move(inbox_.front()));
        inbox_.pop_front();
        scheduler_->add(active_.back().get());
      }
      if (stopping_) break;
      if (active_.empty()) {
        inbox_cv_.wait(lock, [&] { return stopping_ || !inbox_.empty(); });
        continue;
      }
      lock.unlock();
      step();
      lock.lock();
    }
    lock.unlock();
    const auto shutdown = std::make_exception_ptr(Error(ErrorCategory::kUnavailable, "the engine is shutting down"));
    while (!active_.empty()) finish(*active_.front(), "", shutdown);
  }

  /// One iteration: drops cancelled jobs, plans, runs the batch, samples.
  void step() {
    for (size_t i = 0; i < active_.size();) {
      if (active_[i]->cancelled) {
        finish(*active_[i], "abort");  // "abort": cancelled by the caller (vLLM's term)
      } else {
        ++i;
      }
    }
    StepPlan plan = scheduler_->schedule();
    publish_load();
    if (plan.parts.empty()) {
      // Nothing admissible (every block held): wait for a job to end or arrive.
      std::unique_lock lock(inbox_mutex_);
      inbox_cv_.wait_for(lock, kHeartbeat);
      return;
    }
    std::vector<SequenceStep> batch;
    // Kept across steps: a step's logits are [parts, vocab] (151,936 floats a row for Qwen),
    // too much to allocate and zero every decode step.
    step_logits_.resize(std::max(step_logits_.size(), plan.parts.size() * config_.vocab_size));
    float* logits = step_logits_.data();
    const auto now = Clock::now();
    for (size_t i = 0; i < plan.parts.size(); ++i) {
      Job& job = static_cast<Job&>(*plan.parts[i].sequence);
      if (!job.scheduled && metrics_) metrics_->queue_time(std::chrono::duration<double>(now - job.submitted).count());
      job.scheduled = true;
      const size_t n = plan.parts[i].n;
      const bool last = job.cache.length() + n == job.tokens.size();
      batch.push_back(SequenceStep{job.tokens.data() + job.cache.length(), n, &job.cache,
                                   last ? logits + i * config_.vocab_size : nullptr});
    }
    if (metrics_) metrics_->engine_step(plan.tokens);
    try {
      std::lock_guard lock(model_mutex_);
      model_->forward_batch(batch);
    } catch (...) {
      const std::exception_ptr error = std::current_exception();
      for (const StepPlan::Part& part : plan.parts) finish(static_cast<Job&>(*part.sequence), "", error);
      return;
    }
    scheduler_->step_done(plan);
    // Every job's draw touches only that job and its logits row, so a step's jobs draw at
    // once on the OpenMP team (at T > 0 over a 50k vocabulary one draw takes ~0.23 ms:
    // 32 streams would wait ~7 ms a step on one thread); the tokens are then passed on in
    // order.
    std::vector<size_t> sampled;
    for (size_t i = 0; i < plan.parts.size(); ++i) {
      if (batch[i].logits != nullptr) sampled.push_back(i);
    }
    std::vector<Draw> draws(sampled.size());
    const auto n = static_cast<int64_t>(sampled.size());
#pragma omp parallel for schedule(dynamic) if (n > 1)
    for (int64_t k = 0; k < n; ++k) {
      const size_t i = sampled[static_cast<size_t>(k)];
      draws[static_cast<size_t>(k)] = draw(static_cast<Job&>(*plan.parts[i].sequence), batch[i].logits);
    }
    for (size_t k = 0; k < sampled.size(); ++k) {
      accept(static_cast<Job&>(*plan.parts[sampled[k]].sequence), std::move(draws[k]));
      ++tokens_sampled_;
    }
    publish_load();
  }

  /// A job's next token and, when it asked, its logprob entry; or what went wrong.
  struct Draw {
    int32_t token = -1;  ///< -1: nothing drawn (max_tokens 0, or an error)
    std::optional<TokenLogprob> logprob;
    std::exception_ptr error;
  };

  /// Draws the job's next token from its logits [vocab] (used as scratch). Reads and
  /// writes only `job` and `logits` (and reads unsampleable_), so that different jobs may
  /// draw on different threads; never throws (an error is returned: it must not leave an
  /// OpenMP region).
  Draw draw(Job& job, float* logits) const noexcept {
    Draw d;
    try {
      if (job.first_logits && job.result.tokens.empty()) job.first_logits->assign(logits, logits + config_.vocab_size);
      if (job.params.max_tokens == 0) return d;
      const size_t vocab = config_.vocab_size;
      mask_logits(logits, unsampleable_);  // ids the tokenizer cannot decode
      std::vector<float> raw;              // for logprobs: masked, not penalised
      if (job.params.logprobs) raw.assign(logits, logits + vocab);
      const std::span<const int32_t> prompt(job.tokens.data(), job.prompt_tokens);
      apply_penalties(logits, vocab, job.params, prompt, job.result.tokens);
      d.token = sample_token(logits, vocab, job.params, job.rng);
      if (job.params.logprobs) {
        d.logprob = token_logprob(raw.data(), vocab, d.token, static_cast<size_t>(job.params.top_logprobs));
      }
    } catch (...) {
      d.token = -1;
      d.error = std::current_exception();
    }
    return d;
  }

  /// Takes the job's drawn token: passes the text on and ends the job on EOS, a stop
  /// string or max_tokens (or with the draw's error).
  void accept(Job& job, Draw d) {
    if (d.error) return finish(job, "", d.error);
    if (d.token < 0) return finish(job, "length");  // max_tokens 0
    const int32_t token = d.token;
    const auto now = Clock::now();
    if (job.result.tokens.empty()) {
      job.first_token = now;
      job.result.ttft_ms = std::chrono::duration<double, std::milli>(now - job.submitted).count();
    } else {
      job.result.token_latencies_ms.push_back(std::chrono::duration<double, std::milli>(now - job.previous_token).count());
    }
    job.previous_token = now;
    if (std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end()) return finish(job, "stop");
    std::vector<TokenLogprob> logprobs;
    if (d.logprob) {
      logprobs.push_back(std::move(*d.logprob));
      job.result.logprobs.push_back(logprobs.back());
    }
    job.result.tokens.push_back(token);
    job.tokens.push_back(token);
    pass_on(job, job.stops.push(job.decoder.push(token)), std::move(logprobs));
    if (job.stops.stopped()) return finish(job, "stop");
    if (static_cast<int64_t>(job.result.tokens.size()) == job.params.max_tokens) finish(job, "length");
  }

  /// Hands text and logprobs to the job's caller.
  static void pass_on(Job& job, const std::string& text, std::vector<TokenLogprob> logprobs) {
    if (text.empty() && logprobs.empty()) return;
    {
      std::lock_guard lock(job.mu);
      job.result.text += text;
      job.text += text;
      for (TokenLogprob& lp : logprobs) job.logprobs.push_back(std::move(lp));
    }
    job.cv.notify_all();
  }

  /// Ends a job: with `reason` as its finish_reason (the held text flushed), or with
  /// `error` (non-null) for its caller to rethrow. Frees its blocks.
  void finish(Job& job, const std::string& reason, std::exception_ptr error = nullptr) {
    if (!error && reason != "abort") {
      pass_on(job, job.stops.push(job.decoder.flush()), {});
      pass_on(job, job.stops.finish(), {});
    }
    scheduler_->remove(&job, /*keep_prefix=*/!error);
    GenerationResult& r = job.result;
    r.finish_reason = reason;
    r.completion_tokens = static_cast<int64_t>(r.tokens.size());
    if (r.completion_tokens > 1) {
      const double s = std::chrono::duration<double>(job.previous_token - job.first_token).count();
      if (s > 0) r.decode_tokens_per_s = double(r.completion_tokens - 1) / s;
    }
    std::shared_ptr<Job> keep;  // the caller may drop its own reference once done is set
    for (auto it = active_.begin(); it != active_.end(); ++it) {
      if (it->get() == &job) {
        keep = std::move(*it);
        active_.erase(it);
        break;
      }
    }
    {
      std::lock_guard lock(inbox_mutex_);
      --in_flight_;
    }
    publish_load();  // so that a caller who sees the end sees the blocks it freed
    {
      std::lock_guard lock(job.mu);
      job.error = error;
      job.done = true;
    }
    job.cv.notify_all();
  }

  /// Copies the scheduler's and the pool's counters for load().
  void publish_load() {
    EngineLoad l;
    l.running = static_cast<int64_t>(scheduler_->running());
    l.waiting = static_cast<int64_t>(scheduler_->waiting());
    l.kv_blocks_total = static_cast<int64_t>(pool_->num_blocks());
    l.kv_blocks_used = static_cast<int64_t>(pool_->num_blocks() - pool_->free_blocks());
    l.kv_blocks_cached = static_cast<int64_t>(pool_->cached_blocks());
    l.kv_block_tokens = static_cast<int64_t>(KvBlockPool::kBlockSize);
    l.prefix_hits = pool_->prefix_hits();
    l.prefix_misses = pool_->prefix_misses();
    l.preemptions = scheduler_->preemptions();
    l.tokens_sampled = tokens_sampled_;
    std::lock_guard lock(load_mutex_);
    load_ = l;
  }

  Metrics* metrics_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::string tokenizer_origin_;  ///< where the tokenizer came from, for messages
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::vector<int32_t> eos_ids_;
  std::vector<int32_t> unsampleable_;  // ids with no token (unsampleable_ids), masked before sampling
  SamplingParams sampling_defaults_;
  std::string model_name_;
  LocalExperts experts_;  // the in-process worker role (single-node mode only)
  std::unique_ptr<ExpertDispatcher> dispatcher_;  // a RoutingObserver over the real one
  RoutingObserver* observer_ = nullptr;           // dispatcher_, as its type
  std::unique_ptr<Model> model_;
  mutable std::mutex model_mutex_;  // a forward against prefetch_stats()

  std::unique_ptr<KvBlockPool> pool_;       // the loop's, like the scheduler
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::shared_ptr<Job>> active_;  // the loop's: every job it has taken, unfinished
  std::vector<float> step_logits_;            // the loop's: each step's logits, [parts, vocab]

  std::mutex inbox_mutex_;
  std::condition_variable inbox_cv_;
  std::deque<std::shared_ptr<Job>> inbox_;  // submitted, not yet taken by the loop
  size_t in_flight_ = 0;                    // submitted and not finished
  bool stopping_ = false;

  mutable std::mutex load_mutex_;
  EngineLoad load_;
  uint64_t tokens_sampled_ = 0;  // engine loop thread only; published in load_
  std::thread loop_;  // last: started once everything above exists
};

}  // namespace

std::unique_ptr<Engine> Engine::create(const Topology& topology, const EngineOptions& options) {
  return std::make_unique<EngineImpl>(topology, options);
}

}  // namespace charm
