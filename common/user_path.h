// Paths the user gives charm (a YAML value such as `model:` or `store.container`, a
// command-line argument such as --config or --out) and how charm resolved them, so that
// every error about one prints the path as opened and, where the user wrote a relative
// path, what it was resolved against: a relative YAML path against the YAML file's
// folder, a command-line path against the current directory.
#pragma once

#include <concepts>
#include <filesystem>
#include <string>

#include "common/error.h"

namespace charm {

/// A resolved path that remembers what the user wrote. It IS the path charm opens
/// (absolute and lexically normal when it came from resolve()), so it goes wherever a
/// std::filesystem::path goes; describe() is the one way messages print it.
/// Thread-safety: a value type; const methods may be called concurrently.
class UserPath : public std::filesystem::path {
 public:
  UserPath() = default;
  /// A path charm made itself, or one whose origin does not need explaining: describe()
  /// prints it as it is.
  template <typename Source>
    requires std::constructible_from<std::filesystem::path, const Source&>
  UserPath(const Source& path) : std::filesystem::path(path) {}  // NOLINT: implicit on purpose

  /// `given` when it is absolute, else `base` / `given`; `base` itself is made absolute
  /// against the current directory first. Lexically normal ("a/../b" -> "b"). An empty
  /// `given` stays empty.
  static UserPath resolve(const std::string& given, const std::filesystem::path& base);
  /// A command-line path: `given` resolved against the current directory.
  static UserPath from_command_line(const std::string& given);

  /// What the user wrote ("" when this path was not resolved from user text).
  const std::string& given() const { return given_; }
  /// The folder a relative `given` was resolved against; empty when `given` was absolute.
  const std::filesystem::path& base() const { return base_; }

  /// "PATH" or, for a path the user wrote relative, "PATH (resolved from 'GIVEN' against
  /// BASE)". Every error message about a user path prints it this way.
  std::string describe() const;

 private:
  std::string given_;
  std::filesystem::path base_;
};

/// Rethrows `error` (same category) with, when `path` was written relative, " (in PATH,
/// resolved from 'GIVEN' against BASE)" appended, for errors about files inside a
/// user-given directory or file whose own message prints only the resolved path.
/// Rethrows it unchanged otherwise.
[[noreturn]] void rethrow_in(const Error& error, const UserPath& path);

}  // namespace charm
