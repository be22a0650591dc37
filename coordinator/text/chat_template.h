// Renders a model's chat template (the Jinja2 text in tokenizer_config.json's
// "chat_template") the way transformers' apply_chat_template does: a small Jinja
// interpreter covering the constructs real MoE templates use (Qwen2.5, Qwen3), with
// transformers' globals (messages, add_generation_prompt, bos_token, eos_token,
// raise_exception, tools=None) and trim_blocks/lstrip_blocks on, as transformers sets.
#pragma once

#include <ctime>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace charm {

/// One chat message as the OpenAI API and transformers see it.
struct ChatMessage {
  std::string role;     ///< "system", "user", "assistant", "tool"
  std::string content;
};

/// The local wall-clock time, broken down, that a template's strftime_now() formats (gpt-oss
/// templates print "Current date: ..."). Empty: the system clock in the process's time
/// zone, as transformers' `datetime.now()`. Tests and reproducible runs pass a fixed value.
using LocalTime = std::function<std::tm()>;

/// A LocalTime that always answers `t` (fields as std::tm: tm_year = year - 1900, ...).
LocalTime fixed_local_time(const std::tm& t);

/// A parsed chat template. Immutable after load; render is thread-safe.
class ChatTemplate {
 public:
  /// Reads "chat_template" (and bos_token / eos_token) from tokenizer_config.json. The
  /// template may be a string or a list of {"name", "template"} (the one named "default" is
  /// used); when the key is absent, a chat_template.jinja beside the file (transformers >= 4.47
  /// saves it there) is used. Throws Error(kIo) when a file cannot be read, and
  /// Error(kInvalidInput) naming the file when it is not JSON or has no chat template, and
  /// naming the line and construct when the template does not parse.
  /// `local_time` is what strftime_now() reads (empty: the system clock).
  static std::unique_ptr<ChatTemplate> load(const std::filesystem::path& tokenizer_config_json,
                                            LocalTime local_time = {});
  /// Parses template `source` directly (tests, and templates given in YAML).
  static std::unique_ptr<ChatTemplate> parse(const std::string& source, const std::string& bos_token,
                                             const std::string& eos_token, LocalTime local_time = {});
  virtual ~ChatTemplate() = default;

  /// The prompt text for `messages`. Throws Error(kInvalidInput) with the template's own
  /// message when it calls raise_exception, and naming the construct on an
  /// evaluation error (unknown filter, wrong types).
  virtual std::string render(const std::vector<ChatMessage>& messages,
                             bool add_generation_prompt) const = 0;

  /// The prompt text for messages given as JSON objects (role, content, and any other keys the
  /// template reads: reasoning_content, tool_calls, ...), with `extra_vars` (an object, e.g.
  /// {"enable_thinking": false}) added to the template's variables, as apply_chat_template's
  /// **kwargs are. Like transformers, drops null-valued message keys and copies reasoning
  /// under both "reasoning_content" and "thinking". Throws as render does, and
  /// Error(kInvalidInput) when `messages` is not an array of objects.
  virtual std::string render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                  const nlohmann::ordered_json& extra_vars) const = 0;
};

}  // namespace charm
