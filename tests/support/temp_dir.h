// Test support: the one temporary directory every test uses. A fresh, empty directory
// under the system temp dir ($TMPDIR, else /tmp) with a unique name (mkdtemp), removed
// with everything in it when the object dies, also when the test fails.
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace charm::test {

/// Owns a fresh directory named "<tag>-XXXXXX" under the system temp dir.
/// Not copyable; not thread-safe to destroy while another thread writes into it.
class TempDir {
 public:
  /// Creates the directory; throws std::runtime_error naming the path when it cannot.
  explicit TempDir(const std::string& tag = "charm") {
    std::string pattern = (std::filesystem::temp_directory_path() / (tag + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
    }
    path_ = pattern;
  }
  /// Removes the directory and everything in it; errors are ignored (best effort).
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

  /// Writes `bytes` verbatim to the file `name` inside the directory (replacing it) and
  /// returns its path; throws std::runtime_error naming the file when it cannot.
  std::filesystem::path write(const std::string& name, const std::string& bytes) const {
    const std::filesystem::path file = path_ / name;
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error("cannot write " + file.string());
    return file;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace charm::test
