#include "app/plan_model.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace charm {
namespace {

/// One worker's parts on one layer, seconds.
struct LayerParts {
  double memory_s = 0, disk_s = 0, network_s = 0;
  double experts = 0, contact = 0, round_trip_s = 0;
  double total() const { return memory_s + disk_s + network_s; }
};

void require_rate(double rate, const std::string& what) {
  if (!(rate > 0) || !std::isfinite(rate)) fail_invalid("charm plan: " + what + " must be > 0 (got " + std::to_string(rate) + ")");
}

LayerParts layer_parts(const WorkerPlanInput& w, const std::vector<PlanExpert>& experts, const PlanInput& in) {
  double mass = 0, in_ram = 0;
  for (const PlanExpert& e : experts) {
    if (!(e.mass >= 0 && e.mass <= 1)) {
      fail_invalid("charm plan: worker '" + w.name + "' expert " + std::to_string(e.expert) + " has routing mass " +
                   std::to_string(e.mass) + ", outside [0, 1]");
    }
    mass += e.mass;
    if (e.in_ram) in_ram += e.mass;
  }
  mass = std::min(mass, 1.0);  // rounding of many replicas' shares
  in_ram = std::min(in_ram, mass);
  LayerParts p;
  if (mass <= 0) return p;
  const double k = static_cast<double>(in.top_k);
  const double bytes = static_cast<double>(w.expert_bytes);
  p.experts = k * mass;
  p.contact = 1 - std::pow(1 - mass, k);
  p.memory_s = p.experts * bytes / (w.machine.memory_gb_per_s * 1e9);
  p.disk_s = k * (mass - in_ram) * bytes / (w.machine.disk_gb_per_s * 1e9);
  if (w.link) {
    const double per_contact = p.experts / p.contact;  // experts it gets when asked at all
    const double wire = in.wire.request_bytes + in.wire.reply_bytes +
                        per_contact * (in.wire.request_bytes_per_expert + in.wire.reply_bytes_per_expert);
    const double one_trip = w.link->rtt_ms / 1e3 + wire / (w.link->bandwidth_gb_per_s * 1e9);
    p.network_s = p.contact * one_trip;
    p.round_trip_s = one_trip + (p.memory_s + p.disk_s) / p.contact;
  }
  return p;
}

void check_input(const PlanInput& in) {
  if (in.top_k < 1) fail_invalid("charm plan: top_k (num_experts_per_tok) must be >= 1, got " + std::to_string(in.top_k));
  if (in.dense_bytes > 0) require_rate(in.coordinator.memory_gb_per_s, "the coordinator's memory bandwidth");
  for (const WorkerPlanInput& w : in.workers) {
    require_rate(w.machine.memory_gb_per_s, "worker '" + w.name + "': memory bandwidth");
    require_rate(w.machine.disk_gb_per_s, "worker '" + w.name + "': disk bandwidth");
    if (w.link) require_rate(w.link->bandwidth_gb_per_s, "worker '" + w.name + "': link bandwidth");
    if (w.link && !(w.link->rtt_ms >= 0)) fail_invalid("charm plan: worker '" + w.name + "': RTT must be >= 0");
  }
}

}  // namespace

double layer_hit_rate(const std::vector<PlanExpert>& experts) {
  double mass = 0, in_ram = 0;
  for (const PlanExpert& e : experts) {
    mass += e.mass;
    if (e.in_ram) in_ram += e.mass;
  }
  return mass > 0 ? in_ram / mass : 1.0;
}

void mark_resident(std::vector<PlanExpert>& experts, const std::vector<uint32_t>& pinned, size_t lru_slots) {
  std::vector<PlanExpert*> rest;
  for (PlanExpert& e : experts) {
    e.in_ram = std::find(pinned.begin(), pinned.end(), e.expert) != pinned.end();
    if (!e.in_ram) rest.push_back(&e);
  }
  std::sort(rest.begin(), rest.end(), [](const PlanExpert* a, const PlanExpert* b) {
    return a->mass != b->mass ? a->mass > b->mass : a->expert < b->expert;
  });
  for (size_t i = 0; i < rest.size() && i < lru_slots; ++i) rest[i]->in_ram = true;
}

