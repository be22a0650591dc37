#include "coordinator/engine.h"

#include <chrono>
#include <mutex>
#include <random>

#include <spdlog/spdlog.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/model_config.h"
#include "coordinator/dispatch/dispatcher_factory.h"
#include "coordinator/models/families.h"
#include "coordinator/models/model.h"
#include "coordinator/sampler.h"
#include "coordinator/text/stop_strings.h"

namespace charm {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
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

class EngineImpl final : public Engine {
 public:
  EngineImpl(const Topology& topology, const EngineOptions& options) : prefill_chunk_(options.prefill_chunk) {
    if (prefill_chunk_ < 1) fail_invalid("prefill chunk must be at least 1 token, got 0");
    checkpoint_ = Checkpoint::open(topology.model);
    config_ = ModelConfig::parse(checkpoint_->config_json(), (topology.model / "config.json").string(),
                                 checkpoint_families());
    tokenizer_ = Tokenizer::load(topology.model / "tokenizer.json");
    check_tokenizer_fits(topology.model);
    try {
      chat_template_ = ChatTemplate::load(topology.model / "tokenizer_config.json");
    } catch (const Error& e) {
      // Completions still work; chat requests are refused, without the file's path
      // (chat_template()), so the reason is told here, to the operator.
      spdlog::warn("no usable chat template, chat requests will be refused: {}", e.message());
    }
    eos_ids_ = eos_ids(config_, checkpoint_->generation_config_json());
    unsampleable_ = unsampleable_ids(*tokenizer_, static_cast<size_t>(config_.vocab_size), eos_ids_);
    if (!unsampleable_.empty()) {
      spdlog::info("{} of the model's {} vocabulary ids have no token in tokenizer.json ({} tokens); they are never "
                   "sampled", unsampleable_.size(), config_.vocab_size, tokenizer_->vocab_size());
    }
    sampling_defaults_ =
        sampling_defaults(checkpoint_->generation_config_json(), (topology.model / "generation_config.json").string());
    model_name_ = topology.model_name.empty() ? topology.model.filename().string() : topology.model_name;
    auto observer = std::make_unique<RoutingObserver>(
        make_dispatcher(topology, *checkpoint_, config_, experts_, options.metrics),
        RoutingObserverOptions{topology.prefetch, options.routing_trace});
    observer_ = observer.get();
    dispatcher_ = std::move(observer);
    model_ = load_model(*checkpoint_, config_, *dispatcher_);
    spdlog::info("loaded {} ({}, config dtype {}): {} layers, {} experts, top-{}, eos token ids [{}], KV cache {} bytes "
                 "per token", model_name_, config_.architecture, config_.dtype.empty() ? "unset" : config_.dtype,
                 config_.num_hidden_layers, config_.num_experts, config_.num_experts_per_tok,
                 fmt::join(eos_ids_, ", "), model_->new_cache(0).bytes_per_token());
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

  GenerationResult generate(const std::vector<int32_t>& prompt, const SamplingParams& params,
                            const TextCallback& on_text) override {
    std::lock_guard lock(mutex_);
    check_prompt(prompt, params.max_tokens);
    GenerationResult result;
    result.prompt_tokens = static_cast<int64_t>(prompt.size());
    std::mt19937_64 rng(params.seed ? *params.seed : std::random_device{}());
    KvCache cache = model_->new_cache(prompt.size() + static_cast<size_t>(params.max_tokens));
    result.kv_bytes_per_token = static_cast<int64_t>(cache.bytes_per_token());
    std::vector<float> logits(config_.vocab_size);
    StreamDecoder decoder(*tokenizer_, /*skip_special=*/true);
    StopMatcher stops(params.stop);
    auto emit = [&](const std::string& text) {
      result.text += text;
      return text.empty() || !on_text || on_text(text, {});
    };

    const auto start = Clock::now();
    prefill(prompt, cache, logits.data());
    Clock::time_point first_token, previous_token;
    result.finish_reason = "length";
    for (int64_t i = 0; i < params.max_tokens; ++i) {
      mask_logits(logits.data(), unsampleable_);  // ids the tokenizer cannot decode
      const int32_t token = sample_token(logits.data(), logits.size(), params, rng);
      if (i == 0) {
        first_token = previous_token = Clock::now();
        result.ttft_ms = ms_since(start);
      } else {
        result.token_latencies_ms.push_back(ms_since(previous_token));
        previous_token = Clock::now();
      }
      if (std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end()) {
        result.finish_reason = "stop";
        break;
      }
      result.tokens.push_back(token);
      const bool go_on = emit(stops.push(decoder.push(token)));
      if (stops.stopped() || !go_on) {
        result.finish_reason = go_on ? "stop" : "abort";  // "abort": cancelled by the caller (vLLM's term)
        break;
      }
      if (i + 1 < params.max_tokens) model_->forward(&token, 1, cache, logits.data());
    }
    emit(stops.push(decoder.flush()));
    emit(stops.finish());
    result.completion_tokens = static_cast<int64_t>(result.tokens.size());
    if (result.completion_tokens > 1) {
      result.decode_tokens_per_s = (result.completion_tokens - 1) / (ms_since(first_token) / 1000.0);
    }
    return result;
  }

  std::vector<float> prompt_logits(const std::vector<int32_t>& prompt) override {
    std::lock_guard lock(mutex_);
    check_prompt(prompt, 0);
    KvCache cache = model_->new_cache(prompt.size());
    std::vector<float> logits(config_.vocab_size);
    prefill(prompt, cache, logits.data());
    return logits;
  }

  std::vector<WorkerStatus> cluster_status() const override { return dispatcher_->status(); }

  std::map<uint32_t, PrefetchLayerStats> prefetch_stats() const override {
    std::lock_guard lock(mutex_);
    return observer_->prefetch_stats();
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
  }

  /// Every id the tokenizer produces must have an embedding and lm_head row; a larger
  /// tokenizer (one from another checkpoint) would index past them.
  void check_tokenizer_fits(const std::filesystem::path& model) const {
    if (tokenizer_->vocab_size() <= config_.vocab_size) return;
    fail_invalid((model / "tokenizer.json").string() + " has " + std::to_string(tokenizer_->vocab_size()) +
                 " token ids, more than vocab_size " + std::to_string(config_.vocab_size) + " of " +
                 (model / "config.json").string() + ": ids " + std::to_string(config_.vocab_size) + "-" +
                 std::to_string(tokenizer_->vocab_size() - 1) +
                 " have no embedding row (is the tokenizer from another checkpoint?)");
  }

  /// Runs the prompt into `cache` chunk by chunk; logits [vocab] of its last token.
  /// Each chunk's rows attend to the cache the earlier chunks filled, so the result is
  /// the one unchunked forward gives, bit for bit (every kernel is row-independent).
  void prefill(const std::vector<int32_t>& prompt, KvCache& cache, float* logits) {
    for (size_t begin = 0; begin < prompt.size(); begin += prefill_chunk_) {
      const size_t n = std::min(prefill_chunk_, prompt.size() - begin);
      model_->forward(prompt.data() + begin, n, cache, logits);
    }
  }

  size_t prefill_chunk_;
  std::unique_ptr<Checkpoint> checkpoint_;
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
  mutable std::mutex mutex_;
};

}  // namespace

std::unique_ptr<Engine> Engine::create(const Topology& topology, const EngineOptions& options) {
  return std::make_unique<EngineImpl>(topology, options);
}

}  // namespace charm
