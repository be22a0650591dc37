// The tokenizer.json of a sentencepiece vocabulary kept in a GGUF file
// (tokenizer.ggml.model "llama": Llama 2, Mistral, Mixtral), as transformers'
// LlamaConverter writes it for the same vocabulary. Internal to
// coordinator/text/gguf_tokenizer.cpp, which checks the metadata first.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "coordinator/text/gguf_tokenizer.h"

namespace charm {

/// BPE with byte_fallback and fuse_unk over every token but the unused ones; merges from
/// the scores as transformers' generate_merges makes them (tokenization_utils_base.py:
/// every split of a token, at character boundaries, into two tokens, grouped per token by
/// the two ids, then ordered by the merged token's score, then the left and right lengths
/// in characters, all descending, stably; control and unknown tokens score 0 as in
/// LlamaConverter.vocab); normalizer Prepend("▁") (when add_space_prefix, default true) +
/// Replace(" ", "▁"); no pre-tokenizer; decoder Replace("▁", " ") + ByteFallback + Fuse
/// + Strip(1 leading space when add_space_prefix); control tokens special added tokens,
/// user-defined ones added and not special. `types`: the checked token types.
/// Throws Error(kInvalidInput) naming `where` for scores of another length than tokens,
/// a score that is not finite, a normal token listed twice, an unknown_token_id that is
/// no token. Pure function.
nlohmann::json spm_tokenizer_json(const GgufTokenizerMetadata& meta, const std::vector<int32_t>& types,
                                  const std::string& where);

}  // namespace charm
