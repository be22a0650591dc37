// Files that several processes share and that must never be seen half-written: an atomic
// replace (temp file, fsync, rename, fsync of the directory) and an advisory lock.
#pragma once

#include <filesystem>
#include <string>

namespace charm {

/// Writes `text` to `path` durably and atomically: `<path>.tmp.<pid>` written and fsynced,
/// renamed over `path`, then the directory fsynced. A reader sees the old file or the
/// new one, never a mix; a crash leaves at most the temp file. Throws Error(kIo) naming
/// the file when a step fails (the temp file is removed).
void write_file_atomically(const std::filesystem::path& path, const std::string& text);

/// Holds an exclusive flock on `path` (created if absent) for its lifetime, so processes
/// that read-merge-write one file (usage counts, manifests) do not lose each other's
/// updates. Blocks until the lock is free. Throws Error(kIo) naming the file.
class FileLock {
 public:
  explicit FileLock(const std::filesystem::path& path);
  ~FileLock();  // closing the descriptor releases the lock
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

}  // namespace charm
