// Duplicate keys in JSON text. RFC 8259 leaves them undefined and nlohmann-json (like
// Python's json) keeps the last one silently, so a file naming one tensor, one field or
// one weight_map entry twice would load whichever came last. charm's readers of
// checkpoint files (safetensors headers, config.json, generation_config.json, the shard
// index) refuse such files instead; this finds the first repeated key.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace charm {

/// Levels of nesting find_duplicate_key checks; deeper content is skipped (the readers'
/// JSON depth limit refuses such documents first).
constexpr size_t kMaxDuplicateKeyDepth = 1000;

/// A key that appears twice in one JSON object.
struct DuplicateKey {
  /// Keys and "[i]" array indices from the root to the object holding `key`; empty for
  /// the top-level object.
  std::vector<std::string> path;
  std::string key;

  /// "key 'k' appears twice at the top level" or "key 'k' appears twice in 'a'.'b'[2]".
  std::string describe() const;
};

/// Scans `text` (one JSON value) for the first key repeated within one object, at any
/// depth up to kMaxDuplicateKeyDepth; nullopt when there is none or the text is not valid
/// JSON (the caller's parse reports that). One SAX pass (nlohmann::json::sax_parse): no
/// DOM is built; memory is the open objects' keys. Thread-safe.
std::optional<DuplicateKey> find_duplicate_key(std::string_view text);

}  // namespace charm
