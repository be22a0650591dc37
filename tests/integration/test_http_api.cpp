// Tests of the OpenAI-compatible HTTP API (coordinator/api/http_api.h) over a fake Engine:
// every endpoint, the SSE framing of streams, defaults, and each rejected request.
#include <doctest/doctest.h>

#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <nlohmann/json.hpp>
#include <thread>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "coordinator/api/http_api.h"
#include "coordinator/api/openai_request.h"
#include "coordinator/api/openai_response.h"
#include "tests/support/expect_error.h"

using json = nlohmann::json;

namespace {

/// One token per byte; "<|end|>" is special token 256 when parse_special.
class ByteTokenizer : public charm::Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool parse_special) const override {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < text.size(); ++i) {
      if (parse_special && text.substr(i, 7) == "<|end|>") {
        ids.push_back(256);
        i += 6;
      } else {
        ids.push_back(static_cast<unsigned char>(text[i]));
      }
    }
    return ids;
  }
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override {
    std::string s;
    for (int32_t id : ids) s += token_bytes(id);
    return s;
  }
  std::string token_bytes(int32_t id) const override {
    if (id == 256) return "<|end|>";
    if (id < 0 || id >= vocab_size()) charm::fail_invalid("token id out of range");
    return std::string(1, char(id));
  }
  int32_t token_id(std::string_view token) const override { return token == "<|end|>" ? 256 : -1; }
  int32_t vocab_size() const override { return 300; }
  bool is_special(int32_t id) const override { return id == 256; }
  bool has_token(int32_t id) const override { return id >= 0 && id <= 256; }
};

/// "<role>content\n" per message, then "<assistant>"; content "RAISE" raises, as a
/// template's raise_exception would.
class TagTemplate : public charm::ChatTemplate {
 public:
  std::string render(const std::vector<charm::ChatMessage>& messages, bool add_generation_prompt) const override {
    std::string out;
    for (const auto& m : messages) {
      if (m.content == "RAISE") charm::fail_invalid("template: conversation roles must alternate");
      out += "<" + m.role + ">" + m.content + "\n";
    }
    if (add_generation_prompt) out += "<assistant>";
    return out;
  }
  /// As render, then each extra variable as "[key=value]"; a message's "name" key as "(name)".
  std::string render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                          const nlohmann::ordered_json& extra_vars) const override {
    std::vector<charm::ChatMessage> list;
    std::string names;
    for (const auto& m : messages) {
      list.push_back({m.at("role"), m.at("content")});
      if (m.contains("name")) names += "(" + m.at("name").get<std::string>() + ")";
    }
    std::string vars;
    for (const auto& [k, v] : extra_vars.items()) vars += "[" + k + "=" + v.dump() + "]";
    return names + vars + render(list, add_generation_prompt);
  }
};

/// Replies with kReply one byte per token (stop strings and max_tokens honoured). A
/// prompt containing "boom" fails with an I/O error, "nobody" with kUnavailable,
/// "invalid" with kInvalidInput (as a bad tokenizer file would), "unsupported" with
/// kUnsupported, each naming server files or addresses;
/// "forever" emits "x" until cancelled (at most kForever pieces, whatever max_tokens).
class FakeEngine : public charm::Engine {
 public:
  static constexpr const char* kReply = "Hello, world!";
  static constexpr int64_t kForever = 200000;  // ~30 MB of events: more than socket buffers hold

  const charm::Tokenizer& tokenizer() const override { return tokenizer_; }
  /// As the real engine when the model has no usable template (no_template).
  const charm::ChatTemplate& chat_template() const override {
    if (no_template) charm::fail_invalid("model 'fake-moe' has no usable chat template (the server log says why)");
    return template_;
  }
  bool no_template = false;
  const std::string& model_name() const override { return name_; }
  int64_t max_context() const override { return 1000; }

  /// A generation that runs the fake's reply when waited for.
  class FakeGeneration : public charm::Generation {
   public:
    FakeGeneration(FakeEngine& engine, std::vector<int32_t> prompt, charm::SamplingParams params)
        : engine_(engine), prompt_(std::move(prompt)), params_(std::move(params)) {}
    charm::GenerationResult wait(const charm::TextCallback& on_text) override {
      return engine_.run(prompt_, params_, on_text);
    }

   private:
    FakeEngine& engine_;
    std::vector<int32_t> prompt_;
    charm::SamplingParams params_;
  };

  std::unique_ptr<charm::Generation> start(const std::vector<int32_t>& prompt, const charm::SamplingParams& params,
                                           std::vector<float>*) override {
    return std::make_unique<FakeGeneration>(*this, prompt, params);
  }

  charm::GenerationResult run(const std::vector<int32_t>& prompt, const charm::SamplingParams& params,
                              const charm::TextCallback& on_text) {
    std::string text = tokenizer_.decode(prompt, false);
    {
      std::lock_guard lock(mu_);
      last_prompt_ = prompt;
      last_params_ = params;
      cancelled_ = false;
      finished_ = false;
    }
    // What the real engine's failures carry: files, worker addresses, tensor names.
    if (text.find("boom") != std::string::npos) charm::fail_io("expert file /x/e3.bin: disk on fire");
    if (text.find("nobody") != std::string::npos)
      charm::fail_unavailable("layer 3: no live replica of expert 5; worker 'w1' (10.0.0.7:7702) down");
    if (text.find("invalid") != std::string::npos)
      charm::fail_invalid("/srv/models/m/tokenizer.json: token id 151771 is outside [0, 151669)");
    if (text.find("unsupported") != std::string::npos)
      charm::fail_unsupported("/srv/models/m/model.safetensors: tensor 'lm_head.weight' has dtype F8_E5M2");
    {
      std::lock_guard lock(mu_);
      if (params.seed) seeds_.push_back(*params.seed);
    }
    bool forever = text.find("forever") != std::string::npos;
    charm::GenerationResult r;
    r.prompt_tokens = int64_t(prompt.size());
    r.finish_reason = "length";
    std::string reply = kReply;
    int64_t limit = forever ? kForever : params.max_tokens;
    for (int64_t i = 0; i < limit; ++i) {
      if (!forever && size_t(i) == reply.size()) {
        r.finish_reason = "stop";
        break;
      }
      std::string piece = forever ? "x" : reply.substr(size_t(i), 1);
      bool hit_stop = false;
      for (const auto& s : params.stop)
        if ((r.text + piece).ends_with(s)) hit_stop = true;
      r.tokens.push_back(piece[0]);
      std::vector<charm::TokenLogprob> logprobs;
      if (params.logprobs) logprobs.push_back(fake_logprob(piece[0], i, params.top_logprobs));
      r.logprobs.insert(r.logprobs.end(), logprobs.begin(), logprobs.end());
      r.completion_tokens++;
      // Made-up latencies for /metrics: 5 ms to the first token, 2 ms each after.
      if (r.completion_tokens == 1) r.ttft_ms = 5;
      else r.token_latencies_ms.push_back(2);
      if (hit_stop) {  // the fake's stop strings are one character
        r.finish_reason = "stop";
        break;
      }
      r.text += piece;
      pieces_ = r.completion_tokens;
      if (!on_text(piece, logprobs)) {
        std::lock_guard lock(mu_);
        cancelled_ = true;
        break;
      }
    }
    std::lock_guard lock(mu_);
    finished_ = true;
    return r;
  }


  std::vector<charm::WorkerStatus> cluster_status() const override {
    charm::WorkerStatus a{"w0", "127.0.0.1:7001", charm::WorkerState::kUp, 64, 10, 1.5, 3.0, 1000, 2000, 0, 0, 12.5, false, "", "",
                          {{"ram", 64}}};
    a.layer_bytes_out = 900;  // 900 B over 30 token-layers of a 3-MoE-layer model
    a.layer_bytes_in = 1800;
    a.token_layers = 30;
    a.moe_layers = 3;
    charm::WorkerStatus b{"w1", "127.0.0.1:7002", charm::WorkerState::kDown, 0, 0, 0, 0, 0, 0, 2, 1, 800.0, false, "",
                          "heartbeat: timed out", {}};
    return {a, b};
  }

