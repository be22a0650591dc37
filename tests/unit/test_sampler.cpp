// Sampling, penalties and logprobs (coordinator/sampler.h) and stop strings
// (coordinator/text/stop_strings.h). Penalties and logprobs are checked against
// transformers / torch on tests/fixtures/sampler/cases.json (scripts/gen_sampler_cases.py).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "common/kernels.h"
#include "coordinator/sampler.h"
#include "coordinator/sampling_params.h"
#include "coordinator/text/stop_strings.h"
#include "coordinator/text/tokenizer.h"

using namespace charm;

namespace {

/// A tokenizer of `size` ids with holes at `holes`; only has_token and vocab_size matter.
class HoleyTokenizer : public Tokenizer {
 public:
  HoleyTokenizer(int32_t size, std::vector<int32_t> holes) : size_(size), holes_(std::move(holes)) {}
  std::vector<int32_t> encode(std::string_view, bool) const override { return {}; }
  std::string decode(std::span<const int32_t>, bool) const override { return {}; }
  std::string token_bytes(int32_t) const override { return {}; }
  int32_t token_id(std::string_view) const override { return -1; }
  int32_t vocab_size() const override { return size_; }
  bool is_special(int32_t) const override { return false; }
  bool has_token(int32_t id) const override {
    return id >= 0 && id < size_ && std::find(holes_.begin(), holes_.end(), id) == holes_.end();
  }

 private:
  int32_t size_;
  std::vector<int32_t> holes_;
};

}  // namespace

TEST_CASE("unsampleable ids: the model's padding past the tokenizer and its holes, EOS kept") {
  const HoleyTokenizer tok(6, {2});
  const std::vector<int32_t> none, eos = {7};
  CHECK(unsampleable_ids(tok, 6, none) == std::vector<int32_t>{2});
  CHECK(unsampleable_ids(tok, 9, none) == std::vector<int32_t>{2, 6, 7, 8});
  CHECK(unsampleable_ids(tok, 9, eos) == std::vector<int32_t>{2, 6, 8});
  CHECK(unsampleable_ids(HoleyTokenizer(4, {}), 4, none).empty());
}

TEST_CASE("masked logits are never picked, greedy or sampled; the others keep their values") {
  // The masked ids hold the largest logits, and the last id is masked (the padding sits
  // at the end of a vocabulary).
  const std::vector<float> raw = {0.5f, 9.0f, 0.2f, 0.1f, 8.0f};
  const std::vector<int32_t> masked = {1, 4};
  std::vector<float> logits = raw;
  mask_logits(logits.data(), masked);
  CHECK(std::isinf(logits[1]));
  CHECK(logits[1] < 0);
  for (int32_t id : {0, 2, 3}) CHECK(logits[id] == raw[id]);

  SamplingParams p;
  p.temperature = 0;
  std::mt19937_64 rng(5);
  std::vector<float> scratch = logits;
  CHECK(sample_token(scratch.data(), scratch.size(), p, rng) == 0);
  std::map<int32_t, int> counts;
  for (double temperature : {1.0, 1e3, 1e6}) {
    for (int64_t top_k : {0, 2}) {
      for (double top_p : {1.0, 0.5}) {
        p.temperature = temperature;
        p.top_k = top_k;
        p.top_p = top_p;
        for (int i = 0; i < 500; ++i) {
          scratch = logits;
          counts[sample_token(scratch.data(), scratch.size(), p, rng)]++;
        }
      }
    }
  }
  CHECK(counts[1] == 0);
  CHECK(counts[4] == 0);
  CHECK(counts[0] > 0);
  CHECK(counts[3] > 0);  // the masked ids took nothing from the rest: 3 still drawn
}

TEST_CASE("temperature 0 is argmax, first index on ties") {
  std::vector<float> logits = {0.0f, 3.0f, 3.0f, -1.0f};
  SamplingParams p;
  p.temperature = 0;
  std::mt19937_64 rng(1);
  CHECK(sample_token(logits.data(), logits.size(), p, rng) == 1);
}

TEST_CASE("argmax and max_value match the one-at-a-time chain over NaN, zeros, infinities and ties") {
  // The chain both replace: best moves only on a strictly greater value.
  auto chain_argmax = [](const std::vector<float>& x) {
    size_t best = 0;
    for (size_t i = 1; i < x.size(); ++i) {
      if (x[i] > x[best]) best = i;
    }
    return best;
  };
  std::mt19937 rng(11);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::infinity(), 0.0f, -0.0f};
  for (int trial = 0; trial < 20000; ++trial) {
    std::vector<float> x(1 + rng() % 70);  // across the sixteen lanes and the tail
    for (float& v : x) v = rng() % 3 == 0 ? specials[rng() % 5] : static_cast<float>(static_cast<int>(rng() % 7) - 3);
    const size_t want = chain_argmax(x);
    REQUIRE(argmax(x.data(), x.size()) == want);
    if (!std::isnan(x[0])) REQUIRE(max_value(x.data(), x.size()) == x[want]);
  }
}

