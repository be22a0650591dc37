// The OpenAI-compatible HTTP API; see http_api.h and docs/api.md.
#include "coordinator/api/http_api.h"

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <sys/socket.h>

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/listen_check.h"
#include "common/secret.h"
#include "coordinator/api/api_errors.h"
#include "coordinator/api/client_watch.h"
#include "coordinator/api/dashboard_assets.h"
#include "coordinator/api/dashboard_state.h"
#include "coordinator/api/openai_request.h"
#include "coordinator/api/openai_response.h"

namespace charm {

using json = nlohmann::json;

namespace {

constexpr const char* kJson = "application/json";
/// Largest request body accepted (a long chat history is well under this).
constexpr size_t kMaxBodyBytes = 32u << 20;

/// Methods each known path answers; other methods on these paths get 405.
const std::map<std::string, std::set<std::string>>& known_paths() {
  static const std::map<std::string, std::set<std::string>> paths = [] {
    std::map<std::string, std::set<std::string>> p = {
      {"/health", {"GET", "HEAD"}},
      {"/v1/models", {"GET", "HEAD"}},
      {"/cluster/status", {"GET", "HEAD"}},
      {"/metrics", {"GET", "HEAD"}},
      {"/", {"GET", "HEAD"}},
      {"/dashboard/state", {"GET", "HEAD"}},
      {"/v1/completions", {"POST"}},
      {"/v1/chat/completions", {"POST"}},
    };
    for (const EmbeddedFile& f : dashboard_files()) p["/dashboard/" + std::string(f.name)] = {"GET", "HEAD"};
    return p;
  }();
  return paths;
}

/// The dashboard's static files: served without the API key (they hold no data; the page
/// asks for the key and sends it on its fetches of /dashboard/state).
bool is_dashboard_file(const std::string& path) {
  return path == "/" || (path.rfind("/dashboard/", 0) == 0 && find_dashboard_file(path.substr(11)) != nullptr);
}

void send_error(httplib::Response& res, const ApiError& error) {
  res.status = error.status();
  if (error.status() == 429) res.set_header("Retry-After", "1");  // the queue drains by the step
  res.set_content(dump_json(error_body(error)), kJson);
}

/// Runs `body` for request `request_id`, turning any exception into an OpenAI-style error
/// response (api_errors.h: the request stage's own errors are ApiErrors by then). Every
/// response it guards carries X-Request-Id, which the 5xx texts and the server log name.
template <class F>
void guarded(httplib::Response& res, const std::string& request_id, F&& body) {
  res.set_header("X-Request-Id", request_id);
  try {
    body();
  } catch (...) {
    send_error(res, client_error(std::current_exception(), FailureStage::kGeneration, request_id));
  }
}

/// One streamed generation: everything the content provider needs after the handler
/// has returned.
struct StreamJob {
  ApiRequest request;
  ResponseMeta meta;
  std::vector<std::unique_ptr<Generation>> generations;  // one per choice, accepted before the 200 went out
  std::string remote_addr;                 // the client, to notice a hang-up (ClientWatch)
  int remote_port = 0;
};

/// Records a finished generation's tokens and latencies; the prompt's tokens only when
/// `count_prompt` (the first choice of a request: its other choices share the prompt).
void record_generation(Metrics& metrics, const GenerationResult& result, bool count_prompt = true) {
  std::vector<double> latencies_s;
  latencies_s.reserve(result.token_latencies_ms.size());
  for (double ms : result.token_latencies_ms) latencies_s.push_back(ms / 1000.0);
  metrics.generation(count_prompt ? result.prompt_tokens : 0, result.completion_tokens, result.ttft_ms / 1000.0,
                     latencies_s);
}

/// The sampling of choice `index` of a request: with a fixed seed, seed + index, so that
/// the choices differ and each is reproducible on its own.
SamplingParams choice_sampling(const SamplingParams& sampling, int64_t index) {
  SamplingParams s = sampling;
  if (s.seed) *s.seed += static_cast<uint64_t>(index);
  return s;
}

/// Runs generate(i) for each choice i of [0, n) concurrently: choice 0 on the calling
/// thread, every other on a thread of its own (the engine batches concurrent
/// generations). When one throws, `failed` is set (the others' callbacks read it and
/// cancel); once all have ended, the exception of the lowest failed choice is rethrown.
template <class F>
std::vector<GenerationResult> run_choices(int64_t n, std::atomic<bool>& failed, const F& generate) {
  std::vector<GenerationResult> results(static_cast<size_t>(n));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  auto run = [&](size_t i) {
    try {
      results[i] = generate(static_cast<int64_t>(i));
    } catch (...) {
      errors[i] = std::current_exception();
      failed = true;
    }
  };
  {
    std::vector<std::jthread> others;
    for (size_t i = 1; i < results.size(); ++i) others.emplace_back(run, i);
    run(0);
  }  // joined
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return results;
}

/// Writes the SSE stream of one request's choices to `sink` (concurrent choices write
/// through one lock, each event whole). Returns false when the client went away (the
/// generations are then cancelled through their callbacks: at once when a write fails, at
/// the next heartbeat when the client hangs up while nothing is written).
bool write_stream(Metrics& metrics, const std::atomic<bool>& stopping, StreamJob& job, httplib::DataSink& sink) {
  const ResponseMeta& meta = job.meta;
  const bool usage = job.request.include_usage;
  const ClientWatch client(job.remote_addr, job.remote_port);
  std::mutex write_mu;
  std::atomic<bool> open{true}, failed{false};
  auto send = [&](const json& payload) {
    const std::string event = sse_event(payload);
    std::lock_guard lock(write_mu);
    if (open && !sink.write(event.data(), event.size())) open = false;
    return open.load();
  };
  auto going = [&] { return open && !stopping && !failed && !client.gone(); };
  auto choice = [&](int64_t index) {
    if (meta.kind == RequestKind::kChat) send(role_chunk(meta, index, usage));
    std::vector<TokenLogprob> pending;  // of tokens whose text is withheld yet
    size_t sent = 0;                    // logprobs sent so far
    int64_t text_offset = 0;
    auto logprobs_of = [&](std::span<const TokenLogprob> lps) {
      sent += lps.size();
      return logprobs_json(meta, lps, text_offset);
    };
    GenerationResult result = job.generations[static_cast<size_t>(index)]->wait(
        [&](std::string_view piece, std::span<const TokenLogprob> logprobs) {
          if (!meta.tokenizer) {
            return piece.empty() ? going() : send(text_chunk(meta, index, piece, nullptr, usage)) && going();
          }
          pending.insert(pending.end(), logprobs.begin(), logprobs.end());
          if (piece.empty()) return going();  // a heartbeat, or tokens whose text is held
          json lps = logprobs_of(pending);
          pending.clear();
          return send(text_chunk(meta, index, piece, std::move(lps), usage)) && going();
        });
    // The logprobs of tokens whose text never came (a stop string withheld it), so that
    // the stream's logprobs are the whole response's.
    if (meta.tokenizer && sent < result.logprobs.size())
      send(text_chunk(meta, index, "", logprobs_of(std::span(result.logprobs).subspan(sent)), usage));
    if (!stopping && !failed) send(finish_chunk(meta, index, result.finish_reason, usage));
    return result;
  };
  try {
    std::vector<GenerationResult> results = run_choices(job.request.n, failed, choice);
    for (size_t i = 0; i < results.size(); ++i) record_generation(metrics, results[i], i == 0);
    // A generation cut short by shutdown must not look finished: say so as an error event.
    if (stopping) throw ApiError(503, "the server is shutting down; the answer is incomplete");
    if (usage) send(usage_chunk(meta, results));
  } catch (...) {
    // Headers (200) are gone already: report the error as an event, as OpenAI does.
    send(error_body(client_error(std::current_exception(), FailureStage::kGeneration, meta.id)));
  }
  if (open && sink.write(kSseDone.data(), kSseDone.size())) {
    sink.done();
    return true;
  }
  spdlog::info("http api: {}: the client hung up; generation stopped", meta.id);
  return false;
}

/// The request stage of a generation: the validated request and its prompt. Errors are
/// ApiErrors (client_error, FailureStage::kRequest: a template's or the engine's
/// kInvalidInput is the request's fault here, anything else the server's).
std::pair<ApiRequest, std::vector<int32_t>> read_request(const Engine& engine, const httplib::Request& req,
                                                         const ResponseMeta& meta) {
  try {
    const SamplingParams& defaults = engine.default_sampling();
    ApiRequest request = meta.kind == RequestKind::kChat ? parse_chat_request(req.body, defaults)
                                                         : parse_completion_request(req.body, defaults);
    // Only a chat request reads the template: a model without one still serves completions.
    const ChatTemplate* chat_template = request.kind == RequestKind::kChat ? &engine.chat_template() : nullptr;
    std::vector<int32_t> prompt = prompt_token_ids(request, chat_template, engine.tokenizer());
    check_context(request, int64_t(prompt.size()), engine.max_context());
    return {std::move(request), std::move(prompt)};
  } catch (...) {
    throw client_error(std::current_exception(), FailureStage::kRequest, meta.id);
  }
}

/// The engine's acceptance of each of a request's n choices (choice_sampling). Errors are
/// ApiErrors: the prompt not fitting the KV cache is the request's fault (400), a full
/// queue a 429; choices already accepted are then cancelled (dropped).
std::vector<std::unique_ptr<Generation>> start_generations(Engine& engine, const ApiRequest& request,
                                                           const std::vector<int32_t>& prompt,
                                                           const ResponseMeta& meta) {
  try {
    std::vector<std::unique_ptr<Generation>> generations;
    for (int64_t i = 0; i < request.n; ++i) generations.push_back(engine.start(prompt, choice_sampling(request.sampling, i)));
    return generations;
  } catch (...) {
    throw client_error(std::current_exception(), FailureStage::kRequest, meta.id);
  }
}

/// Serves one /v1/completions or /v1/chat/completions request whose response id is
/// meta.id. Whatever fails once the engine has accepted it is the server's fault.
void serve_generation(Engine& engine, Metrics& metrics, const std::atomic<bool>& stopping,
                      const httplib::Request& req, httplib::Response& res, ResponseMeta meta) {
  auto [request, prompt] = read_request(engine, req, meta);
  if (request.sampling.logprobs) meta.tokenizer = &engine.tokenizer();
  std::vector<std::unique_ptr<Generation>> generations = start_generations(engine, request, prompt, meta);

  if (!request.stream) {
    // Cancel when the client hangs up: nobody would read the answer, and it holds a
    // place in the batch (the heartbeat asks while nothing is produced).
    const ClientWatch client(req.remote_addr, req.remote_port);
    std::atomic<bool> failed{false};
    std::vector<GenerationResult> results = run_choices(request.n, failed, [&](int64_t index) {
      return generations[static_cast<size_t>(index)]->wait([&](std::string_view, std::span<const TokenLogprob>) {
        return !stopping.load() && !failed && !client.gone();
      });
    });
    for (size_t i = 0; i < results.size(); ++i) record_generation(metrics, results[i], i == 0);
    if (client.gone()) spdlog::info("http api: {}: the client hung up; generation stopped", meta.id);
    res.set_content(dump_json(response_body(meta, results)), kJson);
    return;
  }
  auto job = std::make_shared<StreamJob>(
      StreamJob{std::move(request), std::move(meta), std::move(generations), req.remote_addr, req.remote_port});
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [&metrics, &stopping, job](size_t, httplib::DataSink& sink) {
    return write_stream(metrics, stopping, *job, sink);
  });
}

json cluster_status_body(const Engine& engine) {
  json workers = json::array();
  for (const WorkerStatus& w : engine.cluster_status()) workers.push_back(worker_status_json(w));
  return {{"workers", workers}};
}

/// The 404 or 405 for a request to a path no route serves with its method; nullopt when
/// a route does.
std::optional<ApiError> routing_error(const httplib::Request& req, httplib::Response& res) {
  auto it = known_paths().find(req.path);
  if (it == known_paths().end())
    return ApiError(404, "no such endpoint: " + req.method + " " + req.path, "", "not_found_error");
  if (it->second.count(req.method)) return std::nullopt;
  std::string allow;
  for (const std::string& m : it->second) allow += (allow.empty() ? "" : ", ") + m;
  res.set_header("Allow", allow);
  return ApiError(405, "method " + req.method + " is not allowed on " + req.path + " (allowed: " + allow + ")");
}

/// The message for an error status httplib set itself, before or without a route.
std::string status_message(int status) {
  switch (status) {
    case 400: return "the request could not be read (malformed headers, chunked encoding or body)";
    case 413: return "request body is larger than " + std::to_string(kMaxBodyBytes >> 20) + " MiB";
    case 414: return "request URI is too long";
    case 415: return "unsupported Content-Encoding";
    case 416: return "requested range not satisfiable";
    default: return "request failed with HTTP status " + std::to_string(status);
  }
}

/// Gives every error response that has no body yet the OpenAI-style JSON error: the
/// 404 / 405 of unrouted requests and the statuses httplib sets itself (400 when it cannot
/// read a body, 413, ...). Handlers' own errors already carry a body and are left alone.
/// A 400 httplib sets before routing on an unknown path or method becomes that path's
/// 404 / 405, as the same request with a readable body would get.
httplib::Server::HandlerResponse fill_error_body(const httplib::Request& req, httplib::Response& res) {
  if (!res.body.empty() || res.status < 400) return httplib::Server::HandlerResponse::Unhandled;
  if (res.status == 404 || res.status == 400) {
    if (std::optional<ApiError> error = routing_error(req, res)) {
      send_error(res, *error);
      return httplib::Server::HandlerResponse::Handled;
    }
  }
  const char* type = res.status >= 500 ? "server_error" : "invalid_request_error";
  send_error(res, ApiError(res.status, status_message(res.status), "", type));
  return httplib::Server::HandlerResponse::Handled;
}

/// A POST / PUT / PATCH / DELETE with neither Content-Length nor Transfer-Encoding has an
/// empty body (RFC 9112 section 6.3), but httplib 0.11 reads such a body until the client
/// closes and then answers a bare 400 after its read timeout (curl -X POST with no -d
/// waits for it). Answer these at once: the route's 404 / 405, else the empty-body 400.
httplib::Server::HandlerResponse answer_bodyless(const httplib::Request& req, httplib::Response& res) {
  static const std::set<std::string> kWithBody = {"POST", "PUT", "PATCH", "DELETE"};
  if (!kWithBody.count(req.method) || req.has_header("Content-Length") || req.has_header("Transfer-Encoding"))
    return httplib::Server::HandlerResponse::Unhandled;
  std::optional<ApiError> error = routing_error(req, res);
  if (!error) error = ApiError(400, "request body is empty: send a JSON object (Content-Type: application/json)");
  send_error(res, *error);
  return httplib::Server::HandlerResponse::Handled;
}

/// The endpoint label of /metrics: the route's path, or "other" (bounded label values).
std::string endpoint_label(const std::string& path) {
  return known_paths().count(path) ? path : "other";
}

/// With an API key, the 401 for a request that does not carry it; nullopt when it does
/// (or the path is /health, which load balancers probe without credentials, or one of the
/// dashboard's static files, which hold no data).
std::optional<ApiError> check_api_key(const httplib::Request& req, const std::string& api_key) {
  if (api_key.empty() || req.path == "/health" || is_dashboard_file(req.path)) return std::nullopt;
  const std::string header = req.get_header_value("Authorization");
  const std::string scheme = "Bearer ";
  if (header.size() < scheme.size() || header.compare(0, scheme.size(), scheme) != 0) {
    return ApiError(401, "missing API key: send the header 'Authorization: Bearer <key>'");
  }
  if (!constant_time_equal(header.substr(scheme.size()), api_key)) return ApiError(401, "incorrect API key provided");
  return std::nullopt;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void check_api_listen(const Topology& topology, const std::string& host, uint16_t port) {
  ListenSpec listen;
  listen.what = "the HTTP API";
  listen.host = host;
  listen.port = port;
  listen.authenticated = !topology.api_key.empty();
  listen.insecure = topology.api_insecure;
  listen.insecure_key = "api.insecure";
  listen.remedy = "Create an API key with `charm secret new api.key` and set `api: {api_key_file: api.key}` in " +
                  topology.source.string() + "; clients then send `Authorization: Bearer <the file's text>`.";
  check_listen(listen);
}

HttpApi::HttpApi(Engine& engine, std::string host, uint16_t port, Metrics* metrics, HttpGuardOptions guard)
    : engine_(engine),
      own_metrics_(metrics ? nullptr : std::make_unique<Metrics>()),
      metrics_(metrics ? *metrics : *own_metrics_),
      host_(std::move(host)),
      port_(port),
      server_(std::make_unique<GuardedHttpServer>(guard)) {}

HttpApi::~HttpApi() { stop(); }

template <class Read>
void HttpApi::install_dashboard_routes(const Read& read) {
  GuardedHttpServer& s = *server_;
  for (const EmbeddedFile& f : dashboard_files()) {
    const EmbeddedFile* file = &f;
    auto serve = read([file](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-cache");
      res.set_content(file->bytes.data(), file->bytes.size(), dashboard_content_type(file->name));
    });
    // Routes are regular expressions to httplib: the name's dots are literal.
    std::string pattern = "/dashboard/";
    for (char c : f.name) pattern += c == '.' ? std::string("\\.") : std::string(1, c);
    s.Get(pattern, serve);
    if (f.name == "index.html") s.Get("/", serve);
  }
  s.Get("/dashboard/state", read([this](const httplib::Request&, httplib::Response& res) {
    guarded(res, new_request_id(), [&] {
      DashboardInputs in;
      in.model = engine_.model_name();
      in.uptime_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_steady_).count();
      in.workers = engine_.cluster_status();
      in.load = engine_.load();
      in.routing = engine_.routing_counts();
      in.metrics = metrics_.summary();
      res.set_header("Cache-Control", "no-store");
      res.set_content(dump_json(dashboard_state(in)), kJson);
    });
  }));
}

void HttpApi::install_routes() {
  GuardedHttpServer& s = *server_;
  // A route's handler runs once its request, body included, has arrived: from then on
  // the guard's read deadline does not apply (a response may stream for minutes).
  GuardedHttpServer* guard = server_.get();
  auto read = [guard](auto handler) {
    return [guard, handler](const httplib::Request& req, httplib::Response& res) {
      guard->request_read(req);
      handler(req, res);
    };
  };
  s.Get("/health", read([this](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump_json({{"status", "ok"}, {"model", engine_.model_name()}}), kJson);
  }));
  s.Get("/v1/models", read([this](const httplib::Request&, httplib::Response& res) {
    json model = {{"id", engine_.model_name()}, {"object", "model"}, {"created", started_at_}, {"owned_by", "charm"},
                  {"max_model_len", engine_.max_context()}};
    res.set_content(dump_json({{"object", "list"}, {"data", json::array({model})}}), kJson);
  }));
  s.Get("/cluster/status", read([this](const httplib::Request&, httplib::Response& res) {
    guarded(res, new_request_id(), [&] { res.set_content(dump_json(cluster_status_body(engine_)), kJson); });
  }));
  s.Get("/metrics", read([this](const httplib::Request&, httplib::Response& res) {
    guarded(res, new_request_id(), [&] {
      const EngineLoad load = engine_.load();
      res.set_content(metrics_.render(engine_.cluster_status(), &load), "text/plain; version=0.0.4; charset=utf-8");
    });
  }));
  install_dashboard_routes(read);
  for (const auto& [path, endpoint] : {std::pair{"/v1/completions", RequestKind::kCompletion},
                                       std::pair{"/v1/chat/completions", RequestKind::kChat}}) {
    const RequestKind kind = endpoint;  // a structured binding cannot be captured (clang 14)
    s.Post(path, read([this, kind](const httplib::Request& req, httplib::Response& res) {
      ResponseMeta meta = new_response_meta(kind, engine_.model_name());
      const std::string id = meta.id;
      guarded(res, id, [&] { serve_generation(engine_, metrics_, stopping_, req, res, std::move(meta)); });
    }));
  }
  // Every other method on a known path is answered 405 by fill_routing_error.
  for (const auto& [path, methods] : known_paths()) {
    auto not_allowed = [](const httplib::Request&, httplib::Response& res) { res.status = 404; };
    if (!methods.count("GET")) s.Get(path, not_allowed);
    if (!methods.count("POST")) s.Post(path, httplib::Server::Handler(not_allowed));
    s.Put(path, httplib::Server::Handler(not_allowed));
    s.Patch(path, httplib::Server::Handler(not_allowed));
    s.Delete(path, httplib::Server::Handler(not_allowed));
  }
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (std::optional<ApiError> error = check_api_key(req, api_key_)) {
      res.set_header("WWW-Authenticate", "Bearer");
      json body = error_body(*error);
      body["error"]["code"] = "invalid_api_key";  // as OpenAI answers a bad key
      res.status = 401;
      res.set_content(dump_json(body), kJson);
      return httplib::Server::HandlerResponse::Handled;
    }
    return answer_bodyless(req, res);
  });
  // Counted after the response is written (streams included), whatever answered it.
  s.set_logger([this, guard](const httplib::Request& req, const httplib::Response& res) {
    guard->response_done(req);  // a keep-alive connection now reads its next request
    metrics_.http_request(endpoint_label(req.path), res.status);
  });
  s.set_error_handler(httplib::Server::HandlerWithResponse(fill_error_body));
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    const std::string id = new_request_id();
    res.set_header("X-Request-Id", id);
    send_error(res, client_error(ep, FailureStage::kGeneration, id));
  });
  s.set_payload_max_length(kMaxBodyBytes);
  // httplib's default also sets SO_REUSEPORT, which lets a second server bind the same
  // port silently; keep only SO_REUSEADDR (quick restarts) so a port in use is an error.
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
}

void HttpApi::start() {
  if (thread_.joinable()) fail_internal("HttpApi::start called twice");
  install_routes();
  started_at_ = unix_now();
  started_steady_ = std::chrono::steady_clock::now();
  int port = port_;
  if (port_ == 0) {
    port = server_->bind_to_any_port(host_);
    if (port < 0) fail_io("http api: cannot bind " + host_ + " on any port");
  } else if (!server_->bind_to_port(host_, port_)) {
    fail_io("http api: cannot bind " + host_ + ":" + std::to_string(port_) + " (in use, or not a local address?)");
  }
  bound_port_ = uint16_t(port);
  server_->guard(bound_port_);
  thread_ = std::thread([this] {
    if (!server_->listen_after_bind() && !stopping_) spdlog::error("http api: server on {}:{} ended", host_, bound_port_);
    listen_ended_ = true;
  });
  // httplib's stop() does nothing until the listen loop has started: wait for it, so
  // that a stop() right after start() is not lost.
  while (!server_->is_running() && !listen_ended_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void HttpApi::stop() {
  stopping_ = true;
  if (!thread_.joinable()) return;
  while (!listen_ended_) {
    server_->stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  thread_.join();
}

}  // namespace charm
