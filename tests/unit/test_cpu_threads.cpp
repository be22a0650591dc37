// common/cpu_threads.h: the physical-core count and the OpenMP team size charm picks.
#include <doctest/doctest.h>
#include <omp.h>

#include <cstdlib>
#include <string>

#include "common/cpu_threads.h"
#include "common/error.h"

using namespace charm;

TEST_CASE("physical_core_count is at least 1 and at most the CPUs this process may use") {
  const int cores = physical_core_count();
  CHECK(cores >= 1);
  CHECK(cores <= omp_get_num_procs());
}

TEST_CASE("configure_threads: an explicit request wins, then OMP_NUM_THREADS, then the core count") {
  const int saved = omp_get_max_threads();
  const char* env = std::getenv("OMP_NUM_THREADS");
  const std::string env_value = env ? env : "";
  unsetenv("OMP_NUM_THREADS");
  CHECK(configure_threads(3) == 3);
  CHECK(omp_get_max_threads() == 3);
  CHECK(configure_threads(std::nullopt) == physical_core_count());
  CHECK_THROWS_AS(configure_threads(0), Error);

  setenv("OMP_NUM_THREADS", "1", 1);
  omp_set_num_threads(2);  // what libgomp would hold; the default must leave it
  CHECK(configure_threads(std::nullopt) == 2);
  CHECK(configure_threads(5) == 5);

  if (env) {
    setenv("OMP_NUM_THREADS", env_value.c_str(), 1);
  } else {
    unsetenv("OMP_NUM_THREADS");
  }
  omp_set_num_threads(saved);
}
