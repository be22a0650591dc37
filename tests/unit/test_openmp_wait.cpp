// app/openmp_wait.h: which OpenMP wait each command line gets.
#include "app/openmp_wait.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"

using charm::OpenmpWait;
using charm::openmp_wait_env;
using charm::openmp_wait_for;
using charm::test::TempDir;

TEST_CASE("a process that computes alone spins before it sleeps; workers and cluster coordinators sleep at once") {
  const std::string configs = std::string(CHARM_SOURCE_DIR) + "/configs/";
  const std::string single = configs + "single-node.yaml", cluster = configs + "local-cluster.yaml";
  CHECK(openmp_wait_for({"run", "--config", single, "hello"}) == OpenmpWait::kSpinThenSleep);
  CHECK(openmp_wait_for({"serve", "--config=" + single}) == OpenmpWait::kSpinThenSleep);
  CHECK(openmp_wait_for({"bench", "kernels"}) == OpenmpWait::kSpinThenSleep);
  CHECK(openmp_wait_for({"run", "--config", cluster, "hello"}) == OpenmpWait::kPassive);
  CHECK(openmp_wait_for({"serve", "--config=" + cluster}) == OpenmpWait::kPassive);
  CHECK(openmp_wait_for({"worker", "--config", cluster, "--name", "w0"}) == OpenmpWait::kPassive);
  CHECK(openmp_wait_for({"status", "--config", single}) == OpenmpWait::kPassive);
  CHECK(openmp_wait_for({}) == OpenmpWait::kPassive);
}

TEST_CASE("a command line whose topology does not load gets the passive wait (its parse reports the error)") {
  TempDir dir("omp");
  charm::testing::write_bytes(dir / "bad.yaml", "model: [unclosed\n");
  CHECK(openmp_wait_for({"run", "--config", (dir / "bad.yaml").string(), "hi"}) == OpenmpWait::kPassive);
  CHECK(openmp_wait_for({"run", "--config", (dir / "missing.yaml").string(), "hi"}) == OpenmpWait::kPassive);
  CHECK(openmp_wait_for({"serve", "--config"}) == OpenmpWait::kPassive);  // the flag without its value
  charm::testing::write_bytes(dir / "odd-mode.yaml", "mode: [single-node]\n");
  CHECK(openmp_wait_for({"run", "--config", (dir / "odd-mode.yaml").string(), "hi"}) == OpenmpWait::kPassive);
  CHECK(openmp_wait_for({"serve"}) == OpenmpWait::kPassive);
}

TEST_CASE("only the mode key is read: a topology its load would refuse still picks the wait by its mode") {
  TempDir dir("omp");
  charm::testing::write_bytes(dir / "t.yaml", "mode: single-node\nbogus_key: 1\n");  // no model, an unknown key
  CHECK(openmp_wait_for({"run", "--config", (dir / "t.yaml").string(), "hi"}) == OpenmpWait::kSpinThenSleep);
}

TEST_CASE("the environment: passive policy, plus libgomp's spin count for the spinning wait") {
  using Env = std::vector<std::pair<std::string, std::string>>;
  CHECK(openmp_wait_env(OpenmpWait::kPassive) == Env{{"OMP_WAIT_POLICY", "passive"}});
  CHECK(openmp_wait_env(OpenmpWait::kSpinThenSleep) ==
        Env{{"OMP_WAIT_POLICY", "passive"}, {"GOMP_SPINCOUNT", std::to_string(charm::kSpinCount)}});
}
