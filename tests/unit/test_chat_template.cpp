// Tests for coordinator/text/chat_template.cpp and the Jinja interpreter behind it.
// Rendering is checked byte for byte against tests/fixtures/chat_template/cases.json, which
// scripts/gen_chat_cases.py produced with transformers' own render_jinja_template.
#include <doctest/doctest.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "coordinator/text/chat_template.h"
#include "tests/support/expect_error.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using charm::ChatMessage;
using charm::ChatTemplate;
using charm::Error;
using charm::ErrorCategory;
using nlohmann::ordered_json;

namespace {

const fs::path kFixtures = fs::path(CHARM_SOURCE_DIR) / "tests" / "fixtures" / "chat_template";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open " << p);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The message of the Error that `fn` throws (tests/support/expect_error.h: fails the test
// case when `fn` throws nothing, and checks the category).
template <typename Fn>
std::string error_of(Fn&& fn, ErrorCategory want = ErrorCategory::kInvalidInput) {
  return charm::test::expect_error(std::forward<Fn>(fn), want).message();
}

// "2025-03-14T15:09:26" (a case's "local_time") as broken-down local time.
std::tm parse_local_time(const std::string& iso) {
  std::tm t{};
  REQUIRE_MESSAGE(std::sscanf(iso.c_str(), "%d-%d-%dT%d:%d:%d", &t.tm_year, &t.tm_mon, &t.tm_mday, &t.tm_hour,
                              &t.tm_min, &t.tm_sec) == 6,
                  "bad local_time " << iso);
  t.tm_year -= 1900;
  t.tm_mon -= 1;
  // Fills tm_wday / tm_yday for %A, %j. timegm, not mktime: no time zone or DST may move
  // the fields (the test must not depend on the machine's zone).
  ::timegm(&t);
  return t;
}

// No test reads the clock: strftime_now() in these templates sees this fixed time.
charm::LocalTime fixed_time() { return charm::fixed_local_time(parse_local_time("2025-03-14T15:09:26")); }

std::string render(const std::string& source, const std::vector<ChatMessage>& messages, bool agp = false) {
  return ChatTemplate::parse(source, "<s>", "</s>", fixed_time())->render(messages, agp);
}

using charm::test::TempDir;

}  // namespace

TEST_CASE("every transformers-rendered case matches byte for byte") {
  ordered_json cases = ordered_json::parse(slurp(kFixtures / "cases.json"));
  REQUIRE(cases.size() >= 40);
  int rendered = 0, errors = 0;
  for (const ordered_json& c : cases) {
    const std::string name = c["name"].get<std::string>();
    CAPTURE(name);
    const ordered_json& kwargs = c["kwargs"];
    // The generator pinned strftime_now() to this time; the same goes in here.
    REQUIRE(c.contains("local_time"));
    auto tmpl = ChatTemplate::parse(slurp(kFixtures / c["template"].get<std::string>()), kwargs.value("bos_token", ""),
                                    kwargs.value("eos_token", ""),
                                    charm::fixed_local_time(parse_local_time(c["local_time"].get<std::string>())));
    auto run = [&] { return tmpl->render_json(c["messages"], c["add_generation_prompt"].get<bool>(), kwargs); };
    if (c.contains("expected")) {
      std::string got;
      try {
        got = run();
      } catch (const Error& e) {
        FAIL_CHECK("threw: " << std::string(e.what()));
        continue;
      }
      CHECK(got == c["expected"].get<std::string>());
      ++rendered;
    } else {
      // raise_exception (TemplateError) must carry the template's own text; other jinja errors
      // (undefined values, type errors) word things differently, so only the failure is checked.
      std::string msg = error_of(run);
      if (c["error_type"] == "TemplateError") {
        CHECK_MESSAGE(msg.find(c["error"].get<std::string>()) != std::string::npos, msg);
      }
      ++errors;
    }
  }
  CHECK(rendered >= 150);
  CHECK(errors >= 2);
}