std::string bottleneck_of(double compute_s, double memory_s, double disk_s, double network_s) {
  const std::pair<const char*, double> parts[] = {
      {"compute", compute_s}, {"memory", memory_s}, {"disk", disk_s}, {"network", network_s}};
  const auto* best = &parts[0];
  for (const auto& p : parts) {
    if (p.second > best->second) best = &p;
  }
  return best->first;
}

PlanResult predict(const PlanInput& in) {
  check_input(in);
  PlanResult r;
  r.compute_s = in.dense_bytes > 0 ? static_cast<double>(in.dense_bytes) / (in.coordinator.memory_gb_per_s * 1e9) : 0;
  std::map<uint32_t, std::vector<LayerParts>> by_layer;  // layer -> per worker (index order)
  double mass_total = 0, mass_in_ram = 0;
  for (size_t wi = 0; wi < in.workers.size(); ++wi) {
    const WorkerPlanInput& w = in.workers[wi];
    WorkerPlan plan;
    plan.name = w.name;
    double mass = 0, in_ram = 0, contacts = 0, trip_weighted = 0;
    for (const auto& [layer, experts] : w.layers) {
      const LayerParts p = layer_parts(w, experts, in);
      auto& row = by_layer[layer];
      row.resize(in.workers.size());
      row[wi] = p;
      plan.experts_per_token += p.experts;
      plan.memory_s += p.memory_s;
      plan.disk_s += p.disk_s;
      plan.network_s += p.network_s;
      contacts += p.contact;
      trip_weighted += p.contact * p.round_trip_s;
      for (const PlanExpert& e : experts) {
        mass += e.mass;
        if (e.in_ram) in_ram += e.mass;
      }
    }
    plan.hit_rate = mass > 0 ? in_ram / mass : 1.0;
    plan.contact_probability = w.layers.empty() ? 0 : contacts / static_cast<double>(w.layers.size());
    plan.layer_round_trip_s = contacts > 0 ? trip_weighted / contacts : 0;
    mass_total += mass;
    mass_in_ram += in_ram;
    r.workers.push_back(plan);
  }
  for (const auto& [layer, parts] : by_layer) {
    const auto slowest = std::max_element(parts.begin(), parts.end(),
                                          [](const LayerParts& a, const LayerParts& b) { return a.total() < b.total(); });
    r.memory_s += slowest->memory_s;
    r.disk_s += slowest->disk_s;
    r.network_s += slowest->network_s;
  }
  r.token_s = r.compute_s + r.memory_s + r.disk_s + r.network_s;
  r.tokens_per_s = r.token_s > 0 ? 1 / r.token_s : 0;
  r.hit_rate = mass_total > 0 ? mass_in_ram / mass_total : 1.0;
  r.bottleneck = bottleneck_of(r.compute_s, r.memory_s, r.disk_s, r.network_s);
  return r;
}

nlohmann::json prediction_json(const PlanResult& r) {
  nlohmann::json workers = nlohmann::json::array();
  for (const WorkerPlan& w : r.workers) {
    workers.push_back({{"name", w.name},
                       {"experts_per_token", w.experts_per_token},
                       {"hit_rate", w.hit_rate},
                       {"contact_probability", w.contact_probability},
                       {"memory_s", w.memory_s},
                       {"disk_s", w.disk_s},
                       {"network_s", w.network_s},
                       {"layer_round_trip_s", w.layer_round_trip_s}});
  }
  return {{"token_s", r.token_s},
          {"tokens_per_s", r.tokens_per_s},
          {"bottleneck", r.bottleneck},
          {"hit_rate", r.hit_rate},
          {"parts", {{"compute_s", r.compute_s}, {"memory_s", r.memory_s}, {"disk_s", r.disk_s}, {"network_s", r.network_s}}},
          {"workers", workers}};
}

}  // namespace charm
