// Internal to coordinator/dispatch/cluster_dispatch.cpp and coordinator/dispatch/cluster_health.cpp: the
// coordinator's record of one worker (its connections, state and statistics) and clock
// helpers. Not part of any public interface.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/topology.h"
#include "common/wire.h"
#include "coordinator/dispatch/cluster_dispatch.h"

namespace charm {

namespace cluster_detail {

using Clock = std::chrono::steady_clock;

inline int64_t ticks(Clock::time_point t) { return t.time_since_epoch().count(); }
inline Clock::time_point from_ticks(int64_t t) { return Clock::time_point(Clock::duration(t)); }

// Whole milliseconds from now until `t`, rounded up (0 if past): a wait that ends before
// its deadline would only wake to wait again.
inline std::chrono::milliseconds ms_until(Clock::time_point t) {
  const auto left = t - Clock::now();
  if (left <= Clock::duration::zero()) return std::chrono::milliseconds(0);
  return std::chrono::ceil<std::chrono::milliseconds>(left);
}

inline long long ms_since(Clock::time_point t) {
  return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

}  // namespace cluster_detail

struct ClusterDispatcher::Worker {
  using Clock = cluster_detail::Clock;

  WorkerSpec spec;
  int index = 0;
  std::string address;  // host:port
  std::string label;    // "worker 'w1' (127.0.0.1:5001)" for messages
  // The data connection (layer requests, hints): sent on and read by the engine thread
  // only, which holds a copy of the pointer while it uses it. Installed by connect() and
  // aborted and dropped by mark_down(), under stats_mutex_.
  std::shared_ptr<FrameConnection> conn;
  // Since when the engine waits on this worker (a send in progress or a reply outstanding),
  // steady-clock ticks, 0 when it does not; `waiting_rows` the rows of the request waited
  // for (0: a hint). Written by the engine thread, read by the health thread: the start of
  // the learned deadline after which it probes the worker.
  std::atomic<int64_t> waiting_since{0};
  std::atomic<uint32_t> waiting_rows{0};
  // The probe connection, this worker's health thread's own (connect() installs it, on that
  // thread or before it starts). `unanswered`: its last probe went unanswered (the worker
  // was found frozen), so a late answer on it says the worker is back.
  std::unique_ptr<FrameConnection> probe;
  bool unanswered = false;
  Clock::time_point probe_sent;
  bool reached = false;  // the last open() got as far as a TCP connection
  std::thread health_thread;
  // State and statistics, guarded by stats_mutex_.
  FrameConnection* opening = nullptr;  // open() is in its handshake: the destructor aborts it
  WorkerState state = WorkerState::kDown;
  bool ever_up = false;
  uint64_t experts_held = 0;
  uint64_t requests = 0;
  uint64_t bytes_out = 0;
  uint64_t bytes_in = 0;
  uint64_t layer_bytes_out = 0;  // of bytes_out: layer request frames only
  uint64_t layer_bytes_in = 0;   // of bytes_in: layer reply frames only
  uint64_t failovers = 0;
  uint64_t rejoins = 0;
  std::optional<Clock::time_point> last_seen;      // last handshake, reply or probe answer
  Clock::time_point last_reply_at;  // the last layer reply's arrival (engine thread only)
  std::optional<Clock::time_point> last_probe_ok;  // last probe answer (the worker lives)
  std::optional<uint64_t> ram_slots;  // HealthReply.slots of its last probe since connecting
  std::map<uint32_t, TierCounters> tier_layers;     // HealthReply.tierLayers, likewise
  std::map<uint32_t, LayerResidency> residency;     // HealthReply.residency, likewise
  Clock::time_point next_retry;
  std::chrono::milliseconds backoff{0};
  std::string down_reason;   // why it last went down
  std::string rejoin_error;  // why its last rejoin failed ("": it has not failed since)
  std::string last_error;    // down_reason, and rejoin_error after it (WorkerStatus::last_error)
  RttWindow rtt;  // every layer round trip (status, slow_workers)
  std::vector<RttWindow> rtt_by_size = std::vector<RttWindow>(kRttSizeClasses, RttWindow(128));
  RttWindow probe_rtt{128};  // health round trips on the probe connection
};

}  // namespace charm
