// Tests for common/text_file.cpp: whole-file reads with a size limit.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "common/text_file.h"
#include "tests/support/expect_error.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using charm::ErrorCategory;
using charm::test::expect_error;
using charm::test::TempDir;
using charm::testing::write_bytes;

TEST_CASE("read_text_file refuses a file over its limit before reading it, naming it") {
  TempDir dir("json");
  write_bytes(dir / "a.json", std::string(100, ' ') + "{}");
  CHECK(charm::read_text_file(dir / "a.json", 102, "a test file").size() == 102);
  expect_error([&] { charm::read_text_file(dir / "a.json", 101, "a test file"); }, ErrorCategory::kInvalidInput,
               {(dir / "a.json").string(), "102 bytes", "limit of 101 bytes for a test file"});
  expect_error([&] { charm::read_text_file(dir / "missing.json", 101, "a test file"); }, ErrorCategory::kIo,
               {(dir / "missing.json").string(), "cannot open"});
  fs::create_directory(dir / "folder.json");
  expect_error([&] { charm::read_text_file(dir / "folder.json", 101, "a test file"); }, ErrorCategory::kIo,
               {"folder.json", "not a readable file"});
}
