// The health side of ClusterDispatcher (coordinator/dispatch/cluster_dispatch.h): one thread per
// worker that probes it when a layer reply is late, sends its heartbeats, declares it
// frozen when a probe goes unanswered, and rejoins it (docs/architecture.md, "Silent
// workers"). The engine side is coordinator/dispatch/cluster_dispatch.cpp.
#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "coordinator/dispatch/cluster_dispatch.h"
#include "coordinator/dispatch/cluster_worker.h"

namespace charm {

using std::chrono::milliseconds;
using cluster_detail::Clock;
using cluster_detail::from_ticks;
using cluster_detail::ms_since;
using cluster_detail::ms_until;

milliseconds learned_deadline(const RttWindow& rtt, milliseconds floor, milliseconds cap) {
  constexpr size_t kMinSamples = 8;
  constexpr double kFactor = 4;  // p99 is the tail already; 4x it is not a busy moment
  if (rtt.size() < kMinSamples) return floor;
  const milliseconds learned(static_cast<int64_t>(std::ceil(kFactor * rtt.percentile(0.99))));
  return std::clamp(learned, floor, std::max(floor, cap));
}

size_t rtt_size_class(uint32_t rows) {
  if (rows <= 1) return 0;
  return std::min<size_t>(static_cast<size_t>(std::bit_width(rows)) - 1, kRttSizeClasses - 1);
}

void ClusterDispatcher::health_loop(Worker& worker) {
  std::unique_lock<std::mutex> lock(health_mutex_);
  while (!stopping_) {
    lock.unlock();
    // Short looks: the worker's own deadlines (a probe due, next_retry, last_seen +
    // heartbeat) shorten the wait; the tick is under the hedge floor, so a probe is sent
    // on time after the engine starts waiting.
    milliseconds wait = health_tick_;
    health_step(worker, wait);
    lock.lock();
    health_wake_.wait_for(lock, wait, [this] { return stopping_.load(); });
  }
}

bool ClusterDispatcher::is_down(const Worker& worker) const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return worker.state == WorkerState::kDown;
}

void ClusterDispatcher::health_step(Worker& worker, milliseconds& wait) {
  WorkerState state;
  Clock::time_point next_retry;
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    state = worker.state;
    next_retry = worker.next_retry;
  }
  if (state == WorkerState::kDown) {
    if (worker.unanswered && answered_late(worker)) next_retry = Clock::now();
    if (Clock::now() >= next_retry) rejoin(worker);
    return;
  }
  if (probe_due(worker, wait)) {
    probe(worker, true);
  } else if (heartbeat_due(worker)) {
    probe(worker, false);
  }
}

bool ClusterDispatcher::answered_late(Worker& worker) {
  // The probe that found the worker frozen is still outstanding on its connection: its
  // answer (after SIGCONT, the link back) is the first sign of life, ahead of any back-off.
  if (!worker.probe || wait_readable({worker.probe.get()}, milliseconds(0)).empty()) return false;
  worker.unanswered = false;
  try {
    decode_as<HealthReplyMsg>(worker.probe->receive(handshake_timeout_));
    spdlog::info("coordinator: {} answered its probe after {} ms; rejoining", worker.label,
                 ms_since(worker.probe_sent));
    return true;
  } catch (const Error&) {
    worker.probe.reset();  // closed (a restarted worker): the back-off rejoin finds it
    return false;
  }
}

void ClusterDispatcher::rejoin(Worker& worker) {
  try {
    connect(worker);  // the full handshake again: a restarted worker may serve another model
  } catch (const Error& e) {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    worker.backoff = std::min(worker.backoff * 2, rejoin_max_);
    worker.next_retry = Clock::now() + worker.backoff;
    if (e.message() != worker.rejoin_error) {
      spdlog::info("coordinator: {} has not rejoined: {} (next try in {} ms)", worker.label, e.message(),
                   worker.backoff.count());
    }
    worker.rejoin_error = e.message();
    worker.last_error = worker.down_reason.empty() ? e.message() : worker.down_reason + "; rejoin: " + e.message();
  }
}

milliseconds ClusterDispatcher::hedge_deadline(const Worker& worker, uint32_t rows) const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return learned_deadline(worker.rtt_by_size[rtt_size_class(rows)], hedge_floor_, hedge_cap_);
}

milliseconds ClusterDispatcher::probe_deadline(const Worker& worker) const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return learned_deadline(worker.probe_rtt, probe_floor_, probe_cap_);
}

