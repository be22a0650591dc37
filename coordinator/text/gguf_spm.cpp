// A GGUF sentencepiece vocabulary -> tokenizer.json (see gguf_spm.h). The merges follow
// transformers 5.24's generate_merges (tokenization_utils_base.py), the layout its
// LlamaConverter (convert_slow_tokenizer.py); tests/fixtures/spm_tokenizer was written by
// scripts/gen_spm_tokenizer_cases.py the same way and checked against llama.cpp's pairs.
#include "coordinator/text/gguf_spm.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>

#include "common/error.h"

namespace charm {
namespace {

using json = nlohmann::json;

constexpr const char* kSpace = "\xE2\x96\x81";  // "▁"

size_t utf8_chars(std::string_view s) {
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

struct Merge {
  std::string_view left, right;
  float score = 0;
};

/// Every token's splits into two tokens, ordered as generate_merges orders them.
std::vector<Merge> merges_from_scores(const std::vector<std::string>& tokens, const std::vector<float>& scores,
                                      const std::unordered_map<std::string_view, size_t>& vocab) {
  std::vector<Merge> merges;
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string_view token = tokens[id];
    if (!vocab.contains(token) || vocab.at(token) != id) continue;  // unused, or not this entry
    const size_t first = merges.size();
    for (size_t cut = 1; cut < token.size(); ++cut) {
      if ((static_cast<unsigned char>(token[cut]) & 0xC0) == 0x80) continue;  // inside a character
      const std::string_view left = token.substr(0, cut), right = token.substr(cut);
      if (vocab.contains(left) && vocab.contains(right)) merges.push_back({left, right, scores[id]});
    }
    std::sort(merges.begin() + static_cast<std::ptrdiff_t>(first), merges.end(), [&](const Merge& a, const Merge& b) {
      return std::pair(vocab.at(a.left), vocab.at(a.right)) < std::pair(vocab.at(b.left), vocab.at(b.right));
    });
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    const auto key = [](const Merge& m) { return std::tuple(m.score, utf8_chars(m.left), utf8_chars(m.right)); };
    return key(a) > key(b);
  });
  return merges;
}

json added_token(size_t id, const std::string& content, bool special) {
  return {{"id", id},           {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},    {"normalized", false}, {"special", special}};
}

std::vector<float> checked_scores(const GgufTokenizerMetadata& meta, const std::vector<int32_t>& types,
                                  const std::string& where) {
  // llama.cpp reads absent scores as 0 for every token.
  std::vector<float> scores = meta.scores.empty() ? std::vector<float>(meta.tokens.size(), 0.0f) : meta.scores;
  if (scores.size() != meta.tokens.size())
    fail_invalid(where + ": tokenizer.ggml.scores has " + std::to_string(scores.size()) +
                 " entries but tokenizer.ggml.tokens " + std::to_string(meta.tokens.size()));
  for (size_t i = 0; i < scores.size(); ++i) {
    if (!std::isfinite(scores[i]))
      fail_invalid(where + ": tokenizer.ggml.scores[" + std::to_string(i) + "] is not a finite number");
    const auto type = static_cast<GgufTokenType>(types[i]);
    if (type == GgufTokenType::kControl || type == GgufTokenType::kUnknown) scores[i] = 0.0f;
  }
  return scores;
}

}  // namespace

json spm_tokenizer_json(const GgufTokenizerMetadata& meta, const std::vector<int32_t>& types,
                        const std::string& where) {
  const std::vector<float> scores = checked_scores(meta, types, where);
  std::unordered_map<std::string_view, size_t> vocab;
  json added = json::array();
  for (size_t id = 0; id < meta.tokens.size(); ++id) {
    const auto type = static_cast<GgufTokenType>(types[id]);
    if (type == GgufTokenType::kUnused) continue;  // a hole
    const auto [it, fresh] = vocab.emplace(meta.tokens[id], id);
    if (!fresh)
      fail_invalid(where + ": tokenizer.ggml.tokens[" + std::to_string(id) + "] \"" + meta.tokens[id] +
                   "\" repeats token " + std::to_string(it->second));
    if (type == GgufTokenType::kControl || type == GgufTokenType::kUnknown || type == GgufTokenType::kUserDefined)
      added.push_back(added_token(id, meta.tokens[id], type != GgufTokenType::kUserDefined));
  }
  const size_t unk = meta.unknown_token_id.value_or(0);
  if (unk >= meta.tokens.size() || static_cast<GgufTokenType>(types[unk]) == GgufTokenType::kUnused)
    fail_invalid(where + ": tokenizer.ggml.unknown_token_id " + std::to_string(unk) + " names no token");
  json merges = json::array();
  for (const Merge& m : merges_from_scores(meta.tokens, scores, vocab))
    merges.push_back({std::string(m.left), std::string(m.right)});
  json vocab_json = json::object();
  for (const auto& [token, id] : vocab) vocab_json[std::string(token)] = id;

  const bool prefix = meta.add_space_prefix.value_or(true);
  json normalizers = json::array();
  if (prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", kSpace}});
  normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}});
  json root = {{"version", "1.0"},
               {"truncation", nullptr},
               {"padding", nullptr},
               {"added_tokens", std::move(added)},
               {"normalizer", {{"type", "Sequence"}, {"normalizers", std::move(normalizers)}}},
               {"pre_tokenizer", nullptr},
               {"post_processor", nullptr},
               {"decoder",
                {{"type", "Sequence"},
                 {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                                           {{"type", "ByteFallback"}},
                                           {{"type", "Fuse"}},
                                           {{"type", "Strip"}, {"content", " "}, {"start", prefix ? 1 : 0}, {"stop", 0}}})}}}};
  root["model"] = {{"type", "BPE"},          {"dropout", nullptr},     {"unk_token", meta.tokens[unk]},
                   {"continuing_subword_prefix", nullptr},           {"end_of_word_suffix", nullptr},
                   {"fuse_unk", true},       {"byte_fallback", true},  {"ignore_merges", false},
                   {"vocab", std::move(vocab_json)},                 {"merges", std::move(merges)}};
  return root;
}

}  // namespace charm
