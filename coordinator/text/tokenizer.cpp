// BPE tokenizer (see tokenizer.h). Mirrors the pipeline of Hugging Face `tokenizers`
// (Rust): lossy UTF-8 -> split out added tokens -> normalizers (NFC, Prepend, Replace) ->
// Split regex or Metaspace -> initial symbols (ByteLevel: one per byte through the
// byte<->unicode map; sentencepiece style: one per character, byte_fallback to "<0xAB>"
// tokens, else unk) -> BPE merges by rank -> ids; decode joins token bytes (ByteLevel
// map, or "▁" -> " " with byte tokens as their byte and the leading-space Strip) and
// replaces invalid UTF-8 as String::from_utf8_lossy does.
#include "coordinator/text/tokenizer.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <optional>
#include <queue>
#include <unordered_map>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/json_reader.h"
#include "common/utf8.h"
#include "coordinator/text/unicode_nfc.h"

namespace charm {
namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------
// GPT-2 byte <-> unicode map (tokenizers pre_tokenizers/byte_level.rs bytes_char): the
// printable bytes stand for themselves, the other 68 bytes for U+0100.. in byte order.

struct ByteMap {
  std::array<std::string, 256> byte_to_utf8;  // byte -> UTF-8 of its stand-in char
  std::unordered_map<char32_t, unsigned char> char_to_byte;

  ByteMap() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
      append_utf8(byte_to_utf8[b], cp);
      char_to_byte[cp] = static_cast<unsigned char>(b);
    }
  }

  /// Bytes a vocabulary string stands for; the string itself if some char is not in the
  /// map (as tokenizers' ByteLevel decoder does).
  std::string to_bytes(std::string_view token) const {
    std::string out;
    for (char32_t cp : decode_utf8_lossy(token)) {
      auto it = char_to_byte.find(cp);
      if (it == char_to_byte.end()) return std::string(token);
      out += static_cast<char>(it->second);
    }
    return out;
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

// ---------------------------------------------------------------------------------------
// PCRE2 wrappers (RAII)

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
using RegexPtr = std::unique_ptr<pcre2_code, CodeDeleter>;
using MatchDataPtr = std::unique_ptr<pcre2_match_data, MatchDataDeleter>;

/// Compiles `pattern` in UTF + Unicode-property mode; throws naming `where`.
RegexPtr compile_regex(const std::string& pattern, const std::string& where) {
  int code = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                 PCRE2_UTF | PCRE2_UCP, &code, &offset, nullptr);
  if (re == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(code, buf, sizeof(buf));
    fail_invalid(where + ": PCRE2 rejects the regex at offset " + std::to_string(offset) + ": " +
                 reinterpret_cast<const char*>(buf));
  }
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // optional speed-up; falls back if absent
  return RegexPtr(re);
}

/// PCRE2 pattern matching `literal` verbatim.
std::string escape_literal(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

// GPT-2's pre-tokenizer regex, used by ByteLevel with use_regex: true.
constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---------------------------------------------------------------------------------------
// The tokenizer

// The sentencepiece word-boundary mark, U+2581 "▁" (Metaspace's default replacement).
constexpr std::string_view kSpmSpace = "\xE2\x96\x81";

/// `text` with every `from` replaced by `to` (tokenizers' Replace normalizer/decoder with
/// a String pattern).
std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  size_t start = 0;
  for (size_t at; !from.empty() && (at = text.find(from, start)) != std::string_view::npos; start = at + from.size()) {
    out.append(text.substr(start, at - start));
    out.append(to);
  }
  out.append(text.substr(start));
  return out;
}

/// The byte a sentencepiece byte token "<0xAB>" stands for, or -1 for any other token.
int byte_token_value(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  int value = 0;
  for (char c : token.substr(3, 2)) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    value = value * 16 + d;
  }
  return value;
}

/// One normalizer of the sequence, applied in order (tokenizers normalizers/*.rs).
struct NormalizerStep {
  enum Kind { kNfc, kPrepend, kReplace } kind = kNfc;
  std::string text, replacement;  // Prepend: text; Replace: text -> replacement
};

