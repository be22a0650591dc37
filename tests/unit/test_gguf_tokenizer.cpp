// GGUF tokenizer metadata -> Tokenizer: the metadata llama.cpp's converter writes
// (tests/fixtures/gguf_tokenizer, from scripts/gen_gguf_tokenizer_cases.py) must give the
// ids of the tokenizer.json it was converted from (HF tokenizers' ids in
// tests/fixtures/tokenizer/cases.jsonl and llama.cpp's test pairs), and malformed
// metadata is refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "coordinator/text/gguf_tokenizer.h"
#include "coordinator/text/tokenizer.h"
#include "tests/support/expect_error.h"

namespace fs = std::filesystem;
using charm::GgufTokenizerMetadata;
using charm::Tokenizer;
using nlohmann::json;

namespace {

const fs::path kSource = fs::path(CHARM_SOURCE_DIR);
const fs::path kGguf = kSource / "tests/fixtures/gguf_tokenizer";
const fs::path kHf = kSource / "tests/fixtures/tokenizer";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in, p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::optional<int32_t> optional_id(const json& dump, const std::string& key) {
  if (!dump.contains(key)) return std::nullopt;
  return dump[key].get<int32_t>();
}

/// What the model-mapping code does with the GGUF reader: one field per tokenizer.* key.
GgufTokenizerMetadata metadata_from_dump(const json& d) {
  GgufTokenizerMetadata m;
  m.model = d.value("tokenizer.ggml.model", "");
  m.pre = d.value("tokenizer.ggml.pre", "");
  m.tokens = d.at("tokenizer.ggml.tokens").get<std::vector<std::string>>();
  m.token_type = d.value("tokenizer.ggml.token_type", std::vector<int32_t>{});
  m.merges = d.value("tokenizer.ggml.merges", std::vector<std::string>{});
  m.scores = d.value("tokenizer.ggml.scores", std::vector<float>{});
  m.bos_token_id = optional_id(d, "tokenizer.ggml.bos_token_id");
  m.eos_token_id = optional_id(d, "tokenizer.ggml.eos_token_id");
  m.eot_token_id = optional_id(d, "tokenizer.ggml.eot_token_id");
  m.padding_token_id = optional_id(d, "tokenizer.ggml.padding_token_id");
  m.unknown_token_id = optional_id(d, "tokenizer.ggml.unknown_token_id");
  if (d.contains("tokenizer.ggml.add_bos_token"))
    m.add_bos = d["tokenizer.ggml.add_bos_token"].get<bool>();
  if (d.contains("tokenizer.ggml.add_eos_token")) m.add_eos = d["tokenizer.ggml.add_eos_token"].get<bool>();
  if (d.contains("tokenizer.ggml.add_space_prefix"))
    m.add_space_prefix = d["tokenizer.ggml.add_space_prefix"].get<bool>();
  m.chat_template = d.value("tokenizer.chat_template", "");
  return m;
}

GgufTokenizerMetadata load_dump(const fs::path& p) {
  return metadata_from_dump(json::parse(read_file(p)));
}

const GgufTokenizerMetadata& qwen_meta() {
  static const GgufTokenizerMetadata meta = load_dump(kGguf / "qwen2.json");
  return meta;
}

std::unique_ptr<Tokenizer> build(const GgufTokenizerMetadata& meta, const std::string& origin) {
  return Tokenizer::from_json(charm::tokenizer_json_from_gguf(meta, origin), origin);
}

const Tokenizer& qwen_gguf() {
  static const std::unique_ptr<Tokenizer> tok = build(qwen_meta(), "qwen2.json");
  return *tok;
}

const Tokenizer& qwen_hf() {
  static const std::unique_ptr<Tokenizer> tok = Tokenizer::load(kHf / "tokenizer.json");
  return *tok;
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

struct Case {
  std::string text, decoded, decoded_skip;
  std::vector<int32_t> ids;
};

std::vector<Case> load_cases(const fs::path& file = kHf / "cases.jsonl") {
  std::vector<Case> cases;
  std::ifstream in(file);
  REQUIRE_MESSAGE(in, file.string());
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    cases.push_back({j.contains("hex") ? from_hex(j["hex"]) : j["text"].get<std::string>(),
                     j["decoded"], j["decoded_skip"], j["ids"].get<std::vector<int32_t>>()});
  }
  return cases;
}

/// llama.cpp's test pairs: texts separated by "\n__ggml_vocab_test__\n", one id line each.
std::vector<std::pair<std::string, std::vector<int32_t>>> load_pairs(const fs::path& inp,
                                                                     const fs::path& out) {
  const std::string text = read_file(inp);
  std::istringstream lines(read_file(out));
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::pair<std::string, std::vector<int32_t>>> pairs;
  size_t start = 0;
  for (size_t end; (end = text.find(sep, start)) != std::string::npos; start = end + sep.size()) {
    std::string line;
    REQUIRE(std::getline(lines, line));
    std::istringstream ids_in(line);
    std::vector<int32_t> ids;
    for (int32_t id; ids_in >> id;) ids.push_back(id);
    pairs.emplace_back(text.substr(start, end - start), std::move(ids));
  }
  return pairs;
}

// Qwen's added tokens that tokenizer.json marks "special": false but llama.cpp's
// converter writes as control tokens because they look like "<|...|>".
bool is_fim_like(int32_t id) { return id >= 151659 && id <= 151664; }

}  // namespace

