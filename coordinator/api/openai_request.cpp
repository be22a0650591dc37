// Request parsing for the OpenAI-compatible API; see openai_request.h.
#include "coordinator/api/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/json_reader.h"

namespace charm {

using json = nlohmann::json;

ApiError::ApiError(int status, const std::string& message, std::string param, std::string type)
    : std::runtime_error(message), status_(status), param_(std::move(param)), type_(std::move(type)) {}

namespace {

[[noreturn]] void reject(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

/// Tracks where the parser is ("messages[0].content") from nlohmann's parse events, so
/// that a limit the parser enforces inside a value (a number overflowing a double, a
/// container nested too deep) can name the field. Elements of arrays are counted as they end.
class FieldPath {
 public:
  void on_event(int, json::parse_event_t event, const json& parsed) {
    using E = json::parse_event_t;
    switch (event) {
      case E::object_start: frames_.push_back({false, "", 0}); break;
      case E::array_start: frames_.push_back({true, "", 0}); break;
      case E::key:
        if (!frames_.empty() && parsed.is_string()) frames_.back().key = parsed.get<std::string>();
        break;
      case E::object_end:
      case E::array_end:
        if (!frames_.empty()) frames_.pop_back();
        next_element();
        break;
      case E::value: next_element(); break;
    }
  }

  /// The field being parsed, e.g. "temperature" or "messages[0].content"; "" at the top.
  std::string current() const {
    std::string path;
    for (const Frame& f : frames_) {
      if (f.array) {
        path += "[" + std::to_string(f.index) + "]";
      } else if (!f.key.empty()) {
        path += (path.empty() ? "" : ".") + f.key;
      }
    }
    return path;
  }

 private:
  struct Frame {
    bool array;
    std::string key;
    size_t index;
  };
  void next_element() {
    if (!frames_.empty() && frames_.back().array) frames_.back().index++;
  }
  std::vector<Frame> frames_;
};

json parse_body(std::string_view body) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos)
    throw ApiError(400, "request body is empty: send a JSON object (Content-Type: application/json)");
  json doc;
  FieldPath path;
  try {
    doc = parse_json(body, "request body", kHttpJsonLimits,
                     [&path](int depth, json::parse_event_t event, const json& parsed) {
                       path.on_event(depth, event, parsed);
                     });
  } catch (const JsonLimitError& e) {
    // Over a limit inside a value: name the field where it happened.
    std::string param = path.current();
    // A path 60 levels deep says little more than its start; the param keeps all of it.
    const std::string shown = param.size() > 80 ? param.substr(0, 60) + "..." : param;
    throw ApiError(400, (param.empty() ? std::string() : "'" + shown + "': ") + e.message(), param);
  } catch (const Error& e) {
    throw ApiError(400, e.message());
  }
  if (!doc.is_object()) throw ApiError(400, "request body must be a JSON object");
  return doc;
}

/// The field `key` if present and not null, else nullptr.
const json* field(const json& doc, const char* key) {
  auto it = doc.find(key);
  if (it == doc.end() || it->is_null()) return nullptr;
  return &*it;
}

double number_field(const json& doc, const char* key, double fallback) {
  const json* v = field(doc, key);
  if (!v) return fallback;
  if (!v->is_number()) reject(key, std::string("'") + key + "' must be a number");
  double x = v->get<double>();
  if (!std::isfinite(x)) reject(key, std::string("'") + key + "' must be finite");
  return x;
}

int64_t integer_field(const json& doc, const char* key, int64_t fallback) {
  const json* v = field(doc, key);
  if (!v) return fallback;
  if (!v->is_number_integer()) reject(key, std::string("'") + key + "' must be an integer");
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    reject(key, std::string("'") + key + "' is too large");
  return v->get<int64_t>();
}

bool bool_field(const json& doc, const char* key, bool fallback) {
  const json* v = field(doc, key);
  if (!v) return fallback;
  if (!v->is_boolean()) reject(key, std::string("'") + key + "' must be a boolean");
  return v->get<bool>();
}

std::vector<std::string> stop_field(const json& doc) {
  const json* v = field(doc, "stop");
  if (!v) return {};
  std::vector<std::string> stops;
  auto add = [&](const json& s) {
    if (!s.is_string()) reject("stop", "'stop' must be a string or a list of strings");
    if (s.get_ref<const std::string&>().empty()) reject("stop", "'stop' strings must not be empty");
    stops.push_back(s.get<std::string>());
  };
  if (v->is_array()) {
    for (const json& s : *v) add(s);
  } else {
    add(*v);
  }
  return stops;
}

/// Fields both endpoints share: sampling, stopping, n, stream and stream_options.
/// `max_tokens_key` names the field that set max_tokens, for error messages.
void parse_common(const json& doc, const SamplingParams& defaults, ApiRequest& req) {
  SamplingParams& s = req.sampling;
  s.temperature = number_field(doc, "temperature", defaults.temperature);
  if (s.temperature < 0) reject("temperature", "'temperature' must be >= 0");
  s.top_p = number_field(doc, "top_p", defaults.top_p);
  if (!(s.top_p > 0 && s.top_p <= 1)) reject("top_p", "'top_p' must be in (0, 1]");
  // top_k is charm's extension (as vLLM and llama.cpp accept it); -1 also means off.
  s.top_k = integer_field(doc, "top_k", defaults.top_k);
  if (s.top_k < -1) reject("top_k", "'top_k' must be >= 0 (0 or -1 = off)");
  if (s.top_k == -1) s.top_k = 0;
  // Newer OpenAI clients send max_completion_tokens for chat; it wins over max_tokens.
  const char* max_key = field(doc, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  req.max_tokens_given = field(doc, max_key) != nullptr;
  s.max_tokens = integer_field(doc, max_key, kDefaultMaxTokens);
  if (s.max_tokens < 1) reject(max_key, std::string("'") + max_key + "' must be >= 1");
  if (const json* seed = field(doc, "seed")) {
    if (!seed->is_number_integer()) reject("seed", "'seed' must be an integer");
    s.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : uint64_t(seed->get<int64_t>());
  }
  s.stop = stop_field(doc);
  // OpenAI's penalties, and vLLM's repetition_penalty extension.
  for (auto [key, out, fallback] : {std::tuple{"frequency_penalty", &s.frequency_penalty, defaults.frequency_penalty},
                                    std::tuple{"presence_penalty", &s.presence_penalty, defaults.presence_penalty}}) {
    *out = number_field(doc, key, fallback);
    if (!(*out >= -2 && *out <= 2)) reject(key, std::string("'") + key + "' must be in [-2, 2]");
  }
  s.repetition_penalty = number_field(doc, "repetition_penalty", defaults.repetition_penalty);
  if (!(s.repetition_penalty > 0)) reject("repetition_penalty", "'repetition_penalty' must be > 0 (1 = off)");
  req.n = integer_field(doc, "n", 1);
  if (req.n < 1 || req.n > kMaxChoices)
    reject("n", "'n' must be in [1, " + std::to_string(kMaxChoices) + "]");
  req.stream = bool_field(doc, "stream", false);
  if (const json* opts = field(doc, "stream_options")) {
    if (!opts->is_object()) reject("stream_options", "'stream_options' must be an object");
    if (!req.stream) reject("stream_options", "'stream_options' is only allowed with stream: true");
    req.include_usage = bool_field(*opts, "include_usage", false);
  }
}

[[noreturn]] void unsupported(const std::string& key, const std::string& what) {
  reject(key, "'" + key + "' is not supported" + what);
}

/// Fields that would change what OpenAI returns and that charm cannot honour: rejected
/// when they ask for something, accepted when they hold the value meaning "off" (clients
/// that send every field with its default keep working). See docs/api.md.
void reject_unsupported(const json& doc, RequestKind kind) {
  // Completions-only: echo the prompt, best_of sampling, insertion suffix.
  if (kind == RequestKind::kCompletion) {
    if (bool_field(doc, "echo", false)) unsupported("echo", " (only false)");
    if (field(doc, "best_of") && integer_field(doc, "best_of", 1) != 1) unsupported("best_of", " (only 1)");
    if (const json* suffix = field(doc, "suffix")) {
      if (!suffix->is_string()) reject("suffix", "'suffix' must be a string");
      if (!suffix->get_ref<const std::string&>().empty()) unsupported("suffix", " (only null or \"\")");
    }
  }
  if (const json* bias = field(doc, "logit_bias")) {
    if (!bias->is_object()) reject("logit_bias", "'logit_bias' must be an object");
    if (!bias->empty()) unsupported("logit_bias", " (only {})");
  }
  // Tool calling and structured output change what the answer must look like; charm
  // neither parses tool calls nor constrains decoding yet, so it says so.
  for (const char* key : {"tools", "functions"}) {
    const json* v = field(doc, key);
    if (v && !(v->is_array() && v->empty())) unsupported(key, " (tool calling is not implemented)");
  }
  for (const char* key : {"tool_choice", "function_call"}) {
    const json* v = field(doc, key);
    if (v && !(v->is_string() && v->get_ref<const std::string&>() == "none")) unsupported(key, " (only \"none\")");
  }
  if (const json* format = field(doc, "response_format")) {
    if (!format->is_object() || format->value("type", std::string()) != "text")
      unsupported("response_format", " (only {\"type\": \"text\"})");
  }
}

/// logprobs and top_logprobs in the endpoint's spelling. Chat: `logprobs` a boolean and
/// `top_logprobs` 0..kMaxTopLogprobs, which needs logprobs: true. Completions (legacy):
/// `logprobs` an integer 0..kMaxCompletionLogprobs, the number of alternatives (0: the
/// sampled token's only); `top_logprobs` is not a completions field and only 0 passes.
void parse_logprobs(const json& doc, ApiRequest& req) {
  SamplingParams& s = req.sampling;
  if (req.kind == RequestKind::kChat) {
    s.logprobs = bool_field(doc, "logprobs", false);
    s.top_logprobs = integer_field(doc, "top_logprobs", 0);
    if (s.top_logprobs < 0 || s.top_logprobs > kMaxTopLogprobs)
      reject("top_logprobs", "'top_logprobs' must be in [0, " + std::to_string(kMaxTopLogprobs) + "]");
    if (s.top_logprobs > 0 && !s.logprobs)
      reject("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    return;
  }
  if (const json* lp = field(doc, "logprobs")) {
    if (!lp->is_number_integer()) reject("logprobs", "'logprobs' must be an integer on /v1/completions");
    const int64_t count = integer_field(doc, "logprobs", 0);
    if (count < 0 || count > kMaxCompletionLogprobs)
      reject("logprobs", "'logprobs' must be in [0, " + std::to_string(kMaxCompletionLogprobs) + "]");
    s.logprobs = true;
    s.top_logprobs = count;
  }
  if (integer_field(doc, "top_logprobs", 0) != 0)
    unsupported("top_logprobs", " on /v1/completions (send 'logprobs': N for N alternatives)");
}

/// Token ids given as the prompt: [int, ...] or [[int, ...]].
std::vector<int32_t> token_ids(const json& ids) {
  std::vector<int32_t> out;
  for (const json& id : ids) {
    if (!id.is_number_integer()) reject("prompt", "'prompt' token ids must be integers");
    int64_t v = id.get<int64_t>();
    if (v < 0 || v > std::numeric_limits<int32_t>::max()) reject("prompt", "'prompt' token id out of range");
    out.push_back(int32_t(v));
  }
  return out;
}

void parse_prompt(const json& doc, ApiRequest& req) {
  const json* p = field(doc, "prompt");
  if (!p) reject("prompt", "'prompt' is required");
  if (p->is_string()) {
    req.prompt_text = p->get<std::string>();
    return;
  }
  if (!p->is_array()) reject("prompt", "'prompt' must be a string, a list of one string, or token ids");
  if (p->empty()) reject("prompt", "'prompt' must not be empty");
  const json& first = (*p)[0];
  if (first.is_string() || first.is_array()) {
    // Several prompts in one request: not supported (one request per prompt; those are batched).
    if (p->size() != 1) reject("prompt", "only one prompt per request is supported");
    if (first.is_string()) {
      req.prompt_text = first.get<std::string>();
    } else {
      req.has_prompt_ids = true;
      req.prompt_ids = token_ids(first);
    }
    return;
  }
  req.has_prompt_ids = true;
  req.prompt_ids = token_ids(*p);
}

/// Message content: a string, null (e.g. an assistant turn of tool calls), or a list of
/// {type: "text", text} parts, which are joined.
std::string message_content(const json& content, size_t index) {
  std::string param = "messages[" + std::to_string(index) + "].content";
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) reject(param, "'" + param + "' must be a string or a list of text parts");
  std::string text;
  for (const json& part : content) {
    if (!part.is_object()) reject(param, "'" + param + "' parts must be objects");
    const json* type = field(part, "type");
    if (!type || !type->is_string() || type->get<std::string>() != "text")
      reject(param, "'" + param + "' supports only parts of type 'text'");
    const json* t = field(part, "text");
    if (!t || !t->is_string()) reject(param, "'" + param + "' text part needs a string 'text'");
    text += t->get<std::string>();
  }
  return text;
}

void parse_messages(const json& doc, ApiRequest& req) {
  static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant", "tool"};
  const json* m = field(doc, "messages");
  if (!m) reject("messages", "'messages' is required");
  if (!m->is_array()) reject("messages", "'messages' must be a list");
  if (m->empty()) reject("messages", "'messages' must not be empty");
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    std::string at = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) reject(at, "'" + at + "' must be an object");
    const json* role = field(msg, "role");
    if (!role || !role->is_string()) reject(at + ".role", "'" + at + ".role' must be a string");
    std::string r = role->get<std::string>();
    if (!kRoles.count(r)) reject(at + ".role", "'" + at + ".role' is '" + r + "', not one of system, developer, user, assistant, tool");
    if (!msg.contains("content") && r != "assistant") reject(at + ".content", "'" + at + ".content' is required");
    std::string content = msg.contains("content") ? message_content(msg["content"], i) : "";
    req.messages.push_back({r, content});
    nlohmann::ordered_json copy = nlohmann::ordered_json::parse(msg.dump());
    copy["content"] = content;
    req.messages_json.push_back(std::move(copy));
  }
  if (const json* kwargs = field(doc, "chat_template_kwargs")) {
    if (!kwargs->is_object()) reject("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    req.template_kwargs = nlohmann::ordered_json::parse(kwargs->dump());
  }
}

/// Runs `parse` on the body, turning any nlohmann error that slipped past the field checks
/// into a 400 (a request must never make a 500).
template <class F>
ApiRequest parse_request(std::string_view body, F&& parse) {
  json doc = parse_body(body);
  try {
    return parse(doc);
  } catch (const json::exception& e) {
    throw ApiError(400, std::string("invalid request: ") + e.what());
  }
}

}  // namespace

