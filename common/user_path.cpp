#include "common/user_path.h"

#include <system_error>

namespace charm {

UserPath UserPath::resolve(const std::string& given, const std::filesystem::path& base) {
  if (given.empty()) return UserPath();
  const std::filesystem::path p(given);
  UserPath out;
  out.given_ = given;
  if (p.is_absolute()) {
    out.assign(p.lexically_normal());
    return out;
  }
  std::error_code ec;
  std::filesystem::path folder = base.empty() ? std::filesystem::current_path(ec) : std::filesystem::absolute(base, ec);
  if (ec) folder = base;  // no current directory (deleted): keep it relative, still described
  out.base_ = folder.lexically_normal();
  out.assign((out.base_ / p).lexically_normal());
  return out;
}

UserPath UserPath::from_command_line(const std::string& given) { return resolve(given, {}); }

namespace {

/// "resolved from 'GIVEN' against BASE" (BASE without a trailing slash).
std::string origin(const UserPath& path) {
  std::string folder = path.base().string();
  if (folder.size() > 1 && folder.back() == '/') folder.pop_back();
  return "resolved from '" + path.given() + "' against " + folder;
}

}  // namespace

std::string UserPath::describe() const {
  if (base_.empty()) return string();
  return string() + " (" + origin(*this) + ")";
}

void rethrow_in(const Error& error, const UserPath& path) {
  if (path.base().empty()) throw error;
  throw Error(error.category(), error.message() + " (in " + path.string() + ", " + origin(path) + ")");
}

}  // namespace charm