TEST_CASE("Qwen3 GGUF metadata gives the tokenizer.json's vocabulary, token by token") {
  const Tokenizer& g = qwen_gguf();
  const Tokenizer& h = qwen_hf();
  REQUIRE(qwen_meta().tokens.size() == 151936);  // padded to config.json's vocab_size
  CHECK(g.vocab_size() == h.vocab_size());       // the 267 "[PAD...]" entries are holes
  CHECK(g.vocab_size() == 151669);
  int bytes_differ = 0, presence_differ = 0, special_differ = 0;
  for (int32_t id = 0; id < 151936; ++id) {
    if (g.has_token(id) != h.has_token(id)) ++presence_differ;
    if (id < h.vocab_size() && g.token_bytes(id) != h.token_bytes(id)) ++bytes_differ;
    if (g.is_special(id) != h.is_special(id)) {
      CHECK_MESSAGE(is_fim_like(id), id);
      ++special_differ;
    }
  }
  CHECK(presence_differ == 0);
  CHECK(bytes_differ == 0);
  CHECK(special_differ == 6);  // <|fim_prefix|> .. <|file_sep|>: GGUF cannot say otherwise
  CHECK(g.token_id("<|im_end|>") == 151645);
  CHECK(g.token_id("<think>") == 151667);
  CHECK_FALSE(g.is_special(151667));  // user-defined: added, not special
  CHECK(g.is_special(151645));
  CHECK_FALSE(g.has_token(151669));  // "[PAD151669]" is unused
  CHECK(g.token_id("[PAD151669]") == -1);
}

TEST_CASE("Qwen3 GGUF tokenizer encodes and decodes every case as HF tokenizers does") {
  const Tokenizer& g = qwen_gguf();
  const Tokenizer& h = qwen_hf();
  const std::vector<Case> cases = load_cases();
  REQUIRE(cases.size() >= 2000);
  int encode_fail = 0, literal_fail = 0, decode_fail = 0, skip_fail = 0, skip_fim = 0;
  for (const Case& c : cases) {
    if (g.encode(c.text) != c.ids) ++encode_fail;
    // parse_special=false: GGUF-special fim tokens become text where HF still matches them.
    const bool has_fim_text = c.text.find("<|fim_") != std::string::npos ||
                              c.text.find("<|repo_name|>") != std::string::npos ||
                              c.text.find("<|file_sep|>") != std::string::npos;
    if (!has_fim_text && g.encode(c.text, false) != h.encode(c.text, false)) ++literal_fail;
    if (g.decode(c.ids) != c.decoded) ++decode_fail;
    const bool has_fim = std::any_of(c.ids.begin(), c.ids.end(), is_fim_like);
    if (has_fim) {
      ++skip_fim;
      CHECK(g.decode(c.ids, true) != c.decoded_skip);  // the documented difference, and only it
    } else if (g.decode(c.ids, true) != c.decoded_skip) {
      ++skip_fail;
    }
  }
  MESSAGE(cases.size() << " cases; " << skip_fim << " hold a fim-like token");
  CHECK(encode_fail == 0);
  CHECK(literal_fail == 0);
  CHECK(decode_fail == 0);
  CHECK(skip_fail == 0);
  CHECK(skip_fim > 0);
}

