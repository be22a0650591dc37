#include "coordinator/scheduler.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace charm {
namespace {

constexpr size_t kBlock = KvBlockPool::kBlockSize;

size_t blocks_for(size_t positions) { return (positions + kBlock - 1) / kBlock; }

std::span<const int32_t> block_tokens(const Sequence& s, size_t block) {
  return std::span<const int32_t>(s.tokens).subspan(block * kBlock, kBlock);
}

}  // namespace

Scheduler::Scheduler(KvBlockPool& pool, const SchedulerOptions& options) : pool_(pool), options_(options) {
  if (options.max_batch_tokens == 0 || options.max_num_seqs == 0) {
    fail_invalid("max_batch_tokens and max_num_seqs must be at least 1");
  }
  if (options.max_batch_tokens < options.max_num_seqs) {
    fail_invalid("max_batch_tokens (" + std::to_string(options.max_batch_tokens) + ") must be at least max_num_seqs (" +
                 std::to_string(options.max_num_seqs) + "): every running sequence decodes one token per step");
  }
}

void Scheduler::add(Sequence* sequence) { waiting_.push_back(sequence); }

void Scheduler::remove(Sequence* sequence, bool keep_prefix) {
  if (auto it = std::find(running_.begin(), running_.end(), sequence); it != running_.end()) running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), sequence); it != waiting_.end()) waiting_.erase(it);
  if (keep_prefix) publish_full_blocks(sequence);
  sequence->cache.clear();
  sequence->published_blocks = 0;
  sequence->last_block_key = 0;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  plan_step(plan);
  // Prompts that each hold blocks and cannot get more would wait on one another forever:
  // the newest gives its blocks up until someone can run (one sequence alone always fits).
  while (plan.parts.empty() && running_.size() > 1) {
    preempt_newest(plan);
    plan_step(plan);
  }
  for (const StepPlan::Part& part : plan.parts) plan.tokens += part.n;
  return plan;
}

void Scheduler::plan_step(StepPlan& plan) {
  size_t budget = options_.max_batch_tokens;
  // Decodes first, oldest first: a running stream advances every step.
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence* s = running_[i];
    if (s->pending() != 1 || !reserve_decode(s, plan)) continue;
    plan.parts.push_back({s, 1});
    --budget;
  }
  // Prompts already running continue in chunks; they take what blocks are free and
  // never preempt anyone.
  for (Sequence* s : running_) {
    if (s->pending() <= 1 || budget == 0) continue;
    s->cache.reserve(s->cache.length() + std::min(s->pending(), budget));
    const size_t n = std::min({s->pending(), budget, s->cache.capacity() - s->cache.length()});
    if (n == 0) continue;
    plan.parts.push_back({s, n});
    budget -= n;
  }
  // A step that had to preempt is short of blocks: admit no one into it.
  if (plan.preempted.empty()) admit(plan, budget);
}

void Scheduler::step_done(const StepPlan& plan) {
  for (const StepPlan::Part& part : plan.parts) publish_full_blocks(part.sequence);
}

bool Scheduler::reserve_decode(Sequence* sequence, StepPlan& plan) {
  while (!sequence->cache.reserve(sequence->cache.length() + 1)) {
    const bool self = running_.back() == sequence;
    preempt_newest(plan);
    if (self) return false;
  }
  return true;
}

void Scheduler::preempt_newest(StepPlan& plan) {
  Sequence* victim = running_.back();
  running_.pop_back();
  std::erase_if(plan.parts, [&](const StepPlan::Part& p) { return p.sequence == victim; });
  remove(victim, /*keep_prefix=*/true);  // recomputing it will find its full blocks, if still cached
  waiting_.push_front(victim);
  plan.preempted.push_back(victim);
  ++preemptions_;
}

void Scheduler::attach_cached_prefix(Sequence* s) {
  if (!prefix_cache_enabled()) return;
  const size_t reusable = (s->tokens.size() - 1) / kBlock;
  // A sequence that waited holds the blocks it found before: go on from there.
  for (size_t b = s->published_blocks; b < reusable; ++b) {
    const uint64_t key = prefix_block_key(s->last_block_key, block_tokens(*s, b));
    std::optional<uint32_t> block = pool_.find_cached(key, block_tokens(*s, b));
    if (!block) return;
    s->cache.append_cached(*block);
    s->published_blocks = b + 1;
    s->last_block_key = key;
  }
}

void Scheduler::admit(StepPlan& plan, size_t& budget) {
  while (!waiting_.empty() && running_.size() < options_.max_num_seqs && budget > 0) {
    Sequence* s = waiting_.front();  // its cache holds only blocks found in the prefix cache
    attach_cached_prefix(s);
    if (waits_for_shared_prefix(*s)) return;  // keeps what it found: the blocks it waits for join them
    // Admitted only when the whole rest of its prompt and its first sampled token fit:
    // a prompt half prefilled would hold blocks that running streams need.
    const size_t need = blocks_for(s->tokens.size() + 1) - s->cache.blocks().size();
    if (need > pool_.free_blocks()) {
      release_unadmitted(s);
      return;
    }
    const size_t n = std::min(s->pending(), budget);
    s->cache.reserve(s->cache.length() + n);
    const size_t reusable = (s->tokens.size() - 1) / kBlock;
    if (prefix_cache_enabled()) pool_.record_prefix_lookup(s->published_blocks, reusable - s->published_blocks);
    waiting_.pop_front();
    running_.push_back(s);
    plan.parts.push_back({s, n});
    budget -= n;
  }
}

bool Scheduler::waits_for_shared_prefix(const Sequence& s) const {
  if (!prefix_cache_enabled()) return false;
  const size_t b = s.published_blocks;  // its first block the cache did not have
  if ((b + 1) * kBlock > s.tokens.size() - 1) return false;
  const uint64_t key = prefix_block_key(s.last_block_key, block_tokens(s, b));
  for (const Sequence* r : running_) {
    const size_t rb = r->published_blocks;  // the next block r will publish
    if (r->pending() <= 1 || (rb + 1) * kBlock > r->tokens.size()) continue;
    if (prefix_block_key(r->last_block_key, block_tokens(*r, rb)) == key) return true;
  }
  return false;
}

void Scheduler::release_unadmitted(Sequence* s) {
  s->cache.clear();  // do not hold cached blocks while waiting
  s->published_blocks = 0;
  s->last_block_key = 0;
}

void Scheduler::publish_full_blocks(Sequence* s) {
  if (!prefix_cache_enabled()) return;
  const size_t full = s->cache.length() / kBlock;
  for (size_t b = s->published_blocks; b < full; ++b) {
    const uint64_t key = prefix_block_key(s->last_block_key, block_tokens(*s, b));
    pool_.publish(s->cache.blocks()[b], key, block_tokens(*s, b));
    s->last_block_key = key;
    s->published_blocks = b + 1;
  }
}

}  // namespace charm