  /// The logprobs the fake reports for `token`, the i-th generated: -0.25 * (i + 1); its
  /// alternatives the token itself, then byte 0xE9 (a lone UTF-8 continuation byte: its
  /// text is U+FFFD), then masked ids (-inf), ids 'a', 'b', ...
  static charm::TokenLogprob fake_logprob(int32_t token, int64_t i, int64_t top_n) {
    charm::TokenLogprob lp;
    lp.token = token;
    lp.logprob = -0.25f * float(i + 1);
    for (int64_t k = 0; k < top_n; ++k) {
      if (k == 0) lp.top.emplace_back(token, lp.logprob);
      else if (k == 1) lp.top.emplace_back(0xE9, lp.logprob - 1);
      else lp.top.emplace_back('a' + int32_t(k - 2), -std::numeric_limits<float>::infinity());
    }
    return lp;
  }

  /// The seeds of every generation so far that had one, in the order they started.
  std::vector<uint64_t> seeds() {
    std::lock_guard lock(mu_);
    return seeds_;
  }

  std::vector<int32_t> last_prompt() {
    std::lock_guard lock(mu_);
    return last_prompt_;
  }
  charm::SamplingParams last_params() {
    std::lock_guard lock(mu_);
    return last_params_;
  }
  bool cancelled() {
    std::lock_guard lock(mu_);
    return cancelled_;
  }
  int64_t pieces() const { return pieces_; }
  bool finished() {
    std::lock_guard lock(mu_);
    return finished_;
  }

 private:
  ByteTokenizer tokenizer_;
  TagTemplate template_;
  std::string name_ = "fake-moe";
  std::mutex mu_;
  std::vector<int32_t> last_prompt_;
  charm::SamplingParams last_params_;
  std::vector<uint64_t> seeds_;
  bool cancelled_ = false;
  bool finished_ = false;
  std::atomic<int64_t> pieces_{0};
};

/// A FakeEngine served on a free loopback port, with a client.
struct Served {
  FakeEngine engine;
  charm::HttpApi api{engine, "127.0.0.1", 0};
  std::unique_ptr<httplib::Client> client;
  Served() {
    api.start();
    client = std::make_unique<httplib::Client>("127.0.0.1", api.port());
    client->set_read_timeout(30, 0);
  }
  httplib::Result post(const std::string& path, const json& body) {
    return client->Post(path.c_str(), body.dump(), "application/json");
  }
};

/// The `data:` payloads of an SSE body; checks the framing of every event.
std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    REQUIRE(end != std::string::npos);
    std::string event = body.substr(pos, end - pos);
    REQUIRE(event.rfind("data: ", 0) == 0);
    out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

/// Sends `request` bytes as they are to 127.0.0.1:port and returns everything the
/// server writes until it closes (requests here say "Connection: close"). The write side
/// stays open, as curl's does, so a server waiting for a body until EOF would stall.
std::string raw_exchange(uint16_t port, const std::string& request) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  timeval timeout{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(send(fd, request.data(), request.size(), 0) == ssize_t(request.size()));
  std::string reply;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) reply.append(buf, size_t(n));
  close(fd);
  return reply;
}

/// The status code and body of a raw HTTP/1.1 response (not chunked).
std::pair<int, std::string> raw_status_body(const std::string& reply) {
  REQUIRE(reply.rfind("HTTP/1.1 ", 0) == 0);
  size_t split = reply.find("\r\n\r\n");
  REQUIRE(split != std::string::npos);
  return {std::stoi(reply.substr(9, 3)), reply.substr(split + 4)};
}

/// Checks an OpenAI-style error response naming `param` (null when empty).
void check_error(const httplib::Result& res, int status, const std::string& param) {
  REQUIRE(res);
  CHECK(res->status == status);
  json body = json::parse(res->body);
  REQUIRE(body.contains("error"));
  CHECK(body["error"]["message"].is_string());
  CHECK(!body["error"]["message"].get<std::string>().empty());
  CHECK(body["error"]["type"].is_string());
  CHECK(body["error"]["code"].is_null());
  if (param.empty()) {
    CHECK(body["error"]["param"].is_null());
  } else {
    CHECK(body["error"]["param"] == param);
  }
}

}  // namespace

TEST_CASE("health, models and cluster status") {
  Served s;
  auto health = s.client->Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
  CHECK(json::parse(health->body) == json{{"status", "ok"}, {"model", "fake-moe"}});

  auto models = s.client->Get("/v1/models");
  REQUIRE(models);
  json m = json::parse(models->body);
  CHECK(m["object"] == "list");
  REQUIRE(m["data"].size() == 1);
  CHECK(m["data"][0]["id"] == "fake-moe");
  CHECK(m["data"][0]["object"] == "model");
  CHECK(m["data"][0]["owned_by"].is_string());
  CHECK(m["data"][0]["created"].is_number_integer());

  auto cluster = s.client->Get("/cluster/status");
  REQUIRE(cluster);
  json c = json::parse(cluster->body);
  REQUIRE(c["workers"].size() == 2);
  CHECK(c["workers"][0] == json{{"name", "w0"}, {"address", "127.0.0.1:7001"}, {"state", "up"},
                                {"experts_held", 64}, {"requests", 10}, {"rtt_p50_ms", 1.5},
                                {"rtt_p99_ms", 3.0}, {"bytes_out", 1000}, {"bytes_in", 2000},
                                {"failovers", 0}, {"rejoins", 0}, {"last_seen_ms", 12.5},
                                {"slow", false}, {"slow_reason", ""}, {"last_error", ""},
                                {"experts_by_tier", {{"ram", 64}}}, {"layer_bytes_out", 900},
                                {"layer_bytes_in", 1800}, {"token_layers", 30}, {"moe_layers", 3},
                                {"bytes_out_per_token", 90.0}, {"bytes_in_per_token", 180.0},
                                {"bytes_out_per_token_layer", 30.0}, {"bytes_in_per_token_layer", 60.0}});
  CHECK(c["workers"][1]["state"] == "down");
  CHECK(c["workers"][1]["bytes_in_per_token"] == 0.0);  // no token yet: 0, not a division by 0
  CHECK(c["workers"][1]["failovers"] == 2);
  CHECK(c["workers"][1]["rejoins"] == 1);
  CHECK(c["workers"][1]["last_error"] == "heartbeat: timed out");
}

