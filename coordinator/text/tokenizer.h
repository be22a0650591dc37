// BPE tokenizer read from a Hugging Face tokenizer.json (the format of the `tokenizers`
// library: model.type "BPE" with vocab and merges, and added_tokens), in the two layouts
// the supported families ship:
//  - byte-level (GPT-2, Qwen, DeepSeek): a ByteLevel or Split+ByteLevel pre-tokenizer whose
//    regex is run with PCRE2 (Unicode properties), an optional NFC normalizer, the
//    ByteLevel decoder;
//  - sentencepiece style (Llama 2, Mistral, Mixtral, as transformers' LlamaConverter
//    writes it): byte_fallback to "<0xAB>" tokens, fuse_unk, the Prepend("▁") +
//    Replace(" ", "▁") normalizers and no pre-tokenizer, or a Metaspace pre-tokenizer
//    (split false), and the decoder Replace("▁", " ") + ByteFallback + Fuse + Strip.
// Follows tokenizers' Rust implementation so that ids match it exactly.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace charm {

/// A loaded tokenizer. Immutable after load; all methods are thread-safe.
class Tokenizer {
 public:
  /// Loads tokenizer.json. Throws Error(kInvalidInput) naming the file and the field for
  /// JSON that does not parse, a model type other than BPE, merges that name unknown
  /// tokens, a pre-tokenizer regex PCRE2 rejects, or added tokens with bad ids;
  /// Error(kUnsupported) for normalizers/pre-tokenizers charm does not implement.
  static std::unique_ptr<Tokenizer> load(const std::filesystem::path& tokenizer_json);

  /// Builds a tokenizer from an already parsed tokenizer.json object (e.g. the one
  /// tokenizer_json_from_gguf makes, coordinator/text/gguf_tokenizer.h). Same checks and
  /// errors as load(); their messages name `origin` where load() names the file.
  static std::unique_ptr<Tokenizer> from_json(const nlohmann::json& root, std::string origin);
  virtual ~Tokenizer() = default;

  /// Token ids of `text` (UTF-8; invalid bytes are encoded as tokenizers does, via the
  /// lossy U+FFFD replacement). With `parse_special`, added/special tokens written in the
  /// text become their ids (as tokenizers' encode(..., add_special_tokens=False) does).
  virtual std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const = 0;

  /// Ids of a whole prompt, as tokenizers' encode(text, add_special_tokens=True) gives
  /// them: encode(text) between the special tokens tokenizer.json's TemplateProcessing
  /// post-processor puts around a single sequence (Llama's "<s>"; none for Qwen). For raw
  /// completion prompts; a chat template writes its special tokens itself.
  std::vector<int32_t> encode_prompt(std::string_view text) const;

  /// Text of `ids` (bytes joined, then invalid UTF-8 replaced by U+FFFD as tokenizers'
  /// decode does; a sentencepiece-style decoder's Strip drops the leading space(s) of the
  /// whole text, as tokenizers' decode does). With `skip_special`, special tokens are left out.
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special = false) const = 0;

  /// The raw bytes token `id` stands for (may be part of a UTF-8 character); "▁" is a
  /// space and no Strip applies (StreamDecoder's text continues a prompt, as vLLM's
  /// incremental detokenizer does: "▁Paris" streams as " Paris").
  /// Throws Error(kInvalidInput) for an id outside [0, vocab_size()).
  virtual std::string token_bytes(int32_t id) const = 0;

  /// The id of a token by its vocabulary string (e.g. "<|im_end|>"), or -1.
  virtual int32_t token_id(std::string_view token) const = 0;

  /// One past the largest id (vocab plus added tokens).
  virtual int32_t vocab_size() const = 0;

  /// True when `id` names a token: one of model.vocab or added_tokens. False for ids
  /// outside [0, vocab_size()) and for holes (ids below vocab_size() that neither lists),
  /// which decode to nothing; the engine never samples either (coordinator/sampler.h).
  virtual bool has_token(int32_t id) const = 0;

  /// True for added tokens marked "special": true.
  virtual bool is_special(int32_t id) const = 0;

  /// The ids the post-processor puts before and after a single sequence (empty: none).
  struct SequenceTemplate {
    std::vector<int32_t> prefix, suffix;
  };
  virtual SequenceTemplate sequence_template() const { return {}; }
};

/// Turns a stream of token ids into text that never splits a UTF-8 character: bytes of
/// an incomplete character are held until the character completes. Not thread-safe.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);
  /// Adds one token; returns the text that is now complete (possibly empty).
  std::string push(int32_t id);
  /// Returns what is still held, invalid sequences replaced by U+FFFD.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace charm