/// The Metaspace pre-tokenizer with split false (tokenizers pre_tokenizers/metaspace.rs):
/// spaces become `replacement`, which is prepended per `prepend_scheme`.
struct Metaspace {
  enum Scheme { kAlways, kFirst, kNever } scheme = kAlways;
  std::string replacement;
};

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool normalized = false;
};

/// A piece of text after added-token splitting: an added token's id, or text (id -1).
struct Segment {
  std::string_view text;
  int32_t id = -1;
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(std::string origin) : file_(std::move(origin)) {}

  void load(const json& root);

  std::vector<int32_t> encode(std::string_view text, bool parse_special) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override;
  std::string token_bytes(int32_t id) const override;
  int32_t token_id(std::string_view token) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(bytes_.size()); }
  SequenceTemplate sequence_template() const override { return template_; }
  bool is_special(int32_t id) const override {
    return id >= 0 && id < vocab_size() && special_[static_cast<size_t>(id)];
  }
  bool has_token(int32_t id) const override {
    return id >= 0 && id < vocab_size() && present_[static_cast<size_t>(id)];
  }

 private:
  [[noreturn]] void bad(const std::string& what) const { fail_invalid(file_ + ": " + what); }
  [[noreturn]] void unsupported(const std::string& what) const {
    fail_unsupported(file_ + ": " + what);
  }

  void load_model(const json& model);
  void load_merges(const json& merges);
  void load_added_tokens(const json& added);
  void load_normalizer(const json& normalizer);
  void load_pre_tokenizer(const json& pre);
  void load_metaspace(const json& pre);
  void load_decoder(const json& decoder);
  void load_post_processor(const json& post, const json& root);
  void add_split(const json& split, const std::string& where);
  void finish_tables();
  std::string token_string_bytes(const std::string& token) const;

  std::vector<Segment> split_added(std::string_view text, bool normalized_set,
                                   bool parse_special) const;
  void encode_text(std::string_view text, bool parse_special, std::vector<int32_t>& out) const;
  std::string normalize(std::string_view text) const;
  void encode_normalized(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
  std::vector<std::string_view> pre_tokenize(std::string_view text) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  std::vector<int32_t> initial_symbols(std::string_view word) const;
  std::vector<int32_t> bpe(std::string_view word) const;

  std::string file_;  // where the tokenizer came from, for error messages
  std::unordered_map<std::string, int32_t> vocab_;                    // vocabulary string -> id
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // pair -> rank, new id
  std::array<int32_t, 256> byte_ids_{};  // ByteLevel: id of each byte's stand-in char
  std::array<int32_t, 256> byte_fallback_ids_{};  // byte_fallback: id of each "<0xAB>" token, or -1
  std::vector<AddedToken> added_;        // sorted longest content first
  std::vector<std::string> bytes_;       // id -> raw bytes
  std::vector<bool> special_;            // id -> special added token
  std::vector<bool> present_;            // id -> in model.vocab or added_tokens (else a hole)
  std::vector<NormalizerStep> normalizers_;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  std::string unk_token_;  // model.unk_token ("" when none)
  int32_t unk_id_ = -1;
  std::vector<RegexPtr> splits_;  // applied in order, Isolated
  std::optional<Metaspace> metaspace_;
  // Decoder: ByteLevel (token strings through the byte map), or the sentencepiece chain
  // Replace("▁", " ") + ByteFallback + Fuse + Strip(" ", strip_leading_, 0).
  bool byte_level_ = true;
  bool pre_byte_level_ = false;  // the pre-tokenizer has a ByteLevel step (bytes -> GPT-2 chars)
  size_t strip_leading_ = 0;
  SequenceTemplate template_;  // TemplateProcessing's special tokens around one sequence

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// Words longer than this are encoded without the per-word cache.
constexpr size_t kMaxCachedWordBytes = 256;

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

void BpeTokenizer::load(const json& root) {
  if (!root.is_object()) bad("top level is not a JSON object");
  if (!root.contains("model") || !root["model"].is_object()) bad("has no \"model\" object");
  load_model(root["model"]);
  load_added_tokens(root.value("added_tokens", json::array()));
  load_normalizer(root.value("normalizer", json()));
  load_pre_tokenizer(root.value("pre_tokenizer", json()));
  load_decoder(root.value("decoder", json()));
  finish_tables();
  load_post_processor(root.value("post_processor", json()), root);
}

void BpeTokenizer::load_model(const json& model) {
  const std::string type = model.value("type", "BPE");
  if (type != "BPE") bad("model.type is \"" + type + "\"; charm supports only \"BPE\"");
  if (!model.contains("vocab") || !model["vocab"].is_object()) bad("model.vocab is missing");
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      bad("model.vocab[\"" + token + "\"] is not a non-negative integer id");
    vocab_.emplace(token, id.get<int32_t>());
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty())
      unsupported(std::string("model.") + key + " is not empty");
  }
  byte_fallback_ = model.value("byte_fallback", false);
  fuse_unk_ = model.value("fuse_unk", false);
  if (model.contains("unk_token") && model["unk_token"].is_string()) unk_token_ = model["unk_token"].get<std::string>();
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0.0)
    unsupported("model.dropout is set");
  ignore_merges_ = model.value("ignore_merges", false);
  if (!model.contains("merges") || !model["merges"].is_array()) bad("model.merges is missing");
  load_merges(model["merges"]);
}

