// Parsing and validation of OpenAI-style request bodies (/v1/completions and
// /v1/chat/completions) into what Engine::generate needs. Follows the OpenAI API
// reference for field names, types and defaults; charm's extensions are `top_k` and
// `repetition_penalty` (as vLLM accepts them).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/sampling_params.h"
#include "coordinator/text/chat_template.h"
#include "coordinator/text/tokenizer.h"

namespace charm {

/// A request the API rejects or fails: the HTTP status, the OpenAI error `type`
/// ("invalid_request_error", "server_error", ...), a message and the request field at
/// fault (`param`, empty when no one field is). Rendered by error_body().
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = "",
           std::string type = "invalid_request_error");
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& type() const { return type_; }

 private:
  int status_;
  std::string param_;
  std::string type_;
};

/// Which endpoint a request came to.
enum class RequestKind { kCompletion, kChat };

/// A validated request. Exactly one of prompt_text / prompt_ids / messages is the prompt:
/// completions carry prompt_text, or prompt_ids when the client sent token ids
/// (`has_prompt_ids`); chat carries messages.
struct ApiRequest {
  RequestKind kind = RequestKind::kCompletion;
  std::string prompt_text;
  bool has_prompt_ids = false;
  std::vector<int32_t> prompt_ids;
  std::vector<ChatMessage> messages;
  /// The chat messages as sent, each with `content` made a string (text parts joined,
  /// null -> ""), other keys (tool_calls, reasoning_content, ...) kept for the template.
  nlohmann::ordered_json messages_json = nlohmann::ordered_json::array();
  /// Extra template variables (vLLM's `chat_template_kwargs` extension, e.g.
  /// {"enable_thinking": false} for Qwen3); an object.
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  SamplingParams sampling;            ///< defaults: temperature 1, top_p 1, max_tokens 256
  /// Whether the client sent max_tokens / max_completion_tokens. When not, check_context
  /// lowers the default to what the context leaves (as vLLM does).
  bool max_tokens_given = false;
  bool stream = false;
  bool include_usage = false;         ///< stream_options.include_usage
  /// How many choices to generate (OpenAI's `n`), 1..kMaxChoices, each its own
  /// generation of the same prompt (with a fixed seed, choice i samples with seed + i).
  int64_t n = 1;
};

/// The most choices (`n`) one request may ask for.
inline constexpr int64_t kMaxChoices = 16;
/// The most alternatives chat's `top_logprobs` may ask for (OpenAI's limit).
inline constexpr int64_t kMaxTopLogprobs = 20;
/// The most alternatives the completions endpoint's integer `logprobs` may ask for
/// (OpenAI's limit for the legacy endpoint).
inline constexpr int64_t kMaxCompletionLogprobs = 5;

/// The default max_tokens when a request names none (OpenAI's own default varies by
/// model; charm documents 256 in docs/api.md), lowered to the context the prompt leaves.
inline constexpr int64_t kDefaultMaxTokens = 256;

/// Parses a /v1/completions body; the sampling fields the body leaves out (temperature,
/// top_p, top_k, the penalties) come from `defaults` (the model's,
/// Engine::default_sampling). `logprobs` is the legacy integer: N >= 0 asks for the
/// sampled tokens' logprobs and N alternatives each. Throws ApiError(400) naming the
/// field for invalid JSON (a number that overflows a double names its field), a missing
/// or mistyped prompt, n outside [1, kMaxChoices], out-of-range sampling fields
/// (frequency_penalty / presence_penalty outside [-2, 2], repetition_penalty <= 0,
/// logprobs outside [0, kMaxCompletionLogprobs]), and fields asking for what charm does
/// not do (echo, best_of != 1, suffix, top_logprobs, logit_bias). Never throws anything
/// but ApiError.
ApiRequest parse_completion_request(std::string_view body, const SamplingParams& defaults = {});

/// Parses a /v1/chat/completions body (sampling defaults as parse_completion_request). Throws ApiError(400) naming the field for invalid
/// JSON, missing or empty `messages`, a message without a string role, a role other than
/// system/developer/user/assistant/tool, content that is neither a string, null nor a
/// list of {type:"text", text} parts, `chat_template_kwargs` that is not an object,
/// out-of-range sampling fields (as completions; `logprobs` must be a boolean and
/// `top_logprobs` in [0, kMaxTopLogprobs], non-zero only with logprobs: true), and
/// logit_bias asked for. Never throws anything but ApiError.
ApiRequest parse_chat_request(std::string_view body, const SamplingParams& defaults = {});

/// Checks that prompt_tokens + max_tokens fit in `max_context`. When the client gave no
/// max_tokens, first sets request.sampling.max_tokens to min(kDefaultMaxTokens,
/// max_context - prompt_tokens) (vLLM's rule), so a default never rejects a prompt that
/// fits. Throws ApiError(400) with the prompt field ("prompt" / "messages") when the
/// prompt is empty or alone fills the context, and with param "max_tokens" when an
/// explicit max_tokens (or max_completion_tokens) does not fit.
void check_context(ApiRequest& request, int64_t prompt_tokens, int64_t max_context);

/// The prompt's token ids: the client's ids (checked against the vocabulary, taken as
/// they are), the completion prompt encoded with the tokenizer's special tokens around it
/// (Tokenizer::encode_prompt: Llama's BOS, as transformers' tokenizer(prompt) adds it), or the chat rendered with `chat_template` (render_json, so
/// keys beyond role/content and chat_template_kwargs reach it as apply_chat_template
/// passes them) and encoded with special tokens parsed (the template writes them as
/// text). `chat_template` is read only for a chat request (it may be null otherwise).
/// Throws ApiError(400) naming "prompt" for an id outside the vocabulary, Error(kInternal)
/// for a chat request without a template, and what render_json and Tokenizer::encode
/// throw (charm::Error).
std::vector<int32_t> prompt_token_ids(const ApiRequest& request, const ChatTemplate* chat_template,
                                      const Tokenizer& tokenizer);

}  // namespace charm
