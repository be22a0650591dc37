#include "worker/experts/expert_cache.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/error.h"

namespace charm {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t ns_since(Clock::time_point start) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
}

}  // namespace

// --- ExpertLease ------------------------------------------------------------------------

ExpertLease::ExpertLease(ExpertCache* cache, uint32_t layer, size_t slot, uint32_t expert, ExpertView view)
    : cache_(cache), layer_(layer), slot_(slot), expert_(expert), view_(view) {}

ExpertLease::ExpertLease(ExpertLease&& other) noexcept
    : cache_(other.cache_), layer_(other.layer_), slot_(other.slot_), expert_(other.expert_), view_(other.view_) {
  other.cache_ = nullptr;
}

ExpertLease::~ExpertLease() {
  if (cache_) cache_->release(layer_, slot_);
}

// --- ExpertCache ------------------------------------------------------------------------

ExpertCache::ExpertCache(const ExpertSource& source, std::map<uint32_t, LayerPlan> plan, int io_threads,
                         EvictionPolicy eviction, const std::string& progress_label)
    : source_(source), eviction_(eviction) {
  for (const auto& [layer, p] : plan) {
    for (uint32_t e : p.owned) {
      const ExpertLayout* layout = source.layout({layer, e});
      if (!layout) {
        fail_invalid(source.describe() + ": holds no layer " + std::to_string(layer) + " expert " + std::to_string(e) +
                     ", which this worker owns");
      }
      slot_bytes_ = std::max(slot_bytes_, align_up(layout->bytes, kRecordAlignment));
    }
  }
  for (const auto& [layer, p] : plan) {
    auto l = std::make_unique<Layer>();
    l->slots.resize(p.pinned.size() + p.lru_slots);
    for (Slot& s : l->slots) s.buffer = AlignedBuffer(slot_bytes_);
    for (size_t i = 0; i < p.pinned.size(); ++i) l->slots[i].pinned = true;
    layers_.emplace(layer, std::move(l));
  }
  pool_ = std::make_unique<IoPool>(io_threads);
  if (!progress_label.empty()) {
    uint64_t pinned_bytes = 0;
    for (const auto& [layer, p] : plan) {
      for (uint32_t e : p.pinned) pinned_bytes += source.layout({layer, e})->bytes;
    }
    startup_progress_ = std::make_unique<LoadProgress>(progress_label, pinned_bytes);
  }
  // Pinned experts: read in parallel, wait for all; they stay for the worker's lifetime.
  for (const auto& [layer, p] : plan) {
    Layer& l = *layers_.at(layer);
    std::unique_lock<std::mutex> lock(l.mutex);
    for (size_t i = 0; i < p.pinned.size(); ++i) start_read(layer, l, i, p.pinned[i], false);
  }
  for (const auto& [layer, p] : plan) {
    Layer& l = *layers_.at(layer);
    std::unique_lock<std::mutex> lock(l.mutex);
    l.cv.wait(lock, [&] {
      return std::none_of(l.slots.begin(), l.slots.end(), [](const Slot& s) { return s.state == State::kLoading; });
    });
    for (const Slot& s : l.slots) {
      if (s.pinned && s.state != State::kReady) fail_io(s.error);  // a failed read leaves it empty
    }
    l.stats = TierCounters{};  // start-up reads are not request traffic
  }
  if (startup_progress_) startup_progress_->finish();  // later (LRU) reads only count
}

ExpertCache::~ExpertCache() { pool_.reset(); }

ExpertCache::Layer& ExpertCache::layer(uint32_t id) {
  const auto it = layers_.find(id);
  if (it == layers_.end()) fail_internal("expert cache: no plan for layer " + std::to_string(id));
  return *it->second;
}

long ExpertCache::free_slot(Layer& l) const {
  long best = -1;
  double best_score = 0;
  for (size_t i = 0; i < l.slots.size(); ++i) {
    const Slot& s = l.slots[i];
    if (s.pinned || s.refs > 0 || s.state == State::kLoading) continue;
    if (s.state != State::kReady) return static_cast<long>(i);  // empty or failed: free now
    const double score = eviction_ == EvictionPolicy::kLrfu ? lrfu_score(l, s.expert) : 0.0;
    if (best >= 0) {
      const Slot& b = l.slots[static_cast<size_t>(best)];
      // Lower score first, then older use; LRFU then takes the higher id (the replay's
      // order), LRU the first slot.
      const bool worse = score != best_score     ? score > best_score
                         : s.last_use != b.last_use ? s.last_use > b.last_use
                                                    : eviction_ == EvictionPolicy::kLru || s.expert < b.expert;
      if (worse) continue;
    }
    best = static_cast<long>(i);
    best_score = score;
  }
  return best;
}