void BpeTokenizer::load_merges(const json& merges) {
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    std::string left, right;
    if (m.is_string()) {  // "left right" (older tokenizers files)
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        bad("model.merges[" + std::to_string(rank) + "] \"" + s + "\" is not two tokens");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();  // ["left", "right"] (tokenizers >= 0.20)
      right = m[1].get<std::string>();
    } else {
      bad("model.merges[" + std::to_string(rank) + "] is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const auto find = [&](const std::string& token) {
      auto it = vocab_.find(token);
      if (it == vocab_.end())
        bad("model.merges[" + std::to_string(rank) + "] names \"" + token +
            "\", which is not in model.vocab");
      return it->second;
    };
    const int32_t a = find(left), b = find(right), merged = find(left + right);
    merges_.emplace(pair_key(a, b), std::make_pair(static_cast<int32_t>(rank), merged));
  }
}

void BpeTokenizer::load_added_tokens(const json& added) {
  if (!added.is_array()) bad("added_tokens is not an array");
  for (size_t i = 0; i < added.size(); ++i) {
    const json& t = added[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("content") || !t["content"].is_string() ||
        t["content"].get<std::string>().empty())
      bad(where + " has no non-empty \"content\"");
    if (!t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 ||
        t["id"].get<int64_t>() > INT32_MAX)
      bad(where + ".id is not a non-negative integer");
    for (const char* flag : {"lstrip", "rstrip", "single_word"})
      if (t.value(flag, false)) unsupported(where + "." + flag + " is true");
    AddedToken token{t["content"].get<std::string>(), t["id"].get<int32_t>(),
                     t.value("special", false), t.value("normalized", false)};
    auto existing = vocab_.find(token.content);
    if (existing != vocab_.end() && existing->second != token.id)
      bad(where + " \"" + token.content + "\" has id " + std::to_string(token.id) +
          " but model.vocab gives it " + std::to_string(existing->second));
    added_.push_back(std::move(token));
  }
  // Longest first, so the first candidate matching at a position is the longest one
  // (tokenizers' Aho-Corasick runs with MatchKind::LeftmostLongest).
  std::stable_sort(added_.begin(), added_.end(), [](const AddedToken& x, const AddedToken& y) {
    return x.content.size() > y.content.size();
  });
}

