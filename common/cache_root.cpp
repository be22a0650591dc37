#include "common/cache_root.h"

#include <cstdlib>

namespace charm {

std::filesystem::path cache_root() {
  if (const char* charm = std::getenv("CHARM_CACHE"); charm && *charm) return charm;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::filesystem::path(xdg) / "charm";
  if (const char* home = std::getenv("HOME"); home && *home) return std::filesystem::path(home) / ".cache" / "charm";
  return {};
}

}  // namespace charm
