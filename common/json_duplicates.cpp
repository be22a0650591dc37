// find_duplicate_key: a SAX handler keeping, per open object, the set of keys seen so far.
#include "common/json_duplicates.h"

#include <set>

#include <nlohmann/json.hpp>

namespace charm {
namespace {

using nlohmann::json;

/// Records the path to the current value and stops at the first repeated key.
class DuplicateFinder : public nlohmann::json_sax<json> {
 public:
  std::optional<DuplicateKey> found;

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override { return open(true); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    if (depth_ > frames_.size()) return true;  // too deep to track
    Frame& f = frames_.back();
    if (!f.keys.insert(k).second) {
      found = DuplicateKey{path(), k};
      return false;  // stops the parse
    }
    f.last_key = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  struct Frame {
    bool object = false;
    std::set<std::string> keys;  ///< objects: keys seen
    std::string last_key;        ///< objects: the key whose value is being read
    size_t index = 0;            ///< arrays: the element being read
    std::string name;            ///< how the parent names this value
  };
  std::vector<Frame> frames_;
  size_t depth_ = 0;  ///< open containers, tracked or not

  /// The parent's name for the value that starts now, and for arrays the next index.
  std::string child_name() {
    if (frames_.empty() || depth_ > frames_.size()) return "";
    Frame& f = frames_.back();
    if (f.object) return "'" + f.last_key + "'";
    return "[" + std::to_string(f.index++) + "]";
  }
  bool value() {
    child_name();  // advances an array's index
    return true;
  }
  bool open(bool object) {
    std::string name = child_name();
    ++depth_;
    if (depth_ <= kMaxDuplicateKeyDepth) frames_.push_back(Frame{object, {}, {}, 0, std::move(name)});
    return true;
  }
  bool close() {
    if (depth_ == frames_.size() && !frames_.empty()) frames_.pop_back();
    --depth_;
    return true;
  }
  std::vector<std::string> path() const {
    std::vector<std::string> out;
    for (size_t i = 1; i < frames_.size(); ++i) out.push_back(frames_[i].name);
    return out;
  }
};

}  // namespace

std::string DuplicateKey::describe() const {
  std::string where;
  for (const auto& part : path) where += (where.empty() || part[0] == '[' ? "" : ".") + part;
  return "key '" + key + "' appears twice " + (path.empty() ? std::string("at the top level") : "in " + where);
}

std::optional<DuplicateKey> find_duplicate_key(std::string_view text) {
  DuplicateFinder finder;
  json::sax_parse(text.begin(), text.end(), &finder);
  return finder.found;
}

}  // namespace charm
