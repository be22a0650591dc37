// The scheduler and the paged KV pool without a model: steps are simulated by marking
// each part's positions stored and "sampling" a fixed token when a part reaches the end
// of its tokens (coordinator/scheduler.h, coordinator/models/kv_cache.h).
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "common/error.h"
#include "coordinator/models/kv_cache.h"
#include "coordinator/scheduler.h"
#include "tests/support/expect_error.h"

using namespace charm;

namespace {

constexpr size_t kBlock = KvBlockPool::kBlockSize;
const KvLayout kLayout{2, 4, 4};

/// A sequence whose prompt is `n` tokens counting up from `first`.
std::unique_ptr<Sequence> sequence(KvBlockPool& pool, size_t n, int32_t first = 0) {
  auto s = std::make_unique<Sequence>(pool);
  s->tokens.resize(n);
  std::iota(s->tokens.begin(), s->tokens.end(), first);
  return s;
}

/// What a forward does to the caches, then a sampled token for each part that finished
/// its tokens. Returns the sequences that sampled.
std::vector<Sequence*> run_step(Scheduler& scheduler, const StepPlan& plan) {
  std::vector<Sequence*> sampled;
  for (const StepPlan::Part& p : plan.parts) {
    REQUIRE(p.n <= p.sequence->cache.capacity() - p.sequence->cache.length());
    p.sequence->cache.advance(p.n);
  }
  scheduler.step_done(plan);
  for (const StepPlan::Part& p : plan.parts) {
    if (p.sequence->pending() == 0) {
      p.sequence->tokens.push_back(1000 + static_cast<int32_t>(p.sequence->tokens.size()));
      sampled.push_back(p.sequence);
    }
  }
  return sampled;
}

size_t tokens_of(const StepPlan& plan, const Sequence* s) {
  for (const StepPlan::Part& p : plan.parts) {
    if (p.sequence == s) return p.n;
  }
  return 0;
}

}  // namespace

TEST_CASE("the pool hands out every block once, reuses released ones, and refuses when all are held") {
  KvBlockPool pool(kLayout, 3);
  std::vector<uint32_t> held;
  for (int i = 0; i < 3; ++i) held.push_back(*pool.allocate());
  std::sort(held.begin(), held.end());
  CHECK(held == std::vector<uint32_t>{0, 1, 2});
  CHECK_FALSE(pool.allocate().has_value());
  CHECK(pool.free_blocks() == 0);
  pool.release(1);
  CHECK(pool.free_blocks() == 1);
  CHECK(*pool.allocate() == 1);
  test::expect_error([&] { KvBlockPool(kLayout, 0); }, ErrorCategory::kInvalidInput, {"at least one block"});
}

TEST_CASE("the prefix cache finds a published block by key and tokens, and evicts the least recently released") {
  KvBlockPool pool(kLayout, 2);
  std::vector<int32_t> a(kBlock, 1), b(kBlock, 2);
  const uint64_t key_a = prefix_block_key(0, a), key_b = prefix_block_key(0, b);
  CHECK(key_a != key_b);
  CHECK(prefix_block_key(key_a, b) != key_b);  // the parent is part of the key
  const uint32_t block_a = *pool.allocate(), block_b = *pool.allocate();
  pool.publish(block_a, key_a, a);
  pool.publish(block_b, key_b, b);
  pool.release(block_a);  // released first: evicted first
  pool.release(block_b);
  CHECK(pool.cached_blocks() == 2);
  CHECK(pool.free_blocks() == 2);
  // The same key with other tokens (a collision) is a miss, never a wrong block.
  CHECK_FALSE(pool.find_cached(key_a, b).has_value());
  CHECK(pool.find_cached(key_b, b) == block_b);
  // block_b is held again; a new allocation takes the cached block_a and forgets its key.
  CHECK(*pool.allocate() == block_a);
  CHECK_FALSE(pool.find_cached(key_a, a).has_value());
  CHECK_FALSE(pool.allocate().has_value());
}