TEST_CASE("Qwen3 GGUF tokenizer: llama.cpp's Qwen2 test pairs and special tokens") {
  const Tokenizer& g = qwen_gguf();
  const auto pairs = load_pairs(kHf / "llama_cpp_vocab_test.inp", kHf / "llama_cpp_vocab_test.out");
  CHECK(pairs.size() == 46);
  for (const auto& [text, ids] : pairs) CHECK_MESSAGE(g.encode(text) == ids, json(text).dump());
  const std::string text = "<|im_start|>user\n<think>hi</think><|im_end|>";
  CHECK(g.encode(text) == qwen_hf().encode(text));
  CHECK(g.encode(text, false) == qwen_hf().encode(text, false));
  CHECK(g.encode(text) == std::vector<int32_t>{151644, 872, 198, 151667, 6023, 151668, 151645});
}

TEST_CASE("Qwen3 GGUF metadata: chat template, special ids, stop ids") {
  const GgufTokenizerMetadata& m = qwen_meta();
  const json config = json::parse(read_file(kHf / "tokenizer_config.json"));
  CHECK(m.chat_template == config["chat_template"].get<std::string>());
  CHECK(m.model == "gpt2");
  CHECK(m.pre == "qwen2");
  CHECK(m.eos_token_id == 151645);
  CHECK(m.add_bos == false);
  CHECK(charm::gguf_stop_token_ids(m, "qwen2.json") == std::vector<int32_t>{151645});
  GgufTokenizerMetadata with_eot = m;
  with_eot.eot_token_id = 151643;
  CHECK(charm::gguf_stop_token_ids(with_eot, "x") == std::vector<int32_t>{151645, 151643});
  with_eot.eot_token_id = 151645;  // the same id once
  CHECK(charm::gguf_stop_token_ids(with_eot, "x") == std::vector<int32_t>{151645});
  GgufTokenizerMetadata none = m;
  none.eos_token_id.reset();
  CHECK(charm::gguf_stop_token_ids(none, "x").empty());
  none.eot_token_id = 151936;
  charm::test::expect_error([&] { charm::gguf_stop_token_ids(none, "stop.gguf"); },
                            charm::ErrorCategory::kInvalidInput,
                            {"stop.gguf", "eot_token_id", "151936"});
}

TEST_CASE("GPT-2 and DeepSeek Coder GGUFs match llama.cpp's HF-made test pairs") {
  // gpt-2: ByteLevel's own regex; deepseek-coder: five Splits before ByteLevel.
  for (const std::string name : {"gpt-2", "deepseek-coder"}) {
    CAPTURE(name);
    const GgufTokenizerMetadata meta = load_dump(kGguf / (name + ".json"));
    CHECK(meta.pre == name);
    const auto tok = build(meta, name + ".json");
    CHECK(tok->vocab_size() == static_cast<int32_t>(meta.tokens.size()));
    const auto pairs = load_pairs(kGguf / (name + ".inp"), kGguf / (name + ".out"));
    CHECK(pairs.size() >= 40);
    for (const auto& [text, ids] : pairs) {
      CHECK_MESSAGE(tok->encode(text) == ids, json(text).dump());
      CHECK(tok->decode(ids) == text);
    }
  }
  const auto gpt2 = build(load_dump(kGguf / "gpt-2.json"), "gpt-2.json");
  CHECK(gpt2->vocab_size() == 50257);
  CHECK(gpt2->is_special(50256));
}

TEST_CASE("Llama's sentencepiece GGUF vocabulary: the hub's tokenizer.json, llama.cpp's pairs, HF's ids") {
  const GgufTokenizerMetadata meta = load_dump(kGguf / "llama-spm.json");
  CHECK(meta.model == "llama");
  REQUIRE(meta.scores.size() == 32000);
  const json built = charm::tokenizer_json_from_gguf(meta, "llama-spm.json");
  // The merges transformers derives from the same scores (scripts/gen_spm_tokenizer_cases.py).
  const json hub = json::parse(read_file(kSource / "tests/fixtures/spm_tokenizer/tokenizer.json"));
  CHECK(built["model"]["merges"] == hub["model"]["merges"]);
  CHECK(built["model"]["vocab"] == hub["model"]["vocab"]);
  CHECK(built["normalizer"] == hub["normalizer"]);
  CHECK(built["decoder"] == hub["decoder"]);
  const auto tok = Tokenizer::from_json(built, "llama-spm.json");
  const auto pairs = load_pairs(kGguf / "llama-spm.inp", kGguf / "llama-spm.out");
  CHECK(pairs.size() == 46);
  for (const auto& [text, ids] : pairs) CHECK_MESSAGE(tok->encode(text) == ids, json(text).dump());
  int encode_fail = 0, decode_fail = 0;
  const std::vector<Case> cases = load_cases(kSource / "tests/fixtures/spm_tokenizer/cases.jsonl");
  for (const Case& c : cases) {
    encode_fail += tok->encode(c.text) != c.ids;
    decode_fail += tok->decode(c.ids) != c.decoded || tok->decode(c.ids, true) != c.decoded_skip;
  }
  MESSAGE(cases.size() << " cases");
  CHECK(encode_fail == 0);
  CHECK(decode_fail == 0);
  // add_bos_token true: a prompt starts with <s> (id 1), as Llama's tokenizer(prompt) does.
  CHECK(meta.add_bos == true);
  CHECK(tok->encode_prompt("Hello").front() == 1);
  CHECK(tok->encode_prompt("Hello").size() == tok->encode("Hello").size() + 1);
  GgufTokenizerMetadata eos = meta;
  eos.add_bos = false;
  eos.add_eos = true;
  CHECK(build(eos, "eos")->encode_prompt("Hello").back() == 2);
  CHECK(qwen_gguf().encode_prompt("Hello") == qwen_gguf().encode("Hello"));  // add_bos false
  GgufTokenizerMetadata no_prefix = meta;  // add_space_prefix false: no Prepend, no Strip
  no_prefix.add_space_prefix = false;
  const auto bare = build(no_prefix, "bare");
  CHECK(bare->encode("Hello") != tok->encode("Hello"));
  CHECK(bare->decode(tok->encode("Hello")) == " Hello");
}