ApiRequest parse_completion_request(std::string_view body, const SamplingParams& defaults) {
  return parse_request(body, [&](const json& doc) {
    ApiRequest req;
    req.kind = RequestKind::kCompletion;
    parse_prompt(doc, req);
    parse_common(doc, defaults, req);
    parse_logprobs(doc, req);
    reject_unsupported(doc, req.kind);
    return req;
  });
}

ApiRequest parse_chat_request(std::string_view body, const SamplingParams& defaults) {
  return parse_request(body, [&](const json& doc) {
    ApiRequest req;
    req.kind = RequestKind::kChat;
    parse_messages(doc, req);
    parse_common(doc, defaults, req);
    parse_logprobs(doc, req);
    reject_unsupported(doc, req.kind);
    return req;
  });
}

void check_context(ApiRequest& request, int64_t prompt_tokens, int64_t max_context) {
  const char* prompt_param = request.kind == RequestKind::kChat ? "messages" : "prompt";
  if (prompt_tokens < 1) reject(prompt_param, std::string("'") + prompt_param + "' encodes to no tokens");
  if (prompt_tokens >= max_context)
    reject(prompt_param, "the prompt is " + std::to_string(prompt_tokens) + " tokens; the model's context is " +
                             std::to_string(max_context));
  // vLLM's default: what the context leaves, capped at the documented default; >= 1 here
  // since the prompt leaves at least one position.
  if (!request.max_tokens_given)
    request.sampling.max_tokens = std::min(kDefaultMaxTokens, max_context - prompt_tokens);
  // Subtracted, never added: max_tokens comes from the client and may be near INT64_MAX.
  if (request.sampling.max_tokens > max_context - prompt_tokens)
    reject("max_tokens", "prompt (" + std::to_string(prompt_tokens) + " tokens) + max_tokens (" +
                             std::to_string(request.sampling.max_tokens) + ") exceeds the model's context of " +
                             std::to_string(max_context));
}

std::vector<int32_t> prompt_token_ids(const ApiRequest& req, const ChatTemplate* chat_template,
                                      const Tokenizer& tokenizer) {
  if (req.kind == RequestKind::kChat) {
    if (chat_template == nullptr) fail_internal("prompt_token_ids: a chat request without a chat template");
    const std::string text =
        chat_template->render_json(req.messages_json, /*add_generation_prompt=*/true, req.template_kwargs);
    return tokenizer.encode(text, /*parse_special=*/true);
  }
  if (!req.has_prompt_ids) return tokenizer.encode_prompt(req.prompt_text);  // with BOS where the model wants one
  for (int32_t id : req.prompt_ids)
    if (id >= tokenizer.vocab_size())
      throw ApiError(400, "'prompt' token id " + std::to_string(id) + " is outside the vocabulary of " +
                              std::to_string(tokenizer.vocab_size()),
                     "prompt");
  return req.prompt_ids;
}

}  // namespace charm
