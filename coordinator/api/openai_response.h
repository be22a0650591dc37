// Response bodies of the OpenAI-compatible API: whole responses, Server-Sent-Event
// chunks and error objects, shaped as the OpenAI API reference shows them (and as the
// official `openai` Python client parses them).
#pragma once

#include <cstdint>
#include <span>
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
  /// Set when the request asked for logprobs (it renders their tokens' text and bytes);
  /// null otherwise, and every choice's "logprobs" is null. Must outlive the meta.
  const Tokenizer* tokenizer = nullptr;
};

/// The logprob the API reports for a -infinity one (JSON has no infinity): vLLM's -9999.
inline constexpr double kMinReportedLogprob = -9999.0;

/// OpenAI's "logprobs" of one choice for `logprobs` (its tokens in order; meta.tokenizer
/// must be set). A token's text is the tokenizer's decoding of that one id, invalid UTF-8
/// (a byte-level token that is part of a character) replaced by U+FFFD; its raw bytes
/// are chat's "bytes". Chat: {"content": [{token, logprob, bytes, top_logprobs:
/// [{token, logprob, bytes}, ...]}, ...]}. Completions: {"tokens", "token_logprobs",
/// "top_logprobs": [{text: logprob, ...}, ...] (a text two alternatives share keeps the
/// likelier), "text_offset"}; text_offset counts characters (code points) of the token
/// texts, as vLLM does, starting from `text_offset`, which is advanced past these tokens
/// (a stream passes the running count of its choice). Logprobs of -infinity are
/// reported as kMinReportedLogprob.
nlohmann::json logprobs_json(const ResponseMeta& meta, std::span<const TokenLogprob> logprobs, int64_t& text_offset);

/// A fresh ResponseMeta with a random id and the current time.
ResponseMeta new_response_meta(RequestKind kind, const std::string& model);

/// The non-streamed body: object "text_completion" (choices[{text, index, logprobs,
/// finish_reason}]) or "chat.completion" (choices[{index, message{role, content},
/// logprobs, finish_reason}]), choice i from choices[i], plus usage (usage_of).
nlohmann::json response_body(const ResponseMeta& meta, std::span<const GenerationResult> choices);

/// The usage of a response of `choices` (generations of one prompt): the prompt counted
/// once, the completion tokens of every choice summed.
nlohmann::json usage_of(std::span<const GenerationResult> choices);

/// The first chunk of a chat stream's choice `index`: delta {role: "assistant", content: ""}.
nlohmann::json role_chunk(const ResponseMeta& meta, int64_t index, bool include_usage);
/// A chunk of choice `index` carrying one piece of generated text (delta.content or text)
/// and the logprobs of the tokens it came from (`logprobs`: logprobs_json's object, or
/// null).
nlohmann::json text_chunk(const ResponseMeta& meta, int64_t index, std::string_view text, nlohmann::json logprobs,
                          bool include_usage);
/// The chunk that ends choice `index`: empty delta / text and finish_reason.
nlohmann::json finish_chunk(const ResponseMeta& meta, int64_t index, const std::string& finish_reason,
                            bool include_usage);
/// The usage chunk sent last when stream_options.include_usage: choices [] and usage.
nlohmann::json usage_chunk(const ResponseMeta& meta, std::span<const GenerationResult> choices);

/// {"error": {"message", "type", "param" (null when empty), "code": null}}.
nlohmann::json error_body(const ApiError& error);

/// One Server-Sent Event: "data: <json>\n\n". Invalid UTF-8 is replaced, never thrown on.
std::string sse_event(const nlohmann::json& payload);
/// The event that ends every stream.
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

/// JSON text of `value`, replacing invalid UTF-8 rather than throwing.
std::string dump_json(const nlohmann::json& value);

}  // namespace charm
