// Stop-string handling for streamed text: finds a stop string as soon as it completes and
// withholds any tail that could still become one, so streamed and non-streamed answers
// are identical and never contain a stop string.
#pragma once

#include <string>
#include <vector>

namespace charm {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  /// Appends `piece` to the text. Returns the text that is now safe to emit. Sets
  /// stopped() when a stop string completed (the text is cut before it).
  std::string push(const std::string& piece);
  /// Everything withheld so far (call once at the end, when no stop string can complete).
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // text not yet emitted
  bool stopped_ = false;
};

}  // namespace charm
