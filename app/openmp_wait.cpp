#include "app/openmp_wait.h"

#include <exception>
#include <optional>

#include <yaml-cpp/yaml.h>

#include "common/text_file.h"
#include "common/topology.h"
#include "common/user_path.h"

namespace charm {
namespace {

/// The value of --config (as "--config FILE" or "--config=FILE"), if given.
std::optional<std::string> config_of(const std::vector<std::string>& args) {
  const std::string flag = "--config";
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag && i + 1 < args.size()) return args[i + 1];
    if (args[i].rfind(flag + "=", 0) == 0) return args[i].substr(flag.size() + 1);
  }
  return std::nullopt;
}

/// True when the YAML at `path` says `mode: single-node`. Reads that key only: no
/// validation, no secret or key file (the command's own Topology::load does those after
/// the exec, when its warnings go to stderr; here they would reach `charm run`'s stdout).
bool says_single_node(const std::string& path) {
  const YAML::Node root =
      YAML::Load(read_text_file(UserPath::from_command_line(path), Topology::kMaxFileBytes, "a topology file"));
  return root.IsMap() && root["mode"] && root["mode"].IsScalar() && root["mode"].Scalar() == "single-node";
}

}  // namespace

OpenmpWait openmp_wait_for(const std::vector<std::string>& args) {
  if (args.empty()) return OpenmpWait::kPassive;
  if (args[0] == "bench") return OpenmpWait::kSpinThenSleep;
  if (args[0] != "run" && args[0] != "serve") return OpenmpWait::kPassive;
  const std::optional<std::string> config = config_of(args);
  if (!config) return OpenmpWait::kPassive;
  try {
    return says_single_node(*config) ? OpenmpWait::kSpinThenSleep : OpenmpWait::kPassive;
  } catch (const std::exception&) {
    return OpenmpWait::kPassive;  // the command's own parse reports what is wrong
  }
}

std::vector<std::pair<std::string, std::string>> openmp_wait_env(OpenmpWait wait) {
  std::vector<std::pair<std::string, std::string>> env = {{"OMP_WAIT_POLICY", "passive"}};
  if (wait == OpenmpWait::kSpinThenSleep) env.emplace_back("GOMP_SPINCOUNT", std::to_string(kSpinCount));
  return env;
}

}  // namespace charm