TEST_CASE("a step stays within max_batch_tokens and max_num_seqs; prompts are chunked, decodes come first") {
  KvBlockPool pool(kLayout, 64);
  Scheduler scheduler(pool, SchedulerOptions{16, 2, 8});
  auto a = sequence(pool, 10), b = sequence(pool, 30), c = sequence(pool, 5);
  for (Sequence* s : {a.get(), b.get(), c.get()}) scheduler.add(s);

  StepPlan step = scheduler.schedule();
  CHECK(step.tokens == 16);
  CHECK(tokens_of(step, a.get()) == 10);
  CHECK(tokens_of(step, b.get()) == 6);   // the rest of the budget
  CHECK(tokens_of(step, c.get()) == 0);   // the sequence cap: 2 running
  CHECK(scheduler.running() == 2);
  CHECK(scheduler.waiting() == 1);
  run_step(scheduler, step);

  // a decodes (1 token, first); b continues with the rest of the budget.
  step = scheduler.schedule();
  CHECK(tokens_of(step, a.get()) == 1);
  CHECK(step.parts.front().sequence == a.get());
  CHECK(tokens_of(step, b.get()) == 15);
  CHECK(step.tokens == 16);
  run_step(scheduler, step);

  // a finishes: c is admitted into the freed place the next step.
  scheduler.remove(a.get());
  step = scheduler.schedule();
  CHECK(tokens_of(step, b.get()) == 9);   // its last 9 prompt tokens
  CHECK(tokens_of(step, c.get()) == 5);
  CHECK(scheduler.waiting() == 0);
}

TEST_CASE("no starvation: a long prompt never stops running streams, and advances every step") {
  KvBlockPool pool(kLayout, 256);
  Scheduler scheduler(pool, SchedulerOptions{8, 4, 8});
  std::vector<std::unique_ptr<Sequence>> streams;
  for (int i = 0; i < 3; ++i) {
    streams.push_back(sequence(pool, 4, 100 * i));
    scheduler.add(streams.back().get());
  }
  run_step(scheduler, scheduler.schedule());  // two of the 4-token prompts (the budget); the third waits a step
  auto long_prompt = sequence(pool, 200, 5000);
  scheduler.add(long_prompt.get());
  size_t steps = 0;
  while (long_prompt->cache.length() < 200 && steps < 200) {
    const StepPlan step = scheduler.schedule();
    for (const auto& s : streams) {
      if (s->cache.length() > 0 && s->pending() == 1) CHECK(tokens_of(step, s.get()) == 1);
    }
    CHECK(step.tokens <= 8);
    run_step(scheduler, step);
    ++steps;
  }
  CHECK(long_prompt->pending() == 1);  // prefilled, its first token sampled
  CHECK(steps < 60);                   // ~200 / (8 - 3) steps, not stalled
}

TEST_CASE("a full pool preempts the newest sequence; it is recomputed from the prefix cache when room returns") {
  // 4 blocks of 16: two sequences of 20 tokens take 2 blocks each; the first decode past
  // 32 positions needs a fifth.
  KvBlockPool pool(kLayout, 4);
  Scheduler scheduler(pool, SchedulerOptions{64, 4, 8});
  auto old_seq = sequence(pool, 30, 0), new_seq = sequence(pool, 20, 500);
  scheduler.add(old_seq.get());
  scheduler.add(new_seq.get());
  run_step(scheduler, scheduler.schedule());
  CHECK(scheduler.running() == 2);
  // Decode old_seq until it needs a third block (position 32).
  StepPlan step;
  while (step.preempted.empty()) {
    step = scheduler.schedule();
    run_step(scheduler, step);
    REQUIRE(old_seq->tokens.size() < 40);
  }
  CHECK(step.preempted == std::vector<Sequence*>{new_seq.get()});
  CHECK(scheduler.preemptions() == 1);
  CHECK(scheduler.waiting() == 1);
  CHECK(new_seq->cache.length() == 0);  // its blocks are gone...
  CHECK(old_seq->cache.length() >= 32);
  // ...its full block is still findable: when old_seq finishes, new_seq comes back with
  // its first block from the cache and recomputes only the rest.
  scheduler.remove(old_seq.get());
  const uint64_t hits = pool.prefix_hits();
  step = scheduler.schedule();
  CHECK(pool.prefix_hits() == hits + 1);
  CHECK(new_seq->cache.length() == kBlock);
  CHECK(tokens_of(step, new_seq.get()) == new_seq->tokens.size() - kBlock);
}

