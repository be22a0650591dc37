#include "coordinator/api/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace charm {
namespace {

// Latency buckets, seconds: TTFT spans a short prompt on a LAN (~10 ms) to a long
// prefill on a slow cluster (minutes); per-token and RPC latencies sit lower.
const std::vector<double> kTtftBounds = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
const std::vector<double> kTokenBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
// Rows per engine step: one per decode, plus prompt chunks (max_batch_tokens at most).
const std::vector<double> kStepBounds = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
const std::vector<double> kRpcBounds = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                        0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,     10};

// The shortest text that reads back as the same double (as Go's strconv, which
// Prometheus uses, writes it): bucket bounds print as written ("0.00025").
std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char text[64];
  // Fixed notation in Go's %g range ("0.0005", not "5e-04"), else exponent notation.
  const double magnitude = std::fabs(v);
  const bool fixed = v == 0 || (magnitude >= 1e-4 && magnitude < 1e21);
  const auto result = std::to_chars(text, text + sizeof text, v,
                                    fixed ? std::chars_format::fixed : std::chars_format::general);
  return std::string(text, result.ptr);
}

std::string label_text(const std::vector<std::string>& names, const std::vector<std::string>& values,
                       const std::string& extra = "") {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    out += (out.empty() ? "" : ",") + names[i] + "=\"" + escape_label_value(values[i]) + "\"";
  }
  if (!extra.empty()) out += (out.empty() ? "" : ",") + extra;
  return out.empty() ? "" : "{" + out + "}";
}

void header(std::string& out, const std::string& name, const std::string& help, const char* type) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

