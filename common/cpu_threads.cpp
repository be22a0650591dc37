#include "common/cpu_threads.h"

#include <omp.h>
#include <sched.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <utility>

#include "common/error.h"

namespace charm {
namespace {

/// The integer in a one-line sysfs file; nullopt when it cannot be read.
std::optional<long> read_sysfs_int(const std::string& path) {
  std::ifstream in(path);
  long value = 0;
  if (!(in >> value)) return std::nullopt;
  return value;
}

}  // namespace

int physical_core_count() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return omp_get_num_procs();
  std::set<std::pair<long, long>> cores;  // (physical_package_id, core_id)
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    const std::optional<long> package = read_sysfs_int(dir + "physical_package_id");
    const std::optional<long> core = read_sysfs_int(dir + "core_id");
    if (!package || !core) return omp_get_num_procs();  // no topology (some containers)
    cores.emplace(*package, *core);
  }
  return cores.empty() ? omp_get_num_procs() : static_cast<int>(cores.size());
}

int configure_threads(std::optional<int> requested) {
  if (requested && (*requested < 1 || *requested > kMaxThreads)) {
    fail_invalid("threads must be between 1 and " + std::to_string(kMaxThreads) + ", got " + std::to_string(*requested));
  }
  if (requested) {
    omp_set_num_threads(*requested);
  } else if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    omp_set_num_threads(physical_core_count());
  }
  return omp_get_max_threads();
}

}  // namespace charm