TEST_CASE("malformed sentencepiece GGUF metadata is refused, naming the key") {
  const GgufTokenizerMetadata good = load_dump(kGguf / "llama-spm.json");
  const auto expect = [](const GgufTokenizerMetadata& m, const std::vector<std::string>& parts) {
    charm::test::expect_error([&] { charm::tokenizer_json_from_gguf(m, "spm.gguf"); },
                              charm::ErrorCategory::kInvalidInput, parts);
  };
  GgufTokenizerMetadata m = good;
  m.scores.pop_back();
  expect(m, {"spm.gguf", "tokenizer.ggml.scores has 31999 entries"});
  m = good;
  m.scores[400] = std::nanf("");
  expect(m, {"spm.gguf", "tokenizer.ggml.scores[400]", "finite"});
  m = good;
  m.tokens[500] = m.tokens[501];
  expect(m, {"spm.gguf", "tokenizer.ggml.tokens[501]", "repeats token 500"});
  m = good;
  m.unknown_token_id = 32000;
  expect(m, {"spm.gguf", "unknown_token_id", "32000"});
  m = good;
  m.token_type[0] = 5;  // <unk> unused: no unk token left
  expect(m, {"spm.gguf", "unknown_token_id 0 names no token"});
}

TEST_CASE("every known pre-tokenizer builds a tokenizer whose regexes PCRE2 accepts") {
  const std::vector<std::string> known = charm::gguf_known_pre_tokenizers();
  CHECK(known.size() >= 10);
  for (const std::string& pre : known) {
    CAPTURE(pre);
    GgufTokenizerMetadata m;
    m.model = "gpt2";
    m.pre = pre;
    m.tokens = {"a", "b", "ab", "Ġ", "1", "<|x|>"};
    m.token_type = {1, 1, 1, 1, 1, 3};
    m.merges = {"a b"};
    const auto tok = build(m, pre);
    CHECK(tok->encode("ab ab<|x|>1") == std::vector<int32_t>{2, 3, 2, 5, 4});
  }
}

TEST_CASE("Qwen3.5's pre-tokenizer keeps a combining mark inside its word; Qwen2's splits it off") {
  GgufTokenizerMetadata m;
  m.model = "gpt2";
  // q, then U+0301 as bytes CC 81 in byte-level form (Ì, ģ), and their merges.
  m.tokens = {"q", "\u00cc", "\u0123", "q\u00cc", "q\u00cc\u0123"};
  m.token_type = {1, 1, 1, 1, 1};
  m.merges = {"q \u00cc", "q\u00cc \u0123"};
  const std::string text = "q\u0301";  // no precomposed form: NFC leaves it
  m.pre = "qwen35";
  CHECK(build(m, "qwen35")->encode(text) == std::vector<int32_t>{4});
  m.pre = "qwen2";
  CHECK(build(m, "qwen2")->encode(text) == std::vector<int32_t>{0, 1, 2});
}

// --- malformed metadata ---------------------------------------------------------------

