// Response bodies of the OpenAI-compatible API; see openai_response.h.
#include "coordinator/api/openai_response.h"

#include <chrono>
#include <cstdio>
#include <random>

namespace charm {

using json = nlohmann::json;

namespace {

bool is_chat(const ResponseMeta& meta) { return meta.kind == RequestKind::kChat; }

json usage_of(const GenerationResult& r) {
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", r.completion_tokens},
          {"total_tokens", r.prompt_tokens + r.completion_tokens}};
}

/// The envelope every chunk shares; `choice` is the single choice (or none).
json chunk_envelope(const ResponseMeta& meta, json choices, bool include_usage) {
  json c = {{"id", meta.id},
            {"object", is_chat(meta) ? "chat.completion.chunk" : "text_completion"},
            {"created", meta.created},
            {"model", meta.model},
            {"choices", std::move(choices)}};
  // OpenAI sends "usage": null on every chunk but the last when usage was asked for.
  if (include_usage) c["usage"] = nullptr;
  return c;
}

json stream_choice(const ResponseMeta& meta, json delta_or_text, json finish_reason) {
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", std::move(finish_reason)}};
  if (is_chat(meta)) {
    choice["delta"] = std::move(delta_or_text);
  } else {
    choice["text"] = std::move(delta_or_text);
  }
  return choice;
}

}  // namespace

ResponseMeta new_response_meta(RequestKind kind, const std::string& model) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(rng()));
  ResponseMeta meta;
  meta.kind = kind;
  meta.id = std::string(kind == RequestKind::kChat ? "chatcmpl-" : "cmpl-") + hex;
  meta.created = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  meta.model = model;
  return meta;
}

json response_body(const ResponseMeta& meta, const GenerationResult& result) {
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", result.finish_reason}};
  if (is_chat(meta)) {
    choice["message"] = {{"role", "assistant"}, {"content", result.text}};
  } else {
    choice["text"] = result.text;
  }
  return {{"id", meta.id},
          {"object", is_chat(meta) ? "chat.completion" : "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", json::array({choice})},
          {"usage", usage_of(result)}};
}

json role_chunk(const ResponseMeta& meta, bool include_usage) {
  json delta = {{"role", "assistant"}, {"content", ""}};
  return chunk_envelope(meta, json::array({stream_choice(meta, delta, nullptr)}), include_usage);
}

json text_chunk(const ResponseMeta& meta, std::string_view text, bool include_usage) {
  json piece = is_chat(meta) ? json{{"content", std::string(text)}} : json(std::string(text));
  return chunk_envelope(meta, json::array({stream_choice(meta, piece, nullptr)}), include_usage);
}

json finish_chunk(const ResponseMeta& meta, const std::string& finish_reason, bool include_usage) {
  json empty = is_chat(meta) ? json::object() : json("");
  return chunk_envelope(meta, json::array({stream_choice(meta, empty, finish_reason)}), include_usage);
}

json usage_chunk(const ResponseMeta& meta, const GenerationResult& result) {
  json c = chunk_envelope(meta, json::array(), false);
  c["usage"] = usage_of(result);
  return c;
}

json error_body(const ApiError& error) {
  return {{"error",
           {{"message", error.what()},
            {"type", error.type()},
            {"param", error.param().empty() ? json(nullptr) : json(error.param())},
            {"code", nullptr}}}};
}

std::string dump_json(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const json& payload) { return "data: " + dump_json(payload) + "\n\n"; }

}  // namespace charm