void BpeTokenizer::load_normalizer(const json& normalizer) {
  if (normalizer.is_null()) return;
  const std::string type = normalizer.value("type", "");
  if (type == "NFC") {
    normalizers_.push_back({NormalizerStep::kNfc, "", ""});
  } else if (type == "Prepend") {
    if (!normalizer.contains("prepend") || !normalizer["prepend"].is_string()) bad("normalizer Prepend.prepend is not a string");
    normalizers_.push_back({NormalizerStep::kPrepend, normalizer["prepend"].get<std::string>(), ""});
  } else if (type == "Replace") {
    const json pattern = normalizer.value("pattern", json());
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string() ||
        !normalizer.contains("content") || !normalizer["content"].is_string())
      unsupported("normalizer Replace other than {pattern: {String: ...}, content: ...} is not implemented");
    normalizers_.push_back(
        {NormalizerStep::kReplace, pattern["String"].get<std::string>(), normalizer["content"].get<std::string>()});
  } else if (type == "Sequence" && normalizer.contains("normalizers") &&
             normalizer["normalizers"].is_array()) {
    for (const json& n : normalizer["normalizers"]) load_normalizer(n);
  } else {
    unsupported("normalizer type \"" + type + "\" is not implemented (only NFC, Prepend, Replace)");
  }
}

void BpeTokenizer::load_pre_tokenizer(const json& pre) {
  const std::string type = pre.is_object() ? pre.value("type", "") : "";
  const auto check_byte_level = [&](const json& bl, const std::string& where) {
    pre_byte_level_ = true;
    if (bl.value("add_prefix_space", false)) unsupported(where + ".add_prefix_space is true");
    if (bl.value("use_regex", true))
      splits_.push_back(compile_regex(kGpt2Regex, file_ + ": " + where));
  };
  if (pre.is_null()) return;  // the whole normalized text is one word (Llama's tokenizer.json)
  if (type == "ByteLevel") {
    check_byte_level(pre, "pre_tokenizer");
    return;
  }
  if (type == "Metaspace") {
    load_metaspace(pre);
    return;
  }
  if (type != "Sequence" || !pre.contains("pretokenizers") || !pre["pretokenizers"].is_array())
    unsupported("pre_tokenizer must be null, ByteLevel, Metaspace or Sequence[Split..., ByteLevel]");
  const json& list = pre["pretokenizers"];
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]";
    const std::string t = list[i].is_object() ? list[i].value("type", "") : "";
    const bool last = i + 1 == list.size();
    if (t == "Split" && !last) {
      add_split(list[i], where);
    } else if (t == "ByteLevel" && last) {
      check_byte_level(list[i], where);
    } else {
      unsupported(where + " of type \"" + t + "\" is not implemented here");
    }
  }
  if (list.empty()) unsupported("pre_tokenizer.pretokenizers is empty");
}

void BpeTokenizer::load_metaspace(const json& pre) {
  if (pre.value("split", true)) unsupported("pre_tokenizer Metaspace with split true is not implemented");
  Metaspace m;
  m.replacement = pre.value("replacement", std::string(kSpmSpace));
  const std::string scheme = pre.value("prepend_scheme", std::string("always"));
  if (scheme == "always") {
    m.scheme = Metaspace::kAlways;
  } else if (scheme == "first") {
    m.scheme = Metaspace::kFirst;
  } else if (scheme == "never") {
    m.scheme = Metaspace::kNever;
  } else {
    bad("pre_tokenizer.prepend_scheme \"" + scheme + "\" is none of always, first, never");
  }
  if (m.replacement.empty()) bad("pre_tokenizer.replacement is empty");
  metaspace_ = std::move(m);
}

