// The tokenizer and chat template of a GGUF file (llama.cpp), given as its tokenizer.*
// metadata, turned into the Hugging Face tokenizer.json that charm's Tokenizer loads.
//
// GGUF keeps a byte-level BPE tokenizer as arrays (tokens in id order, a type per token,
// merges "a b") plus the *name* of the pre-tokenizer (tokenizer.ggml.pre); the regexes
// that name stands for live in llama.cpp's code (src/llama-vocab.cpp) and in the model
// family's tokenizer.json. This file holds that name -> pre-tokenizer table for the
// families charm supports and rebuilds the tokenizer.json the family ships, so that
// encoding goes through the same code path (and gives the same ids) as a safetensors
// checkpoint's tokenizer.json. It does not read GGUF files: the model-mapping code fills
// GgufTokenizerMetadata from the GGUF reader.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace charm {

/// tokenizer.ggml.token_type values (llama.cpp's llama_token_type / gguf-py TokenType).
enum class GgufTokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      ///< special token (e.g. "<|im_end|>"); becomes a "special": true added token
  kUserDefined = 4,  ///< added token that is not special (e.g. Qwen3's "<think>")
  kUnused = 5,       ///< padding entry ("[PAD151669]") past the tokenizer's vocabulary
  kByte = 6,         ///< "<0xAB>" byte token (sentencepiece vocabularies)
};

/// Most entries tokenizer.ggml.tokens / .merges may hold (the largest real vocabularies
/// have ~260k tokens); longer arrays are rejected as malformed.
inline constexpr size_t kMaxGgufTokens = size_t{4} << 20;
inline constexpr size_t kMaxGgufMerges = size_t{4} << 20;

/// The tokenizer.* metadata of a GGUF file, one field per key. Plain data; the caller
/// (model mapping) fills it from the GGUF reader and leaves absent keys empty/nullopt.
struct GgufTokenizerMetadata {
  std::string model;                ///< tokenizer.ggml.model: "gpt2" (byte-level BPE), "llama", ...
  std::string pre;                  ///< tokenizer.ggml.pre: pre-tokenizer name ("qwen2", ...)
  std::vector<std::string> tokens;  ///< tokenizer.ggml.tokens, in id order
  std::vector<int32_t> token_type;  ///< tokenizer.ggml.token_type (GgufTokenType), or empty
  std::vector<std::string> merges;  ///< tokenizer.ggml.merges, "left right", by rank
  std::vector<float> scores;        ///< tokenizer.ggml.scores (sentencepiece "llama"), or empty
  std::optional<int32_t> bos_token_id;      ///< tokenizer.ggml.bos_token_id
  std::optional<int32_t> eos_token_id;      ///< tokenizer.ggml.eos_token_id
  std::optional<int32_t> eot_token_id;      ///< tokenizer.ggml.eot_token_id
  std::optional<int32_t> padding_token_id;  ///< tokenizer.ggml.padding_token_id
  std::optional<int32_t> unknown_token_id;  ///< tokenizer.ggml.unknown_token_id
  std::optional<bool> add_bos;              ///< tokenizer.ggml.add_bos_token
  std::optional<bool> add_eos;              ///< tokenizer.ggml.add_eos_token
  std::optional<bool> add_space_prefix;     ///< tokenizer.ggml.add_space_prefix ("llama"; default true)
  std::string chat_template;                ///< tokenizer.chat_template ("" when absent)
};

/// The pre-tokenizer names (tokenizer.ggml.pre) tokenizer_json_from_gguf knows, sorted.
std::vector<std::string> gguf_known_pre_tokenizers();

/// The tokenizer.json equivalent of `meta`. For model "llama" (sentencepiece BPE), the
/// layout of coordinator/text/gguf_spm.h (spm_tokenizer_json). For "gpt2": model BPE (vocab = the normal, unknown and
/// byte tokens; merges as given), the pre-tokenizer the family's tokenizer.json has for
/// `meta.pre` (Split(regex, Isolated)... + ByteLevel, or ByteLevel with its GPT-2 regex),
/// NFC normalizer where the family has one (Qwen2), added_tokens = the control tokens
/// ("special": true) and user-defined ones ("special": false), ByteLevel decoder. Both: a
/// TemplateProcessing post-processor putting BOS before / EOS after a sequence when
/// add_bos / add_eos say so (Tokenizer::encode_prompt). Unused
/// tokens become holes (Tokenizer::has_token is false for them), as in the tokenizer.json
/// the GGUF was converted from. Load the result with Tokenizer::from_json.
///
/// What GGUF cannot carry: an added token's "special" flag is llama.cpp converter's guess
/// (convert_hf_to_gguf.py marks "<|...|>"-looking tokens control, so Qwen's
/// "<|fim_prefix|>", special false in tokenizer.json, comes back special) and its
/// "normalized" flag (always false here, as llama.cpp matches them in raw text).
///
/// Throws Error(kUnsupported) for a model other than "gpt2" or "llama", or (gpt2) a pre-tokenizer name not
/// in gguf_known_pre_tokenizers() (the message names it and lists the known ones), and
/// Error(kInvalidInput) naming `origin` and the key for: no tokens, more than
/// kMaxGgufTokens tokens or kMaxGgufMerges merges, token_type of another length than
/// tokens or with a value outside 1..6, a normal token listed twice, merges that are not
/// "a b" or name tokens missing from the vocabulary, special ids outside [0, tokens).
/// Pure function; thread-safe.
nlohmann::json tokenizer_json_from_gguf(const GgufTokenizerMetadata& meta, std::string_view origin);

/// The ids generation stops on: eos_token_id, then eot_token_id if present and different
/// (both as llama.cpp reads them from the GGUF). Deliberately not llama.cpp's extra
/// end-of-generation guesses by token text ("<|im_end|>", "<|eot_id|>", "<|endoftext|>",
/// ...), which would stop a base model at a token its converter did not name; the chat
/// template's stop strings cover turn ends beyond these. Throws Error(kInvalidInput)
/// naming `origin` for an id outside [0, tokens). Thread-safe.
std::vector<int32_t> gguf_stop_token_ids(const GgufTokenizerMetadata& meta,
                                         std::string_view origin);

}  // namespace charm