TEST_CASE("completions: response shape, usage and defaults") {
  Served s;
  auto res = s.post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 5}});
  REQUIRE(res);
  REQUIRE(res->status == 200);
  CHECK(res->get_header_value("Content-Type") == "application/json");
  json b = json::parse(res->body);
  CHECK(b["object"] == "text_completion");
  CHECK(b["id"].get<std::string>().rfind("cmpl-", 0) == 0);
  CHECK(b["model"] == "fake-moe");
  CHECK(b["created"].is_number_integer());
  REQUIRE(b["choices"].size() == 1);
  CHECK(b["choices"][0] == json{{"text", "Hello"}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", "length"}});
  CHECK(b["usage"] == json{{"prompt_tokens", 2}, {"completion_tokens", 5}, {"total_tokens", 7}});
  CHECK(s.engine.last_prompt() == std::vector<int32_t>{'h', 'i'});

  // OpenAI defaults when fields are absent.
  res = s.post("/v1/completions", {{"prompt", "hi"}});
  REQUIRE(res);
  REQUIRE(res->status == 200);
  charm::SamplingParams p = s.engine.last_params();
  CHECK(p.temperature == 1.0);
  CHECK(p.top_p == 1.0);
  CHECK(p.top_k == 0);
  CHECK(p.max_tokens == 256);
  CHECK(!p.seed.has_value());
  CHECK(p.stop.empty());
  json b2 = json::parse(res->body);
  CHECK(b2["choices"][0]["text"] == FakeEngine::kReply);
  CHECK(b2["choices"][0]["finish_reason"] == "stop");
}

TEST_CASE("completions: prompt forms and sampling fields reach the engine") {
  Served s;
  auto res = s.post("/v1/completions", {{"prompt", json::array({"ab<|end|>"})}, {"max_tokens", 1}});
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(s.engine.last_prompt() == std::vector<int32_t>{'a', 'b', 256});  // special token parsed

  res = s.post("/v1/completions", {{"prompt", json::array({7, 8, 9})}, {"max_tokens", 1}});
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(s.engine.last_prompt() == std::vector<int32_t>{7, 8, 9});

  res = s.post("/v1/completions", {{"prompt", json::array({json::array({4, 5})})}, {"max_tokens", 1}});
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(s.engine.last_prompt() == std::vector<int32_t>{4, 5});

  res = s.post("/v1/completions", {{"prompt", "x"}, {"temperature", 0.5}, {"top_p", 0.9}, {"top_k", 40},
                                   {"seed", 7}, {"stop", json::array({"o", "z"})}, {"max_tokens", 50}});
  REQUIRE(res);
  REQUIRE(res->status == 200);
  charm::SamplingParams p = s.engine.last_params();
  CHECK(p.temperature == 0.5);
  CHECK(p.top_p == 0.9);
  CHECK(p.top_k == 40);
  REQUIRE(p.seed.has_value());
  CHECK(*p.seed == 7u);
  CHECK(p.max_tokens == 50);
  CHECK(p.stop == std::vector<std::string>{"o", "z"});
  json b = json::parse(res->body);
  CHECK(b["choices"][0]["text"] == "Hell");
  CHECK(b["choices"][0]["finish_reason"] == "stop");

  res = s.post("/v1/completions", {{"prompt", "x"}, {"stop", "l"}, {"top_k", -1}, {"temperature", 0}});
  REQUIRE(res);
  REQUIRE(res->status == 200);
  CHECK(s.engine.last_params().stop == std::vector<std::string>{"l"});
  CHECK(s.engine.last_params().top_k == 0);
  CHECK(s.engine.last_params().temperature == 0.0);
}

TEST_CASE("chat completions: template, tokenization and response shape") {
  Served s;
  json messages = json::array({{{"role", "system"}, {"content", "be brief"}},
                               {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "hi "}},
                                                                           {{"type", "text"}, {"text", "there"}}})}}});
  auto res = s.post("/v1/chat/completions", {{"messages", messages}, {"max_completion_tokens", 3}});
  REQUIRE(res);
  REQUIRE(res->status == 200);
  ByteTokenizer tok;
  CHECK(s.engine.last_prompt() == tok.encode("<system>be brief\n<user>hi there\n<assistant>", true));
  CHECK(s.engine.last_params().max_tokens == 3);
  json b = json::parse(res->body);
  CHECK(b["object"] == "chat.completion");
  CHECK(b["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
  REQUIRE(b["choices"].size() == 1);
  CHECK(b["choices"][0]["index"] == 0);
  CHECK(b["choices"][0]["message"] == json{{"role", "assistant"}, {"content", "Hel"}});
  CHECK(b["choices"][0]["finish_reason"] == "length");
  int64_t prompt_tokens = int64_t(s.engine.last_prompt().size());
  CHECK(b["usage"] == json{{"prompt_tokens", prompt_tokens}, {"completion_tokens", 3},
                           {"total_tokens", prompt_tokens + 3}});
}

TEST_CASE("chat: extra message keys and chat_template_kwargs reach the template") {
  Served s;
  json messages = json::array({{{"role", "user"}, {"content", "hi"}, {"name", "ann"}},
                               {{"role", "assistant"}, {"content", nullptr}}});
  auto res = s.post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 1},
                                             {"chat_template_kwargs", {{"enable_thinking", false}}}});
  REQUIRE(res);
  REQUIRE(res->status == 200);
  ByteTokenizer tok;
  CHECK(s.engine.last_prompt() == tok.encode("(ann)[enable_thinking=false]<user>hi\n<assistant>\n<assistant>", true));
  check_error(s.post("/v1/chat/completions", {{"messages", messages}, {"chat_template_kwargs", "x"}}), 400,
              "chat_template_kwargs");
}

TEST_CASE("completions stream: SSE framing and text equal to the whole response") {
  Served s;
  auto whole = s.post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 8}});
  REQUIRE(whole);
  std::string expected = json::parse(whole->body)["choices"][0]["text"];

  auto res = s.post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 8}, {"stream", true}});
  REQUIRE(res);
  REQUIRE(res->status == 200);
  CHECK(res->get_header_value("Content-Type") == "text/event-stream");
  std::vector<std::string> events = sse_payloads(res->body);
  REQUIRE(events.size() == 8 + 2);  // one per piece, the finish chunk, [DONE]
  CHECK(events.back() == "[DONE]");
  std::string text;
  std::string id;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    CHECK(c["object"] == "text_completion");
    CHECK(!c.contains("usage"));
    if (id.empty()) id = c["id"];
    CHECK(c["id"] == id);  // one id for the whole stream
    REQUIRE(c["choices"].size() == 1);
    text += c["choices"][0]["text"].get<std::string>();
    bool last = i + 2 == events.size();
    CHECK(c["choices"][0]["finish_reason"] == (last ? json("length") : json(nullptr)));
  }
  CHECK(text == expected);
}

TEST_CASE("chat stream: role chunk, content deltas, finish chunk, usage chunk") {
  Served s;
  json body = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  auto res = s.post("/v1/chat/completions", body);
  REQUIRE(res);
  REQUIRE(res->status == 200);
  std::vector<std::string> events = sse_payloads(res->body);
  size_t n = std::string(FakeEngine::kReply).size();
  REQUIRE(events.size() == 1 + n + 1 + 1 + 1);  // role, pieces, finish, usage, [DONE]
  CHECK(events.back() == "[DONE]");

  json first = json::parse(events[0]);
  CHECK(first["object"] == "chat.completion.chunk");
  CHECK(first["choices"][0]["delta"]["role"] == "assistant");
  CHECK(first["usage"].is_null());
  std::string content;
  for (size_t i = 1; i <= n; ++i) {
    json c = json::parse(events[i]);
    CHECK(c["choices"][0]["finish_reason"].is_null());
    CHECK(!c["choices"][0]["delta"].contains("role"));
    content += c["choices"][0]["delta"]["content"].get<std::string>();
  }
  CHECK(content == FakeEngine::kReply);
  json finish = json::parse(events[n + 1]);
  CHECK(finish["choices"][0]["finish_reason"] == "stop");
  CHECK(finish["choices"][0]["delta"] == json::object());
  json usage = json::parse(events[n + 2]);
  CHECK(usage["choices"] == json::array());
  int64_t prompt_tokens = int64_t(s.engine.last_prompt().size());
  CHECK(usage["usage"] == json{{"prompt_tokens", prompt_tokens}, {"completion_tokens", int64_t(n)},
                               {"total_tokens", prompt_tokens + int64_t(n)}});
}

