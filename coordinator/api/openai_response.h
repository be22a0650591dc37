// Response bodies of the OpenAI-compatible API: whole responses, Server-Sent-Event
// chunks and error objects, shaped as the OpenAI API reference shows them (and as the
// official `openai` Python client parses them).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "coordinator/api/openai_request.h"
#include "coordinator/engine.h"

namespace charm {

/// What every body and chunk of one response repeats.
struct ResponseMeta {
  RequestKind kind = RequestKind::kCompletion;
  std::string id;          ///< "cmpl-<hex>" or "chatcmpl-<hex>"
  int64_t created = 0;     ///< Unix seconds
  std::string model;
};

/// A fresh ResponseMeta with a random id and the current time.
ResponseMeta new_response_meta(RequestKind kind, const std::string& model);

/// The non-streamed body: object "text_completion" (choices[{text, index, logprobs,
/// finish_reason}]) or "chat.completion" (choices[{index, message{role, content},
/// logprobs, finish_reason}]), plus usage.
nlohmann::json response_body(const ResponseMeta& meta, const GenerationResult& result);

/// The first chunk of a chat stream: delta {role: "assistant", content: ""}.
nlohmann::json role_chunk(const ResponseMeta& meta, bool include_usage);
/// A chunk carrying one piece of generated text (delta.content or text).
nlohmann::json text_chunk(const ResponseMeta& meta, std::string_view text, bool include_usage);
/// The chunk that ends the choice: empty delta / text and finish_reason.
nlohmann::json finish_chunk(const ResponseMeta& meta, const std::string& finish_reason, bool include_usage);
/// The usage chunk sent last when stream_options.include_usage: choices [] and usage.
nlohmann::json usage_chunk(const ResponseMeta& meta, const GenerationResult& result);

/// {"error": {"message", "type", "param" (null when empty), "code": null}}.
nlohmann::json error_body(const ApiError& error);

/// One Server-Sent Event: "data: <json>\n\n". Invalid UTF-8 is replaced, never thrown on.
std::string sse_event(const nlohmann::json& payload);
/// The event that ends every stream.
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

/// JSON text of `value`, replacing invalid UTF-8 rather than throwing.
std::string dump_json(const nlohmann::json& value);

}  // namespace charm