TEST_CASE("strftime_now formats the injected local time, so no output depends on today's date") {
  const std::string src = "{{ strftime_now('%Y-%m-%d %H:%M:%S %A') }}";
  CHECK(render(src, {}) == "2025-03-14 15:09:26 Friday");
  auto leap = ChatTemplate::parse(src, "", "", charm::fixed_local_time(parse_local_time("2024-02-29T23:59:58")));
  CHECK(leap->render({}, false) == "2024-02-29 23:59:58 Thursday");
  // gpt-oss prints the date in its system header; two clocks, two dates, nothing else differs.
  const std::string gpt_oss = slurp(kFixtures / "openai-gpt-oss-120b.jinja");
  const std::string a = ChatTemplate::parse(gpt_oss, "", "", fixed_time())->render({{"user", "hi"}}, true);
  const std::string b = ChatTemplate::parse(gpt_oss, "", "", charm::fixed_local_time(parse_local_time("2024-02-29T00:00:00")))
                            ->render({{"user", "hi"}}, true);
  CHECK(a.find("Current date: 2025-03-14") != std::string::npos);
  CHECK(b.find("Current date: 2024-02-29") != std::string::npos);
}

TEST_CASE("render with ChatMessage matches render_json for role/content messages") {
  auto tmpl = ChatTemplate::parse(slurp(kFixtures / "qwen3.jinja"), "", "<|im_end|>");
  std::vector<ChatMessage> msgs = {{"system", "S"}, {"user", "Hi"}, {"assistant", "<think>r</think>\n\nA"}};
  ordered_json j = ordered_json::array();
  for (const auto& m : msgs) j.push_back({{"role", m.role}, {"content", m.content}});
  CHECK(tmpl->render(msgs, true) == tmpl->render_json(j, true, ordered_json::object()));
  CHECK(tmpl->render({{"user", "Hi"}}, true) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("Qwen3 strips reasoning from turns before the last user query") {
  auto tmpl = ChatTemplate::parse(slurp(kFixtures / "qwen3.jinja"), "", "<|im_end|>");
  std::string out = tmpl->render({{"user", "Q1"}, {"assistant", "<think>old</think>A1"}, {"user", "Q2"}}, true);
  CHECK(out.find("old") == std::string::npos);
  CHECK(out.find("<|im_start|>assistant\nA1<|im_end|>") != std::string::npos);
}

TEST_CASE("raise_exception surfaces the template's own message") {
  const std::string src = "{% if messages[0].role == 'system' %}{{ raise_exception('No system role, please') }}{% endif %}ok";
  CHECK(render(src, {{"user", "x"}}) == "ok");
  std::string msg = error_of([&] { render(src, {{"system", "x"}}); });
  CHECK(msg.find("No system role, please") != std::string::npos);
}

TEST_CASE("parse errors name the problem and the line") {
  auto parse = [](const std::string& s) { ChatTemplate::parse(s, "", ""); };
  std::string msg = error_of([&] { parse("hello\n{{ messages "); });
  CHECK(msg.find("line 2") != std::string::npos);
  CHECK(msg.find("unterminated tag") != std::string::npos);

  msg = error_of([&] { parse("{% if true %}\nno end"); });
  CHECK(msg.find("unclosed 'if'") != std::string::npos);
  CHECK(msg.find("endif") != std::string::npos);

  msg = error_of([&] { parse("a\nb\n{{ 1 + }}"); });
  CHECK(msg.find("line 3") != std::string::npos);
  CHECK(msg.find("unexpected") != std::string::npos);

  msg = error_of([&] { parse("{% for x messages %}{% endfor %}"); });
  CHECK(msg.find("expected 'in'") != std::string::npos);

  msg = error_of([&] { parse("{{ 'abc }}"); });
  CHECK(msg.find("unterminated string") != std::string::npos);

  msg = error_of([&] { parse("{# never closed"); });
  CHECK(msg.find("unterminated comment") != std::string::npos);

  msg = error_of([&] { parse("{{ (1 }}"); });
  CHECK(msg.find("unexpected '}', expected ')'") != std::string::npos);

  msg = error_of([&] { parse("{% endfor %}"); });
  CHECK(msg.find("unknown tag 'endfor'") != std::string::npos);

  msg = error_of([&] { parse("{% break %}"); });
  CHECK(msg.find("outside of a for loop") != std::string::npos);

  msg = error_of([&] { parse("{{ }}"); });
  CHECK(msg.find("empty expression") != std::string::npos);

  msg = error_of([&] { parse("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"); });
  CHECK(msg.find("nested too deeply") != std::string::npos);
  msg = error_of([&] { parse("{{ " + std::string(5000, '-') + "1 }}"); });
  CHECK(msg.find("nested too deeply") != std::string::npos);
  std::string deep;
  for (int k = 0; k < 1000; ++k) deep += "{% if true %}";
  msg = error_of([&] { parse(deep); });
  CHECK(msg.find("nested too deeply") != std::string::npos);

  msg = error_of([&] { parse("x\n{% include 'other.jinja' %}"); }, ErrorCategory::kUnsupported);
  CHECK(msg.find("'{% include %}'") != std::string::npos);
  CHECK(msg.find("line 2") != std::string::npos);
}

TEST_CASE("evaluation errors name the construct") {
  std::string msg = error_of([&] { render("\n{{ messages | frobnicate }}", {{"user", "x"}}); });
  CHECK(msg.find("unknown filter 'frobnicate'") != std::string::npos);
  CHECK(msg.find("line 2") != std::string::npos);

  // An unknown filter in a branch that is never taken does not stop rendering.
  CHECK(render("{% if false %}{{ x | frobnicate }}{% endif %}fine", {}) == "fine");

  msg = error_of([&] { render("{{ 1 is frobbed }}", {}); });
  CHECK(msg.find("unknown test 'frobbed'") != std::string::npos);

  msg = error_of([&] { render("{{ 'a' + 1 }}", {}); });
  CHECK(msg.find("unsupported operand types for +: 'str' and 'int'") != std::string::npos);

  msg = error_of([&] { render("{{ nope.attr }}", {}); });
  CHECK(msg.find("'nope' is undefined") != std::string::npos);

  msg = error_of([&] { render("{{ messages[0].content.frob() }}", {{"user", "x"}}); });
  CHECK(msg.find("string method 'frob'") != std::string::npos);

  msg = error_of([&] { render("{{ messages.append(1) }}", {}); });
  CHECK(msg.find("cannot modify lists") != std::string::npos);

  msg = error_of([&] { render("{% set x = 1 %}{% set x.y = 2 %}", {}); });
  CHECK(msg.find("not a namespace") != std::string::npos);

  msg = error_of([&] { render("{{ 1 // 0 }}", {}); });
  CHECK(msg.find("division by zero") != std::string::npos);
}

TEST_CASE("tools is None and the tools branch parses") {
  auto tmpl = ChatTemplate::parse(slurp(kFixtures / "qwen2_5.jinja"), "", "<|im_end|>");
  CHECK(tmpl->render({{"user", "Hi"}}, false).rfind("<|im_start|>system\nYou are Qwen", 0) == 0);
  CHECK(render("{{ tools is none }}", {}) == "True");
  // With tools given, the tools branch renders tojson of each tool.
  ordered_json tools = ordered_json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  std::string out = tmpl->render_json(ordered_json::array({{{"role", "user"}, {"content", "Hi"}}}), false,
                                      {{"tools", tools}});
  CHECK(out.find("{\"type\": \"function\", \"function\": {\"name\": \"f\"}}") != std::string::npos);
}

TEST_CASE("render_json rejects malformed messages") {
  auto tmpl = ChatTemplate::parse("{{ messages|length }}", "", "");
  CHECK(error_of([&] { tmpl->render_json(ordered_json::object(), false, ordered_json::object()); }).find("array") !=
        std::string::npos);
  CHECK(error_of([&] { tmpl->render_json(ordered_json::array({1}), false, ordered_json::object()); }).find("object") !=
        std::string::npos);
}

TEST_CASE("load reads chat_template and special tokens from tokenizer_config.json") {
  TempDir dir;
  ordered_json cfg = {{"bos_token", "<s>"},
                      {"eos_token", {{"content", "</s>"}, {"lstrip", false}}},
                      {"chat_template", "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{{ eos_token }}"}};
  auto path = dir.write("tokenizer_config.json", cfg.dump());
  auto tmpl = ChatTemplate::load(path);
  CHECK(tmpl->render({{"user", "hi"}}, false) == "<s>[user]hi</s>");

  SUBCASE("a list of named templates uses 'default'") {
    ordered_json list_cfg = {{"chat_template", ordered_json::array({{{"name", "tool_use"}, {"template", "T"}},
                                                                     {{"name", "default"}, {"template", "D"}}})}};
    CHECK(ChatTemplate::load(dir.write("list.json", list_cfg.dump()))->render({}, false) == "D");
  }
  SUBCASE("missing key fails naming the file") {
    auto p = dir.write("no_template.json", R"({"eos_token": "</s>"})");
    std::string msg = error_of([&] { ChatTemplate::load(p); });
    CHECK(msg.find("no_template.json") != std::string::npos);
    CHECK(msg.find("chat_template") != std::string::npos);
  }
  SUBCASE("chat_template.jinja beside the config is used when the key is absent") {
    TempDir d2;
    d2.write("chat_template.jinja", "J{{ messages|length }}");
    CHECK(ChatTemplate::load(d2.write("tokenizer_config.json", "{}"))->render({{"user", "x"}}, false) == "J1");
  }
  SUBCASE("malformed files fail clearly") {
    std::string msg = error_of([&] { ChatTemplate::load(dir.write("bad.json", "{not json")); });
    CHECK(msg.find("bad.json") != std::string::npos);
    CHECK(msg.find("not valid JSON") != std::string::npos);
    msg = error_of([&] { ChatTemplate::load(dir.write("arr.json", "[1]")); });
    CHECK(msg.find("JSON object") != std::string::npos);
    msg = error_of([&] { ChatTemplate::load(dir.write("num.json", R"({"chat_template": 3})")); });
    CHECK(msg.find("must be a string") != std::string::npos);
    msg = error_of([&] { ChatTemplate::load(dir.write("tok.json", R"({"chat_template": "x", "bos_token": 5})")); });
    CHECK(msg.find("bos_token") != std::string::npos);
    msg = error_of([&] { ChatTemplate::load(dir.write("syn.json", R"({"chat_template": "{% if %}"})")); });
    CHECK(msg.find("syn.json") != std::string::npos);
    CHECK(msg.find("line 1") != std::string::npos);
    error_of([&] { ChatTemplate::load(dir / "does_not_exist.json"); }, ErrorCategory::kIo);
  }
}

TEST_CASE("the repository's tokenizer_config.json fixtures load and render") {
  // Other fixtures (tiny models, tokenizer) that carry a chat template must load and render;
  // the Qwen ones hold exactly the templates checked byte for byte above.
  for (const char* sub : {"tokenizer", "models"}) {
    fs::path root = fs::path(CHARM_SOURCE_DIR) / "tests" / "fixtures" / sub;
    REQUIRE_MESSAGE(fs::is_directory(root), "committed fixture folder missing: " << root);
    for (const auto& entry : fs::recursive_directory_iterator(root)) {
      if (entry.path().filename() != "tokenizer_config.json") continue;
      ordered_json cfg = ordered_json::parse(slurp(entry.path()), nullptr, false);
      if (cfg.is_discarded() || !cfg.is_object() || !cfg.contains("chat_template")) continue;
      CAPTURE(entry.path());
      std::string out = ChatTemplate::load(entry.path())->render({{"user", "Hello"}}, true);
      CHECK(out.find("Hello") != std::string::npos);
    }
  }
}