TEST_CASE("bad requests get 400 naming the field") {
  Served s;
  json user = json::array({{{"role", "user"}, {"content", "hi"}}});
  auto raw = s.client->Post("/v1/chat/completions", "{not json", "application/json");
  check_error(raw, 400, "");
  raw = s.client->Post("/v1/completions", "[1, 2]", "application/json");
  check_error(raw, 400, "");

  check_error(s.post("/v1/chat/completions", json::object()), 400, "messages");
  check_error(s.post("/v1/chat/completions", {{"messages", json::array()}}), 400, "messages");
  check_error(s.post("/v1/chat/completions", {{"messages", "hi"}}), 400, "messages");
  check_error(s.post("/v1/chat/completions", {{"messages", json::array({{{"role", "wizard"}, {"content", "x"}}})}}),
              400, "messages[0].role");
  check_error(s.post("/v1/chat/completions", {{"messages", json::array({{{"content", "x"}}})}}), 400,
              "messages[0].role");
  check_error(s.post("/v1/chat/completions", {{"messages", json::array({{{"role", "user"}, {"content", 5}}})}}),
              400, "messages[0].content");
  check_error(s.post("/v1/chat/completions",
                     {{"messages", json::array({{{"role", "user"},
                                                 {"content", json::array({{{"type", "image_url"}}})}}})}}),
              400, "messages[0].content");
  check_error(s.post("/v1/chat/completions", {{"messages", user}, {"temperature", -1}}), 400, "temperature");
  check_error(s.post("/v1/chat/completions", {{"messages", user}, {"temperature", "hot"}}), 400, "temperature");
  check_error(s.post("/v1/chat/completions", {{"messages", user}, {"top_p", 0}}), 400, "top_p");
  check_error(s.post("/v1/chat/completions", {{"messages", user}, {"top_p", 1.5}}), 400, "top_p");
  check_error(s.post("/v1/chat/completions", {{"messages", user}, {"top_k", -2}}), 400, "top_k");
  check_error(s.post("/v1/chat/completions", {{"messages", user}, {"max_tokens", 0}}), 400, "max_tokens");
  check_error(s.post("/v1/chat/completions", {{"messages", user}, {"max_tokens", 1.5}}), 400, "max_tokens");
  check_error(s.post("/v1/chat/completions", {{"messages", user}, {"max_tokens", 995}}), 400, "max_tokens");
  check_error(s.post("/v1/chat/completions", {{"messages", user}, {"n", 17}}), 400, "n");
  check_error(s.post("/v1/chat/completions", {{"messages", user}, {"seed", "x"}}), 400, "seed");
  check_error(s.post("/v1/chat/completions", {{"messages", user}, {"stop", 5}}), 400, "stop");
  check_error(s.post("/v1/chat/completions", {{"messages", user}, {"stop", json::array({""})}}), 400, "stop");
  check_error(s.post("/v1/chat/completions", {{"messages", user}, {"stream", "yes"}}), 400, "stream");
  check_error(s.post("/v1/chat/completions", {{"messages", user}, {"stream_options", {{"include_usage", true}}}}),
              400, "stream_options");
  check_error(s.post("/v1/chat/completions", {{"messages", user}, {"logprobs", "yes"}}), 400, "logprobs");

  check_error(s.post("/v1/completions", {{"max_tokens", 3}}), 400, "prompt");
  check_error(s.post("/v1/completions", {{"prompt", 5}}), 400, "prompt");
  check_error(s.post("/v1/completions", {{"prompt", json::array({"a", "b"})}}), 400, "prompt");
  check_error(s.post("/v1/completions", {{"prompt", json::array({1, "b"})}}), 400, "prompt");
  check_error(s.post("/v1/completions", {{"prompt", json::array({-1})}}), 400, "prompt");
  check_error(s.post("/v1/completions", {{"prompt", json::array({300})}}), 400, "prompt");  // outside vocab
  check_error(s.post("/v1/completions", {{"prompt", ""}}), 400, "prompt");
  check_error(s.post("/v1/completions", {{"prompt", std::string(1000, 'a')}, {"max_tokens", 1}}), 400, "prompt");
  check_error(s.post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 999}}), 400, "max_tokens");
  // The limit itself is allowed: 2 + 998 = 1000.
  auto ok = s.post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 998}});
  REQUIRE(ok);
  CHECK(ok->status == 200);
}

TEST_CASE("unknown paths get 404, wrong methods 405") {
  Served s;
  auto res = s.client->Get("/v1/nothing");
  REQUIRE(res);
  CHECK(res->status == 404);
  CHECK(json::parse(res->body)["error"]["message"].get<std::string>().find("/v1/nothing") != std::string::npos);
  res = s.client->Post("/nothing", "{}", "application/json");
  REQUIRE(res);
  CHECK(res->status == 404);

  res = s.client->Get("/v1/completions");
  REQUIRE(res);
  CHECK(res->status == 405);
  CHECK(res->get_header_value("Allow") == "POST");
  CHECK(json::parse(res->body)["error"]["type"] == "invalid_request_error");
  res = s.client->Post("/health", "{}", "application/json");
  REQUIRE(res);
  CHECK(res->status == 405);
  res = s.client->Delete("/v1/chat/completions");
  REQUIRE(res);
  CHECK(res->status == 405);
}

/// Collects what spdlog logs while it lives (the default logger's sinks, swapped).
struct LogCapture {
  std::ostringstream text;
  std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
  LogCapture() {
    spdlog::set_default_logger(
        std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(text)));
  }
  ~LogCapture() { spdlog::set_default_logger(previous); }
};

/// Checks a 5xx error (a response body's or a stream event's) for request `id`: the
/// fixed text naming the id and none of `hidden`, type server_error; the server log
/// names the id with the detail.
void check_server_error(const json& body, int status, const std::string& id, const LogCapture& log,
                        const std::vector<std::string>& hidden) {
  const std::string message = body["error"]["message"];
  CAPTURE(message);
  CHECK(body["error"]["type"] == "server_error");
  CHECK(message.find(status == 503 ? "retry later" : "internal server error") != std::string::npos);
  CHECK(message.find("request " + id) != std::string::npos);
  const std::string logged = log.text.str();
  CAPTURE(logged);
  CHECK(logged.find("request " + id) != std::string::npos);
  for (const std::string& h : hidden) {
    CHECK(message.find(h) == std::string::npos);
    CHECK(logged.find(h) != std::string::npos);
  }
}

TEST_CASE("request errors are 400; server failures 500 / 503 without paths or addresses, the detail logged") {
  Served s;
  // A template's raise_exception: the request's fault, its text reaches the client.
  auto res = s.post("/v1/chat/completions", {{"messages", json::array({{{"role", "user"}, {"content", "RAISE"}}})}});
  check_error(res, 400, "");
  CHECK(json::parse(res->body)["error"]["message"].get<std::string>().find("alternate") != std::string::npos);

  struct Case {
    std::string prompt;
    int status;
    std::vector<std::string> hidden;
  };
  const std::vector<Case> cases = {
      {"boom", 500, {"/x/e3.bin", "disk on fire"}},
      // kInvalidInput while generating is a bad server file (tokenizer.json), not the client.
      {"invalid", 500, {"/srv/models/m/tokenizer.json", "151771"}},
      {"unsupported", 500, {"/srv/models/m/model.safetensors", "lm_head.weight"}},
      // No live replica: 503 (a retry may succeed), without the worker's address.
      {"nobody", 503, {"10.0.0.7", "w1"}},
  };
  for (const Case& c : cases) {
    for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
      CAPTURE(c.prompt);
      CAPTURE(path);
      const bool chat = std::string(path) == "/v1/chat/completions";
      json body = chat ? json{{"messages", json::array({{{"role", "user"}, {"content", c.prompt}}})}}
                       : json{{"prompt", c.prompt}};
      {
        LogCapture log;
        res = s.post(path, body);
        check_error(res, c.status, "");
        const std::string id = res->get_header_value("X-Request-Id");
        CHECK(id.rfind(chat ? "chatcmpl-" : "cmpl-", 0) == 0);
        check_server_error(json::parse(res->body), c.status, id, log, c.hidden);
      }
      // After the stream began (200 sent): the same error as an event, then [DONE].
      LogCapture log;
      body["stream"] = true;
      res = s.post(path, body);
      REQUIRE(res);
      CHECK(res->status == 200);
      std::vector<std::string> events = sse_payloads(res->body);
      REQUIRE(events.size() >= 2);
      CHECK(events.back() == "[DONE]");
      const json error = json::parse(events[events.size() - 2]);
      REQUIRE(error.contains("error"));
      check_server_error(error, c.status, res->get_header_value("X-Request-Id"), log, c.hidden);
      if (chat) CHECK(json::parse(events[0])["id"] == res->get_header_value("X-Request-Id"));
    }
  }

  auto health = s.client->Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
}

// Completions never need the chat template: a model without one still serves them.
TEST_CASE("a model without a chat template serves completions; chat gets a 400 naming the model") {
  Served s;
  s.engine.no_template = true;
  auto res = s.post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 3}});
  REQUIRE(res);
  CHECK(res->status == 200);
  res = s.post("/v1/completions", {{"prompt", json::array({104, 105})}, {"max_tokens", 3}});
  REQUIRE(res);
  CHECK(res->status == 200);
  res = s.post("/v1/chat/completions", {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}});
  check_error(res, 400, "");
  CHECK(json::parse(res->body)["error"]["message"].get<std::string>().find("no usable chat template") !=
        std::string::npos);
}

