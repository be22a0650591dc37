// SIGINT/SIGTERM handling shared by `charm serve` and `charm worker`: the signals are
// blocked in every thread and taken synchronously by one sigwait, so no random thread
// is interrupted and shutdown runs in a known place.
#pragma once

#include <csignal>

namespace charm {

/// Blocks SIGINT and SIGTERM in the calling thread and every thread it starts afterwards.
/// Returns the set for wait_for_stop_signal. Call before starting threads.
sigset_t block_stop_signals();

/// Waits until SIGINT or SIGTERM arrives; returns its number.
int wait_for_stop_signal(const sigset_t& set);

}  // namespace charm