TEST_CASE("removing a sequence, running or waiting, frees its blocks") {
  KvBlockPool pool(kLayout, 8);
  Scheduler scheduler(pool, SchedulerOptions{64, 1, 8});
  auto running = sequence(pool, 40), waiting = sequence(pool, 10, 900);
  scheduler.add(running.get());
  scheduler.add(waiting.get());
  run_step(scheduler, scheduler.schedule());
  CHECK(pool.free_blocks() == 8 - 3);
  CHECK(scheduler.waiting() == 1);
  scheduler.remove(waiting.get());
  scheduler.remove(running.get());
  CHECK(scheduler.running() == 0);
  CHECK(scheduler.waiting() == 0);
  CHECK(pool.free_blocks() == 8);
  CHECK(pool.cached_blocks() == 2);  // its two full blocks stay findable
  CHECK(scheduler.schedule().parts.empty());
}

TEST_CASE("a prompt sharing full blocks with a finished one reuses them; the last token is always computed") {
  KvBlockPool pool(kLayout, 16);
  Scheduler scheduler(pool, SchedulerOptions{64, 4, 8});
  auto first = sequence(pool, 2 * kBlock);
  scheduler.add(first.get());
  run_step(scheduler, scheduler.schedule());
  scheduler.remove(first.get());
  // The same 32 tokens again: only one block is reused, so that the step computes the last token.
  auto same = sequence(pool, 2 * kBlock);
  scheduler.add(same.get());
  StepPlan step = scheduler.schedule();
  CHECK(same->cache.length() == kBlock);
  CHECK(tokens_of(step, same.get()) == kBlock);
  run_step(scheduler, step);
  // A longer prompt with the same start reuses both blocks.
  auto longer = sequence(pool, 2 * kBlock + 5);
  scheduler.add(longer.get());
  step = scheduler.schedule();
  CHECK(longer->cache.length() == 2 * kBlock);
  CHECK(tokens_of(step, longer.get()) == 5);
}

TEST_CASE("serving.prefix_cache off: the same prompt again is computed whole, and nothing is cached or counted") {
  KvBlockPool pool(kLayout, 16);
  Scheduler scheduler(pool, SchedulerOptions{64, 4, 8, /*prefix_cache=*/false});
  auto first = sequence(pool, 2 * kBlock + 3);
  scheduler.add(first.get());
  run_step(scheduler, scheduler.schedule());
  scheduler.remove(first.get());
  CHECK(pool.cached_blocks() == 0);
  auto same = sequence(pool, 2 * kBlock + 3);
  scheduler.add(same.get());
  const StepPlan step = scheduler.schedule();
  CHECK(same->cache.length() == 0);
  CHECK(tokens_of(step, same.get()) == 2 * kBlock + 3);
  CHECK(pool.prefix_hits() == 0);
  CHECK(pool.prefix_misses() == 0);
}

TEST_CASE("two equal prompts arriving together are computed once: the second waits for the first's blocks") {
  KvBlockPool pool(kLayout, 32);
  Scheduler scheduler(pool, SchedulerOptions{24, 4, 8});
  auto a = sequence(pool, 3 * kBlock + 4), b = sequence(pool, 3 * kBlock + 4);
  auto other = sequence(pool, 5, 7000);  // behind them in the queue
  for (Sequence* s : {a.get(), b.get(), other.get()}) scheduler.add(s);
  size_t b_computed = 0, steps = 0;
  while (b->tokens.size() == 3 * kBlock + 4 && steps < 20) {  // until b samples its first token
    const StepPlan step = scheduler.schedule();
    b_computed += tokens_of(step, b.get());
    if (a->cache.length() + tokens_of(step, a.get()) < a->tokens.size()) CHECK(tokens_of(step, b.get()) == 0);
    run_step(scheduler, step);
    ++steps;
  }
  CHECK(b->pending() == 1);
  CHECK(b_computed == 4);  // its 3 full blocks came from a; only the tail was computed
  CHECK(pool.prefix_hits() == 3);    // counted once, at b's admission, however long it waited
  CHECK(pool.prefix_misses() == 3);  // a's three blocks, which it computed
}

TEST_CASE("limits that cannot work are refused by name") {
  KvBlockPool pool(kLayout, 4);
  test::expect_error([&] { Scheduler(pool, SchedulerOptions{0, 1, 1}); }, ErrorCategory::kInvalidInput,
                     {"max_batch_tokens"});
  test::expect_error([&] { Scheduler(pool, SchedulerOptions{2, 4, 1}); }, ErrorCategory::kInvalidInput,
                     {"max_batch_tokens (2)", "max_num_seqs (4)"});
}
