// Every JSON document charm reads (checkpoint and tokenizer files, safetensors headers,
// index, usage and container files, HTTP bodies, peers' replies) goes through here, so each
// has a size and a nesting-depth limit: nlohmann's parser itself is iterative, but the
// walks over a parsed value (dump(), copies, comparisons, the chat template's value
// conversion) recurse once per level, and a 40 KB body of '[' would overflow the stack.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/text_file.h"

namespace charm {

/// How large one JSON document may be: `max_bytes` of text and `max_depth` levels of
/// nested arrays and objects (a scalar is depth 0, `[]` depth 1, `[[1]]` depth 2).
struct JsonLimits {
  uint64_t max_bytes;
  int max_depth;
};

// The limits per kind of document, far above what real files need (the largest known
// tokenizer.json files are ~35 MB; a sharded index of a 1 T model ~10 MB; config files nest
// 3 levels, tool schemas in requests rarely 10).
inline constexpr uint64_t kMiB = uint64_t{1} << 20;
/// config.json, generation_config.json, tokenizer_config.json (chat templates included).
inline constexpr JsonLimits kConfigJsonLimits{64 * kMiB, 64};
/// tokenizer.json (vocabularies and merges).
inline constexpr JsonLimits kTokenizerJsonLimits{512 * kMiB, 64};
/// model.safetensors.index.json, expert container index.json, usage files, journals.
inline constexpr JsonLimits kIndexJsonLimits{512 * kMiB, 16};
/// A safetensors header: the format caps it at 100 MB; entries nest 3 levels.
inline constexpr JsonLimits kSafetensorsHeaderLimits{100'000'000, 8};
/// An HTTP request body (the server's payload limit applies first) and HTTP replies
/// charm reads from its own peers (`charm status`).
inline constexpr JsonLimits kHttpJsonLimits{64 * kMiB, 64};

/// The Error (kInvalidInput) parse_json throws when a document is over one of its limits
/// (bytes, depth) or holds a number a double cannot represent (1e400): input that is
/// well-formed JSON but that charm refuses. Callers that can name the field at fault (the
/// HTTP layer, through an observer) catch it apart from plain syntax errors.
class JsonLimitError : public Error {
 public:
  explicit JsonLimitError(const std::string& message) : Error(ErrorCategory::kInvalidInput, message) {}
};

/// A key that appears twice in one JSON object. RFC 8259 leaves that undefined, and
/// nlohmann (like Python's json) silently keeps the last: a file naming a tensor, a field
/// or a weight_map entry twice would load whichever came last, so parse_json refuses it.
struct DuplicateKey {
  /// Keys ("'a'") and array indices ("[1]") from the root to the object holding `key`;
  /// empty for the top-level object.
  std::vector<std::string> path;
  std::string key;

  /// "key 'k' appears twice at the top level" or "key 'k' appears twice in 'a'[2].'b'".
  std::string describe() const;
};

/// The Error (kInvalidInput) parse_json throws for a repeated key: "<source>: " +
/// duplicate().describe(). Readers that can say more (a safetensors header: "tensor 'w'
/// appears twice") catch it.
class JsonDuplicateKeyError : public Error {
 public:
  JsonDuplicateKeyError(const std::string& source, DuplicateKey duplicate)
      : Error(ErrorCategory::kInvalidInput, source + ": " + duplicate.describe()), duplicate_(std::move(duplicate)) {}
  const DuplicateKey& duplicate() const { return duplicate_; }

 private:
  DuplicateKey duplicate_;
};

/// Called for every parse event with the nesting depth nlohmann reports (the number of
/// enclosing containers), the event and the value parsed so far; see nlohmann's
/// parser_callback_t. Used by the HTTP layer to know which field an error is in.
template <class BasicJson>
using JsonObserver = std::function<void(int depth, typename BasicJson::parse_event_t event, const BasicJson& parsed)>;

/// Parses `text` as one JSON document. `source` names it in errors ("config.json", a path,
/// "request body"). Throws JsonLimitError "<source>: ..." for text over limits.max_bytes,
/// nesting deeper than limits.max_depth and numbers out of a double's range (each message
/// names the limit), JsonDuplicateKeyError for a key repeated within one object (at any
/// depth), and Error(kInvalidInput) for invalid JSON (nlohmann's message, which names the
/// byte). `observer`, when given, sees every parse event before the depth check
/// (so it knows where a too-deep container starts); exceptions it throws propagate
/// unchanged.
nlohmann::json parse_json(std::string_view text, const std::string& source, const JsonLimits& limits,
                          const JsonObserver<nlohmann::json>& observer = {});
/// parse_json keeping object keys in document order.
nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& source,
                                          const JsonLimits& limits,
                                          const JsonObserver<nlohmann::ordered_json>& observer = {});

/// read_text_file + parse_json; errors name the path.
nlohmann::json read_json_file(const std::filesystem::path& path, const JsonLimits& limits, const std::string& what);
/// read_text_file + parse_ordered_json; errors name the path.
nlohmann::ordered_json read_ordered_json_file(const std::filesystem::path& path, const JsonLimits& limits,
                                              const std::string& what);

}  // namespace charm
