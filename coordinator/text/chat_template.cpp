// ChatTemplate: loads a model's chat template and renders it with charm's Jinja interpreter
// (jinja_lexer / jinja_parser / jinja_eval), with the variables transformers'
// render_jinja_template passes (transformers/utils/chat_template_utils.py).
#include "coordinator/text/chat_template.h"

#include <optional>

#include "common/error.h"
#include "common/json_reader.h"
#include "coordinator/text/jinja/ast.h"
#include "coordinator/text/jinja/eval.h"

namespace charm {
namespace {

using nlohmann::ordered_json;

class JinjaChatTemplate final : public ChatTemplate {
 public:
  JinjaChatTemplate(jinja::Body body, std::optional<std::string> bos, std::optional<std::string> eos,
                    LocalTime local_time)
      : body_(std::move(body)), bos_(std::move(bos)), eos_(std::move(eos)), env_{std::move(local_time)} {}

  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const override {
    ordered_json list = ordered_json::array();
    for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
    return render_json(list, add_generation_prompt, ordered_json::object());
  }

  std::string render_json(const ordered_json& messages, bool add_generation_prompt,
                          const ordered_json& extra_vars) const override {
    if (!messages.is_array()) fail_invalid("chat template: messages must be a JSON array");
    if (!extra_vars.is_null() && !extra_vars.is_object()) fail_invalid("chat template: extra variables must be a JSON object");
    jinja::ValueList chat;
    for (const ordered_json& m : messages) chat.push_back(jinja::Value::from_json(normalise_message(m)));
    jinja::Variables vars;
    if (bos_) vars["bos_token"] = jinja::Value::string(*bos_);
    if (eos_) vars["eos_token"] = jinja::Value::string(*eos_);
    if (extra_vars.is_object())
      for (const auto& [k, v] : extra_vars.items()) vars[k] = jinja::Value::from_json(v);
    // render_jinja_template passes these last, so they win over same-named extras.
    vars["messages"] = jinja::Value::new_list(std::move(chat));
    vars["add_generation_prompt"] = jinja::Value::boolean(add_generation_prompt);
    if (!vars.count("tools")) vars["tools"] = jinja::Value::none();
    if (!vars.count("documents")) vars["documents"] = jinja::Value::none();
    return jinja::render_body(body_, vars, env_);
  }

 private:
  // transformers' _normalize_chat_messages drops None-valued keys, and _alias_reasoning_fields
  // copies the first non-null of reasoning_content/thinking/reasoning to "thinking" (first)
  // and "reasoning_content" (last).
  static ordered_json normalise_message(const ordered_json& m) {
    if (!m.is_object()) fail_invalid("chat template: each message must be a JSON object, got " + std::string(m.type_name()));
    ordered_json out = ordered_json::object();
    for (const auto& [k, v] : m.items())
      if (!v.is_null()) out[k] = v;
    const ordered_json* reasoning = nullptr;
    for (const char* key : {"reasoning_content", "thinking", "reasoning"})
      if (!reasoning && out.contains(key)) reasoning = &out[key];
    if (!reasoning) return out;
    ordered_json aliased = ordered_json::object();
    aliased["thinking"] = *reasoning;
    for (const auto& [k, v] : out.items())
      if (k != "reasoning_content") aliased[k] = v;
    aliased["reasoning_content"] = *reasoning;
    return aliased;
  }

  jinja::Body body_;
  std::optional<std::string> bos_;
  std::optional<std::string> eos_;
  jinja::Environment env_;
};

// A special token in tokenizer_config.json: a string, an AddedToken object {"content": ...}, or null.
std::optional<std::string> special_token(const ordered_json& config, const char* key, const std::filesystem::path& path) {
  if (!config.contains(key) || config[key].is_null()) return std::nullopt;
  const ordered_json& t = config[key];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  fail_invalid(path.string() + ": field '" + key + "' must be a string or an object with \"content\"");
}

std::string template_text(const ordered_json& config, const std::filesystem::path& path) {
  if (!config.contains("chat_template") || config["chat_template"].is_null()) {
    std::filesystem::path sibling = path.parent_path() / "chat_template.jinja";
    if (std::filesystem::exists(sibling)) return read_text_file(sibling, kConfigJsonLimits.max_bytes, "a chat template");
    fail_invalid(path.string() + ": no \"chat_template\" field (and no chat_template.jinja beside it)");
  }
  const ordered_json& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const ordered_json& entry : t)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string())
        return entry["template"].get<std::string>();
    fail_invalid(path.string() + ": \"chat_template\" is a list without a template named \"default\"");
  }
  fail_invalid(path.string() + ": \"chat_template\" must be a string or a list of {name, template}");
}

std::unique_ptr<ChatTemplate> make(const std::string& source, std::optional<std::string> bos,
                                   std::optional<std::string> eos, LocalTime local_time) {
  return std::make_unique<JinjaChatTemplate>(jinja::parse_template(source), std::move(bos), std::move(eos),
                                             std::move(local_time));
}

}  // namespace

LocalTime fixed_local_time(const std::tm& t) {
  return [t] { return t; };
}

std::unique_ptr<ChatTemplate> ChatTemplate::load(const std::filesystem::path& tokenizer_config_json,
                                                 LocalTime local_time) {
  const ordered_json config = read_ordered_json_file(tokenizer_config_json, kConfigJsonLimits, "a tokenizer config");
  if (!config.is_object()) fail_invalid(tokenizer_config_json.string() + ": expected a JSON object");
  std::string source = template_text(config, tokenizer_config_json);
  auto bos = special_token(config, "bos_token", tokenizer_config_json);
  auto eos = special_token(config, "eos_token", tokenizer_config_json);
  try {
    return make(source, std::move(bos), std::move(eos), std::move(local_time));
  } catch (const Error& e) {
    throw Error(e.category(), tokenizer_config_json.string() + ": " + e.message());
  }
}

std::unique_ptr<ChatTemplate> ChatTemplate::parse(const std::string& source, const std::string& bos_token,
                                                  const std::string& eos_token, LocalTime local_time) {
  return make(source, bos_token, eos_token, std::move(local_time));
}

}  // namespace charm
