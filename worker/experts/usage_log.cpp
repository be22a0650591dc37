#include "worker/experts/usage_log.h"

#include <fstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/durable_file.h"
#include "common/error.h"
#include "common/json_reader.h"

namespace charm {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kUsageFormat = "charm-expert-usage";

UsageCounts parse_counts(const json& j) {
  if (!j.is_object() || j.value("format", "") != kUsageFormat) throw std::runtime_error("not a charm usage file");
  if (!j.contains("counts") || !j["counts"].is_array()) throw std::runtime_error("'counts' is missing or not a list");
  UsageCounts counts;
  for (const auto& entry : j["counts"]) {
    if (!entry.is_array() || entry.size() != 3) throw std::runtime_error("a count is not [layer, expert, count]");
    for (const auto& v : entry) {
      if (!v.is_number_unsigned()) throw std::runtime_error("a count holds a value that is not a non-negative integer");
    }
    counts[{entry[0].get<uint32_t>(), entry[1].get<uint32_t>()}] += entry[2].get<uint64_t>();
  }
  return counts;
}

}  // namespace

UsageCounts read_usage_file(const fs::path& path, const std::string& fingerprint, std::string* warning) {
  if (!fs::exists(path)) return {};
  try {
    const json j = read_json_file(path, kIndexJsonLimits, "a usage file");
    UsageCounts counts = parse_counts(j);
    const std::string fp = j.value("model_fingerprint", "");
    if (!fingerprint.empty() && fp != fingerprint) {
      if (warning) *warning = path.string() + ": usage recorded for model fingerprint " + fp + ", not " + fingerprint + "; ignored";
      return {};
    }
    return counts;
  } catch (const std::exception& e) {
    if (warning) *warning = path.string() + ": unreadable usage file (" + e.what() + "); ignored, it will be replaced";
    return {};
  }
}

UsageLog::UsageLog(fs::path path, std::string fingerprint, std::chrono::milliseconds interval)
    : path_(std::move(path)), fingerprint_(std::move(fingerprint)), interval_(interval) {
  if (path_.empty()) return;
  thread_ = std::thread([this] { flusher(); });
}

UsageLog::~UsageLog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  try {
    flush();
  } catch (const std::exception& e) {
    spdlog::warn("expert usage not saved: {}", e.what());
  }
}

void UsageLog::record(const ExpertKey& key, uint64_t count) {
  if (path_.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  pending_[key] += count;
}

void UsageLog::flush() {
  if (path_.empty()) return;
  std::lock_guard<std::mutex> one_flush(flush_mutex_);
  UsageCounts delta;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    delta.swap(pending_);
  }
  if (delta.empty()) return;
  try {
    if (path_.has_parent_path()) fs::create_directories(path_.parent_path());
    FileLock lock(path_.string() + ".lock");
    std::string warning;
    UsageCounts merged = read_usage_file(path_, fingerprint_, &warning);
    if (!warning.empty()) spdlog::warn("{}", warning);
    for (const auto& [key, n] : delta) merged[key] += n;
    json j{{"format", kUsageFormat}, {"version", 1}, {"model_fingerprint", fingerprint_}, {"counts", json::array()}};
    for (const auto& [key, n] : merged) j["counts"].push_back({key.first, key.second, n});
    const fs::path tmp = path_.string() + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << j.dump() << "\n";
      if (!out) fail_io(tmp.string() + ": write failed");
    }
    fs::rename(tmp, path_);
  } catch (...) {
    // Keep the counts for the next try rather than lose them.
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [key, n] : delta) pending_[key] += n;
    throw;
  }
}

void UsageLog::flusher() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (cv_.wait_for(lock, interval_, [this] { return stopping_; })) break;
    lock.unlock();
    try {
      flush();
    } catch (const std::exception& e) {
      spdlog::warn("expert usage not saved (will retry): {}", e.what());
    }
    lock.lock();
  }
}

}  // namespace charm
