// libFuzzer target: bytes as an HTTP request body, down the path a request takes to the
// model: parse_chat_request / parse_completion_request (JSON limits, field checks), the
// chat template (render_json with the messages and chat_template_kwargs), and the
// tokenizer, to token ids. The first byte picks the endpoint and the template (Qwen3's,
// the fixture model's, or gpt-oss's, the most intricate one we ship). Only ApiError and
// charm::Error may escape; a crash, a hang or any other exception is a finding.
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string_view>

#include "common/error.h"
#include "common/json_reader.h"
#include "coordinator/api/openai_request.h"
#include "coordinator/text/chat_template.h"
#include "coordinator/text/tokenizer.h"

namespace {

const std::filesystem::path kFixtures = std::filesystem::path(CHARM_SOURCE_DIR) / "tests" / "fixtures";

struct Model {
  std::unique_ptr<charm::Tokenizer> tokenizer;
  std::unique_ptr<charm::ChatTemplate> qwen3;
  std::unique_ptr<charm::ChatTemplate> gpt_oss;
};

const Model& model() {
  static const Model m = [] {
    std::tm fixed{};  // strftime_now() must not make runs differ by the day
    fixed.tm_year = 125;
    fixed.tm_mday = 1;
    const charm::LocalTime clock = charm::fixed_local_time(fixed);
    const std::filesystem::path tiny = kFixtures / "models" / "qwen3-moe-tiny";
    Model out;
    out.tokenizer = charm::Tokenizer::load(tiny / "tokenizer.json");
    out.qwen3 = charm::ChatTemplate::load(tiny / "tokenizer_config.json", clock);
    std::string source = charm::read_text_file(kFixtures / "chat_template" / "openai-gpt-oss-120b.jinja",
                                               1 << 20, "a chat template");
    out.gpt_oss = charm::ChatTemplate::parse(source, "<|startoftext|>", "<|return|>", clock);
    return out;
  }();
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Model& m = model();
  const uint8_t mode = data[0];
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const bool chat = (mode & 1) != 0;
    const charm::ApiRequest request = chat ? charm::parse_chat_request(body) : charm::parse_completion_request(body);
    const charm::ChatTemplate& tmpl = (mode & 2) != 0 ? *m.gpt_oss : *m.qwen3;
    charm::prompt_token_ids(request, &tmpl, *m.tokenizer);
  } catch (const charm::ApiError&) {
  } catch (const charm::Error&) {
  }
  return 0;
}
