// The routed experts one worker holds. Issue 2: every owned expert is read from the
// checkpoint (pread, on demand, never mapping the rest) into RAM at start, in f32.
// The tier hierarchy (budgets, LRU, pins, disk streaming) replaces this later.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "common/checkpoint.h"

namespace charm {

/// (layer, expert) ids.
using ExpertKey = std::pair<uint32_t, uint32_t>;

/// Owned routed-expert weights. Immutable after construction; thread-safe reads.
class ExpertStore {
 public:
  /// Loads `owned` experts from `checkpoint`. Shapes: gate/up [intermediate, hidden],
  /// down [hidden, intermediate]. Throws what Checkpoint::load_expert throws.
  ExpertStore(const Checkpoint& checkpoint, const ExpertTensorNames& names,
              const std::vector<ExpertKey>& owned, int64_t hidden_size, int64_t intermediate_size);

  /// The expert's weights, or nullptr when this store does not hold it.
  const ExpertWeights* find(uint32_t layer, uint32_t expert) const;
  size_t size() const { return experts_.size(); }
  int64_t hidden_size() const { return hidden_size_; }
  int64_t intermediate_size() const { return intermediate_size_; }
  /// Held experts per layer (for status and the handshake).
  std::map<uint32_t, std::vector<uint32_t>> held() const;

 private:
  int64_t hidden_size_;
  int64_t intermediate_size_;
  std::map<ExpertKey, ExpertWeights> experts_;
};

}  // namespace charm
