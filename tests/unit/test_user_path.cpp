// common/user_path.h (issue 12, item 11): a user's path is resolved once, absolute and
// normal, and every message prints it with what a relative one was resolved against.
#include <doctest/doctest.h>

#include <filesystem>

#include "common/error.h"
#include "common/user_path.h"
#include "tests/support/expect_error.h"

using namespace charm;
namespace fs = std::filesystem;

TEST_CASE("resolve: relative against the base folder (made absolute), absolute as written, both normal") {
  const UserPath rel = UserPath::resolve("../models/q", "/srv/charm/configs");
  CHECK(rel == fs::path("/srv/charm/models/q"));
  CHECK(rel.given() == "../models/q");
  CHECK(rel.base() == fs::path("/srv/charm/configs"));
  CHECK(rel.describe() == "/srv/charm/models/q (resolved from '../models/q' against /srv/charm/configs)");

  const UserPath abs = UserPath::resolve("/data//models/./q", "/srv/charm/configs");
  CHECK(abs == fs::path("/data/models/q"));
  CHECK(abs.base().empty());
  CHECK(abs.describe() == "/data/models/q");

  CHECK(UserPath::resolve("", "/srv").empty());
  CHECK(UserPath(fs::path("made/by/charm")).describe() == "made/by/charm");  // not user text: as is
}

TEST_CASE("from_command_line resolves against the current directory; a relative base is made absolute") {
  const fs::path cwd = fs::current_path();
  const UserPath p = UserPath::from_command_line("out/logits.f32");
  CHECK(p == (cwd / "out/logits.f32").lexically_normal());
  CHECK(p.describe() == p.string() + " (resolved from 'out/logits.f32' against " + cwd.string() + ")");
  const UserPath q = UserPath::resolve("m", "configs");  // a YAML given as configs/x.yaml
  CHECK(q == (cwd / "configs/m").lexically_normal());
  CHECK(q.base() == (cwd / "configs").lexically_normal());
}

TEST_CASE("rethrow_in appends a relative path's origin to an error about a file inside it") {
  const UserPath rel = UserPath::resolve("models/q", "/srv");
  const Error relative = test::expect_error(
      [&] { rethrow_in(Error(ErrorCategory::kIo, "/srv/models/q/config.json: missing"), rel); }, ErrorCategory::kIo);
  CHECK(relative.message() ==
        "/srv/models/q/config.json: missing (in /srv/models/q, resolved from 'models/q' against /srv)");
  const Error absolute = test::expect_error(
      [] { rethrow_in(Error(ErrorCategory::kInvalidInput, "x: bad"), UserPath::resolve("/abs/q", "/srv")); },
      ErrorCategory::kInvalidInput);
  CHECK(absolute.message() == "x: bad");  // absolute: nothing to add
}