TEST_CASE("top_k = 1 always picks the best token whatever the temperature") {
  SamplingParams p;
  p.temperature = 5.0;
  p.top_k = 1;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> logits = {0.5f, 0.4f, 0.9f, 0.1f};
    CHECK(sample_token(logits.data(), logits.size(), p, rng) == 2);
  }
}

TEST_CASE("top_p keeps only the nucleus") {
  // probs ~ {0.665, 0.245, 0.09}: top_p 0.6 keeps only token 0; 0.8 keeps tokens 0 and 1.
  SamplingParams p;
  p.temperature = 1.0;
  std::mt19937_64 rng(3);
  std::map<int32_t, int> counts;
  p.top_p = 0.8;
  for (int i = 0; i < 2000; ++i) {
    std::vector<float> logits = {2.0f, 1.0f, 0.0f};
    counts[sample_token(logits.data(), logits.size(), p, rng)]++;
  }
  CHECK(counts[2] == 0);
  CHECK(counts[1] > 0);
  p.top_p = 0.6;
  for (int i = 0; i < 200; ++i) {
    std::vector<float> logits = {2.0f, 1.0f, 0.0f};
    CHECK(sample_token(logits.data(), logits.size(), p, rng) == 0);
  }
}

TEST_CASE("sampling follows the softmax distribution and a seed reproduces it") {
  SamplingParams p;
  p.temperature = 1.0;
  std::vector<int32_t> a, b;
  for (auto* out : {&a, &b}) {
    std::mt19937_64 rng(42);
    for (int i = 0; i < 4000; ++i) {
      std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
      out->push_back(sample_token(logits.data(), logits.size(), p, rng));
    }
  }
  CHECK(a == b);
  std::map<int32_t, int> counts;
  for (int32_t t : a) counts[t]++;
  CHECK(counts[0] / 4000.0 == doctest::Approx(0.5).epsilon(0.1));
  CHECK(counts[2] / 4000.0 == doctest::Approx(0.2).epsilon(0.15));
}

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// The fixture's f32 list (null = -inf).
std::vector<float> f32s(const nlohmann::json& list) {
  std::vector<float> out;
  for (const auto& v : list) out.push_back(v.is_null() ? kNegInf : static_cast<float>(v.get<double>()));
  return out;
}

