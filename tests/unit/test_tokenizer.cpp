// Tokenizer tests: id parity with Hugging Face tokenizers on tests/fixtures/tokenizer
// (cases.jsonl from scripts/gen_tokenizer_cases.py and llama.cpp's Qwen2 test pairs),
// decoding, streaming, special tokens, and malformed tokenizer.json files.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "coordinator/text/tokenizer.h"
#include "coordinator/text/unicode_nfc.h"
#include "tests/support/expect_error.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using charm::Tokenizer;
using nlohmann::json;

namespace {

const fs::path kFixtures = fs::path(CHARM_SOURCE_DIR) / "tests/fixtures/tokenizer";

const Tokenizer& qwen() {
  static const std::unique_ptr<Tokenizer> tok = Tokenizer::load(kFixtures / "tokenizer.json");
  return *tok;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

struct Case {
  std::string cat, text;  // text: raw bytes (may be invalid UTF-8 for "hex" cases)
  bool raw_bytes = false, nfc_changes = false;
  std::vector<int32_t> ids;
  std::string decoded, decoded_skip;
};

std::vector<Case> load_cases(const fs::path& file = kFixtures / "cases.jsonl") {
  std::vector<Case> cases;
  std::ifstream in(file);
  REQUIRE_MESSAGE(in, file.string());
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    Case c;
    c.cat = j["cat"];
    c.raw_bytes = j.contains("hex");
    c.text = c.raw_bytes ? from_hex(j["hex"]) : j["text"].get<std::string>();
    c.nfc_changes = j.value("nfc_changes", false);
    c.ids = j["ids"].get<std::vector<int32_t>>();
    c.decoded = j["decoded"];
    c.decoded_skip = j["decoded_skip"];
    cases.push_back(std::move(c));
  }
  return cases;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

bool valid_utf8(const std::string& s) {
  // A round trip through decode of nothing-but-bytes would hide errors; check directly.
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

}  // namespace

TEST_CASE("vocabulary facts of the Qwen3 fixture") {
  const Tokenizer& t = qwen();
  CHECK(t.vocab_size() == 151669);
  CHECK(t.token_id("<|endoftext|>") == 151643);
  CHECK(t.token_id("<|im_start|>") == 151644);
  CHECK(t.token_id("<|im_end|>") == 151645);
  CHECK(t.token_id("<think>") == 151667);
  CHECK(t.token_id("</think>") == 151668);
  CHECK(t.token_id("Ġthe") == 279);  // vocabulary strings are in byte-level form
  CHECK(t.token_id("no such token") == -1);
  CHECK(t.is_special(151645));
  CHECK(t.is_special(151656));
  CHECK_FALSE(t.is_special(151667));  // <think> is added but not special in Qwen3
  CHECK_FALSE(t.is_special(279));
  CHECK_FALSE(t.is_special(-1));
  CHECK_FALSE(t.is_special(151669));
  CHECK(t.token_bytes(198) == "\n");
  CHECK(t.token_bytes(279) == " the");
  CHECK(t.token_bytes(151645) == "<|im_end|>");
  CHECK_THROWS_AS(t.token_bytes(-1), charm::Error);
  CHECK_THROWS_AS(t.token_bytes(151669), charm::Error);
  const std::vector<int32_t> bad{1, 999999};
  CHECK_THROWS_AS(t.decode(bad), charm::Error);
}

/// Encodes and decodes every case with `t`; checks each id list and both decodes.
void check_parity(const Tokenizer& t, const std::vector<Case>& cases) {
  int encode_fail = 0, decode_fail = 0;
  for (const Case& c : cases) {
    const std::vector<int32_t> got = t.encode(c.text);
    if (got != c.ids && ++encode_fail <= 10)
      MESSAGE("encode mismatch [" << c.cat << "] " << json(c.raw_bytes ? "<bytes>" : c.text).dump()
                                  << "\n  want " << show(c.ids) << "\n  got  " << show(got));
    const bool dec_ok = t.decode(c.ids) == c.decoded && t.decode(c.ids, true) == c.decoded_skip;
    if (!dec_ok && ++decode_fail <= 10)
      MESSAGE("decode mismatch [" << c.cat << "] " << show(c.ids));
  }
  MESSAGE("tokenizer parity: " << cases.size() - encode_fail << "/" << cases.size()
                               << " encodes and " << cases.size() - decode_fail << "/"
                               << cases.size() << " decodes match");
  CHECK(encode_fail == 0);
  CHECK(decode_fail == 0);
}

TEST_CASE("ids match HF tokenizers on every case of cases.jsonl") {
  const std::vector<Case> cases = load_cases();
  REQUIRE(cases.size() >= 2000);
  check_parity(qwen(), cases);
}

// --- sentencepiece-style tokenizer.json (Llama 2 / Mistral / Mixtral layout) ---------------

const fs::path kSpm = fs::path(CHARM_SOURCE_DIR) / "tests/fixtures/spm_tokenizer";

json spm_json() {
  static const json j = json::parse(read_file(kSpm / "tokenizer.json"));
  return j;
}

/// The newer layout transformers writes (legacy false): no normalizer, Metaspace
/// prepend_scheme "first" (scripts/gen_spm_tokenizer_cases.py makes the same change).
json spm_metaspace_json() {
  json j = spm_json();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", false}};
  return j;
}

TEST_CASE("sentencepiece-style tokenizer.json: ids and decodes match HF tokenizers on every case") {
  const auto legacy = Tokenizer::from_json(spm_json(), "spm tokenizer.json");
  CHECK(legacy->vocab_size() == 32000);
  const std::vector<Case> cases = load_cases(kSpm / "cases.jsonl");
  REQUIRE(cases.size() >= 1000);
  check_parity(*legacy, cases);
  const auto metaspace = Tokenizer::from_json(spm_metaspace_json(), "spm metaspace");
  check_parity(*metaspace, load_cases(kSpm / "cases_metaspace.jsonl"));
}

TEST_CASE("sentencepiece-style tokenizer.json: byte fallback, spaces, special tokens, streaming") {
  const auto t = Tokenizer::from_json(spm_json(), "spm");
  // "▁Hello" is one piece; a leading "▁" comes from Prepend; "😀" has no piece: 4 byte tokens.
  const std::vector<int32_t> ids = t->encode("Hello 😀");
  REQUIRE(ids.size() == 6);
  CHECK(t->token_bytes(ids[0]) == " Hello");
  for (size_t i = 2; i < 6; ++i) CHECK(t->token_bytes(ids[i]).size() == 1);  // "<0xF0>" ...
  CHECK(t->decode(ids) == "Hello 😀");  // Strip drops the Prepend's space
  charm::StreamDecoder stream(*t);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.push(id);
  CHECK(streamed + stream.flush() == " Hello 😀");  // a stream continues a prompt: no Strip
  CHECK(t->encode("<s>") == std::vector<int32_t>{1});
  CHECK(t->is_special(1));
  CHECK(t->decode(std::vector<int32_t>{1, ids[0]}, true) == "Hello");
}

TEST_CASE("encode_prompt puts the post-processor's special tokens around the text") {
  CHECK(qwen().encode_prompt("Hello world") == qwen().encode("Hello world"));  // ByteLevel: none
  json j = spm_json();
  j["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}})");
  const auto t = Tokenizer::from_json(j, "llama");
  std::vector<int32_t> want{1};
  for (int32_t id : t->encode("Hello world")) want.push_back(id);
  CHECK(t->encode_prompt("Hello world") == want);
  CHECK(t->encode_prompt("<s>x").size() == t->encode("<s>x").size() + 1);  // as HF: a written BOS is kept too
  j["post_processor"]["single"].push_back(json::parse(R"({"SpecialToken": {"id": "</s>", "type_id": 0}})"));
  j["post_processor"]["special_tokens"]["</s>"] = json::parse(R"({"id": "</s>", "ids": [2], "tokens": ["</s>"]})");
  CHECK(Tokenizer::from_json(j, "llama")->encode_prompt("a").back() == 2);
  // Llama 3's layout: ByteLevel then TemplateProcessing in a Sequence.
  json seq = j;
  seq["post_processor"] = {{"type", "Sequence"}, {"processors", json::array({{{"type", "ByteLevel"}}, j["post_processor"]})}};
  CHECK(Tokenizer::from_json(seq, "seq")->encode_prompt("a").front() == 1);
  using C = charm::ErrorCategory;
  j["post_processor"]["special_tokens"]["</s>"]["ids"] = json::array({40000});
  charm::test::expect_error([&] { Tokenizer::from_json(j, "pp.json"); }, C::kInvalidInput, {"pp.json", "40000"});
  j["post_processor"]["single"][2] = json::parse(R"({"SpecialToken": {"id": "<x>", "type_id": 0}})");
  charm::test::expect_error([&] { Tokenizer::from_json(j, "pp.json"); }, C::kInvalidInput, {"pp.json", "<x>"});
  j["post_processor"].erase("single");
  charm::test::expect_error([&] { Tokenizer::from_json(j, "pp.json"); }, C::kInvalidInput, {"post_processor.single is missing"});
  j["post_processor"] = {{"type", "Sequence"}, {"processors", "ByteLevel"}};
  charm::test::expect_error([&] { Tokenizer::from_json(j, "pp.json"); }, C::kInvalidInput, {"processors is not an array"});
  j["post_processor"] = {{"type", "RobertaProcessing"}};
  charm::test::expect_error([&] { Tokenizer::from_json(j, "pp.json"); }, C::kUnsupported, {"RobertaProcessing"});
}

TEST_CASE("sentencepiece-style tokenizer.json: unsupported variants are named") {
  using C = charm::ErrorCategory;
  json j = spm_metaspace_json();
  j["pre_tokenizer"]["split"] = true;
  charm::test::expect_error([&] { Tokenizer::from_json(j, "s.json"); }, C::kUnsupported, {"s.json", "split true"});
  j = spm_json();
  j["decoder"]["decoders"].erase(1);  // no ByteFallback
  charm::test::expect_error([&] { Tokenizer::from_json(j, "d.json"); }, C::kUnsupported, {"d.json", "decoder"});
  j = spm_json();
  j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " +"}};
  charm::test::expect_error([&] { Tokenizer::from_json(j, "r.json"); }, C::kUnsupported, {"r.json", "Replace"});
  j = spm_json();
  j["decoder"] = nullptr;  // encoding would not say whether tokens are bytes or text: refused, not guessed
  charm::test::expect_error([&] { Tokenizer::from_json(j, "n.json"); }, C::kUnsupported, {"n.json", "decoder is null"});
  j = spm_json();
  j["decoder"] = {{"type", "ByteLevel"}};  // no ByteLevel pre-tokenizer: decoding bytes it never encoded
  charm::test::expect_error([&] { Tokenizer::from_json(j, "bl.json"); }, C::kUnsupported, {"bl.json", "ByteLevel decoder"});
  j = json::parse(read_file(kFixtures / "tokenizer.json"));
  j["decoder"] = spm_json()["decoder"];  // ByteLevel pre-tokenizer, sentencepiece decoder
  charm::test::expect_error([&] { Tokenizer::from_json(j, "mix.json"); }, C::kUnsupported, {"mix.json", "ByteLevel pre-tokenizer"});
  j = spm_json();
  j["normalizer"]["normalizers"][0]["prepend"] = 7;
  charm::test::expect_error([&] { Tokenizer::from_json(j, "pre.json"); }, C::kInvalidInput, {"pre.json", "Prepend.prepend is not a string"});
  j = spm_json();
  j["model"]["unk_token"] = "<nope>";
  charm::test::expect_error([&] { Tokenizer::from_json(j, "u.json"); }, C::kInvalidInput, {"u.json", "<nope>"});
  j = spm_metaspace_json();
  j["pre_tokenizer"]["prepend_scheme"] = "sometimes";
  charm::test::expect_error([&] { Tokenizer::from_json(j, "p.json"); }, C::kInvalidInput, {"p.json", "sometimes"});
}

