// Next-token selection: greedy, or temperature sampling with top-k and top-p (nucleus)
// filtering, in the order transformers' generate applies its logits warpers
// (temperature, then top-k, then top-p); the repetition, frequency and presence
// penalties applied before it; and the log-probabilities a request may ask for.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace charm {

struct SamplingParams;
class Tokenizer;

/// The log-probability of one sampled token under the model's distribution (log-softmax
/// of the raw logits, before penalties and temperature: vLLM's default "raw_logprobs"),
/// and the `top` most likely tokens with theirs, most likely first (ties: lower id first).
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  ///< (token id, logprob), at most top_logprobs
};

/// Picks the next token from logits [vocab] f32. temperature == 0 -> argmax (first index
/// on ties). Otherwise softmax(logits / temperature) restricted to the top_k most likely
/// (top_k > 0) and then to the smallest set whose probability reaches top_p (always at
/// least one token), sampled with `rng`. `logits` is used as scratch and modified. A
/// logit of -infinity (mask_logits) is never picked while any other is finite.
int32_t sample_token(float* logits, size_t vocab, const SamplingParams& params, std::mt19937_64& rng);

/// The ids of a model's vocabulary [0, model_vocab) that must never be sampled because
/// `tokenizer` has no token for them (Tokenizer::has_token): the padding config.json's
/// vocab_size often adds past the tokenizer's last id (Qwen: 151936 rows for 151669
/// tokens), and holes below it. Ids in `keep` (the EOS ids: they end a generation and are
/// never decoded) are left out. Ascending. Computed once per model; the caller checks
/// that the tokenizer fits the model (vocab_size() <= model_vocab).
std::vector<int32_t> unsampleable_ids(const Tokenizer& tokenizer, size_t model_vocab, std::span<const int32_t> keep);

/// Applies the penalties of `params` to logits [vocab] f32 in place, in vLLM's order
/// (vllm/model_executor/layers/utils.py, apply_penalties):
///  1. repetition_penalty (transformers' RepetitionPenaltyLogitsProcessor), over every
///     distinct id of `prompt` and `generated`, each once: logit < 0 ? logit * p : logit / p,
///     in f32 with p rounded to f32;
///  2. frequency_penalty and presence_penalty (OpenAI's definition), over `generated`
///     only: logit -= frequency_penalty * count, then logit -= presence_penalty, for each id
///     generated count > 0 times, each step in f32 as vLLM's f32 tensors compute it.
/// A -infinity (masked) logit stays -infinity. With repetition_penalty 1 and both other
/// penalties 0 the logits are not touched (bit for bit). Ids outside [0, vocab) are
/// ignored. Deterministic: the result does not depend on the order of the ids.
void apply_penalties(float* logits, size_t vocab, const SamplingParams& params, std::span<const int32_t> prompt,
                     std::span<const int32_t> generated);

/// The log-probability of `token` under log_softmax(logits) (logits [vocab] f32, the raw
/// ones: before penalties, temperature and top-k/top-p), and the `top_n` most likely ids
/// with theirs (most likely first; ties: lower id first). Computed as
/// float((logit - max) - log(sum over ids of exp(logit - max))): each exp in f32, the sum,
/// the log and the last subtraction in double, rounded to f32 once (torch.log_softmax
/// rounds in f32 at each step; on tests/fixtures/sampler the two agree within 1e-6, or
/// one f32 ulp of the value where |logprob| > 8). An id whose logit is -infinity (masked)
/// has logprob -infinity and is listed in `top` only when fewer than top_n ids have a
/// finite logit; `top` has min(top_n, vocab) entries. Cost: one pass of exp over the
/// vocabulary per call (3.4 ms for 151,936 ids and top_n 20 on a loaded 2-core machine),
/// so call it only for requests that ask for logprobs. REQUIRES: token < vocab, at least
/// one finite logit, no NaN.
TokenLogprob token_logprob(const float* logits, size_t vocab, int32_t token, size_t top_n);

/// Sets logits[id] = -infinity for every id of `ids` (each < the logits' length), so that
/// neither greedy nor temperature sampling can pick it. Other logits are untouched.
void mask_logits(float* logits, std::span<const int32_t> ids);

}  // namespace charm
