// A topology YAML for one of the committed fixture models (tests/fixtures/models), with
// its experts split over worker processes on free loopback ports, or single-node.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/child_process.h"

namespace charm::test {

namespace fs = std::filesystem;

/// Writes a topology YAML for the fixture model (a fixture's name, or an absolute path) with the given expert split, one worker
/// per entry on a free loopback port. An empty split means single-node mode. `tiers`
/// (e.g. "ram_gb: 0.001, container: /x") goes into every worker entry, or into `store:`
/// in single-node mode; `serving` (e.g. "max_batch_tokens: 7") is the `serving:` section.
inline fs::path write_topology(const fs::path& dir, const std::string& model, const std::vector<std::string>& split,
                               std::vector<std::pair<std::string, uint16_t>>& workers, const std::string& tiers = "",
                               bool prefetch = false, const std::string& serving = "") {
  fs::create_directories(dir);
  const fs::path path = dir / ("topology-" + std::to_string(split.size()) + (prefetch ? "-prefetch" : "") + ".yaml");
  std::ofstream out(path);
  // A fixture's name, or an absolute path (e.g. a GGUF file the tests wrote).
  const fs::path model_path = fs::path(model).is_absolute() ? fs::path(model)
                                                             : fs::path(CHARM_SOURCE_DIR) / "tests/fixtures/models" / model;
  out << "model: " << model_path.string() << "\n";
  out << "prefetch: " << (prefetch ? "true" : "false") << "\n";
  out << "mode: " << (split.empty() ? "single-node" : "cluster") << "\n";
  if (split.empty() && !tiers.empty()) out << "store: {" << tiers << "}\n";
  if (!serving.empty()) out << "serving: {" << serving << "}\n";
  if (!split.empty()) out << "workers:\n";
  for (size_t i = 0; i < split.size(); ++i) {
    const uint16_t port = test::free_port();
    workers.emplace_back("w" + std::to_string(i), port);
    out << "  - {name: w" << i << ", host: 127.0.0.1, port: " << port << ", experts: " << split[i]
        << (tiers.empty() ? "" : ", " + tiers) << "}\n";
  }
  return path;
}

}  // namespace charm::test
