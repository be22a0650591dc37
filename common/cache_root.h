// The per-user directory charm keeps derived files in (expert usage counts, expert
// manifests, the demo model), shared with scripts/moefy.py and scripts/serve.sh.
#pragma once

#include <filesystem>

namespace charm {

/// $CHARM_CACHE, else $XDG_CACHE_HOME/charm, else $HOME/.cache/charm; empty when none of
/// them is set (then nothing is cached). Not created here. Thread-safe (reads the
/// environment only).
std::filesystem::path cache_root();

}  // namespace charm