std::optional<Clock::time_point> ClusterDispatcher::probe_time(const Worker& worker) const {
  // The engine waits on the worker since `since`; a probe answered after that restarts the
  // countdown (busy, not frozen: probe again one deadline later).
  const int64_t since = worker.waiting_since.load();
  if (since == 0) return std::nullopt;
  Clock::time_point start = from_ticks(since);
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    if (worker.last_probe_ok && *worker.last_probe_ok > start) start = *worker.last_probe_ok;
  }
  // The floor first: under it no deadline is due, and the percentile is not worked out.
  if (Clock::now() < start + hedge_floor_) return start + hedge_floor_;
  return start + hedge_deadline(worker, worker.waiting_rows.load());
}

bool ClusterDispatcher::probe_due(Worker& worker, milliseconds& wait) {
  const std::optional<Clock::time_point> at = probe_time(worker);
  if (!at) return false;
  if (Clock::now() >= *at) return true;
  wait = std::min(wait, std::max(ms_until(*at), milliseconds(1)));
  return false;
}

bool ClusterDispatcher::heartbeat_due(const Worker& worker) const {
  if (heartbeat_interval_.count() == 0) return false;
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return !worker.last_seen || Clock::now() - *worker.last_seen >= heartbeat_interval_;
}

void ClusterDispatcher::probe(Worker& worker, bool late_reply) {
  const char* what = late_reply ? "probe" : "heartbeat";
  if (!worker.probe) {
    mark_down(worker, nullptr, std::string(what) + ": no probe connection");
    return;
  }
  const milliseconds deadline = probe_deadline(worker);
  const auto sent = Clock::now();
  if (late_reply) {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    if (worker.state == WorkerState::kUp) worker.state = WorkerState::kSuspect;
  }
  try {
    const uint64_t out = worker.probe->send(encode_health_request(), deadline);
    {
      std::lock_guard<std::mutex> lock(stats_mutex_);
      worker.bytes_out += out;
    }
    if (!await_answer(worker, late_reply, sent, deadline)) return;
    const FrameBody body = worker.probe->receive(deadline);
    HealthReplyMsg health = decode_as<HealthReplyMsg>(body);
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(stats_mutex_);
    worker.probe_rtt.add(std::chrono::duration<double, std::milli>(now - sent).count());
    worker.last_seen = worker.last_probe_ok = now;
    worker.ram_slots = health.slots;
    worker.tier_layers = std::move(health.tier_layers);
    worker.residency = std::move(health.residency);
    worker.bytes_in += body.bytes + 4;
    if (worker.state == WorkerState::kSuspect) worker.state = WorkerState::kUp;  // busy, not frozen
  } catch (const Error& e) {
    worker.probe.reset();
    mark_down(worker, nullptr, std::string(what) + ": " + e.message());
  }
}

bool ClusterDispatcher::await_answer(Worker& worker, bool late_reply, Clock::time_point sent, milliseconds deadline) {
  // A probe for a late reply must be answered within the learned deadline. A heartbeat to
  // an idle worker gets heartbeat_ms, as long as no layer waits on the worker: once one
  // does, the heartbeat stands for the probe that layer's lateness would send.
  for (;;) {
    auto until = sent + (late_reply ? deadline : std::max(deadline, heartbeat_interval_));
    if (const std::optional<Clock::time_point> at = probe_time(worker); !late_reply && at) {
      until = std::min(until, std::max(sent, *at) + deadline);
    }
    const milliseconds left = ms_until(until);
    if (!wait_readable({worker.probe.get()}, std::min(left, health_tick_)).empty()) return true;
    if (Clock::now() >= until) break;
    if (stopping_) return false;
    if (is_down(worker)) {
      // Its data connection failed meanwhile (the engine marked it down): that is the
      // verdict. The probe stays outstanding, to say when the worker is back.
      worker.unanswered = true;
      worker.probe_sent = sent;
      return false;
    }
  }
  // Frozen: its probe connection is silent too. Kept open with the probe outstanding: the
  // late answer says it is back (answered_late).
  worker.unanswered = true;
  worker.probe_sent = sent;
  const int64_t since = worker.waiting_since.load();
  std::string why = std::string("no answer to a ") + (late_reply ? "health probe" : "heartbeat") + " within " +
                    std::to_string(ms_since(sent)) + " ms";
  if (since != 0) why += ", a layer reply awaited for " + std::to_string(ms_since(from_ticks(since))) + " ms";
  mark_down(worker, nullptr, "frozen: " + why);
  return false;
}

}  // namespace charm
