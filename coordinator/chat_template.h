// Renders a model's chat template (the Jinja2 text in tokenizer_config.json's
// "chat_template") the way transformers' apply_chat_template does: a small Jinja
// interpreter covering the constructs real MoE templates use (Qwen2.5, Qwen3), with
// transformers' globals (messages, add_generation_prompt, bos_token, eos_token,
// raise_exception, tools=None) and trim_blocks/lstrip_blocks on, as transformers sets.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace charm {

/// One chat message as the OpenAI API and transformers see it.
struct ChatMessage {
  std::string role;     ///< "system", "user", "assistant", "tool"
  std::string content;
};

/// A parsed chat template. Immutable after load; render is thread-safe.
class ChatTemplate {
 public:
  /// Reads "chat_template" (and bos_token / eos_token) from tokenizer_config.json.
  /// Throws Error(kInvalidInput) naming the file when it has no chat template, and
  /// naming the line and construct when the template does not parse.
  static std::unique_ptr<ChatTemplate> load(const std::filesystem::path& tokenizer_config_json);
  /// Parses template `source` directly (tests, and templates given in YAML).
  static std::unique_ptr<ChatTemplate> parse(const std::string& source, const std::string& bos_token,
                                             const std::string& eos_token);
  virtual ~ChatTemplate() = default;

  /// The prompt text for `messages`. Throws Error(kInvalidInput) with the template's own
  /// message when it calls raise_exception, and naming the construct on an
  /// evaluation error (unknown filter, wrong types).
  virtual std::string render(const std::vector<ChatMessage>& messages,
                             bool add_generation_prompt) const = 0;
};

}  // namespace charm