void ExpertCache::record_use(Layer& l, const std::vector<uint32_t>& experts) {
  ++l.calls;
  for (uint32_t e : experts) {
    const double score = lrfu_score(l, e) + 1.0;
    l.uses[e] = {score, l.calls};
  }
}

double ExpertCache::lrfu_score(const Layer& l, uint32_t expert) {
  const auto it = l.uses.find(expert);
  if (it == l.uses.end()) return 0.0;
  const double age = static_cast<double>(l.calls - it->second.call);
  return it->second.score * std::exp2(-age / kLrfuHalfLifeCalls);
}

void ExpertCache::start_read(uint32_t layer_id, Layer& l, size_t slot, uint32_t expert, bool prefetch) {
  Slot& s = l.slots[slot];
  if (s.state == State::kReady) l.where.erase(s.expert);  // evict
  s.state = State::kLoading;
  s.expert = expert;
  s.layout = source_.layout({layer_id, expert});
  s.prefetched = prefetch;
  s.error.clear();
  l.where[expert] = slot;
  pool_->submit([this, layer_id, &l, slot, expert] {
    const auto start = Clock::now();
    uint64_t bytes = 0;
    std::string error;
    try {
      bytes = source_.read({layer_id, expert}, l.slots[slot].buffer.data());
    } catch (const Error& e) {
      error = e.message();  // re-raised as Error(kIo) by whoever waits for it: no second category prefix
    } catch (const std::exception& e) {
      error = e.what();
    }
    const uint64_t ns = ns_since(start);
    if (startup_progress_) startup_progress_->add(bytes);
    std::lock_guard<std::mutex> lock(l.mutex);
    Slot& done = l.slots[slot];
    done.read_bytes = bytes;
    done.read_ns = ns;
    l.stats.bytes_read += bytes;
    l.stats.disk_ns += ns;
    if (error.empty()) {
      done.state = State::kReady;
    } else {
      done.state = done.refs > 0 ? State::kFailed : State::kEmpty;
      done.error = error;
      l.where.erase(expert);
    }
    l.cv.notify_all();
  });
}

void ExpertCache::release(uint32_t layer_id, size_t slot) {
  Layer& l = layer(layer_id);
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    unref(l, slot);
  }
  l.cv.notify_all();
}

ExpertView ExpertCache::view_of(const Slot& s) const { return s.layout->view(s.buffer.data()); }

void ExpertCache::unref(Layer& l, size_t slot) {
  Slot& s = l.slots[slot];
  s.last_use = ++l.clock;
  if (--s.refs == 0 && s.state == State::kFailed) s.state = State::kEmpty;
}

void ExpertCache::hold_hit(Layer& l, size_t slot, TierCounters& request) {
  Slot& s = l.slots[slot];
  ++s.refs;
  ++request.hits;
  ++l.stats.hits;
  if (s.prefetched) {
    ++request.prefetch_hits;
    ++l.stats.prefetch_hits;
    s.prefetched = false;
  }
}

std::unique_ptr<ExpertFetch> ExpertCache::fetch(uint32_t layer_id, const std::vector<uint32_t>& experts) {
  return std::unique_ptr<ExpertFetch>(new ExpertFetch(*this, layer_id, experts));
}

size_t ExpertCache::prefetch(uint32_t layer_id, const std::vector<uint32_t>& experts) {
  const auto it = layers_.find(layer_id);
  if (it == layers_.end()) return 0;
  Layer& l = *it->second;
  std::lock_guard<std::mutex> lock(l.mutex);
  size_t started = 0;
  for (uint32_t e : experts) {
    if (l.where.count(e) || !source_.layout({layer_id, e})) continue;
    const long slot = free_slot(l);
    if (slot < 0) break;
    start_read(layer_id, l, static_cast<size_t>(slot), e, true);
    ++l.stats.prefetch_issued;
    ++started;
  }
  return started;
}

std::map<uint32_t, TierCounters> ExpertCache::stats() const {
  std::map<uint32_t, TierCounters> out;
  for (const auto& [id, l] : layers_) {
    std::lock_guard<std::mutex> lock(l->mutex);
    out[id] = l->stats;
  }
  return out;
}