void BpeTokenizer::load_decoder(const json& decoder) {
  const std::string type = decoder.is_object() ? decoder.value("type", "") : "";
  // Encoding follows the pre-tokenizer (ByteLevel maps bytes to characters), decoding the
  // decoder; charm implements the two consistent pairs and refuses the rest, never guessing.
  if (pre_byte_level_ && (type == "ByteLevel" || decoder.is_null())) return;  // byte_level_ stays true
  if (decoder.is_null())
    unsupported("decoder is null without a ByteLevel pre-tokenizer: how tokens become text is not said");
  if (type == "ByteLevel") unsupported("a ByteLevel decoder without a ByteLevel pre-tokenizer is not implemented");
  if (pre_byte_level_) unsupported("a ByteLevel pre-tokenizer with decoder \"" + type + "\" is not implemented");
  // The chain LlamaConverter writes (Llama 2, Mistral, Mixtral): exactly these four.
  const json list = type == "Sequence" ? decoder.value("decoders", json()) : json();
  const auto is = [&](size_t i, const char* t) {
    return list.is_array() && list.size() == 4 && list[i].is_object() && list[i].value("type", "") == t;
  };
  if (!(is(0, "Replace") && is(1, "ByteFallback") && is(2, "Fuse") && is(3, "Strip")) ||
      list[0].value("pattern", json()).value("String", "") != kSpmSpace || list[0].value("content", "") != " " ||
      list[3].value("content", "") != " " || list[3].value("stop", 0) != 0 || !list[3]["start"].is_number_integer() ||
      list[3]["start"].get<int64_t>() < 0 || list[3]["start"].get<int64_t>() > 16)
    unsupported("decoder must be ByteLevel or Sequence[Replace(\"\u2581\", \" \"), ByteFallback, Fuse, Strip(\" \", "
                "N, 0)]");
  byte_level_ = false;
  strip_leading_ = static_cast<size_t>(list[3]["start"].get<int64_t>());
}