TEST_CASE("a client that disconnects mid-stream cancels the generation") {
  Served s;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = json{{"prompt", "forever"}, {"max_tokens", 10}, {"stream", true}}.dump();
  req.set_header("Content-Type", "application/json");
  size_t received = 0;
  req.content_receiver = [&](const char*, size_t len, uint64_t, uint64_t) {
    received += len;
    return false;  // hang up after the first bytes
  };
  // "forever" keeps the server writing well after the client has gone.
  s.client->send(req);
  CHECK(received > 0);
  // Wait (bounded) for the server to notice; no timing is asserted.
  for (int i = 0; i < 1000 && !s.engine.finished(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(s.engine.finished());
  CHECK(s.engine.cancelled());
  CHECK(s.engine.pieces() < FakeEngine::kForever);

  auto health = s.client->Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
}

TEST_CASE("start reports a port in use, stop is idempotent") {
  FakeEngine engine;
  charm::HttpApi first(engine, "127.0.0.1", 0);
  first.start();
  CHECK(first.port() != 0);
  charm::HttpApi second(engine, "127.0.0.1", first.port());
  CHECK_THROWS_AS(second.start(), charm::Error);
  first.stop();
  first.stop();
}

TEST_CASE("a number that overflows a double is a 400 naming the field, never a 500") {
  Served s;
  std::string user = R"("messages": [{"role": "user", "content": "hi"}])";
  auto res = s.client->Post("/v1/chat/completions", "{" + user + R"(, "temperature": 1e400})", "application/json");
  check_error(res, 400, "temperature");
  CHECK(json::parse(res->body)["error"]["type"] == "invalid_request_error");
  res = s.client->Post("/v1/chat/completions", "{" + user + R"(, "top_p": -1e400})", "application/json");
  check_error(res, 400, "top_p");
  // Nested: the path names the array element and key.
  res = s.client->Post("/v1/chat/completions",
                       R"({"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": 1e999}]})",
                       "application/json");
  check_error(res, 400, "messages[1].content");
  res = s.client->Post("/v1/completions", R"({"prompt": [1, 2, 1e400]})", "application/json");
  check_error(res, 400, "prompt[2]");
  res = s.client->Post("/v1/completions", "1e400", "application/json");
  check_error(res, 400, "");
  // Other parse errors stay 400 with no field; empty bodies say so.
  check_error(s.client->Post("/v1/completions", R"({"prompt": "x", "seed": 1)", "application/json"), 400, "");
  res = s.client->Post("/v1/completions", "", "application/json");
  check_error(res, 400, "");
  CHECK(json::parse(res->body)["error"]["message"].get<std::string>().find("empty") != std::string::npos);
}

TEST_CASE("max_tokens near INT64_MAX is a 400 naming it, never an overflow past the context check") {
  Served s;
  for (const char* big : {"9223372036854775807", "9223372036854775806", "9223372036854775800"}) {
    CAPTURE(big);
    auto res = s.client->Post("/v1/completions", std::string(R"({"prompt": "hello world", "max_tokens": )") + big + "}",
                              "application/json");
    check_error(res, 400, "max_tokens");
    res = s.client->Post("/v1/chat/completions",
                         std::string(R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": )") +
                             big + "}",
                         "application/json");
    REQUIRE(res);
    CHECK(res->status == 400);
  }
  auto health = s.client->Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
}

TEST_CASE("JSON nested deeper than the limit is a 400 naming the field, and the server lives") {
  Served s;
  // 20000 levels in 40 KB: one unauthenticated request used to take the process down.
  const std::string deep = std::string(20000, '[') + std::string(20000, ']');
  auto res = s.client->Post(
      "/v1/chat/completions",
      R"({"messages": [{"role": "user", "content": "hi", "tool_calls": )" + deep + "}]}", "application/json");
  std::string where = "messages[0].tool_calls";  // then one [0] per array down to the 65th level
  for (int level = 4; level < 66; ++level) where += "[0]";
  check_error(res, 400, where);
  CHECK(json::parse(res->body)["error"]["message"].get<std::string>().find("limit of 64 levels") != std::string::npos);
  res = s.client->Post("/v1/chat/completions",
                       R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"x": )" + deep +
                           "}}",
                       "application/json");
  REQUIRE(res);
  CHECK(res->status == 400);
  CHECK(json::parse(res->body)["error"]["param"].get<std::string>().rfind("chat_template_kwargs.x[0]", 0) == 0);
  res = s.client->Post("/v1/completions", deep, "application/json");
  REQUIRE(res);
  CHECK(res->status == 400);
  CHECK(json::parse(res->body)["error"]["param"].get<std::string>().rfind("[0][0]", 0) == 0);
  auto health = s.client->Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
}

TEST_CASE("errors httplib raises before routing carry the JSON error body") {
  Served s;
  // POST with neither Content-Length nor Transfer-Encoding (curl -X POST, no -d): the
  // body is empty, answered at once with the route's error.
  auto [status, body] = raw_status_body(raw_exchange(
      s.api.port(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  CHECK(status == 400);
  json b = json::parse(body);
  CHECK(b["error"]["type"] == "invalid_request_error");
  CHECK(b["error"]["message"].get<std::string>().find("empty") != std::string::npos);

  std::tie(status, body) =
      raw_status_body(raw_exchange(s.api.port(), "POST /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  CHECK(status == 404);
  CHECK(json::parse(body)["error"]["type"] == "not_found_error");

  std::tie(status, body) = raw_status_body(
      raw_exchange(s.api.port(), "PUT /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  CHECK(status == 405);
  CHECK(json::parse(body)["error"]["message"].get<std::string>().find("PUT") != std::string::npos);

  // A body httplib cannot read (bad chunk size): its 400 gets a JSON body, or the
  // path's 404 when no route would have served it.
  const std::string bad_chunks = " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
  std::tie(status, body) = raw_status_body(raw_exchange(s.api.port(), "POST /v1/completions" + bad_chunks));
  CHECK(status == 400);
  CHECK(json::parse(body)["error"]["type"] == "invalid_request_error");
  std::tie(status, body) = raw_status_body(raw_exchange(s.api.port(), "POST /nope" + bad_chunks));
  CHECK(status == 404);
  CHECK(json::parse(body)["error"]["type"] == "not_found_error");

  // Content-Length: 0 reaches the handler: the same empty-body 400.
  std::tie(status, body) = raw_status_body(raw_exchange(
      s.api.port(),
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"));
  CHECK(status == 400);
  CHECK(json::parse(body)["error"]["message"].get<std::string>().find("empty") != std::string::npos);

  // The server is still up and serving.
  auto ok = s.post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 1}});
  REQUIRE(ok);
  CHECK(ok->status == 200);
}

TEST_CASE("default max_tokens is lowered to what the context leaves; an explicit one is not") {
  Served s;  // the fake's context is 1000 tokens, one token per byte
  auto res = s.post("/v1/completions", {{"prompt", std::string(900, 'a')}});
  REQUIRE(res);
  REQUIRE(res->status == 200);
  CHECK(s.engine.last_params().max_tokens == 100);
  res = s.post("/v1/completions", {{"prompt", std::string(999, 'a')}});
  REQUIRE(res);
  REQUIRE(res->status == 200);
  CHECK(s.engine.last_params().max_tokens == 1);
  res = s.post("/v1/completions", {{"prompt", std::string(10, 'a')}});
  REQUIRE(res);
  REQUIRE(res->status == 200);
  CHECK(s.engine.last_params().max_tokens == 256);
  // A prompt that fills the context still fails, naming the prompt.
  check_error(s.post("/v1/completions", {{"prompt", std::string(1000, 'a')}}), 400, "prompt");
  // Chat: the rendered prompt counts.
  json long_chat = json::array({{{"role", "user"}, {"content", std::string(950, 'a')}}});
  res = s.post("/v1/chat/completions", {{"messages", long_chat}});
  REQUIRE(res);
  REQUIRE(res->status == 200);
  int64_t prompt_tokens = int64_t(s.engine.last_prompt().size());
  CHECK(s.engine.last_params().max_tokens == 1000 - prompt_tokens);
  // Explicit values that do not fit stay errors.
  check_error(s.post("/v1/completions", {{"prompt", std::string(900, 'a')}, {"max_tokens", 101}}), 400, "max_tokens");
  check_error(s.post("/v1/chat/completions", {{"messages", long_chat}, {"max_completion_tokens", 256}}), 400,
              "max_tokens");
  res = s.post("/v1/completions", {{"prompt", std::string(900, 'a')}, {"max_tokens", 100}});
  REQUIRE(res);
  CHECK(res->status == 200);
}

TEST_CASE("fields asking for what charm does not do get 400; their off values and harmless fields pass") {
  Served s;
  json user = json::array({{{"role", "user"}, {"content", "hi"}}});
  json prompt = {{"prompt", "hi"}, {"max_tokens", 1}};
  auto with = [](json body, const char* key, json value) {
    body[key] = std::move(value);
    return body;
  };
  auto rejected = [&](const std::string& path, const json& body, const std::string& param) {
    auto res = s.post(path, body);
    check_error(res, 400, param);
    CHECK(json::parse(res->body)["error"]["message"].get<std::string>().find("not supported") != std::string::npos);
  };
  const std::string cmpl = "/v1/completions", chat = "/v1/chat/completions";
  json chat_body = {{"messages", user}, {"max_tokens", 1}};
  rejected(cmpl, with(prompt, "echo", true), "echo");
  rejected(cmpl, with(prompt, "best_of", 2), "best_of");
  rejected(cmpl, with(prompt, "best_of", 0), "best_of");
  rejected(cmpl, with(prompt, "suffix", "tail"), "suffix");
  rejected(cmpl, with(prompt, "top_logprobs", 2), "top_logprobs");  // completions: 'logprobs': N instead
  for (const auto& [path, body] : {std::pair{cmpl, prompt}, std::pair{chat, chat_body}})
    rejected(path, with(body, "logit_bias", {{"50256", -100}}), "logit_bias");
  // Mistyped: 400 naming the field (not "not supported").
  check_error(s.post(cmpl, with(prompt, "echo", "yes")), 400, "echo");
  check_error(s.post(cmpl, with(prompt, "best_of", "2")), 400, "best_of");
  check_error(s.post(cmpl, with(prompt, "suffix", 3)), 400, "suffix");
  check_error(s.post(chat, with(chat_body, "logit_bias", json::array())), 400, "logit_bias");
  check_error(s.post(chat, with(chat_body, "presence_penalty", "high")), 400, "presence_penalty");

  // Values meaning "off", and fields that change nothing charm returns, are accepted.
  json off = prompt;
  off.update({{"echo", false}, {"best_of", 1}, {"suffix", ""}, {"logprobs", 0}, {"top_logprobs", nullptr},
              {"presence_penalty", 0}, {"frequency_penalty", 0.0}, {"logit_bias", json::object()},
              {"user", "u1"}, {"metadata", {{"k", "v"}}}, {"service_tier", "auto"}, {"model", "anything"}});
  auto res = s.post(cmpl, off);
  REQUIRE(res);
  CHECK(res->status == 200);
  json chat_off = chat_body;
  chat_off.update({{"logprobs", false}, {"best_of", nullptr}, {"suffix", nullptr}, {"presence_penalty", 0},
                   {"logit_bias", nullptr}, {"user", "u1"}, {"store", false}, {"parallel_tool_calls", true}});
  res = s.post(chat, chat_off);
  REQUIRE(res);
  CHECK(res->status == 200);
}

TEST_CASE("tool calling and structured output are refused by name, not ignored") {
  for (const char* body : {
           R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}]})",
           R"({"messages":[{"role":"user","content":"hi"}],"tool_choice":"auto"})",
           R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}})"}) {
    CAPTURE(body);
    charm::test::expect_throw<charm::ApiError>([&] { charm::parse_chat_request(body); }, {"is not supported"});
  }
  CHECK_NOTHROW(charm::parse_chat_request(
      R"({"messages":[{"role":"user","content":"hi"}],"tools":[],"tool_choice":"none","response_format":{"type":"text"}})"));
}

// --- API key and /metrics ------------------------------------------------------------

namespace {

/// A FakeEngine served with an API key and a Metrics the test can read.
struct ServedWithKey {
  static constexpr const char* kKey = "sk-test-0123456789abcdef";
  FakeEngine engine;
  charm::Metrics metrics;
  charm::HttpApi api{engine, "127.0.0.1", 0, &metrics};
  std::unique_ptr<httplib::Client> client;
  ServedWithKey() {
    api.set_api_key(kKey);
    api.start();
    client = std::make_unique<httplib::Client>("127.0.0.1", api.port());
    client->set_read_timeout(30, 0);
  }
};

/// Checks a 401 with OpenAI's invalid_api_key error body.
void check_unauthorized(const httplib::Result& res) {
  REQUIRE(res);
  CHECK(res->status == 401);
  CHECK(res->get_header_value("WWW-Authenticate") == "Bearer");
  json body = json::parse(res->body);
  CHECK(body["error"]["code"] == "invalid_api_key");
  CHECK(body["error"]["type"] == "invalid_request_error");
  CHECK(body["error"]["message"].get<std::string>().find("API key") != std::string::npos);
}

/// The value of the sample `series` (name with labels, exactly as rendered) in a
/// Prometheus text body; every line is checked to be a comment or "series value".
double sample(const std::string& text, const std::string& series) {
  std::istringstream lines(text);
  std::optional<double> found;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') {
      CHECK((line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0));
      continue;
    }
    const size_t space = line.rfind(' ');
    REQUIRE(space != std::string::npos);
    const std::string value = line.substr(space + 1);
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    CHECK_MESSAGE((end == value.c_str() + value.size() || value == "+Inf"), line);
    if (line.substr(0, space) == series) found = v;
  }
  if (!found) FAIL("no sample " << series);
  return found.value_or(0);
}

}  // namespace

