#include "coordinator/text/model_text.h"

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/text/gguf_tokenizer.h"

namespace charm {
namespace {

std::optional<int32_t> optional_id(const GgufModelFiles& files, const char* key) {
  const GgufValue* v = files.find(key);
  return v ? std::optional<int32_t>(v->as_i32()) : std::nullopt;
}

/// GgufTokenizerMetadata from the reader, key by key (absent keys stay empty).
GgufTokenizerMetadata tokenizer_metadata(const GgufModelFiles& files) {
  GgufTokenizerMetadata meta;
  auto string = [&](const char* key) { const GgufValue* v = files.find(key); return v ? v->as_string() : std::string(); };
  meta.model = string("tokenizer.ggml.model");
  meta.pre = string("tokenizer.ggml.pre");
  meta.chat_template = string("tokenizer.chat_template");
  if (const GgufValue* v = files.find("tokenizer.ggml.tokens")) meta.tokens = v->as_string_array();
  if (const GgufValue* v = files.find("tokenizer.ggml.merges")) meta.merges = v->as_string_array();
  if (const GgufValue* v = files.find("tokenizer.ggml.token_type")) {
    for (int64_t t : v->as_i64_array()) meta.token_type.push_back(static_cast<int32_t>(t));
  }
  meta.bos_token_id = optional_id(files, "tokenizer.ggml.bos_token_id");
  meta.eos_token_id = optional_id(files, "tokenizer.ggml.eos_token_id");
  meta.eot_token_id = optional_id(files, "tokenizer.ggml.eot_token_id");
  meta.padding_token_id = optional_id(files, "tokenizer.ggml.padding_token_id");
  meta.unknown_token_id = optional_id(files, "tokenizer.ggml.unknown_token_id");
  if (const GgufValue* v = files.find("tokenizer.ggml.scores")) meta.scores = v->as_f32_array();
  if (const GgufValue* v = files.find("tokenizer.ggml.add_bos_token")) meta.add_bos = v->as_bool();
  if (const GgufValue* v = files.find("tokenizer.ggml.add_eos_token")) meta.add_eos = v->as_bool();
  if (const GgufValue* v = files.find("tokenizer.ggml.add_space_prefix")) meta.add_space_prefix = v->as_bool();
  return meta;
}

ModelText gguf_text(const GgufModelFiles& files, LocalTime local_time) {
  const std::string origin = files.files().front()->path().string();
  const GgufTokenizerMetadata meta = tokenizer_metadata(files);
  ModelText text;
  text.tokenizer_origin = origin + " (tokenizer.ggml.*)";
  text.tokenizer = Tokenizer::from_json(tokenizer_json_from_gguf(meta, origin), text.tokenizer_origin);
  if (meta.chat_template.empty()) {
    text.chat_template_error = origin + " has no tokenizer.chat_template";
    return text;
  }
  auto token = [&](const std::optional<int32_t>& id) {
    return id && *id >= 0 && static_cast<size_t>(*id) < meta.tokens.size() ? meta.tokens[static_cast<size_t>(*id)]
                                                                            : std::string();
  };
  try {
    text.chat_template =
        ChatTemplate::parse(meta.chat_template, token(meta.bos_token_id), token(meta.eos_token_id), local_time);
  } catch (const Error& e) {
    text.chat_template_error = origin + ": tokenizer.chat_template: " + e.message();
  }
  return text;
}

}  // namespace

ModelText load_model_text(const Checkpoint& checkpoint, LocalTime local_time) {
  if (const GgufModelFiles* files = checkpoint.gguf()) return gguf_text(*files, local_time);
  ModelText text;
  text.tokenizer_origin = (checkpoint.dir() / "tokenizer.json").string();
  text.tokenizer = Tokenizer::load(checkpoint.dir() / "tokenizer.json");
  try {
    text.chat_template = ChatTemplate::load(checkpoint.dir() / "tokenizer_config.json", local_time);
  } catch (const Error& e) {
    text.chat_template_error = e.message();
  }
  return text;
}

}  // namespace charm