namespace {

GgufTokenizerMetadata tiny() {
  GgufTokenizerMetadata m;
  m.model = "gpt2";
  m.pre = "qwen2";
  m.tokens = {"a", "b", "ab", "<|end|>", "[PAD4]"};
  m.token_type = {1, 1, 1, 3, 5};
  m.merges = {"a b"};
  m.eos_token_id = 3;
  return m;
}

void expect_refused(const GgufTokenizerMetadata& m, charm::ErrorCategory category,
                    const std::vector<std::string>& parts) {
  std::vector<std::string> all{"bad.gguf"};
  all.insert(all.end(), parts.begin(), parts.end());
  charm::test::expect_error([&] { charm::tokenizer_json_from_gguf(m, "bad.gguf"); }, category, all);
}

}  // namespace

TEST_CASE("the tiny metadata is valid (so each error below is the one change)") {
  const auto tok = build(tiny(), "tiny");
  CHECK(tok->encode("ab<|end|>a") == std::vector<int32_t>{2, 3, 0});
  CHECK(tok->vocab_size() == 4);
  CHECK_FALSE(tok->has_token(4));
}

TEST_CASE("unsupported tokenizer models and pre-tokenizers are named") {
  using C = charm::ErrorCategory;
  GgufTokenizerMetadata m = tiny();
  m.model = "t5";
  expect_refused(m, C::kUnsupported, {"tokenizer.ggml.model \"t5\" (Unigram) is not supported", "\"llama\""});
  m.model = "";
  expect_refused(m, C::kUnsupported, {"tokenizer.ggml.model \"\""});
  m = tiny();
  m.pre = "tekken";
  expect_refused(m, C::kUnsupported,
                 {"tokenizer.ggml.pre \"tekken\"", "known: ", "qwen2", "llama-bpe"});
  m.pre = "";  // llama.cpp's "default" regexes match no tokenizer.json: refuse
  expect_refused(m, C::kUnsupported, {"tokenizer.ggml.pre \"\""});
}

TEST_CASE("malformed tokenizer metadata is refused, naming the key") {
  using C = charm::ErrorCategory;
  GgufTokenizerMetadata m = tiny();
  m.token_type.pop_back();
  expect_refused(m, C::kInvalidInput,
                 {"tokenizer.ggml.token_type has 4 entries", "tokenizer.ggml.tokens 5"});
  m = tiny();
  m.token_type[1] = 7;
  expect_refused(m, C::kInvalidInput, {"tokenizer.ggml.token_type[1] is 7"});
  m = tiny();
  m.merges = {"a zz"};
  expect_refused(m, C::kInvalidInput, {"tokenizer.ggml.merges[0]", "\"zz\""});
  m.merges = {"a <|end|>"};  // control tokens are not in the BPE vocabulary
  expect_refused(m, C::kInvalidInput, {"tokenizer.ggml.merges[0]", "\"<|end|>\""});
  m.merges = {"ab"};
  expect_refused(m, C::kInvalidInput, {"tokenizer.ggml.merges[0] \"ab\" is not two tokens"});
  m = tiny();
  m.tokens.clear();
  m.token_type.clear();
  expect_refused(m, C::kInvalidInput, {"tokenizer.ggml.tokens is missing or empty"});
  m = tiny();
  m.tokens[1] = "a";
  expect_refused(m, C::kInvalidInput, {"tokenizer.ggml.tokens[1] \"a\" repeats token 0"});
  m = tiny();
  m.tokens[4] = "<|end|>";
  m.token_type[4] = 4;
  expect_refused(m, C::kInvalidInput,
                 {"tokenizer.ggml.tokens[4] is an empty or repeated added token"});
  for (const char* key : {"bos", "eos", "eot", "padding", "unknown"}) {
    m = tiny();
    const std::string k = key;
    auto& id = k == "bos"       ? m.bos_token_id
               : k == "eos"     ? m.eos_token_id
               : k == "eot"     ? m.eot_token_id
               : k == "padding" ? m.padding_token_id
                                : m.unknown_token_id;
    id = 5;
    expect_refused(m, C::kInvalidInput,
                   {"tokenizer.ggml." + k + "_token_id is 5", "outside [0, 5)"});
    id = -1;
    expect_refused(m, C::kInvalidInput, {"tokenizer.ggml." + k + "_token_id is -1"});
  }
}

