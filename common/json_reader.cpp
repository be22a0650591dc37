#include "common/json_reader.h"

#include "common/error.h"

namespace charm {
namespace {

template <class BasicJson>
BasicJson parse_limited(std::string_view text, const std::string& source, const JsonLimits& limits,
                        const JsonObserver<BasicJson>& observer) {
  if (text.size() > limits.max_bytes) {
    throw JsonLimitError(source + ": " + std::to_string(text.size()) + " bytes of JSON is over the limit of " +
                 std::to_string(limits.max_bytes) + " bytes");
  }
  using Event = typename BasicJson::parse_event_t;
  // nlohmann's depth is the number of enclosing containers, so a container starting at
  // depth d is nested d + 1 levels deep.
  // The throw stops the parse at the first container too deep, before anything recurses.
  auto callback = [&](int depth, Event event, BasicJson& parsed) {
    if (observer) observer(depth, event, parsed);
    if ((event == Event::object_start || event == Event::array_start) && depth + 1 > limits.max_depth) {
      throw JsonLimitError(source + ": JSON nested deeper than the limit of " + std::to_string(limits.max_depth) +
                           " levels of arrays and objects");
    }
    return true;
  };
  try {
    return BasicJson::parse(text.begin(), text.end(), callback);
  } catch (const nlohmann::json::out_of_range& e) {
    // nlohmann raises out_of_range 406 for a number that overflows a double (1e400).
    throw JsonLimitError(source + ": a number is out of range: " + e.what());
  } catch (const nlohmann::json::exception& e) {
    fail_invalid(source + ": not valid JSON: " + e.what());
  }
}

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& source, const JsonLimits& limits,
                          const JsonObserver<nlohmann::json>& observer) {
  return parse_limited<nlohmann::json>(text, source, limits, observer);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& source,
                                          const JsonLimits& limits,
                                          const JsonObserver<nlohmann::ordered_json>& observer) {
  return parse_limited<nlohmann::ordered_json>(text, source, limits, observer);
}

nlohmann::json read_json_file(const std::filesystem::path& path, const JsonLimits& limits, const std::string& what) {
  return parse_json(read_text_file(path, limits.max_bytes, what), path.string(), limits);
}

nlohmann::ordered_json read_ordered_json_file(const std::filesystem::path& path, const JsonLimits& limits,
                                              const std::string& what) {
  return parse_ordered_json(read_text_file(path, limits.max_bytes, what), path.string(), limits);
}

}  // namespace charm