std::string escape_label_value(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

Metrics::Metrics()
    : http_requests_{"charm_http_requests_total", "HTTP requests answered, by endpoint and status code.",
                     {"endpoint", "status"}, {}},
      prompt_tokens_{"charm_prompt_tokens_total", "Prompt tokens of the requests answered (cached, computed, or cut short by a hang-up).", {}, {}},
      completion_tokens_{"charm_completion_tokens_total", "Tokens generated.", {}, {}},
      worker_errors_{"charm_worker_errors_total",
                     "Layer requests to a worker that failed (socket error, timeout, error reply).", {"worker"}, {}},
      failovers_{"charm_worker_failovers_total", "Times a worker failed mid-layer and its share went to replicas.", {"worker"}, {}},
      expert_hits_{"charm_expert_hits_total", "Experts a worker found in memory when a request needed them.",
                   {"worker"}, {}},
      expert_misses_{"charm_expert_misses_total", "Experts a worker had to read from storage for a request.",
                     {"worker"}, {}},
      expert_bytes_read_{"charm_expert_bytes_read_total", "Bytes of expert weights workers read from storage.",
                         {"worker"}, {}},
      ttft_{"charm_time_to_first_token_seconds", "Time from a request's start to its first sampled token.", {},
            kTtftBounds, {}},
      token_latency_{"charm_time_per_output_token_seconds",
                     "Time from one sampled token to the next (every token after the first).", {}, kTokenBounds, {}},
      worker_rpc_{"charm_worker_rpc_seconds", "Round trip of one layer request to a worker.", {"worker"},
                  kRpcBounds, {}},
      queue_time_{"charm_queue_time_seconds", "Time from a request's arrival to its first engine step.", {},
                  kTtftBounds, {}},
      step_tokens_{"charm_step_tokens", "Rows (decode tokens and prompt-chunk tokens) of each engine step.", {},
                   kStepBounds, {}} {
  // Unlabelled counters exist from the start, so a scrape shows 0 rather than nothing.
  prompt_tokens_.values[{}] = 0;
  completion_tokens_.values[{}] = 0;
  ttft_.values[{}] = HistogramData{std::vector<uint64_t>(kTtftBounds.size(), 0), 0, 0};
  token_latency_.values[{}] = HistogramData{std::vector<uint64_t>(kTokenBounds.size(), 0), 0, 0};
  queue_time_.values[{}] = HistogramData{std::vector<uint64_t>(kTtftBounds.size(), 0), 0, 0};
  step_tokens_.values[{}] = HistogramData{std::vector<uint64_t>(kStepBounds.size(), 0), 0, 0};
}

void Metrics::add(CounterFamily& family, const Labels& labels, double amount) {
  family.values[labels] += amount;
}

void Metrics::observe(HistogramFamily& family, const Labels& labels, double value) {
  HistogramData& h = family.values[labels];
  if (h.counts.empty()) h.counts.assign(family.bounds.size(), 0);
  const auto bucket = std::lower_bound(family.bounds.begin(), family.bounds.end(), value);
  if (bucket != family.bounds.end()) ++h.counts[static_cast<size_t>(bucket - family.bounds.begin())];
  h.sum += value;
  ++h.count;
}

void Metrics::http_request(const std::string& endpoint, int status) {
  std::lock_guard lock(mutex_);
  add(http_requests_, {endpoint, std::to_string(status)}, 1);
}

void Metrics::generation(int64_t prompt_tokens, int64_t completion_tokens, double ttft_s,
                         const std::vector<double>& token_latencies_s) {
  std::lock_guard lock(mutex_);
  add(prompt_tokens_, {}, static_cast<double>(prompt_tokens));
  add(completion_tokens_, {}, static_cast<double>(completion_tokens));
  if (completion_tokens > 0) observe(ttft_, {}, ttft_s);
  for (double s : token_latencies_s) observe(token_latency_, {}, s);
}

MetricsSummary Metrics::summary() const {
  std::lock_guard lock(mutex_);
  MetricsSummary m;
  auto total = [](const CounterFamily& f) {
    double sum = 0;
    for (const auto& [labels, v] : f.values) sum += v;
    return static_cast<uint64_t>(sum);
  };
  m.prompt_tokens = total(prompt_tokens_);
  m.completion_tokens = total(completion_tokens_);
  const HistogramData& ttft = ttft_.values.at({});
  const HistogramData& token = token_latency_.values.at({});
  const HistogramData& queue = queue_time_.values.at({});
  m.ttft_count = ttft.count, m.ttft_sum_s = ttft.sum;
  m.token_latency_count = token.count, m.token_latency_sum_s = token.sum;
  m.queue_count = queue.count, m.queue_sum_s = queue.sum;
  for (const auto& [labels, v] : expert_hits_.values) m.experts[labels.at(0)].hits = static_cast<uint64_t>(v);
  for (const auto& [labels, v] : expert_misses_.values) m.experts[labels.at(0)].misses = static_cast<uint64_t>(v);
  for (const auto& [labels, v] : expert_bytes_read_.values) m.experts[labels.at(0)].bytes_read = static_cast<uint64_t>(v);
  return m;
}

void Metrics::queue_time(double seconds) {
  std::lock_guard lock(mutex_);
  observe(queue_time_, {}, seconds);
}

void Metrics::engine_step(size_t tokens) {
  std::lock_guard lock(mutex_);
  observe(step_tokens_, {}, static_cast<double>(tokens));
}

void Metrics::worker_rpc(const std::string& worker, double seconds) {
  std::lock_guard lock(mutex_);
  observe(worker_rpc_, {worker}, seconds);
}

void Metrics::worker_error(const std::string& worker) {
  std::lock_guard lock(mutex_);
  add(worker_errors_, {worker}, 1);
}

void Metrics::failover(const std::string& worker) {
  std::lock_guard lock(mutex_);
  add(failovers_, {worker}, 1);
}

uint64_t Metrics::failovers(const std::string& worker) const {
  std::lock_guard lock(mutex_);
  const auto it = failovers_.values.find({worker});
  return it == failovers_.values.end() ? 0 : static_cast<uint64_t>(it->second);
}

void Metrics::expert_stats(const std::string& worker, uint64_t hits, uint64_t misses, uint64_t bytes_read) {
  std::lock_guard lock(mutex_);
  add(expert_hits_, {worker}, static_cast<double>(hits));
  add(expert_misses_, {worker}, static_cast<double>(misses));
  add(expert_bytes_read_, {worker}, static_cast<double>(bytes_read));
}

namespace {

/// The engine's gauges and counters (EngineLoad).
void render_load(std::string& out, const EngineLoad& load) {
  auto one = [&](const char* name, const char* help, const char* type, double value) {
    header(out, name, help, type);
    out += std::string(name) + " " + number(value) + "\n";
  };
  one("charm_sequences_running", "Sequences in the running batch.", "gauge", double(load.running));
  one("charm_sequences_waiting", "Requests queued for admission.", "gauge", double(load.waiting));
  header(out, "charm_kv_cache_blocks", "Blocks of the paged KV cache, by state (used: held by sequences; cached: "
                                       "free, holding a reusable prefix; free: neither).", "gauge");
  const int64_t free = load.kv_blocks_total - load.kv_blocks_used - load.kv_blocks_cached;
  for (auto [state, value] : {std::pair{"used", load.kv_blocks_used}, {"cached", load.kv_blocks_cached},
                              {"free", free}}) {
    out += std::string("charm_kv_cache_blocks{state=\"") + state + "\"} " + std::to_string(value) + "\n";
  }
  one("charm_kv_cache_block_tokens", "Positions per KV cache block.", "gauge", double(load.kv_block_tokens));
  one("charm_prefix_cache_hits_total", "KV blocks reused from the prefix cache.", "counter", double(load.prefix_hits));
  one("charm_prefix_cache_misses_total", "Full prompt blocks the prefix cache did not have (hits / (hits + misses) is the block hit rate).", "counter",
      double(load.prefix_misses));
  one("charm_preemptions_total", "Sequences sent back to the queue for want of KV blocks (recomputed later).",
      "counter", double(load.preemptions));
}

}  // namespace

std::string Metrics::render(const std::vector<WorkerStatus>& workers, const EngineLoad* load) const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (const CounterFamily* f : {&http_requests_, &prompt_tokens_, &completion_tokens_, &worker_errors_,
                                 &failovers_, &expert_hits_, &expert_misses_, &expert_bytes_read_}) {
    header(out, f->name, f->help, "counter");
    for (const auto& [labels, value] : f->values) {
      out += f->name + label_text(f->label_names, labels) + " " + number(value) + "\n";
    }
  }
  for (const HistogramFamily* f : {&ttft_, &token_latency_, &worker_rpc_, &queue_time_, &step_tokens_}) {
    header(out, f->name, f->help, "histogram");
    for (const auto& [labels, h] : f->values) {
      uint64_t cumulative = 0;
      for (size_t i = 0; i < f->bounds.size(); ++i) {
        cumulative += h.counts[i];
        out += f->name + "_bucket" + label_text(f->label_names, labels, "le=\"" + number(f->bounds[i]) + "\"") +
               " " + std::to_string(cumulative) + "\n";
      }
      out += f->name + "_bucket" + label_text(f->label_names, labels, "le=\"+Inf\"") + " " +
             std::to_string(h.count) + "\n";
      out += f->name + "_sum" + label_text(f->label_names, labels) + " " + number(h.sum) + "\n";
      out += f->name + "_count" + label_text(f->label_names, labels) + " " + std::to_string(h.count) + "\n";
    }
  }
  if (load != nullptr) render_load(out, *load);
  if (!workers.empty()) {
    header(out, "charm_worker_up", "1 while the coordinator holds a working connection to the worker.", "gauge");
    for (const WorkerStatus& w : workers) {
      out += "charm_worker_up" + label_text({"worker"}, {w.name}) + " " +
             (w.state == WorkerState::kUp || w.state == WorkerState::kInProcess ? "1" : "0") + "\n";
    }
    header(out, "charm_worker_experts_held", "(layer, expert) pairs the worker holds.", "gauge");
    for (const WorkerStatus& w : workers) {
      out += "charm_worker_experts_held" + label_text({"worker"}, {w.name}) + " " +
             std::to_string(w.experts_held) + "\n";
    }
  }
  return out;
}

}  // namespace charm