std::map<uint32_t, LayerResidency> ExpertCache::residency() const {
  std::map<uint32_t, LayerResidency> out;
  for (const auto& [id, l] : layers_) {
    LayerResidency& r = out[id];
    std::lock_guard<std::mutex> lock(l->mutex);
    for (const Slot& s : l->slots) {
      if (s.state == State::kReady) (s.pinned ? r.pinned : r.cached).push_back(s.expert);
    }
    std::sort(r.pinned.begin(), r.pinned.end());
    std::sort(r.cached.begin(), r.cached.end());
  }
  return out;
}

size_t ExpertCache::slot_count() const {
  size_t n = 0;
  for (const auto& [id, l] : layers_) n += l->slots.size();
  return n;
}

std::vector<uint32_t> ExpertCache::resident(uint32_t layer_id) const {
  std::vector<uint32_t> out;
  const auto it = layers_.find(layer_id);
  if (it == layers_.end()) return out;
  std::lock_guard<std::mutex> lock(it->second->mutex);
  for (const Slot& s : it->second->slots) {
    if (s.state == State::kReady) out.push_back(s.expert);
  }
  return out;
}

// --- ExpertFetch ------------------------------------------------------------------------

ExpertFetch::ExpertFetch(ExpertCache& cache, uint32_t layer_id, const std::vector<uint32_t>& experts)
    : cache_(cache), layer_(layer_id) {
  ExpertCache::Layer& l = cache.layer(layer_id);
  std::lock_guard<std::mutex> lock(l.mutex);
  ExpertCache::record_use(l, experts);
  for (uint32_t e : experts) {
    const auto it = l.where.find(e);
    if (it == l.where.end()) {
      to_load_.push_back(e);
      continue;
    }
    // Resident or on its way: hold it so it is not evicted under us.
    ExpertCache::hold_hit(l, it->second, stats_);
    waiting_.push_back({it->second, false});
  }
  std::reverse(to_load_.begin(), to_load_.end());  // popped from the back: request order
}

ExpertFetch::~ExpertFetch() {
  // An abandoned fetch (an exception in the caller) gives back what it holds; a read
  // still in flight keeps its slot in kLoading, which nobody evicts, so no wait is needed.
  ExpertCache::Layer& l = cache_.layer(layer_);
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    for (const Waiting& w : waiting_) ExpertCache::unref(l, w.slot);
  }
  l.cv.notify_all();
}

std::vector<ExpertLease> ExpertFetch::next() {
  ExpertCache::Layer& l = cache_.layer(layer_);
  std::unique_lock<std::mutex> lock(l.mutex);
  for (;;) {
    // Give free slots to missing experts; another request may have started one meanwhile.
    while (!to_load_.empty()) {
      const uint32_t e = to_load_.back();
      if (const auto it = l.where.find(e); it != l.where.end()) {
        ExpertCache::hold_hit(l, it->second, stats_);
        waiting_.push_back({it->second, false});
        to_load_.pop_back();
        continue;
      }
      const long slot = cache_.free_slot(l);
      if (slot < 0) break;
      cache_.start_read(layer_, l, static_cast<size_t>(slot), e, false);
      ++l.slots[static_cast<size_t>(slot)].refs;
      waiting_.push_back({static_cast<size_t>(slot), true});
      to_load_.pop_back();
      ++stats_.misses;
      ++l.stats.misses;
    }
    for (const Waiting& w : waiting_) {
      // Thrown before any lease exists here: a lease's destructor takes this lock.
      if (l.slots[w.slot].state == ExpertCache::State::kFailed) fail_io(l.slots[w.slot].error);
    }
    std::vector<ExpertLease> ready;
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      ExpertCache::Slot& s = l.slots[it->slot];
      if (s.state != ExpertCache::State::kReady) {
        ++it;
        continue;
      }
      if (it->own_read) {
        stats_.bytes_read += s.read_bytes;
        stats_.disk_ns += s.read_ns;
      }
      ready.push_back(ExpertLease(&cache_, layer_, it->slot, s.expert, cache_.view_of(s)));
      it = waiting_.erase(it);
    }
    if (!ready.empty() || (waiting_.empty() && to_load_.empty())) {
      lock.unlock();  // before `ready` could ever be destroyed here
      return ready;
    }
    const auto start = Clock::now();
    l.cv.wait(lock);
    const uint64_t waited = ns_since(start);
    stats_.io_wait_ns += waited;
    l.stats.io_wait_ns += waited;
  }
}

}  // namespace charm