nlohmann::json sampler_cases() {
  const auto path = std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/sampler/cases.json";
  std::ifstream in(path);
  REQUIRE_MESSAGE(in, "missing " << path.string() << " (python3 scripts/gen_sampler_cases.py)");
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("penalties match transformers' RepetitionPenaltyLogitsProcessor and vLLM's formula bit for bit") {
  const nlohmann::json doc = sampler_cases();
  REQUIRE(doc["cases"].size() >= 5);
  for (const auto& c : doc["cases"]) {
    CAPTURE(c["name"].get<std::string>());
    SamplingParams p;
    p.repetition_penalty = c["repetition_penalty"];
    p.frequency_penalty = c["frequency_penalty"];
    p.presence_penalty = c["presence_penalty"];
    const auto prompt = c["prompt"].get<std::vector<int32_t>>();
    const auto generated = c["generated"].get<std::vector<int32_t>>();
    std::vector<float> logits = f32s(c["logits"]);
    const std::vector<float> want = f32s(c["penalized"]);
    apply_penalties(logits.data(), logits.size(), p, prompt, generated);
    size_t differ = 0;
    for (size_t i = 0; i < logits.size(); ++i) differ += std::bit_cast<uint32_t>(logits[i]) != std::bit_cast<uint32_t>(want[i]);
    CHECK(differ == 0);
  }
}

TEST_CASE("penalties: a no-op bit for bit when off; each id once; order of ids irrelevant") {
  std::vector<float> raw = {1.5f, -2.0f, 0.0f, -0.0f, 3.25f, kNegInf, 7.0f};
  const std::vector<int32_t> prompt = {0, 1, 5, 0, 0}, generated = {4, 4, 1, 6};
  std::vector<float> logits = raw;
  apply_penalties(logits.data(), logits.size(), SamplingParams{}, prompt, generated);
  CHECK(std::memcmp(logits.data(), raw.data(), raw.size() * sizeof(float)) == 0);

  SamplingParams p;
  p.repetition_penalty = 2.0;
  p.frequency_penalty = 0.5;
  p.presence_penalty = 0.25;
  apply_penalties(logits.data(), logits.size(), p, prompt, generated);
  CHECK(logits[0] == 0.75f);            // in the prompt three times: divided once
  CHECK(logits[1] == -4.0f - 0.5f - 0.25f);  // prompt and generated: multiplied once, then once generated
  CHECK(logits[2] == 0.0f);             // not seen
  CHECK(logits[4] == 3.25f / 2 - 1.0f - 0.25f);  // generated twice
  CHECK(logits[5] == kNegInf);          // masked stays masked
  CHECK(logits[6] == 3.5f - 0.5f - 0.25f);
  // The same histories in another order give the same bits.
  std::vector<float> again = raw;
  const std::vector<int32_t> prompt2 = {5, 0, 1, 0, 0}, generated2 = {6, 1, 4, 4};
  apply_penalties(again.data(), again.size(), p, prompt2, generated2);
  CHECK(std::memcmp(again.data(), logits.data(), raw.size() * sizeof(float)) == 0);
  // Ids outside the vocabulary are ignored.
  std::vector<float> small = {1.0f, 2.0f};
  const std::vector<int32_t> outside = {-1, 2, 1000};
  apply_penalties(small.data(), small.size(), p, outside, outside);
  CHECK(small == std::vector<float>{1.0f, 2.0f});
}

TEST_CASE("token logprobs match torch.log_softmax of the raw logits; top by logit, ties lower id first") {
  const nlohmann::json doc = sampler_cases();
  double worst = 0, worst_small = 0;
  for (const auto& c : doc["cases"]) {
    CAPTURE(c["name"].get<std::string>());
    const std::vector<float> logits = f32s(c["logits"]);
    const std::vector<float> want = f32s(c["logprobs"]);
    const auto order = c["order"].get<std::vector<int32_t>>();
    const size_t vocab = logits.size();
    // Every id's logprob; the top 20 (and, for the small case, the whole ranking).
    for (size_t id = 0; id < vocab; ++id) {
      const TokenLogprob lp = token_logprob(logits.data(), vocab, int32_t(id), 0);
      CHECK(lp.token == int32_t(id));
      CHECK(lp.top.empty());
      if (std::isinf(want[id])) {
        CHECK(lp.logprob == kNegInf);
      } else {
        // torch rounds in f32 at every step (it is up to 3.5e-6 from the float64 value on
        // this fixture, where logprobs reach -42); charm rounds once: they may differ by
        // one f32 ulp of the value, which is above 1e-6 past |logprob| = 8.
        const double diff = std::abs(double(lp.logprob) - double(want[id]));
        const double ulp = std::nextafter(std::abs(want[id]), std::numeric_limits<float>::infinity()) - std::abs(want[id]);
        CHECK(diff <= std::max(1e-6, ulp));
        worst = std::max(worst, diff);
        if (std::abs(want[id]) < 8) worst_small = std::max(worst_small, diff);
      }
    }
    for (size_t top_n : {size_t(1), size_t(5), size_t(20), vocab <= 64 ? vocab + 3 : size_t(20)}) {
      const TokenLogprob lp = token_logprob(logits.data(), vocab, order.back(), top_n);
      REQUIRE(lp.top.size() == std::min(top_n, vocab));
      for (size_t i = 0; i < lp.top.size(); ++i) {
        CHECK(lp.top[i].first == order[i]);
        CHECK(lp.top[i].second == token_logprob(logits.data(), vocab, order[i], 0).logprob);
      }
    }
  }
  MESSAGE("max |charm - torch.log_softmax| = " << worst << ", " << worst_small << " where |logprob| < 8");
  CHECK(worst_small <= 1e-6);
}

TEST_CASE("token logprobs: masked ids are -inf and listed last, only when nothing else is left") {
  const std::vector<float> logits = {kNegInf, 1.0f, kNegInf, 1.0f, 0.0f};
  const TokenLogprob lp = token_logprob(logits.data(), logits.size(), 0, 4);
  CHECK(lp.logprob == kNegInf);
  REQUIRE(lp.top.size() == 4);
  CHECK(lp.top[0].first == 1);  // tie: lower id first
  CHECK(lp.top[1].first == 3);
  CHECK(lp.top[2].first == 4);
  CHECK(lp.top[3].first == 0);  // a masked id, only because 4 were asked for
  CHECK(lp.top[3].second == kNegInf);
  const double p1 = std::exp(double(lp.top[0].second)), p4 = std::exp(double(lp.top[2].second));
  CHECK(2 * p1 + p4 == doctest::Approx(1.0).epsilon(1e-6));
}

TEST_CASE("stop strings cut the text and withhold possible prefixes while streaming") {
  StopMatcher m({"END", "\n\n"});
  std::string out;
  out += m.push("Hello E");
  CHECK(out == "Hello ");  // "E" could start "END"
  out += m.push("N");
  CHECK(out == "Hello ");
  out += m.push("Dless");
  CHECK(m.stopped());
  CHECK(out == "Hello ");
  CHECK(m.finish().empty());
}

TEST_CASE("a held prefix that does not complete is released") {
  StopMatcher m({"END"});
  std::string out = m.push("abc EN");
  CHECK(out == "abc ");
  out += m.push("X");
  CHECK(out == "abc ENX");
  out += m.push("EN");
  out += m.finish();
  CHECK(out == "abc ENXEN");
  CHECK(!m.stopped());
}