TEST_CASE("ids match llama.cpp's Qwen2 test pairs") {
  const Tokenizer& t = qwen();
  const std::string inp = read_file(kFixtures / "llama_cpp_vocab_test.inp");
  std::istringstream out(read_file(kFixtures / "llama_cpp_vocab_test.out"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  size_t start = 0, count = 0;
  for (size_t end; (end = inp.find(sep, start)) != std::string::npos; start = end + sep.size()) {
    const std::string text = inp.substr(start, end - start);
    std::string line;
    REQUIRE(std::getline(out, line));
    std::istringstream ids_in(line);
    std::vector<int32_t> want;
    for (int32_t id; ids_in >> id;) want.push_back(id);
    CHECK_MESSAGE(t.encode(text) == want, json(text).dump());
    ++count;
  }
  CHECK(count == 46);
}

TEST_CASE("decode(encode(text)) gives the text back") {
  const Tokenizer& t = qwen();
  int checked = 0;
  for (const Case& c : load_cases()) {
    if (c.raw_bytes || c.nfc_changes) continue;  // lossy or normalised: not identity
    CHECK_MESSAGE(t.decode(t.encode(c.text)) == c.text, json(c.text).dump());
    ++checked;
  }
  CHECK(checked > 2000);
  // Invalid bytes come back as U+FFFD, one per maximal invalid subpart.
  CHECK(t.decode(t.encode("a\xff"
                          "b\xe4\xb8")) ==
        "a\xEF\xBF\xBD"
        "b\xEF\xBF\xBD");
}

TEST_CASE("StreamDecoder holds incomplete characters") {
  const Tokenizer& t = qwen();
  // Texts whose tokens split a character (checked against HF tokenizers): the ZWJ U+200D
  // and rare emoji/CJK/Latin characters fall apart into byte tokens.
  for (const std::string text :
       {"👨‍👩‍👧‍👦 family", " 🦙.cpp", "🫶 love", "鑫龘", "ǅ x"}) {
    const std::vector<int32_t> ids = t.encode(text);
    charm::StreamDecoder stream(t);
    std::string joined;
    bool held = false;
    for (int32_t id : ids) {
      const std::string piece = stream.push(id);
      CHECK(valid_utf8(piece));
      if (piece.size() < t.token_bytes(id).size()) held = true;
      joined += piece;
    }
    joined += stream.flush();
    CHECK(joined == text);
    CHECK_MESSAGE(held, text);  // each of these splits a character across tokens
  }
  // The concatenated stream equals decode() on every case, invalid bytes included.
  for (const Case& c : load_cases()) {
    charm::StreamDecoder stream(t, /*skip_special=*/true);
    std::string joined;
    for (int32_t id : c.ids) joined += stream.push(id);
    joined += stream.flush();
    CHECK(joined == c.decoded_skip);
  }
  // A dangling lead byte is flushed as U+FFFD.
  charm::StreamDecoder stream(t);
  const int32_t lead = t.encode(" \xF0\x9F\xA6\x99")[0];  // " " + first 2 bytes of 🦙
  REQUIRE(t.token_bytes(lead) == " \xF0\x9F");
  CHECK(stream.push(lead) == " ");
  CHECK(stream.flush() == "\xEF\xBF\xBD");
}

TEST_CASE("special tokens written in text") {
  const Tokenizer& t = qwen();
  const std::string text = "<|im_start|>user\n<think>hi</think><|im_end|>";
  const std::vector<int32_t> parsed{151644, 872, 198, 151667, 6023, 151668, 151645};
  CHECK(t.encode(text) == parsed);
  // parse_special=false: special tokens are plain text, non-special added tokens still
  // match (tokenizers' encode_special_tokens=True); ids from HF tokenizers 0.23.
  const std::vector<int32_t> literal{27,   91,     318, 4906, 91,  29,   872, 198, 151667,
                                     6023, 151668, 27,  91,   318, 6213, 91,  29};
  CHECK(t.encode(text, false) == literal);
  CHECK(t.decode(parsed) == text);
  CHECK(t.decode(parsed, /*skip_special=*/true) == "user\n<think>hi</think>");
  CHECK(t.encode("<|im_end|><|im_end|>") == std::vector<int32_t>{151645, 151645});
}

TEST_CASE("NFC normalisation") {
  CHECK(charm::is_nfc_quick("plain ASCII and Latin-1: café"));
  CHECK_FALSE(charm::is_nfc_quick("e\xCC\x81"));       // e + U+0301
  CHECK(charm::to_nfc("e\xCC\x81") == "\xC3\xA9");     // é
  CHECK(charm::to_nfc("\xE2\x84\xAB") == "\xC3\x85");  // Angstrom sign -> Å
  CHECK(charm::to_nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8") == "\xEA\xB0\x81");  // 각
  CHECK(charm::to_nfc("\xE0\xA5\x98") == "\xE0\xA4\x95\xE0\xA4\xBC");  // excluded U+0958
  CHECK(charm::to_nfc("a\xCC\x81\xCC\xA8") == "\xC4\x85\xCC\x81");     // marks reordered
  const Tokenizer& t = qwen();
  CHECK(t.encode("caf"
                 "e\xCC\x81") == t.encode("caf\xC3\xA9"));
}

// --- malformed tokenizer.json files ------------------------------------------------------

namespace {

json tiny_tokenizer() {
  return json::parse(R"({
    "added_tokens": [{"id": 3, "content": "<s>", "special": true, "normalized": false}],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "\\p{L}+|\\s+"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 4}, "merges": ["a b"]}
  })");
}

// Writes `content` to `name` in a scratch directory removed when the test program exits.
fs::path write_temp(const std::string& name, const std::string& content) {
  static const charm::test::TempDir dir("charm-tokenizer");
  return dir.write(name, content);
}

// Loading `content` saved as `name` fails with `category`, naming the file and `needle`.
void expect_load_error(const std::string& name, const std::string& content,
                       charm::ErrorCategory category, const std::string& needle) {
  const fs::path p = write_temp(name, content);
  CAPTURE(name);
  charm::test::expect_error([&] { Tokenizer::load(p); }, category, {p.string(), needle});
}

}  // namespace

