// Which experts fire: per (layer, expert) counts a worker records as it serves, merged
// into a usage file so `pin: auto` can pin the hottest experts at the next start.
//
// File (JSON): {"format": "charm-expert-usage", "version": 1, "model_fingerprint": "...",
//               "counts": [[layer, expert, count], ...]}
// Merge-safe: each process keeps only the counts it added since its last flush and
// merges them into the file under an exclusive flock on "<file>.lock" (read, add, write a
// temp file, rename), so restarts and several workers sharing one file only ever add.
// A file that does not parse, or belongs to another model, is ignored with a warning
// (and replaced at the next flush), never a crash.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "worker/experts/expert_source.h"

namespace charm {

/// (layer, expert) -> times fired.
using UsageCounts = std::map<ExpertKey, uint64_t>;

/// Reads a usage file. Missing file: empty counts, no warning. Malformed (truncated,
/// not JSON, wrong fields, negative counts) or written for another model fingerprint
/// (when `fingerprint` is non-empty): empty counts and `*warning` says why, naming the
/// file. Never throws.
UsageCounts read_usage_file(const std::filesystem::path& path, const std::string& fingerprint, std::string* warning);

/// Records usage and flushes it periodically and at destruction.
/// Thread-safety: record() and flush() from any thread.
class UsageLog {
 public:
  /// `path` empty: records nothing and never writes. Otherwise flushes every `interval`
  /// on a background thread (creating the file's folder if needed).
  UsageLog(std::filesystem::path path, std::string fingerprint,
           std::chrono::milliseconds interval = std::chrono::seconds(30));
  /// Stops the flusher and flushes what is left (a failure is logged, not thrown).
  ~UsageLog();
  UsageLog(const UsageLog&) = delete;
  UsageLog& operator=(const UsageLog&) = delete;

  void record(const ExpertKey& key, uint64_t count = 1);
  /// Merges the counts recorded since the last flush into the file. Throws Error(kIo)
  /// when the file or its lock cannot be written. No-op without a path.
  void flush();
  const std::filesystem::path& path() const { return path_; }

 private:
  void flusher();
  std::filesystem::path path_;
  std::string fingerprint_;
  std::chrono::milliseconds interval_;
  std::mutex mutex_;  // guards pending_ and stopping_
  std::mutex flush_mutex_;  // one flush at a time per process
  std::condition_variable cv_;
  UsageCounts pending_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace charm
