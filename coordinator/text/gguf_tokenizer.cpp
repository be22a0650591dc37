// GGUF tokenizer metadata -> tokenizer.json (see gguf_tokenizer.h). The mapping of token
// types follows llama.cpp's convert_hf_to_gguf.py (get_vocab_base), run backwards; the
// pre-tokenizer table follows each family's tokenizer.json and llama.cpp's
// src/llama-vocab.cpp (the regexes a tokenizer.ggml.pre name stands for).
#include "coordinator/text/gguf_tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "common/error.h"
#include "coordinator/text/gguf_spm.h"

namespace charm {
namespace {

using json = nlohmann::json;

/// How a family pre-tokenizes, as its tokenizer.json says.
struct PreTokenizer {
  std::vector<std::string_view> names;   // tokenizer.ggml.pre values
  std::vector<std::string_view> splits;  // Split(Regex, Isolated) in order, then ByteLevel
  bool byte_level_regex = false;         // ByteLevel(use_regex: true): GPT-2's regex
  bool nfc = false;                      // normalizer NFC
  bool ignore_merges = false;            // model.ignore_merges: a piece in the vocab is one token
};

// Qwen2/2.5/3 tokenizer.json (tests/fixtures/tokenizer/tokenizer.json): single digits.
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen3.5's tokenizer.json as llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN35 quotes it: Qwen2's,
// with combining marks (\p{M}) inside words. Its normalizer is taken to be Qwen2's NFC,
// which could not be checked: no package here carries Qwen3.5's tokenizer.json.
constexpr std::string_view kQwen35Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Llama 3 tokenizer.json; GLM-4.5 uses the same (llama.cpp's CHATGLM4 = LLAMA3 regex).
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// GPT-4o (o200k) tokenizer.json; llama.cpp spells the case classes with lookaheads.
constexpr std::string_view kGpt4oRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek-V3 / R1 tokenizer.json: digits in threes, CJK runs, then the word regex.
constexpr std::string_view kDeepseekV3Digits = R"(\p{N}{1,3})";
constexpr std::string_view kDeepseekV3Cjk = R"([一-龥぀-ゟ゠-ヿ]+)";
constexpr std::string_view kDeepseekV3Words =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek LLM (v1, 67B/7B) tokenizer.json: six Splits.
constexpr std::string_view kDeepseekLlmLetters =
    R"(\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+)";
constexpr std::string_view kDeepseekLlmPunct = R"(\s?[!-/:-~！-／：-～‘-‟　-。]+)";
constexpr std::string_view kDeepseekCjk = R"([一-龥ࠀ-一가-퟿]+)";

const std::vector<PreTokenizer>& pre_tokenizers() {
  static const std::vector<PreTokenizer> table = {
      {{"qwen2"}, {kQwen2Regex}, false, true},
      {{"qwen35"}, {kQwen35Regex}, false, true},
      {{"llama-bpe"}, {kLlama3Regex}, false, false, true},
      {{"glm4"}, {kLlama3Regex}, false, false, true},
      // GPT-4o's tokenizer.json; MiniMax-M2 per llama.cpp, which gives it the same regex.
      {{"gpt-4o", "minimax-m2"}, {kGpt4oRegex}, false, false},
      {{"deepseek-v3"}, {kDeepseekV3Digits, kDeepseekV3Cjk, kDeepseekV3Words}, false, false},
      {{"deepseek-llm"},
       {R"([\r\n])", kDeepseekLlmLetters, kDeepseekLlmPunct, R"(\s+$)", kDeepseekCjk, R"(\p{N}+)"},
       false,
       false},
      {{"deepseek-coder"},
       {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"},
       false,
       false},
      // GPT-2's tokenizer.json: ByteLevel with its built-in regex, no normalizer.
      {{"gpt-2"}, {}, true, false},
      // GPT-NeoX-20B's tokenizer.json (ByteLevel regex + NFC), which MPT uses and OLMo /
      // OLMoE's tokenizers derive from.
      {{"mpt", "olmo"}, {}, true, true},
      // StarCoder / Refact tokenizer.json: Digits(individual_digits) -- a Split on each
      // \p{N} char (Rust's char::is_numeric) -- then ByteLevel's own regex.
      {{"starcoder", "refact"}, {R"(\p{N})"}, true, false},
      // Command-R tokenizer.json: the same, with an NFC normalizer.
      {{"command-r"}, {R"(\p{N})"}, true, true},
  };
  return table;
}

const PreTokenizer* find_pre_tokenizer(std::string_view name) {
  for (const PreTokenizer& p : pre_tokenizers())
    if (std::find(p.names.begin(), p.names.end(), name) != p.names.end()) return &p;
  return nullptr;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

json pre_tokenizer_json(const PreTokenizer& p) {
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", p.byte_level_regex}};
  if (p.splits.empty()) return byte_level;
  json list = json::array();
  for (std::string_view regex : p.splits)
    list.push_back({{"type", "Split"},
                    {"pattern", {{"Regex", std::string(regex)}}},
                    {"behavior", "Isolated"},
                    {"invert", false}});
  list.push_back(byte_level);
  return {{"type", "Sequence"}, {"pretokenizers", std::move(list)}};
}

/// Checks the arrays' sizes and the token types; returns the type of each token.
std::vector<int32_t> checked_types(const GgufTokenizerMetadata& meta, const std::string& where) {
  if (meta.tokens.empty()) fail_invalid(where + ": tokenizer.ggml.tokens is missing or empty");
  if (meta.tokens.size() > kMaxGgufTokens)
    fail_invalid(where + ": tokenizer.ggml.tokens has " + std::to_string(meta.tokens.size()) +
                 " entries, more than the limit of " + std::to_string(kMaxGgufTokens));
  if (meta.merges.size() > kMaxGgufMerges)
    fail_invalid(where + ": tokenizer.ggml.merges has " + std::to_string(meta.merges.size()) +
                 " entries, more than the limit of " + std::to_string(kMaxGgufMerges));
  if (meta.token_type.empty())  // llama.cpp reads an absent token_type as all normal
    return std::vector<int32_t>(meta.tokens.size(), static_cast<int32_t>(GgufTokenType::kNormal));
  if (meta.token_type.size() != meta.tokens.size())
    fail_invalid(where + ": tokenizer.ggml.token_type has " +
                 std::to_string(meta.token_type.size()) + " entries but tokenizer.ggml.tokens " +
                 std::to_string(meta.tokens.size()));
  for (size_t i = 0; i < meta.token_type.size(); ++i)
    if (meta.token_type[i] < 1 || meta.token_type[i] > 6)
      fail_invalid(where + ": tokenizer.ggml.token_type[" + std::to_string(i) + "] is " +
                   std::to_string(meta.token_type[i]) + ", not a token type 1..6");
  return meta.token_type;
}

void check_id(const std::optional<int32_t>& id, const char* key, size_t n_tokens,
              const std::string& where) {
  if (id && (*id < 0 || static_cast<size_t>(*id) >= n_tokens))
    fail_invalid(where + ": tokenizer.ggml." + key + " is " + std::to_string(*id) +
                 ", outside [0, " + std::to_string(n_tokens) + ")");
}

void check_special_ids(const GgufTokenizerMetadata& meta, const std::string& where) {
  const size_t n = meta.tokens.size();
  check_id(meta.bos_token_id, "bos_token_id", n, where);
  check_id(meta.eos_token_id, "eos_token_id", n, where);
  check_id(meta.eot_token_id, "eot_token_id", n, where);
  check_id(meta.padding_token_id, "padding_token_id", n, where);
  check_id(meta.unknown_token_id, "unknown_token_id", n, where);
}

/// Normal token string -> id (the BPE vocabulary); views into meta.tokens.
using NormalIds = std::unordered_map<std::string_view, size_t>;

/// Checks that each merge is "left right" and that left, right and left+right are normal
/// tokens (tokenizers requires all three in model.vocab).
void check_merges(const GgufTokenizerMetadata& meta, const NormalIds& normal,
                  const std::string& where) {
  std::string merged;
  for (size_t rank = 0; rank < meta.merges.size(); ++rank) {
    const std::string_view m = meta.merges[rank];
    const auto key = [&] { return "tokenizer.ggml.merges[" + std::to_string(rank) + "]"; };
    const size_t space = m.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == m.size() ||
        m.find(' ', space + 1) != std::string::npos)
      fail_invalid(where + ": " + key() + " \"" + std::string(m) +
                   "\" is not two tokens \"left right\"");
    const std::string_view left = m.substr(0, space), right = m.substr(space + 1);
    merged.assign(left).append(right);
    for (std::string_view token : {left, right, std::string_view(merged)})
      if (!normal.contains(token))
        fail_invalid(where + ": " + key() + " names \"" + std::string(token) +
                     "\", which is not a normal token of tokenizer.ggml.tokens");
  }
}

}  // namespace

std::vector<std::string> gguf_known_pre_tokenizers() {
  std::vector<std::string> names;
  for (const PreTokenizer& p : pre_tokenizers())
    for (std::string_view n : p.names) names.emplace_back(n);
  std::sort(names.begin(), names.end());
  return names;
}

/// add_bos_token / add_eos_token as tokenizer.json says them: a TemplateProcessing
/// post-processor around the single sequence (null when neither is set).
json post_processor_json(const GgufTokenizerMetadata& meta) {
  json single = json::array(), table = json::object();
  const auto special = [&](int32_t id) {
    const std::string& name = meta.tokens[static_cast<size_t>(id)];
    single.push_back({{"SpecialToken", {{"id", name}, {"type_id", 0}}}});
    table[name] = {{"id", name}, {"ids", {id}}, {"tokens", {name}}};
  };
  const bool bos = meta.add_bos.value_or(false) && meta.bos_token_id;
  const bool eos = meta.add_eos.value_or(false) && meta.eos_token_id;
  if (!bos && !eos) return nullptr;
  if (bos) special(*meta.bos_token_id);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (eos) special(*meta.eos_token_id);
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", nullptr}, {"special_tokens", table}};
}

json tokenizer_json_from_gguf(const GgufTokenizerMetadata& meta, std::string_view origin) {
  const std::string where(origin);
  if (meta.model == "llama") {  // sentencepiece BPE (Llama 2, Mistral, Mixtral)
    const std::vector<int32_t> types = checked_types(meta, where);
    check_special_ids(meta, where);
    json root = spm_tokenizer_json(meta, types, where);
    root["post_processor"] = post_processor_json(meta);
    return root;
  }
  if (meta.model != "gpt2") {
    const std::string kind = meta.model == "bert" ? " (WordPiece)" : meta.model == "t5" ? " (Unigram)" : "";
    fail_unsupported(where + ": tokenizer.ggml.model \"" + meta.model + "\"" + kind +
                     " is not supported; charm reads \"gpt2\" (byte-level BPE) and \"llama\" (sentencepiece "
                     "BPE) tokenizers");
  }
  const PreTokenizer* pre = find_pre_tokenizer(meta.pre);
  if (pre == nullptr)
    fail_unsupported(where + ": tokenizer.ggml.pre \"" + meta.pre +
                     "\" names a pre-tokenizer charm does not know; known: " +
                     join(gguf_known_pre_tokenizers()));
  const std::vector<int32_t> types = checked_types(meta, where);
  check_special_ids(meta, where);

  NormalIds normal;
  normal.reserve(meta.tokens.size());
  json added = json::array();
  std::unordered_set<std::string_view> added_contents;
  for (size_t id = 0; id < meta.tokens.size(); ++id) {
    const std::string& token = meta.tokens[id];
    const auto type = static_cast<GgufTokenType>(types[id]);
    if (type == GgufTokenType::kUnused) continue;  // a hole, as in the source tokenizer.json
    if (type == GgufTokenType::kControl || type == GgufTokenType::kUserDefined) {
      if (token.empty() || !added_contents.insert(token).second)
        fail_invalid(where + ": tokenizer.ggml.tokens[" + std::to_string(id) +
                     "] is an empty or repeated added token");
      added.push_back({{"id", id},
                       {"content", token},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", type == GgufTokenType::kControl}});
      continue;
    }
    const auto [it, fresh] = normal.emplace(token, id);
    if (!fresh)
      fail_invalid(where + ": tokenizer.ggml.tokens[" + std::to_string(id) + "] \"" + token +
                   "\" repeats token " + std::to_string(it->second));
  }
  check_merges(meta, normal, where);
  json vocab = json::object();
  for (const auto& [token, id] : normal) vocab[std::string(token)] = id;

  json root = {{"version", "1.0"},
               {"truncation", nullptr},
               {"padding", nullptr},
               {"added_tokens", std::move(added)},
               {"normalizer", pre->nfc ? json{{"type", "NFC"}} : json(nullptr)},
               {"pre_tokenizer", pre_tokenizer_json(*pre)},
               {"post_processor", post_processor_json(meta)},
               {"decoder",
                {{"type", "ByteLevel"},
                 {"add_prefix_space", false},
                 {"trim_offsets", false},
                 {"use_regex", false}}}};
  root["model"] = {{"type", "BPE"},
                   {"dropout", nullptr},
                   {"unk_token", nullptr},
                   {"continuing_subword_prefix", ""},
                   {"end_of_word_suffix", ""},
                   {"fuse_unk", false},
                   {"byte_fallback", false},
                   {"ignore_merges", pre->ignore_merges},
                   {"vocab", std::move(vocab)},
                   {"merges", meta.merges}};
  return root;
}

std::vector<int32_t> gguf_stop_token_ids(const GgufTokenizerMetadata& meta,
                                         std::string_view origin) {
  const std::string where(origin);
  check_id(meta.eos_token_id, "eos_token_id", meta.tokens.size(), where);
  check_id(meta.eot_token_id, "eot_token_id", meta.tokens.size(), where);
  std::vector<int32_t> ids;
  if (meta.eos_token_id) ids.push_back(*meta.eos_token_id);
  if (meta.eot_token_id && meta.eot_token_id != meta.eos_token_id)
    ids.push_back(*meta.eot_token_id);
  return ids;
}

}  // namespace charm
