// How many OpenMP threads charm computes with. The kernels are bound by memory
// bandwidth and by the vector units of a core, and SMT siblings share both, so the
// default is one thread per physical core this process may run on.
#pragma once

#include <optional>

namespace charm {

/// The most compute threads charm accepts (--threads, the topology's `threads`): far above
/// any core count it targets, far below what exhausts memory for thread stacks.
constexpr int kMaxThreads = 1024;

/// Physical cores among the CPUs this process may run on (sched_getaffinity): distinct
/// (physical_package_id, core_id) pairs under /sys/devices/system/cpu/cpu*/topology.
/// Falls back to omp_get_num_procs() where that topology cannot be read. At least 1.
int physical_core_count();

/// Sets the OpenMP team size: `requested` when given (charm's own --threads or the
/// topology's `threads`: an explicit choice wins); otherwise OMP_NUM_THREADS when it is
/// set (libgomp has already applied it), else physical_core_count(). Returns the team
/// size in use (omp_get_max_threads()). Throws Error(kInvalidInput) when requested is
/// outside [1, kMaxThreads].
int configure_threads(std::optional<int> requested);

}  // namespace charm