TEST_CASE("Tokenizer::from_json names the origin in its errors") {
  GgufTokenizerMetadata m = tiny();
  m.tokens[1] = "<|end|>";  // a normal token spelled like the control token 3
  m.merges.clear();
  const json j = charm::tokenizer_json_from_gguf(m, "clash.gguf");
  charm::test::expect_error([&] { Tokenizer::from_json(j, "clash.gguf"); },
                            charm::ErrorCategory::kInvalidInput,
                            {"clash.gguf", "\"<|end|>\" has id 3 but model.vocab gives it 1"});
  json wrong_type = charm::tokenizer_json_from_gguf(tiny(), "t");
  wrong_type["model"]["merges"] = 7;
  charm::test::expect_error([&] { Tokenizer::from_json(wrong_type, "typed.gguf"); },
                            charm::ErrorCategory::kInvalidInput, {"typed.gguf", "model.merges"});
}

TEST_CASE("over-long token and merge arrays are refused before any work") {
  using C = charm::ErrorCategory;
  GgufTokenizerMetadata m = tiny();
  m.tokens.resize(charm::kMaxGgufTokens + 1);
  m.token_type.clear();
  expect_refused(m, C::kInvalidInput,
                 {"tokenizer.ggml.tokens has 4194305 entries", "limit of 4194304"});
  m = tiny();
  m.merges.resize(charm::kMaxGgufMerges + 1);
  expect_refused(m, C::kInvalidInput, {"tokenizer.ggml.merges has 4194305 entries"});
}

// A GGUF file outside the tree (e.g. a real model's, dumped with
// `scripts/gen_gguf_tokenizer_cases.py --dump FILE.gguf OUT.json`), checked by hand:
//   CHARM_GGUF_TOKENIZER_DUMP=OUT.json [CHARM_GGUF_TOKENIZER_PAIRS=prefix]
//     build/tests/test_gguf_tokenizer --no-skip -tc='*dumped*'
// CHARM_GGUF_TOKENIZER_JSON_OUT=FILE also writes the tokenizer.json made from it (to run
// HF tokenizers on). With PAIRS, prefix.inp/prefix.out are test pairs for it; without, it must
// encode the Qwen cases as the Qwen3 tokenizer.json does (texts with Qwen3-only tokens
// left out). Skipped in ctest: the file is not part of the tree.
TEST_CASE("a dumped GGUF's tokenizer (manual)" * doctest::skip()) {
  const char* dump = std::getenv("CHARM_GGUF_TOKENIZER_DUMP");
  REQUIRE_MESSAGE(dump != nullptr, "set CHARM_GGUF_TOKENIZER_DUMP");
  using Clock = std::chrono::steady_clock;  // reported, never asserted
  const auto t0 = Clock::now();
  const GgufTokenizerMetadata meta = load_dump(dump);
  const auto t1 = Clock::now();
  const json tokenizer_json = charm::tokenizer_json_from_gguf(meta, dump);
  const auto t2 = Clock::now();
  const auto tok = Tokenizer::from_json(tokenizer_json, dump);
  if (const char* out = std::getenv("CHARM_GGUF_TOKENIZER_JSON_OUT"))  // for HF tokenizers
    std::ofstream(out) << tokenizer_json.dump();
  const auto t3 = Clock::now();
  const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  MESSAGE("read dump " << ms(t1 - t0) << " ms, tokenizer_json_from_gguf " << ms(t2 - t1)
                       << " ms, Tokenizer::from_json " << ms(t3 - t2) << " ms");
  MESSAGE("pre " << meta.pre << ", " << meta.tokens.size() << " tokens, vocab_size "
                 << tok->vocab_size() << ", eos " << meta.eos_token_id.value_or(-1) << ", eot "
                 << meta.eot_token_id.value_or(-1));
  if (const char* pairs = std::getenv("CHARM_GGUF_TOKENIZER_PAIRS")) {
    int ok = 0, n = 0;
    for (const auto& [text, ids] :
         load_pairs(std::string(pairs) + ".inp", std::string(pairs) + ".out")) {
      ++n;
      if (tok->encode(text) == ids)
        ++ok;
      else
        MESSAGE("mismatch: " << json(text).dump());
    }
    MESSAGE(ok << "/" << n << " test pairs match");
    CHECK(ok == n);
    return;
  }
  int ok = 0, n = 0;
  for (const Case& c : load_cases()) {
    bool qwen3_only = false;
    for (const char* t : {"<think>", "</think>", "<tool_response>", "</tool_response>"})
      qwen3_only = qwen3_only || c.text.find(t) != std::string::npos;
    if (qwen3_only) continue;
    ++n;
    if (tok->encode(c.text) == c.ids && tok->decode(c.ids) == c.decoded) ++ok;
  }
  MESSAGE(ok << "/" << n << " cases match");
  CHECK(ok == n);
}
