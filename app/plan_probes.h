// `charm plan`'s quick probes of this machine (memory bandwidth, disk read bandwidth)
// and the per-machine cache that keeps their results, so a second `charm plan` does not
// measure again. The probes take a few hundred milliseconds each; tests never run them
// (they inject rates into app/plan_model.h instead) except the CLI's integration test.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace charm {

/// One disk read measurement.
struct DiskProbe {
  std::string file;          ///< what was read (a checkpoint shard or container file)
  uint64_t bytes = 0;        ///< bytes read
  double gb_per_s = 0;       ///< bytes / seconds / 1e9
  /// Fraction of the range in the page cache just before the read (mincore), after asking
  /// the kernel to drop it (posix_fadvise DONTNEED, which a file mapped by a running
  /// worker survives). Above 0.05 the rate is a "cached read", not the disk's.
  double resident_fraction = 0;
  /// "disk" (a cold read: under 5% resident) or "cached read".
  std::string kind() const { return resident_fraction > 0.05 ? "cached read" : "disk"; }
};

/// What the cache holds for one machine.
struct HostProbes {
  std::optional<double> memory_gb_per_s;  ///< stream_copy_gb_per_s
  std::map<std::string, DiskProbe> disk;  ///< by file path
};

/// host identity -> its probes.
using ProbeCache = std::map<std::string, HostProbes>;

/// The largest probe cache file read, bytes (a real one is a few KiB).
inline constexpr uint64_t kMaxProbeCacheBytes = 1 << 20;

/// This machine's identity for the cache: /etc/machine-id when readable, else the host
/// name. Not for tests (they pass fixed identities to the functions below).
std::string this_host_identity();

/// <cache_root()>/plan-probes.json; empty without a cache root (then nothing is cached).
std::filesystem::path probe_cache_file();

/// Reads the cache. A missing file: empty, no warning. A file over kMaxProbeCacheBytes,
/// that does not parse, or is not {"format": "charm-plan-probes", "version": 1, "hosts":
/// {id: {"memory_gb_per_s": x > 0, "disk": {path: {"bytes", "gb_per_s" > 0,
/// "resident_fraction" in [0, 1]}}}}}: empty, and `*warning` names the file and what is
/// wrong (the next write replaces it). Never throws.
ProbeCache read_probe_cache(const std::filesystem::path& path, std::string* warning);

/// The cache as its JSON text (read_probe_cache reads it back).
std::string probe_cache_text(const ProbeCache& cache);

/// Writes the cache atomically (common/durable_file.h), creating its folder. Throws
/// Error(kIo) naming the file.
void write_probe_cache(const std::filesystem::path& path, const ProbeCache& cache);

/// Measures this machine's memory bandwidth: stream_copy_gb_per_s over 3 arrays of
/// `array_mib` MiB, best of `repeat` passes. Throws what it throws.
double probe_memory(double array_mib = 256, int repeat = 4);

/// Reads up to `max_bytes` of `file` from its start with pread in 4 MiB blocks, stopping
/// after `max_seconds`, having asked the kernel to drop the range from the page cache
/// first, and measures what was resident (DiskProbe). Throws Error(kIo) naming the file
/// when it cannot be opened or read, Error(kInvalidInput) when it is empty.
DiskProbe probe_disk(const std::filesystem::path& file, uint64_t max_bytes = 256ull << 20, double max_seconds = 0.5);

}  // namespace charm