/// TemplateProcessing's "single" template: special tokens, then the sequence "A", then
/// special tokens (tokenizers processors/template.rs); ByteLevel (offsets only) and a
/// Sequence of processors are accepted too. Each special token's ids come from the
/// processor's special_tokens table, and must be tokens.
void BpeTokenizer::load_post_processor(const json& post, const json& root) {
  const std::string type = post.is_object() ? post.value("type", "") : "";
  if (post.is_null() || type == "ByteLevel") return;
  if (type == "Sequence") {
    if (!post.contains("processors") || !post["processors"].is_array()) bad("post_processor.processors is not an array");
    for (const json& p : post["processors"]) load_post_processor(p, root);
    return;
  }
  if (type != "TemplateProcessing")
    unsupported("post_processor of type \"" + type + "\" is not implemented (ByteLevel, TemplateProcessing, Sequence)");
  if (!post.contains("single") || !post["single"].is_array()) bad("post_processor.single is missing or not an array");
  const json table = post.value("special_tokens", json::object());
  bool seen_sequence = false;
  for (const json& piece : post["single"]) {
    if (piece.contains("Sequence") && piece["Sequence"].value("id", "") == "A" && !seen_sequence) {
      seen_sequence = true;
      continue;
    }
    const std::string name = piece.contains("SpecialToken") ? piece["SpecialToken"].value("id", "") : "";
    if (name.empty() || !table.contains(name) || !table[name].contains("ids") || !table[name]["ids"].is_array())
      bad("post_processor.single: " + piece.dump() + " is neither sequence A nor a special token of special_tokens");
    for (const json& id : table[name]["ids"]) {
      if (!id.is_number_integer() || id.get<int64_t>() > INT32_MAX || !has_token(static_cast<int32_t>(id.get<int64_t>())))
        bad("post_processor.special_tokens[\"" + name + "\"].ids: " + id.dump() + " is not a token id");
      (seen_sequence ? template_.suffix : template_.prefix).push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  if (!seen_sequence) bad("post_processor.single has no sequence A");
}

void BpeTokenizer::add_split(const json& split, const std::string& where) {
  if (split.value("behavior", "") != "Isolated")
    unsupported(where + ".behavior is not \"Isolated\"");
  if (split.value("invert", false)) unsupported(where + ".invert is true");
  const json pattern = split.value("pattern", json());
  if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
    splits_.push_back(
        compile_regex(pattern["Regex"].get<std::string>(), file_ + ": " + where + ".pattern"));
  } else if (pattern.contains("String") && pattern["String"].is_string()) {
    splits_.push_back(compile_regex(escape_literal(pattern["String"].get<std::string>()),
                                    file_ + ": " + where + ".pattern"));
  } else {
    bad(where + ".pattern has neither \"Regex\" nor \"String\"");
  }
}

/// The bytes a vocabulary string stands for, as the decoder turns it into text.
std::string BpeTokenizer::token_string_bytes(const std::string& token) const {
  if (byte_level_) return byte_map().to_bytes(token);
  const int byte = byte_fallback_ ? byte_token_value(token) : -1;
  if (byte >= 0) return std::string(1, static_cast<char>(byte));
  return replace_all(token, kSpmSpace, " ");
}

void BpeTokenizer::finish_tables() {
  int32_t size = 0;
  for (const auto& [token, id] : vocab_) size = std::max(size, id + 1);
  for (const AddedToken& t : added_) size = std::max(size, t.id + 1);
  bytes_.assign(static_cast<size_t>(size), std::string());
  special_.assign(static_cast<size_t>(size), false);
  present_.assign(static_cast<size_t>(size), false);
  const ByteMap& map = byte_map();
  byte_fallback_ids_.fill(-1);
  for (const auto& [token, id] : vocab_) {
    bytes_[static_cast<size_t>(id)] = token_string_bytes(token);
    present_[static_cast<size_t>(id)] = true;
    const int byte = byte_fallback_ ? byte_token_value(token) : -1;
    if (byte >= 0) byte_fallback_ids_[static_cast<size_t>(byte)] = id;
  }
  for (const AddedToken& t : added_) {
    bytes_[static_cast<size_t>(t.id)] = token_string_bytes(t.content);
    special_[static_cast<size_t>(t.id)] = t.special;
    present_[static_cast<size_t>(t.id)] = true;
    vocab_.emplace(t.content, t.id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(map.byte_to_utf8[b]);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;  // -1: byte dropped (no unk)
  }
  if (!unk_token_.empty()) {
    auto it = vocab_.find(unk_token_);
    if (it == vocab_.end()) bad("model.unk_token \"" + unk_token_ + "\" is not in model.vocab");
    unk_id_ = it->second;
  }
}

// --- encode -----------------------------------------------------------------------------

std::vector<Segment> BpeTokenizer::split_added(std::string_view text, bool normalized_set,
                                               bool parse_special) const {
  std::vector<Segment> out;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const AddedToken* hit = nullptr;
    for (const AddedToken& t : added_) {
      if (t.normalized != normalized_set || (t.special && !parse_special)) continue;
      if (text.compare(i, t.content.size(), t.content) == 0) {
        hit = &t;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (i > start) out.push_back({text.substr(start, i - start), -1});
    out.push_back({text.substr(i, hit->content.size()), hit->id});
    i += hit->content.size();
    start = i;
  }
  if (start < text.size()) out.push_back({text.substr(start), -1});
  return out;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool parse_special) const {
  std::string valid;
  if (!is_valid_utf8(text)) {
    valid = utf8_lossy(text);
    text = valid;
  }
  std::vector<int32_t> ids;
  encode_text(text, parse_special, ids);
  return ids;
}

void BpeTokenizer::encode_text(std::string_view text, bool parse_special,
                               std::vector<int32_t>& out) const {
  for (const Segment& seg : split_added(text, /*normalized_set=*/false, parse_special)) {
    if (seg.id >= 0) {
      out.push_back(seg.id);
      continue;
    }
    // Normalisation runs on the text between non-normalized added tokens; normalized
    // added tokens are then matched in the normalised text (tokenizers AddedVocabulary).
    const std::string normalized = normalize(seg.text);
    const bool seg_at_start = seg.text.data() == text.data();
    for (const Segment& sub : split_added(normalized, /*normalized_set=*/true, parse_special)) {
      if (sub.id >= 0) {
        out.push_back(sub.id);
      } else {
        encode_normalized(sub.text, seg_at_start && sub.text.data() == normalized.data(), out);
      }
    }
  }
}

std::string BpeTokenizer::normalize(std::string_view text) const {
  std::string s(text);
  for (const NormalizerStep& step : normalizers_) {
    if (step.kind == NormalizerStep::kNfc) {
      if (!is_nfc_quick(s)) s = to_nfc(s);
    } else if (step.kind == NormalizerStep::kPrepend) {
      if (!s.empty()) s.insert(0, step.text);
    } else {
      s = replace_all(s, step.text, step.replacement);
    }
  }
  return s;
}

/// `at_start`: the text begins the input (Metaspace's prepend_scheme "first").
void BpeTokenizer::encode_normalized(std::string_view text, bool at_start, std::vector<int32_t>& out) const {
  if (metaspace_) {
    std::string word = replace_all(text, " ", metaspace_->replacement);
    const bool prepend = metaspace_->scheme == Metaspace::kAlways || (metaspace_->scheme == Metaspace::kFirst && at_start);
    if (prepend && word.compare(0, metaspace_->replacement.size(), metaspace_->replacement) != 0)
      word.insert(0, metaspace_->replacement);
    encode_word(word, out);
    return;
  }
  for (std::string_view word : pre_tokenize(text)) encode_word(word, out);
}

std::vector<std::string_view> BpeTokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string_view> pieces{text};
  for (const RegexPtr& re : splits_) {
    MatchDataPtr md(pcre2_match_data_create_from_pattern(re.get(), nullptr));
    std::vector<std::string_view> next;
    for (std::string_view piece : pieces) {
      const auto subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t pos = 0, gap_start = 0;
      while (pos < piece.size()) {
        const int rc = pcre2_match(re.get(), subject, piece.size(), pos, PCRE2_NO_UTF_CHECK,
                                   md.get(), nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {  // e.g. a JIT stack or match limit: never guess a split
          PCRE2_UCHAR buf[256];
          pcre2_get_error_message(rc, buf, sizeof(buf));
          fail_internal(file_ + ": pre-tokenizer regex failed on a " +
                        std::to_string(piece.size()) +
                        "-byte piece: " + reinterpret_cast<const char*>(buf));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        if (ov[1] == ov[0]) {  // empty match: step over one character
          pos = ov[0] + 1;
          while (pos < piece.size() && (static_cast<unsigned char>(piece[pos]) & 0xC0) == 0x80)
            ++pos;
          continue;
        }
        if (ov[0] > gap_start) next.push_back(piece.substr(gap_start, ov[0] - gap_start));
        next.push_back(piece.substr(ov[0], ov[1] - ov[0]));
        pos = gap_start = ov[1];
      }
      if (gap_start < piece.size()) next.push_back(piece.substr(gap_start));
    }
    pieces = std::move(next);
  }
  return pieces;
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  // Without a pre-tokenizer a "word" is a whole text: worth no cache entry.
  if (word.size() > kMaxCachedWordBytes) {
    std::vector<int32_t> ids = bpe(word);
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(std::string(word));
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = bpe(word);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= 200000) cache_.clear();  // bound memory on adversarial input
  cache_.emplace(std::string(word), std::move(ids));
}

/// The symbols BPE starts from (tokenizers' BPE::merge_word): ByteLevel, one per byte
/// (a byte without a token is dropped); otherwise one per character in the vocabulary,
/// else its bytes' "<0xAB>" tokens (byte_fallback, all of them present), else unk, with
/// runs of unk fused into one (fuse_unk); a character with none of these is dropped.
std::vector<int32_t> BpeTokenizer::initial_symbols(std::string_view word) const {
  std::vector<int32_t> ids;
  ids.reserve(word.size());
  if (byte_level_) {
    for (char c : word) {
      const int32_t id = byte_ids_[static_cast<unsigned char>(c)];
      if (id >= 0) ids.push_back(id);
    }
    return ids;
  }
  bool last_unk = false;
  for (size_t i = 0; i < word.size();) {
    size_t len = 1;
    while (i + len < word.size() && (static_cast<unsigned char>(word[i + len]) & 0xC0) == 0x80) ++len;
    const std::string_view ch = word.substr(i, len);
    i += len;
    auto it = vocab_.find(std::string(ch));
    if (it != vocab_.end()) {
      ids.push_back(it->second);
      last_unk = false;
      continue;
    }
    const bool bytes_known = byte_fallback_ && std::all_of(ch.begin(), ch.end(), [&](char c) {
      return byte_fallback_ids_[static_cast<unsigned char>(c)] >= 0;
    });
    if (bytes_known) {
      for (char c : ch) ids.push_back(byte_fallback_ids_[static_cast<unsigned char>(c)]);
      last_unk = false;
    } else if (unk_id_ >= 0 && !(fuse_unk_ && last_unk)) {
      ids.push_back(unk_id_);
      last_unk = true;
    }
  }
  return ids;
}

/// BPE of one pre-token, as tokenizers' Word::merge_all: a min-heap of candidate merges
/// ordered by (rank, position); a popped merge is applied if its pair still exists.
std::vector<int32_t> BpeTokenizer::bpe(std::string_view word) const {
  if (ignore_merges_) {
    std::string mapped;
    for (char c : word) mapped += byte_map().byte_to_utf8[static_cast<unsigned char>(c)];
    auto it = vocab_.find(mapped);
    if (it != vocab_.end()) return {it->second};
  }
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> sym;
  for (int32_t id : initial_symbols(word)) {
    const int32_t n = static_cast<int32_t>(sym.size());
    sym.push_back({id, n - 1, n + 1, true});
  }
  if (sym.empty()) return {};
  sym.back().next = -1;

  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto push_pair = [&](int32_t left) {
    if (left < 0 || sym[left].next < 0) return;
    auto it = merges_.find(pair_key(sym[left].id, sym[sym[left].next].id));
    if (it != merges_.end()) heap.push({it->second.first, left, it->second.second});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) push_pair(i);

  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    Symbol& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    auto it = merges_.find(pair_key(left.id, sym[left.next].id));
    if (it == merges_.end() || it->second.second != top.new_id) continue;  // stale
    Symbol& right = sym[left.next];
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) sym[left.next].prev = top.pos;
    push_pair(left.prev);
    push_pair(top.pos);
  }
  std::vector<int32_t> ids;
  for (const Symbol& s : sym)
    if (s.alive) ids.push_back(s.id);
  return ids;
}

// --- decode -----------------------------------------------------------------------------

std::string BpeTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    fail_invalid(file_ + ": token id " + std::to_string(id) + " is outside [0, " +
                 std::to_string(vocab_size()) + ")");
  return bytes_[static_cast<size_t>(id)];
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string raw;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    raw += token_bytes(id);
  }
  // The sentencepiece chain's Strip: the fused text loses up to N leading spaces.
  size_t strip = 0;
  while (strip < strip_leading_ && strip < raw.size() && raw[strip] == ' ') ++strip;
  return utf8_lossy(std::string_view(raw).substr(strip));
}

