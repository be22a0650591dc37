// libFuzzer target: bytes as a topology YAML file, through Topology::parse and, when it
// loads, Topology::placement over a small model (3 MoE layers of 8 experts). Only
// charm::Error may escape. Secret files and variables a fuzzed file names are read as a
// real load would read them (none exist in the fuzzing environment).
#include <cstdint>
#include <string>

#include "common/error.h"
#include "common/topology.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const charm::Topology topology = charm::Topology::parse(text, "/nonexistent/fuzz/topology.yaml");
    topology.placement({0, 2, 3}, 8);
  } catch (const charm::Error&) {
  }
  return 0;
}