TEST_CASE("an API key is required on every endpoint but /health") {
  ServedWithKey s;
  auto health = s.client->Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);

  for (const char* path : {"/v1/models", "/cluster/status", "/metrics", "/dashboard/state", "/no/such/path"}) {
    INFO(path);
    check_unauthorized(s.client->Get(path));
  }
  check_unauthorized(s.client->Post("/v1/completions", json{{"prompt", "hi"}}.dump(), "application/json"));
  // A wrong key, a key of another length, another scheme: all 401.
  for (const char* header : {"Bearer sk-test-0123456789abcdeX", "Bearer short", "Basic c2stdGVzdA==",
                             "bearer sk-test-0123456789abcdef"}) {
    INFO(header);
    check_unauthorized(s.client->Get("/v1/models", {{"Authorization", header}}));
  }

  s.client->set_bearer_token_auth(ServedWithKey::kKey);
  auto models = s.client->Get("/v1/models");
  REQUIRE(models);
  CHECK(models->status == 200);
  auto res = s.client->Post("/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 3}}.dump(), "application/json");
  REQUIRE(res);
  CHECK(res->status == 200);
  // With the key, an unknown path is an ordinary 404 again.
  auto missing = s.client->Get("/no/such/path");
  REQUIRE(missing);
  CHECK(missing->status == 404);
}