TEST_CASE("a tiny valid tokenizer.json, merges in both formats") {
  json j = tiny_tokenizer();
  auto t = Tokenizer::load(write_temp("tiny.json", j.dump()));
  CHECK(t->encode("ab <s>ba") == std::vector<int32_t>{2, 4, 3, 1, 0});
  CHECK(t->encode("ab <s>", false) == std::vector<int32_t>{2, 4});  // '<' 's' '>' unknown bytes
  CHECK(t->vocab_size() == 5);
  j["model"]["merges"] = json::parse(R"([["a", "b"]])");
  auto t2 = Tokenizer::load(write_temp("tiny_pairs.json", j.dump()));
  CHECK(t2->encode("ab") == std::vector<int32_t>{2});
}

TEST_CASE("has_token: vocabulary and added ids only, not holes or ids past the end") {
  json j = tiny_tokenizer();
  j["model"]["vocab"] = json::parse(R"({"a": 0, "b": 1, "ab": 2, "Ġ": 5})");  // 4 is a hole
  j["added_tokens"][0]["id"] = 3;
  auto t = Tokenizer::load(write_temp("holes.json", j.dump()));
  CHECK(t->vocab_size() == 6);
  for (int32_t id : {0, 1, 2, 3, 5}) CHECK(t->has_token(id));
  for (int32_t id : {-1, 4, 6, 1 << 30}) CHECK_FALSE(t->has_token(id));
  CHECK(t->token_bytes(4).empty());  // a hole decodes to nothing, as tokenizers skips it
  CHECK(qwen().has_token(151668));
  CHECK_FALSE(qwen().has_token(151669));
}

