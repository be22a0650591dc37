// Response bodies of the OpenAI-compatible API; see openai_response.h.
#include "coordinator/api/openai_response.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

namespace charm {

using json = nlohmann::json;

namespace {

bool is_chat(const ResponseMeta& meta) { return meta.kind == RequestKind::kChat; }

/// A logprob as JSON can carry it.
double reported(float logprob) { return std::isinf(logprob) ? kMinReportedLogprob : double(logprob); }

/// A token's text (its one id decoded: invalid UTF-8 replaced) and raw bytes.
struct TokenText {
  std::string text;
  json bytes = json::array();
};

TokenText token_text(const Tokenizer& tokenizer, int32_t id) {
  TokenText t;
  const int32_t ids[] = {id};
  t.text = tokenizer.decode(ids, /*skip_special=*/false);
  for (unsigned char c : tokenizer.token_bytes(id)) t.bytes.push_back(int(c));
  return t;
}

/// Code points of valid UTF-8 `text`: its bytes that do not continue a character.
int64_t code_points(std::string_view text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
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

json stream_choice(const ResponseMeta& meta, int64_t index, json delta_or_text, json finish_reason,
                   json logprobs = nullptr) {
  json choice = {{"index", index}, {"logprobs", std::move(logprobs)}, {"finish_reason", std::move(finish_reason)}};
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

json logprobs_json(const ResponseMeta& meta, std::span<const TokenLogprob> logprobs, int64_t& text_offset) {
  const Tokenizer& tokenizer = *meta.tokenizer;
  if (is_chat(meta)) {
    json content = json::array();
    for (const TokenLogprob& lp : logprobs) {
      TokenText t = token_text(tokenizer, lp.token);
      json top = json::array();
      for (const auto& [id, logprob] : lp.top) {
        TokenText alt = token_text(tokenizer, id);
        top.push_back(
            {{"token", std::move(alt.text)}, {"logprob", reported(logprob)}, {"bytes", std::move(alt.bytes)}});
      }
      content.push_back({{"token", std::move(t.text)},
                         {"logprob", reported(lp.logprob)},
                         {"bytes", std::move(t.bytes)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       offsets = json::array();
  for (const TokenLogprob& lp : logprobs) {
    std::string text = token_text(tokenizer, lp.token).text;
    offsets.push_back(text_offset);
    text_offset += code_points(text);
    tokens.push_back(std::move(text));
    token_logprobs.push_back(reported(lp.logprob));
    json top = json::object();
    for (const auto& [id, logprob] : lp.top) {
      std::string alt = token_text(tokenizer, id).text;
      if (!top.contains(alt)) top[alt] = reported(logprob);  // most likely first: keep it
    }
    top_logprobs.push_back(std::move(top));
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

json usage_of(std::span<const GenerationResult> choices) {
  const int64_t prompt = choices.empty() ? 0 : choices.front().prompt_tokens;
  int64_t completion = 0;
  for (const GenerationResult& r : choices) completion += r.completion_tokens;
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

json response_body(const ResponseMeta& meta, std::span<const GenerationResult> choices) {
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const GenerationResult& result = choices[i];
    int64_t offset = 0;
    json logprobs = meta.tokenizer ? logprobs_json(meta, result.logprobs, offset) : json(nullptr);
    json choice = {{"index", i}, {"logprobs", std::move(logprobs)}, {"finish_reason", result.finish_reason}};
    if (is_chat(meta)) {
      choice["message"] = {{"role", "assistant"}, {"content", result.text}};
    } else {
      choice["text"] = result.text;
    }
    list.push_back(std::move(choice));
  }
  return {{"id", meta.id},
          {"object", is_chat(meta) ? "chat.completion" : "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", std::move(list)},
          {"usage", usage_of(choices)}};
}

json role_chunk(const ResponseMeta& meta, int64_t index, bool include_usage) {
  json delta = {{"role", "assistant"}, {"content", ""}};
  return chunk_envelope(meta, json::array({stream_choice(meta, index, delta, nullptr)}), include_usage);
}

json text_chunk(const ResponseMeta& meta, int64_t index, std::string_view text, json logprobs, bool include_usage) {
  json piece = is_chat(meta) ? json{{"content", std::string(text)}} : json(std::string(text));
  return chunk_envelope(meta, json::array({stream_choice(meta, index, piece, nullptr, std::move(logprobs))}),
                        include_usage);
}

json finish_chunk(const ResponseMeta& meta, int64_t index, const std::string& finish_reason, bool include_usage) {
  json empty = is_chat(meta) ? json::object() : json("");
  return chunk_envelope(meta, json::array({stream_choice(meta, index, empty, finish_reason)}), include_usage);
}

json usage_chunk(const ResponseMeta& meta, std::span<const GenerationResult> choices) {
  json c = chunk_envelope(meta, json::array(), false);
  c["usage"] = usage_of(choices);
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
