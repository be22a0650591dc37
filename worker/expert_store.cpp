#include "worker/expert_store.h"

namespace charm {

ExpertStore::ExpertStore(const Checkpoint& checkpoint, const ExpertTensorNames& names,
                         const std::vector<ExpertKey>& owned, int64_t hidden_size, int64_t intermediate_size)
    : hidden_size_(hidden_size), intermediate_size_(intermediate_size) {
  for (const auto& [layer, expert] : owned) {
    experts_.emplace(ExpertKey{layer, expert},
                     checkpoint.load_expert(names, static_cast<int>(layer), static_cast<int>(expert), hidden_size,
                                            intermediate_size));
  }
}

const ExpertWeights* ExpertStore::find(uint32_t layer, uint32_t expert) const {
  auto it = experts_.find(ExpertKey{layer, expert});
  return it == experts_.end() ? nullptr : &it->second;
}

std::map<uint32_t, std::vector<uint32_t>> ExpertStore::held() const {
  std::map<uint32_t, std::vector<uint32_t>> out;
  for (const auto& [key, weights] : experts_) out[key.first].push_back(key.second);
  return out;
}

}  // namespace charm