TEST_CASE("/metrics: Prometheus text whose counters move with requests") {
  ServedWithKey s;
  s.client->set_bearer_token_auth(ServedWithKey::kKey);
  auto before = s.client->Get("/metrics");
  REQUIRE(before);
  REQUIRE(before->status == 200);
  CHECK(before->get_header_value("Content-Type").find("text/plain; version=0.0.4") == 0);
  CHECK(sample(before->body, "charm_prompt_tokens_total") == 0);
  CHECK(sample(before->body, "charm_completion_tokens_total") == 0);
  CHECK(sample(before->body, "charm_time_to_first_token_seconds_count") == 0);
  // The engine's workers appear as gauges.
  CHECK(sample(before->body, "charm_worker_up{worker=\"w0\"}") == 1);
  CHECK(sample(before->body, "charm_worker_up{worker=\"w1\"}") == 0);
  CHECK(sample(before->body, "charm_worker_experts_held{worker=\"w0\"}") == 64);

  // "hi" is 2 byte-tokens; 5 tokens generated, whole and streamed.
  auto whole = s.client->Post("/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 5}}.dump(), "application/json");
  REQUIRE(whole);
  REQUIRE(whole->status == 200);
  auto streamed = s.client->Post("/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 5}, {"stream", true}}.dump(),
                                 "application/json");
  REQUIRE(streamed);
  REQUIRE(streamed->status == 200);
  auto bad = s.client->Post("/v1/completions", json{{"prompt", 7}}.dump(), "application/json");
  REQUIRE(bad);
  REQUIRE(bad->status == 400);

  // httplib counts a request (its logger) after writing the response, so the 400 and
  // the first /metrics may not be counted yet when the next request arrives on a new
  // connection: poll, bounded.
  std::string m;
  for (int i = 0; i < 500; ++i) {
    auto after = s.client->Get("/metrics");
    REQUIRE(after);
    m = after->body;
    const auto count = [&m](const std::string& name) {
      return m.find(name) == std::string::npos ? 0.0 : sample(m, name);
    };
    if (count("charm_http_requests_total{endpoint=\"/v1/completions\",status=\"200\"}") >= 2 &&
        count("charm_http_requests_total{endpoint=\"/v1/completions\",status=\"400\"}") >= 1 &&
        count("charm_http_requests_total{endpoint=\"/metrics\",status=\"200\"}") >= 1)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  INFO(m);
  CHECK(sample(m, "charm_prompt_tokens_total") == 4);
  CHECK(sample(m, "charm_completion_tokens_total") == 10);
  CHECK(sample(m, "charm_http_requests_total{endpoint=\"/v1/completions\",status=\"200\"}") == 2);
  CHECK(sample(m, "charm_http_requests_total{endpoint=\"/v1/completions\",status=\"400\"}") == 1);
  CHECK(sample(m, "charm_http_requests_total{endpoint=\"/metrics\",status=\"200\"}") >= 1);
  // TTFT 5 ms per generation: in the 0.01 s bucket, not in the 0.0025 one it does not reach.
  CHECK(sample(m, "charm_time_to_first_token_seconds_count") == 2);
  CHECK(sample(m, "charm_time_to_first_token_seconds_bucket{le=\"0.01\"}") == 2);
  CHECK(sample(m, "charm_time_to_first_token_seconds_sum") == doctest::Approx(0.010));
  // 4 later tokens per generation at 2 ms: le=0.0025 holds all 8, le=0.001 none.
  CHECK(sample(m, "charm_time_per_output_token_seconds_count") == 8);
  CHECK(sample(m, "charm_time_per_output_token_seconds_bucket{le=\"0.001\"}") == 0);
  CHECK(sample(m, "charm_time_per_output_token_seconds_bucket{le=\"0.0025\"}") == 8);
  CHECK(sample(m, "charm_time_per_output_token_seconds_bucket{le=\"+Inf\"}") == 8);
}

TEST_CASE("Metrics: histogram buckets are cumulative and label values escaped") {
  charm::Metrics metrics;
  metrics.worker_rpc("w\"1\n", 0.0003);
  metrics.worker_rpc("w\"1\n", 0.004);
  metrics.worker_rpc("w\"1\n", 100);  // beyond the last bound: only +Inf
  metrics.worker_error("w2");
  metrics.failover("w2");
  metrics.failover("w2");
  metrics.expert_stats("w2", 6, 1, 4096);
  const std::string m = metrics.render();
  INFO(m);
  const std::string w = "worker=\"w\\\"1\\n\"";
  CHECK(sample(m, "charm_worker_rpc_seconds_bucket{" + w + ",le=\"0.00025\"}") == 0);
  CHECK(sample(m, "charm_worker_rpc_seconds_bucket{" + w + ",le=\"0.0005\"}") == 1);
  CHECK(sample(m, "charm_worker_rpc_seconds_bucket{" + w + ",le=\"0.005\"}") == 2);
  CHECK(sample(m, "charm_worker_rpc_seconds_bucket{" + w + ",le=\"10\"}") == 2);
  CHECK(sample(m, "charm_worker_rpc_seconds_bucket{" + w + ",le=\"+Inf\"}") == 3);
  CHECK(sample(m, "charm_worker_rpc_seconds_count{" + w + "}") == 3);
  CHECK(sample(m, "charm_worker_errors_total{worker=\"w2\"}") == 1);
  CHECK(sample(m, "charm_worker_failovers_total{worker=\"w2\"}") == 2);
  CHECK(metrics.failovers("w2") == 2);
  CHECK(metrics.failovers("nobody") == 0);
  CHECK(sample(m, "charm_expert_hits_total{worker=\"w2\"}") == 6);
  CHECK(sample(m, "charm_expert_misses_total{worker=\"w2\"}") == 1);
  CHECK(sample(m, "charm_expert_bytes_read_total{worker=\"w2\"}") == 4096);
  // Every family is declared once, with its type.
  CHECK(m.find("# TYPE charm_worker_rpc_seconds histogram\n") != std::string::npos);
  CHECK(m.find("# TYPE charm_http_requests_total counter\n") != std::string::npos);
}

TEST_CASE("the model's generation_config.json gives the sampling a request leaves out") {
  using charm::ApiRequest, charm::SamplingParams, charm::parse_chat_request, charm::parse_completion_request,
      charm::sampling_defaults;
  const SamplingParams d = sampling_defaults(
      nlohmann::json{{"temperature", 0.7}, {"top_p", 0.8}, {"top_k", 20}, {"repetition_penalty", 1.1}}, "g.json");
  CHECK(d.temperature == 0.7);
  CHECK(d.top_p == 0.8);
  CHECK(d.top_k == 20);
  CHECK(d.repetition_penalty == 1.1);
  CHECK(sampling_defaults(nlohmann::json{{"repetition_penalty", 0}}, "g.json").repetition_penalty == 1.0);
  CHECK(sampling_defaults(nlohmann::json{{"do_sample", false}, {"temperature", 0.7}}, "g.json").temperature == 0);
  const SamplingParams bad = sampling_defaults(nlohmann::json{{"temperature", "hot"}, {"top_p", 3}}, "g.json");
  CHECK(bad.temperature == 1.0);  // ignored with a warning
  CHECK(bad.top_p == 1.0);
  CHECK(sampling_defaults(nlohmann::json::object(), "g.json").temperature == 1.0);

  const ApiRequest left_out = parse_completion_request(R"({"prompt": "x"})", d);
  CHECK(left_out.sampling.temperature == 0.7);
  CHECK(left_out.sampling.top_p == 0.8);
  CHECK(left_out.sampling.top_k == 20);
  CHECK(left_out.sampling.repetition_penalty == 1.1);
  CHECK(parse_completion_request(R"({"prompt": "x", "repetition_penalty": 1})", d).sampling.repetition_penalty == 1);
  const ApiRequest given =
      parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "temperature": 0, "top_k": -1})", d);
  CHECK(given.sampling.temperature == 0);
  CHECK(given.sampling.top_k == 0);
  CHECK(given.sampling.top_p == 0.8);
}

TEST_CASE("penalties reach the engine; out-of-range penalties, n and logprobs are 400s naming the field") {
  Served s;
  json user = json::array({{{"role", "user"}, {"content", "hi"}}});
  auto res = s.post("/v1/chat/completions", {{"messages", user}, {"max_tokens", 1}, {"frequency_penalty", -2},
                                             {"presence_penalty", 1.5}, {"repetition_penalty", 1.2}});
  REQUIRE(res);
  CHECK(res->status == 200);
  charm::SamplingParams p = s.engine.last_params();
  CHECK(p.frequency_penalty == -2);
  CHECK(p.presence_penalty == 1.5);
  CHECK(p.repetition_penalty == 1.2);
  CHECK(!p.logprobs);

  const std::string cmpl = "/v1/completions", chat = "/v1/chat/completions";
  json prompt = {{"prompt", "hi"}, {"max_tokens", 1}}, chat_body = {{"messages", user}, {"max_tokens", 1}};
  auto with = [](json body, json fields) {
    body.update(fields);
    return body;
  };
  for (const auto& [path, body] : {std::pair{cmpl, prompt}, std::pair{chat, chat_body}}) {
    check_error(s.post(path, with(body, {{"frequency_penalty", 2.5}})), 400, "frequency_penalty");
    check_error(s.post(path, with(body, {{"presence_penalty", -2.01}})), 400, "presence_penalty");
    check_error(s.post(path, with(body, {{"repetition_penalty", 0}})), 400, "repetition_penalty");
    check_error(s.post(path, with(body, {{"repetition_penalty", -1}})), 400, "repetition_penalty");
    check_error(s.post(path, with(body, {{"n", 0}})), 400, "n");
    check_error(s.post(path, with(body, {{"n", charm::kMaxChoices + 1}})), 400, "n");
    check_error(s.post(path, with(body, {{"n", 1.5}})), 400, "n");
  }
  check_error(s.post(chat, with(chat_body, {{"logprobs", 3}})), 400, "logprobs");  // chat: a boolean
  check_error(s.post(chat, with(chat_body, {{"logprobs", true}, {"top_logprobs", 21}})), 400, "top_logprobs");
  check_error(s.post(chat, with(chat_body, {{"logprobs", true}, {"top_logprobs", -1}})), 400, "top_logprobs");
  check_error(s.post(chat, with(chat_body, {{"top_logprobs", 2}})), 400, "top_logprobs");  // needs logprobs
  check_error(s.post(cmpl, with(prompt, {{"logprobs", 6}})), 400, "logprobs");
  check_error(s.post(cmpl, with(prompt, {{"logprobs", -1}})), 400, "logprobs");
  check_error(s.post(cmpl, with(prompt, {{"logprobs", true}})), 400, "logprobs");  // completions: an integer
}

