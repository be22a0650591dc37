// A checkpoint's tokenizer and chat template, from wherever its format keeps them: a
// Hugging Face directory's tokenizer.json and tokenizer_config.json, or a GGUF file's
// tokenizer.* metadata (coordinator/text/gguf_tokenizer.h).
#pragma once

#include <memory>
#include <string>

#include "common/checkpoint.h"
#include "coordinator/text/chat_template.h"
#include "coordinator/text/tokenizer.h"

namespace charm {

/// What load_model_text found.
struct ModelText {
  std::unique_ptr<Tokenizer> tokenizer;
  std::string tokenizer_origin;  ///< "<dir>/tokenizer.json" or "<file>.gguf (tokenizer.ggml.*)", for messages
  /// Null when the checkpoint has no usable chat template; `chat_template_error` says why
  /// (completions still work, chat requests are refused).
  std::unique_ptr<ChatTemplate> chat_template;
  std::string chat_template_error;
};

/// Loads `checkpoint`'s tokenizer (throws as Tokenizer::load / tokenizer_json_from_gguf
/// document, naming the file) and chat template (its errors are kept in
/// chat_template_error, not thrown). For GGUF: the template is tokenizer.chat_template,
/// with bos/eos token strings from tokenizer.ggml.{bos,eos}_token_id.
ModelText load_model_text(const Checkpoint& checkpoint, LocalTime local_time = {});

}  // namespace charm
