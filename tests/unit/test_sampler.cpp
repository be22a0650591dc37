// Sampling (coordinator/sampler.h) and stop strings (coordinator/text/stop_strings.h).
#include <doctest/doctest.h>

#include <cmath>
#include <map>

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
