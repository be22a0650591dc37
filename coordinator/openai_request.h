// Parsing and validation of OpenAI-style request bodies (/v1/completions and
// /v1/chat/completions) into what Engine::generate needs. Follows the OpenAI API
// reference for field names, types and defaults; charm's extension is `top_k`.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/chat_template.h"
#include "coordinator/engine.h"

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
  bool stream = false;
  bool include_usage = false;         ///< stream_options.include_usage
};

/// The default max_tokens when a request names none (OpenAI's own default varies by
/// model; charm documents 256 in docs/api.md).
inline constexpr int64_t kDefaultMaxTokens = 256;

/// Parses a /v1/completions body. Throws ApiError(400) naming the field for invalid JSON,
/// a missing or mistyped prompt, n != 1, and out-of-range sampling fields
/// (see parse_sampling).
ApiRequest parse_completion_request(std::string_view body);

/// Parses a /v1/chat/completions body. Throws ApiError(400) naming the field for invalid
/// JSON, missing or empty `messages`, a message without a string role, a role other than
/// system/developer/user/assistant/tool, content that is neither a string, null nor a
/// list of {type:"text", text} parts, `chat_template_kwargs` that is not an object, and
/// out-of-range sampling fields.
ApiRequest parse_chat_request(std::string_view body);

/// Checks that prompt_tokens + max_tokens fit in `max_context`. Throws ApiError(400) with
/// param "max_tokens" (or the prompt field when the prompt alone fills the context).
void check_context(const ApiRequest& request, int64_t prompt_tokens, int64_t max_context);

}  // namespace charm