TEST_CASE("malformed tokenizer.json files name the file and the problem") {
  using C = charm::ErrorCategory;
  expect_load_error("bad.json", "{\"model\": {", C::kInvalidInput, "not valid JSON");
  expect_load_error("array.json", "[1, 2]", C::kInvalidInput, "not a JSON object");

  json j = tiny_tokenizer();
  j.erase("model");
  expect_load_error("no_model.json", j.dump(), C::kInvalidInput, "\"model\"");

  j = tiny_tokenizer();
  j["model"]["type"] = "WordPiece";
  expect_load_error("wordpiece.json", j.dump(), C::kInvalidInput, "WordPiece");

  j = tiny_tokenizer();
  j["model"]["merges"] = json::array({"a zz"});
  expect_load_error("merge_unknown.json", j.dump(), C::kInvalidInput, "\"zz\"");

  j = tiny_tokenizer();
  j["model"]["merges"] = json::array({"ab"});
  expect_load_error("merge_one.json", j.dump(), C::kInvalidInput, "model.merges[0]");

  j = tiny_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(\\p{L}+";
  expect_load_error("bad_regex.json", j.dump(), C::kInvalidInput, "PCRE2");

  j = tiny_tokenizer();
  j["added_tokens"][0]["id"] = -5;
  expect_load_error("added_id.json", j.dump(), C::kInvalidInput, "added_tokens[0].id");

  j = tiny_tokenizer();
  j["added_tokens"][0]["content"] = "ab";  // vocab has "ab" as id 2
  expect_load_error("added_clash.json", j.dump(), C::kInvalidInput, "model.vocab gives it 2");

  j = tiny_tokenizer();
  j["model"]["vocab"]["a"] = "zero";
  expect_load_error("vocab_type.json", j.dump(), C::kInvalidInput, "model.vocab[\"a\"]");

  j = tiny_tokenizer();
  j["normalizer"] = json::parse(R"({"type": "Lowercase"})");
  expect_load_error("lowercase.json", j.dump(), C::kUnsupported, "Lowercase");

  j = tiny_tokenizer();
  j["pre_tokenizer"] = json::parse(R"({"type": "Whitespace"})");
  expect_load_error("whitespace.json", j.dump(), C::kUnsupported, "pre_tokenizer");

  charm::test::expect_error([] { Tokenizer::load("/nonexistent/tokenizer.json"); }, C::kIo,
                            {"/nonexistent/tokenizer.json"});
}

TEST_CASE("long inputs round-trip (no regex limits hit)") {
  const Tokenizer& t = qwen();
  std::string spaces(200000, ' ');
  spaces += "a";
  CHECK(t.decode(t.encode(spaces)) == spaces);
  std::string mixed;
  for (int i = 0; i < 20000; ++i) mixed += "混合专家 mixture\t\t 12345 ";
  CHECK(t.decode(t.encode(mixed)) == mixed);
  const std::string letters(100000, 'x');
  CHECK(t.decode(t.encode(letters)) == letters);
}
