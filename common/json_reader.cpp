#include "common/json_reader.h"

#include <unordered_set>

#include "common/error.h"

namespace charm {
namespace {

// Where the parse is, for naming a repeated key: per open container its name in the
// parent and, for objects, the keys seen so far.
class KeyTracker {
 public:
  template <class Event, class BasicJson>
  void on(Event event, const BasicJson& parsed, const std::string& source) {
    switch (event) {
      case Event::object_start: open(true); break;
      case Event::array_start: open(false); break;
      case Event::key: key(parsed.template get<std::string>(), source); break;
      case Event::object_end:
      case Event::array_end: frames_.pop_back(); break;
      case Event::value: child_name(); break;  // advances an array's index
    }
  }

 private:
  struct Frame {
    bool object = false;
    std::unordered_set<std::string> keys;  // objects: keys seen
    std::string last_key;                  // objects: the key whose value is being read
    size_t index = 0;                      // arrays: the element being read
    std::string name;                      // how the parent names this container
  };

  std::string child_name() {
    if (frames_.empty()) return "";
    Frame& f = frames_.back();
    // Appends, not "[" + std::to_string(...): GCC 12 warns (-Wrestrict) falsely on that.
    std::string name(f.object ? "'" : "[");
    name += f.object ? f.last_key : std::to_string(f.index++);
    name += f.object ? "'" : "]";
    return name;
  }
  void open(bool object) {
    std::string name = child_name();
    frames_.push_back(Frame{object, {}, {}, 0, std::move(name)});
  }
  void key(std::string k, const std::string& source) {
    Frame& f = frames_.back();
    if (!f.keys.insert(k).second) {
      DuplicateKey dup;
      for (size_t i = 1; i < frames_.size(); ++i) dup.path.push_back(frames_[i].name);
      dup.key = std::move(k);
      throw JsonDuplicateKeyError(source, std::move(dup));
    }
    f.last_key = std::move(k);
  }

  std::vector<Frame> frames_;
};

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
  KeyTracker keys;
  auto callback = [&](int depth, Event event, BasicJson& parsed) {
    if (observer) observer(depth, event, parsed);
    if ((event == Event::object_start || event == Event::array_start) && depth + 1 > limits.max_depth) {
      throw JsonLimitError(source + ": JSON nested deeper than the limit of " + std::to_string(limits.max_depth) +
                           " levels of arrays and objects");
    }
    keys.on(event, parsed, source);
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

std::string DuplicateKey::describe() const {
  std::string where;
  for (const auto& part : path) where += (where.empty() || part[0] == '[' ? "" : ".") + part;
  return "key '" + key + "' appears twice " + (path.empty() ? std::string("at the top level") : "in " + where);
}

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