int32_t BpeTokenizer::token_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  return it == vocab_.end() ? -1 : it->second;
}

json read_json(const std::filesystem::path& path) {
  return read_json_file(path, kTokenizerJsonLimits, "a tokenizer file");
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::filesystem::path& tokenizer_json) {
  return from_json(read_json(tokenizer_json), tokenizer_json.string());
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(const json& root, std::string origin) {
  auto tokenizer = std::make_unique<BpeTokenizer>(origin);
  try {
    tokenizer->load(root);
  } catch (const json::exception& e) {  // a field of the wrong JSON type
    fail_invalid(origin + ": unexpected field type: " + e.what());
  }
  return tokenizer;
}

std::vector<int32_t> Tokenizer::encode_prompt(std::string_view text) const {
  SequenceTemplate around = sequence_template();
  std::vector<int32_t> ids = std::move(around.prefix);
  const std::vector<int32_t> body = encode(text, /*parse_special=*/true);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), around.suffix.begin(), around.suffix.end());
  return ids;
}

// --- StreamDecoder ------------------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  pending_ += tokenizer_.token_bytes(id);
  const size_t cut = utf8_incomplete_tail_start(pending_);
  std::string out = utf8_lossy(std::string_view(pending_).substr(0, cut));
  pending_.erase(0, cut);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace charm
