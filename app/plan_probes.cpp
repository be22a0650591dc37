#include "app/plan_probes.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <vector>

#include "app/bench_memory.h"
#include "common/cache_root.h"
#include "common/durable_file.h"
#include "common/error.h"
#include "common/json_reader.h"
#include "common/text_file.h"

namespace charm {
namespace {

constexpr const char* kFormat = "charm-plan-probes";
constexpr uint64_t kBlock = 4ull << 20;

/// A positive finite number at `j[key]`, else throws a message naming `where`.
double positive(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) fail_invalid(where + "." + key + " is missing or not a number");
  const double v = j[key].get<double>();
  if (!(v > 0) || !std::isfinite(v)) fail_invalid(where + "." + key + " must be > 0");
  return v;
}

HostProbes parse_host(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail_invalid(where + " is not an object");
  HostProbes h;
  if (j.contains("memory_gb_per_s")) h.memory_gb_per_s = positive(j, "memory_gb_per_s", where);
  if (!j.contains("disk")) return h;
  if (!j["disk"].is_object()) fail_invalid(where + ".disk is not an object");
  for (const auto& [file, d] : j["disk"].items()) {
    const std::string at = where + ".disk['" + file + "']";
    DiskProbe p;
    p.file = file;
    p.gb_per_s = positive(d, "gb_per_s", at);
    p.bytes = static_cast<uint64_t>(positive(d, "bytes", at));
    if (!d.contains("resident_fraction") || !d["resident_fraction"].is_number()) fail_invalid(at + ".resident_fraction is missing");
    p.resident_fraction = d["resident_fraction"].get<double>();
    if (!(p.resident_fraction >= 0 && p.resident_fraction <= 1)) fail_invalid(at + ".resident_fraction must be in [0, 1]");
    h.disk[file] = p;
  }
  return h;
}

/// Closes a descriptor on scope exit.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

/// Fraction of [0, bytes) of `fd` in the page cache (mincore over a read-only mapping).
double resident_fraction(int fd, uint64_t bytes) {
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return 0;  // unknown: report the read as a disk read, as measured
  const long page = ::sysconf(_SC_PAGESIZE);
  const size_t pages = (bytes + page - 1) / page;
  std::vector<unsigned char> vec(pages);
  double fraction = 0;
  if (::mincore(map, bytes, vec.data()) == 0) {
    const auto resident = std::count_if(vec.begin(), vec.end(), [](unsigned char c) { return (c & 1) != 0; });
    fraction = static_cast<double>(resident) / static_cast<double>(pages);
  }
  ::munmap(map, bytes);
  return fraction;
}

}  // namespace

std::string this_host_identity() {
  std::ifstream in("/etc/machine-id");
  std::string id;
  if (in >> id && !id.empty()) return "machine-id:" + id;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0 && name[0] != 0) return std::string("host:") + name;
  return "unknown-host";
}

std::filesystem::path probe_cache_file() {
  const std::filesystem::path root = cache_root();
  return root.empty() ? root : root / "plan-probes.json";
}

ProbeCache read_probe_cache(const std::filesystem::path& path, std::string* warning) {
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(path, ec)) return {};
  try {
    const std::string text = read_text_file(path, kMaxProbeCacheBytes, "a charm plan probe cache");
    const nlohmann::json j = parse_json(text, path.string(), kIndexJsonLimits);
    const std::string where = path.string();
    if (!j.is_object() || j.value("format", "") != kFormat || j.value("version", 0) != 1) {
      fail_invalid(where + ": not a charm-plan-probes version 1 file");
    }
    if (!j.contains("hosts") || !j["hosts"].is_object()) fail_invalid(where + ": \"hosts\" is missing or not an object");
    ProbeCache cache;
    for (const auto& [host, h] : j["hosts"].items()) cache[host] = parse_host(h, where + ": hosts['" + host + "']");
    return cache;
  } catch (const Error& e) {
    if (warning) *warning = e.message() + " (ignored; charm plan measures again and replaces it)";
  } catch (const std::exception& e) {
    if (warning) *warning = path.string() + ": " + e.what() + " (ignored; charm plan measures again and replaces it)";
  }
  return {};
}

std::string probe_cache_text(const ProbeCache& cache) {
  nlohmann::json hosts = nlohmann::json::object();
  for (const auto& [host, h] : cache) {
    nlohmann::json entry = nlohmann::json::object();
    if (h.memory_gb_per_s) entry["memory_gb_per_s"] = *h.memory_gb_per_s;
    nlohmann::json disk = nlohmann::json::object();
    for (const auto& [file, d] : h.disk) {
      disk[file] = {{"bytes", d.bytes}, {"gb_per_s", d.gb_per_s}, {"resident_fraction", d.resident_fraction}};
    }
    entry["disk"] = disk;
    hosts[host] = entry;
  }
  return nlohmann::json{{"format", kFormat}, {"version", 1}, {"hosts", hosts}}.dump(1) + "\n";
}

void write_probe_cache(const std::filesystem::path& path, const ProbeCache& cache) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) fail_io("cannot create " + path.parent_path().string() + ": " + ec.message());
  write_file_atomically(path, probe_cache_text(cache));
}

double probe_memory(double array_mib, int repeat) { return stream_copy_gb_per_s(array_mib, repeat); }

DiskProbe probe_disk(const std::filesystem::path& file, uint64_t max_bytes, double max_seconds) {
  Fd f{::open(file.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) fail_io("charm plan: cannot open " + file.string() + " for the disk probe");
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail_io("charm plan: cannot stat " + file.string());
  const uint64_t bytes = std::min<uint64_t>(static_cast<uint64_t>(st.st_size), max_bytes);
  if (bytes == 0) fail_invalid("charm plan: " + file.string() + " is empty: nothing to measure the disk with");
  // Drop the range first: a read from the page cache measures memory, not the disk.
  ::posix_fadvise(f.fd, 0, static_cast<off_t>(bytes), POSIX_FADV_DONTNEED);
  DiskProbe probe;
  probe.file = file.string();
  probe.resident_fraction = resident_fraction(f.fd, bytes);
  std::unique_ptr<char[]> buffer(new char[kBlock]);
  const auto start = std::chrono::steady_clock::now();
  double seconds = 0;
  uint64_t done = 0;
  while (done < bytes && (done == 0 || seconds < max_seconds)) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kBlock, bytes - done));
    const ssize_t got = ::pread(f.fd, buffer.get(), want, static_cast<off_t>(done));
    if (got <= 0) fail_io("charm plan: read of " + file.string() + " failed at byte " + std::to_string(done));
    done += static_cast<uint64_t>(got);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  probe.bytes = done;
  probe.gb_per_s = static_cast<double>(done) / std::max(seconds, 1e-9) / 1e9;
  return probe;
}

}  // namespace charm
