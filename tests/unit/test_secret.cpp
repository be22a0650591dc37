// Tests of common/secret.h: `charm secret new`'s file (format, mode, never overwriting,
// nothing half-written) and what read_secret refuses.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <cctype>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/secret.h"
#include "tests/support/expect_error.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"

using namespace charm;
namespace fs = std::filesystem;

namespace {

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

unsigned mode_of(const fs::path& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

SecretSource file_source(const fs::path& path) {
  SecretSource source;
  source.file = path;
  source.key = "t.yaml: cluster.secret_file";
  return source;
}

}  // namespace

TEST_CASE("create_secret_file: 64 hex digits and a newline, mode 0600, that read_secret reads back") {
  test::TempDir dir("charm-secret");
  const mode_t old_umask = ::umask(0);  // even a permissive umask gives 0600
  create_secret_file(dir / "cluster.secret");
  ::umask(old_umask);
  const std::string text = read_all(dir / "cluster.secret");
  REQUIRE(text.size() == 65);
  CHECK(text.back() == '\n');
  for (size_t i = 0; i < 64; ++i) CHECK(std::isxdigit(static_cast<unsigned char>(text[i])));
  CHECK(mode_of(dir / "cluster.secret") == 0600);
  CHECK(read_secret(file_source(dir / "cluster.secret")) == text.substr(0, 64));

  create_secret_file(dir / "other.secret");
  CHECK(read_all(dir / "other.secret") != text);  // fresh randomness each time
  // Nothing but the two secrets is left in the folder (no temporary files).
  CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 2);
}

TEST_CASE("create_secret_file never overwrites, and leaves nothing behind when it cannot write") {
  test::TempDir dir("charm-secret");
  testing::write_bytes(dir / "existing", "keep me\n");
  test::expect_error([&] { create_secret_file(dir / "existing"); }, ErrorCategory::kInvalidInput,
                     {(dir / "existing").string(), "already exists"});
  CHECK(read_all(dir / "existing") == "keep me\n");
  fs::create_symlink(dir / "nowhere", dir / "dangling");
  test::expect_error([&] { create_secret_file(dir / "dangling"); }, ErrorCategory::kInvalidInput,
                     {"already exists"});
  CHECK_FALSE(fs::exists(dir / "nowhere"));
  test::expect_error([&] { create_secret_file(dir / "no-such-dir" / "s"); }, ErrorCategory::kIo,
                     {(dir / "no-such-dir" / "s").string(), "cannot create"});
  CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 2);
}

TEST_CASE("read_secret refuses files others may access or the group may write; warns on group-readable") {
  test::TempDir dir("charm-secret");
  const fs::path file = dir / "s";
  testing::write_bytes(file, "0123456789abcdef0123456789abcdef\n");
  for (unsigned mode : {0644u, 0604u, 0602u, 0601u, 0620u, 0660u, 0666u}) {
    CAPTURE(mode);
    REQUIRE(::chmod(file.c_str(), mode) == 0);
    test::expect_error([&] { read_secret(file_source(file)); }, ErrorCategory::kInvalidInput,
                       {"t.yaml: cluster.secret_file", file.string(), "has mode", "chmod 600"});
  }
  for (unsigned mode : {0600u, 0400u, 0640u}) {
    CAPTURE(mode);
    REQUIRE(::chmod(file.c_str(), mode) == 0);
    CHECK(read_secret(file_source(file)) == "0123456789abcdef0123456789abcdef");
  }
}

TEST_CASE("read_secret refuses what is not a small regular file") {
  test::TempDir dir("charm-secret");
  test::expect_error([&] { read_secret(file_source(dir.path())); }, ErrorCategory::kInvalidInput,
                     {"not a regular file"});
  testing::write_bytes(dir / "big", std::string(kMaxSecretBytes + 1, 'x'));
  REQUIRE(::chmod((dir / "big").c_str(), 0600) == 0);
  test::expect_error([&] { read_secret(file_source(dir / "big")); }, ErrorCategory::kInvalidInput,
                     {"longer than 4096 bytes"});
  test::expect_error([&] { read_secret(file_source(dir / "absent")); }, ErrorCategory::kInvalidInput,
                     {"cannot be read", "charm secret new"});
}
