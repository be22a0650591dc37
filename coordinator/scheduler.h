// Iteration-level scheduling (Orca, Yu et al. OSDI 2022; vLLM's scheduler): before each
// engine step, which sequences run and how many of their tokens, within a token budget
// and a sequence cap, with the KV blocks they need. Running sequences decode one token
// each, oldest first; then unfinished prompts continue in chunks; then waiting prompts
// are admitted first come, first served while the budget, the cap and the KV pool allow;
// one whose next uncached prompt block another running prompt is computing waits for it
// (so concurrent equal prefixes are computed once and shared).
// When a running sequence needs a block the pool cannot give, the newest running one is
// preempted: its full blocks go to the prefix cache, the rest are freed, and it waits at
// the head of the queue to be recomputed (bit-identical: its KV depends on its tokens
// only). Pure bookkeeping: no model, no threads; the engine loop calls it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "coordinator/models/kv_cache.h"

namespace charm {

/// The scheduler's limits.
struct SchedulerOptions {
  size_t max_batch_tokens = 256;  ///< tokens per step, decode and prompt chunks together
  size_t max_num_seqs = 32;       ///< sequences running at once
  size_t max_waiting = 128;       ///< requests queued beyond those; more are refused (429)
  bool prefix_cache = true;       ///< reuse earlier prompts' full KV blocks (serving.prefix_cache)
};

/// One generation as the scheduler sees it. `tokens` is the prompt followed by every
/// token sampled so far; the cache holds the KV of a prefix of them, and the next step
/// computes the rest (the whole prompt, or the one token sampled last).
struct Sequence {
  explicit Sequence(KvBlockPool& pool) : cache(pool) {}
  virtual ~Sequence() = default;
  std::vector<int32_t> tokens;
  KvCache cache;
  /// Full blocks already offered to the prefix cache, and the key of the last one.
  size_t published_blocks = 0;
  uint64_t last_block_key = 0;
  /// Tokens not in the cache yet.
  size_t pending() const { return tokens.size() - cache.length(); }
};

/// What one step runs: n tokens of each part's sequence, starting at its cache length.
struct StepPlan {
  struct Part {
    Sequence* sequence = nullptr;
    size_t n = 0;
  };
  std::vector<Part> parts;
  std::vector<Sequence*> preempted;  ///< sent back to the queue by this step's planning
  size_t tokens = 0;                 ///< sum of the parts' n
};

class Scheduler {
 public:
  /// Throws Error(kInvalidInput) when a limit is 0 or max_batch_tokens < max_num_seqs
  /// (every running sequence must be able to decode in one step).
  Scheduler(KvBlockPool& pool, const SchedulerOptions& options);

  /// Queues `sequence` (not owned; must stay valid until remove()) at the back.
  void add(Sequence* sequence);
  /// Forgets a finished or cancelled sequence, running or waiting: its full blocks go to
  /// the prefix cache (unless !keep_prefix: a step that failed left its KV unwritten),
  /// every block is released.
  void remove(Sequence* sequence, bool keep_prefix = true);

  /// Plans the next step (see the file comment). Reserves every part's KV blocks. Empty
  /// when nothing is running or admissible.
  StepPlan schedule();
  /// After a step ran: offers the parts' newly full blocks to the prefix cache.
  void step_done(const StepPlan& plan);

  size_t running() const { return running_.size(); }
  size_t waiting() const { return waiting_.size(); }
  uint64_t preemptions() const { return preemptions_; }
  const SchedulerOptions& options() const { return options_; }
  /// False when serving.prefix_cache is off, and for a model with per-sequence state
  /// (KvLayout::state_floats: linear attention), whose state after a prefix is not in the
  /// blocks: every sequence computes its prompt.
  bool prefix_cache_enabled() const { return options_.prefix_cache && pool_.layout().state_floats == 0; }

 private:
  /// One planning pass into `plan` (empty parts): decodes, prompt chunks, admissions.
  void plan_step(StepPlan& plan);
  /// Gives `part` the blocks for its tokens, preempting the newest running sequences as
  /// needed; false when the part's own sequence was preempted.
  bool reserve_decode(Sequence* sequence, StepPlan& plan);
  /// Sends the newest running sequence back to the head of the queue.
  void preempt_newest(StepPlan& plan);
  /// Attaches the prefix cache's blocks for the leading full blocks of a waiting sequence's
  /// tokens (never its last token: the step must compute at least one to get logits).
  void attach_cached_prefix(Sequence* sequence);
  /// Admits waiting sequences into `plan` while the budget, the cap and the pool allow.
  void admit(StepPlan& plan, size_t& budget);
  /// Whether a running prompt is computing the first block `s` did not find in the prefix
  /// cache: `s` then waits for it to be published rather than compute it again (the n
  /// choices of one request, a system prompt many clients send at once).
  bool waits_for_shared_prefix(const Sequence& s) const;
  /// Lets go of the cached blocks a sequence that stays queued had attached.
  void release_unadmitted(Sequence* s);
  /// Offers the sequence's full blocks not yet published to the prefix cache.
  void publish_full_blocks(Sequence* sequence);

  KvBlockPool& pool_;
  SchedulerOptions options_;
  std::vector<Sequence*> running_;  // in admission order, oldest first
  std::deque<Sequence*> waiting_;
  uint64_t preemptions_ = 0;
};

}  // namespace charm