TEST_CASE("chat logprobs: OpenAI's content list, token text and bytes, top_logprobs; -inf as -9999") {
  Served s;
  json body = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
               {"max_tokens", 3}, {"logprobs", true}, {"top_logprobs", 3}};
  auto res = s.post("/v1/chat/completions", body);
  REQUIRE(res);
  REQUIRE(res->status == 200);
  CHECK(s.engine.last_params().logprobs);
  CHECK(s.engine.last_params().top_logprobs == 3);
  json b = json::parse(res->body);
  const json& content = b["choices"][0]["logprobs"]["content"];
  REQUIRE(content.size() == 3);  // "Hel"
  CHECK(content[0] == json{{"token", "H"},
                           {"logprob", -0.25},
                           {"bytes", {72}},
                           {"top_logprobs",
                            {{{"token", "H"}, {"logprob", -0.25}, {"bytes", {72}}},
                             {{"token", "\xEF\xBF\xBD"}, {"logprob", -1.25}, {"bytes", {0xE9}}},  // U+FFFD
                             {{"token", "a"}, {"logprob", charm::kMinReportedLogprob}, {"bytes", {97}}}}}});
  CHECK(content[2]["token"] == "l");
  CHECK(content[2]["logprob"] == -0.75);

  // logprobs: true alone: the sampled tokens' logprobs, no alternatives.
  body.erase("top_logprobs");
  res = s.post("/v1/chat/completions", body);
  REQUIRE(res);
  json b2 = json::parse(res->body);
  REQUIRE(b2["choices"][0]["logprobs"]["content"].size() == 3);
  CHECK(b2["choices"][0]["logprobs"]["content"][1]["top_logprobs"] == json::array());
}

TEST_CASE("completions logprobs: tokens, token_logprobs, top_logprobs dicts, text_offset") {
  Served s;
  auto res = s.post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 4}, {"logprobs", 2}});
  REQUIRE(res);
  REQUIRE(res->status == 200);
  json lp = json::parse(res->body)["choices"][0]["logprobs"];
  CHECK(lp["tokens"] == json{"H", "e", "l", "l"});
  CHECK(lp["token_logprobs"] == json{-0.25, -0.5, -0.75, -1.0});
  CHECK(lp["text_offset"] == json{0, 1, 2, 3});
  REQUIRE(lp["top_logprobs"].size() == 4);
  CHECK(lp["top_logprobs"][1] == json{{"e", -0.5}, {"\xEF\xBF\xBD", -1.5}});
  // logprobs 0: the sampled tokens only.
  res = s.post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}, {"logprobs", 0}});
  REQUIRE(res);
  json lp0 = json::parse(res->body)["choices"][0]["logprobs"];
  CHECK(lp0["top_logprobs"] == json::array({json::object(), json::object()}));
  CHECK(lp0["token_logprobs"] == json{-0.25, -0.5});
}

/// The logprobs of every chunk of choice `index` of an SSE body, joined (chat: the
/// content entries; completions: the object's lists).
json streamed_logprobs(const std::vector<std::string>& events, int64_t index, bool chat) {
  json all = chat ? json::array()
                  : json{{"tokens", json::array()}, {"token_logprobs", json::array()},
                         {"top_logprobs", json::array()}, {"text_offset", json::array()}};
  for (const std::string& e : events) {
    if (e == "[DONE]") continue;
    const json chunk = json::parse(e);
    for (const json& c : chunk["choices"]) {
      if (c["index"] != index || c["logprobs"].is_null()) continue;
      if (chat) {
        for (const json& entry : c["logprobs"]["content"]) all.push_back(entry);
      } else {
        for (auto& [key, list] : all.items())
          for (const json& v : c["logprobs"][key]) list.push_back(v);
      }
    }
  }
  return all;
}

TEST_CASE("streamed logprobs: each chunk its tokens', together the whole response's (withheld tokens too)") {
  Served s;
  for (bool chat : {true, false}) {
    CAPTURE(chat);
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    json body = {{"max_tokens", 8}, {"stop", "w"}};  // the 'w' token's text is withheld
    if (chat) {
      body.update({{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"logprobs", true},
                   {"top_logprobs", 2}});
    } else {
      body.update({{"prompt", "hi"}, {"logprobs", 2}});
    }
    auto whole = s.post(path, body);
    REQUIRE(whole);
    REQUIRE(whole->status == 200);
    const json expected = json::parse(whole->body)["choices"][0]["logprobs"];
    body["stream"] = true;
    auto res = s.post(path, body);
    REQUIRE(res);
    std::vector<std::string> events = sse_payloads(res->body);
    // Each text chunk carries exactly its one token's logprobs.
    for (const std::string& e : events) {
      if (e == "[DONE]") continue;
      const json c = json::parse(e)["choices"][0];
      const std::string text = chat ? c["delta"].value("content", "") : c["text"].get<std::string>();
      if (text.empty()) continue;
      REQUIRE(!c["logprobs"].is_null());
      CHECK((chat ? c["logprobs"]["content"][0]["token"] : c["logprobs"]["tokens"][0]) == text);
    }
    const json streamed = streamed_logprobs(events, 0, chat);
    CHECK(streamed == (chat ? expected["content"] : expected));
  }
}

TEST_CASE("n choices: generated concurrently, indexed 0..n-1, seed + i each, usage summed") {
  Served s;
  json body = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 4}, {"n", 3},
               {"seed", 100}, {"logprobs", true}};
  auto res = s.post("/v1/chat/completions", body);
  REQUIRE(res);
  REQUIRE(res->status == 200);
  json b = json::parse(res->body);
  REQUIRE(b["choices"].size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(b["choices"][i]["index"] == i);
    CHECK(b["choices"][i]["message"]["content"] == "Hell");
    CHECK(b["choices"][i]["logprobs"]["content"].size() == 4);
  }
  const int64_t prompt_tokens = int64_t(s.engine.last_prompt().size());
  CHECK(b["usage"] == json{{"prompt_tokens", prompt_tokens}, {"completion_tokens", 12},
                           {"total_tokens", prompt_tokens + 12}});
  std::vector<uint64_t> seeds = s.engine.seeds();
  std::sort(seeds.begin(), seeds.end());
  CHECK(seeds == std::vector<uint64_t>{100, 101, 102});

  // Streamed: every choice its role chunk, pieces and finish chunk; one usage chunk.
  body.update({{"stream", true}, {"stream_options", {{"include_usage", true}}}, {"n", 2}});
  res = s.post("/v1/chat/completions", body);
  REQUIRE(res);
  REQUIRE(res->status == 200);
  std::vector<std::string> events = sse_payloads(res->body);
  CHECK(events.back() == "[DONE]");
  std::map<int64_t, std::string> content;
  std::map<int64_t, int> roles, finishes;
  int usage_chunks = 0;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    if (c["choices"].empty()) {
      ++usage_chunks;
      CHECK(c["usage"]["completion_tokens"] == 8);
      CHECK(c["usage"]["prompt_tokens"] == prompt_tokens);
      continue;
    }
    REQUIRE(c["choices"].size() == 1);
    const json& choice = c["choices"][0];
    const int64_t index = choice["index"];
    CHECK((index == 0 || index == 1));
    if (choice["delta"].contains("role")) ++roles[index];
    content[index] += choice["delta"].value("content", "");
    if (!choice["finish_reason"].is_null()) ++finishes[index];
  }
  CHECK(usage_chunks == 1);
  CHECK(content == std::map<int64_t, std::string>{{0, "Hell"}, {1, "Hell"}});
  CHECK(roles == std::map<int64_t, int>{{0, 1}, {1, 1}});
  CHECK(finishes == std::map<int64_t, int>{{0, 1}, {1, 1}});
  CHECK(streamed_logprobs(events, 1, true).size() == 4);

  // Completions too; without a seed each choice is unseeded.
  res = s.post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}, {"n", 2}});
  REQUIRE(res);
  json c = json::parse(res->body);
  REQUIRE(c["choices"].size() == 2);
  CHECK(c["choices"][1] == json{{"text", "He"}, {"index", 1}, {"logprobs", nullptr}, {"finish_reason", "length"}});
  CHECK(c["usage"]["completion_tokens"] == 4);
}
