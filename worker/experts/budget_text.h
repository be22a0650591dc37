// How the tiers' budget messages print a byte count: as GiB with up to six significant
// digits ("0.25", "1.5e-05"), the unit of ram_gb and vram_gb.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace charm {

/// `bytes` / 2^30, "%.6g".
inline std::string gib_text(uint64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%.6g", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

}  // namespace charm
