#include "worker/experts/expert_convert.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/durable_file.h"
#include "common/error.h"
#include "common/fingerprint.h"
#include "common/json_reader.h"
#include "worker/experts/expert_container.h"
#include "worker/experts/expert_manifest.h"

namespace charm {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

/// An owned file descriptor.
class Fd {
 public:
  Fd(const fs::path& path, int flags) : path_(path), fd_(::open(path.c_str(), flags | O_CLOEXEC, 0644)) {
    if (fd_ < 0) fail_io(path.string() + ": cannot open: " + std::strerror(errno));
  }
  ~Fd() { ::close(fd_); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  void pwrite_all(const uint8_t* data, uint64_t bytes, uint64_t offset) const {
    uint64_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::pwrite(fd_, data + done, bytes - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail_io(path_.string() + ": write failed: " + std::strerror(errno));
      done += static_cast<uint64_t>(n);
    }
  }
  bool pread_all(uint8_t* data, uint64_t bytes, uint64_t offset) const {
    uint64_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::pread(fd_, data + done, bytes - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<uint64_t>(n);
    }
    return true;
  }
  void sync() const {
    if (::fsync(fd_) != 0) fail_io(path_.string() + ": fsync failed: " + std::strerror(errno));
  }
  void truncate(uint64_t bytes) const {
    if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) fail_io(path_.string() + ": truncate failed: " + std::strerror(errno));
  }

 private:
  fs::path path_;
  int fd_;
};

/// Every header field that differs, "quant (\"int8\" there, \"none\" now), ...".
std::string differing_field(const ContainerHeader& a, const ContainerHeader& b) {
  const json ja = a.to_json();
  const json jb = b.to_json();
  std::string out;
  for (const auto& [key, value] : ja.items()) {
    if (jb[key] != value) out += (out.empty() ? "" : ", ") + key + " (" + value.dump() + " there, " + jb[key].dump() + " now)";
  }
  return out;
}

/// The layout an expert gets in the container: the checkpoint's dtypes, or quantised.
ExpertLayout target_layout(const ExpertSlices& slices, const ConvertOptions& o) {
  if (slices.transposed || slices.has_biases()) {  // the container's records have no bias parts yet
    fail_unsupported(slices.gate.tensor->file.string() + ": gpt-oss experts (with biases) cannot be "
                     "converted into an expert container yet; serve them from the checkpoint");
  }
  if (o.quant == "none") {
    // Kept as stored, except block-scaled fp8, which is widened to f32 (lossless: the
    // values load_f32 computes) since the container format has no fp8 form yet.
    ExpertLayout l = layout_of(slices);
    auto plain = [](MatrixShape s) {
      return s.format == WeightFormat::kF8E4M3Block ? MatrixShape{WeightFormat::kF32, s.rows, s.cols, 0} : s;
    };
    return ExpertLayout::make(plain(l.gate.shape), plain(l.up.shape), plain(l.down.shape));
  }
  const WeightFormat f = o.quant == "int8" ? WeightFormat::kInt8 : WeightFormat::kInt4;
  auto shape = [&](const ExpertSlice& s) { return MatrixShape{f, s.rows, s.cols, o.group_size}; };
  return ExpertLayout::make(shape(slices.gate), shape(slices.up), shape(slices.down));
}

/// Writes the expert held in `source` (a blob in the checkpoint's layout `from`, as
/// read_checkpoint_expert fills it) into `blob` (zeroed, aligned) in `layout`: parts in
/// the same form are copied, others widened to f32 (fp8 dequantised with its block
/// scales, as Checkpoint::load_f32 does) and stored as f32 or quantised.
void build_blob(const ExpertLayout& from, const uint8_t* source, const ExpertLayout& layout, uint8_t* blob) {
  const ExpertView in = from.view(source);
  const MatrixView* src[3] = {&in.gate, &in.up, &in.down};
  const MatrixPart* dst[3] = {&layout.gate, &layout.up, &layout.down};
  for (int m = 0; m < 3; ++m) {
    const MatrixShape& shape = dst[m]->shape;
    if (shape.format == src[m]->shape.format) {
      std::memcpy(blob + dst[m]->data_offset, src[m]->data, shape.data_bytes());  // as stored
      continue;
    }
    std::vector<float> f32(static_cast<size_t>(shape.rows * shape.cols));
    for (int64_t r = 0; r < shape.rows; ++r) matrix_row_to_f32(*src[m], r, f32.data() + r * shape.cols);
    if (shape.format == WeightFormat::kF32) {
      std::memcpy(blob + dst[m]->data_offset, f32.data(), f32.size() * sizeof(float));
    } else {
      quantize_matrix(f32.data(), shape, blob + dst[m]->data_offset, reinterpret_cast<float*>(blob + dst[m]->scale_offset));
    }
  }
}

/// The checkpoint's content identities of `keys` now (the manifest cache when valid).
ExpertIdentities source_identities(const Checkpoint& checkpoint, const ModelConfig& config,
                                   const std::vector<ExpertKey>& keys) {
  ManifestOptions options;
  options.cache_file = manifest_cache_file(checkpoint, model_fingerprint(checkpoint));
  return load_expert_manifest(checkpoint, config, keys, options);
}

/// Keeps the verified prefix of an earlier run's journal: records that are the plan's
/// next expert, at the next offset, whose bytes in experts.bin match their checksum.
std::vector<ContainerRecord> verified_prefix(const fs::path& journal, const fs::path& data,
                                             const ContainerHeader& header, const std::vector<ExpertKey>& plan,
                                             const Checkpoint& checkpoint, const ModelConfig& config) {
  std::ifstream in(journal);
  std::string line;
  if (!std::getline(in, line)) return {};
  ContainerHeader previous;
  try {
    previous = container_header_from_json(parse_json(line, journal.string(), kIndexJsonLimits), journal.string() + ": header");
  } catch (const std::exception&) {
    return {};  // torn before the header was whole: nothing to keep
  }
  if (!(previous == header)) {
    fail_invalid(journal.string() + ": an unfinished conversion with other options is here: " +
                 differing_field(previous, header) + "; rerun with the same options or delete " +
                 journal.parent_path().string());
  }
  if (!fs::exists(data)) return {};
  Fd fd(data, O_RDONLY);
  std::vector<ContainerRecord> kept;
  uint64_t cursor = 0;
  while (kept.size() < plan.size() && std::getline(in, line)) {
    ContainerRecord r;
    try {
      r = ContainerRecord::from_json(parse_json(line, journal.string(), kIndexJsonLimits), header, journal.string());
    } catch (const std::exception&) {
      break;  // a torn last line
    }
    if (r.key != plan[kept.size()] || r.offset != cursor) break;
    AlignedBuffer blob(r.layout.bytes);
    if (!fd.pread_all(blob.data(), r.layout.bytes, r.offset) || blob_checksum(blob.data(), r.layout.bytes) != r.checksum) break;
    cursor = align_up(r.offset + r.layout.bytes, kRecordAlignment);
    kept.push_back(r);
  }
  // Records converted from other bytes than the checkpoint holds now (a rerun on an
  // edited or other copy of the model: same fingerprint, other weights) end the prefix.
  std::vector<ExpertKey> keys;
  for (const ContainerRecord& r : kept) keys.push_back(r.key);
  const ExpertIdentities now = source_identities(checkpoint, config, keys);
  for (size_t i = 0; i < kept.size(); ++i) {
    if (!(now.at(kept[i].key) == kept[i].source_hash)) {
      kept.resize(i);
      break;
    }
  }
  return kept;
}

void progress_line(const ConvertOptions& o, uint32_t layer, size_t done, size_t total, uint64_t bytes) {
  if (!o.progress) return;
  std::fprintf(stderr, "charm convert: layer %u done: %zu/%zu experts (%.0f%%), %.1f MiB written\n", layer, done, total,
               100.0 * static_cast<double>(done) / static_cast<double>(total), static_cast<double>(bytes) / (1 << 20));
}

}  // namespace

ConvertResult convert_experts(const Checkpoint& checkpoint, const ModelConfig& config,
                              const std::vector<ExpertKey>& experts, const ConvertOptions& options) {
  const ExpertTensorNames names = config.expert_tensors;
  const int64_t hidden_size = config.hidden_size;
  const int64_t intermediate_size = config.moe_intermediate_size;
  ConvertOptions o = options;
  if (o.quant != "none" && o.quant != "int8" && o.quant != "int4") {
    fail_invalid("--quant '" + o.quant + "' is unknown (expected int8 or int4; omit it to keep the checkpoint's precision)");
  }
  if (o.quant == "none" && o.group_size != 0) fail_invalid("--group-size needs --quant int8 or int4");
  if (o.quant != "none" && o.group_size == 0) o.group_size = kDefaultGroupSize;
  if (o.group_size < 0) fail_invalid("--group-size must be >= 1, got " + std::to_string(o.group_size));
  if (o.quant != "none" && o.progress) {
    std::fprintf(stderr,
                 "charm convert: WARNING: --quant %s is LOSSY: expert weights are rounded to %s with one f32 scale per "
                 "%lld elements; outputs will differ from the checkpoint's\n",
                 o.quant.c_str(), o.quant == "int8" ? "8 bits" : "4 bits", static_cast<long long>(o.group_size));
  }
  ContainerHeader header{model_fingerprint(checkpoint), hidden_size, intermediate_size, o.quant, o.group_size, o.worker};
  std::vector<ExpertKey> plan = experts;
  std::sort(plan.begin(), plan.end());
  plan.erase(std::unique(plan.begin(), plan.end()), plan.end());

  std::error_code ec;
  fs::create_directories(o.out, ec);
  if (ec) fail_io("cannot create the container directory " + o.out.describe() + ": " + ec.message());
  const fs::path index = o.out / "index.json";
  const fs::path data = o.out / "experts.bin";
  const fs::path journal = o.out / "convert.journal";
  if (fs::exists(index, ec)) {
    std::unique_ptr<ExpertContainer> existing;
    try {
      existing = ExpertContainer::open(o.out, header.model_fingerprint, hidden_size, intermediate_size);
    } catch (const Error& e) {
      rethrow_in(e, o.out);
    }
    std::vector<ExpertKey> keys;
    for (const auto& [key, record] : existing->records()) keys.push_back(key);
    if (!(existing->header() == header) || keys != plan) {
      fail_invalid(o.out.describe() + " already holds a finished container with other options or experts (" +
                   (existing->header() == header ? std::string("expert set") : differing_field(existing->header(), header)) +
                   "); choose another --out or delete it");
    }
    // Same options and experts, but converted from these weights? (An edited or other
    // copy of the model has the same fingerprint.)
    ExpertIdentities recorded;
    for (const ExpertKey& key : keys) recorded.emplace(key, *existing->identity(key));
    const auto mismatches = compare_identities(source_identities(checkpoint, config, keys), recorded, keys);
    if (!mismatches.empty()) {
      fail_invalid(o.out.string() + " already holds a finished container converted from other weights (" +
                   describe_mismatches(mismatches, "in the container", "in " + checkpoint.dir().string()) +
                   "); choose another --out or delete it");
    }
    ConvertResult done;
    done.experts = keys.size();
    done.already_complete = true;
    done.data_bytes = fs::file_size(data);
    return done;
  }

  std::vector<ContainerRecord> records = verified_prefix(journal, data, header, plan, checkpoint, config);
  ConvertResult result;
  result.experts_resumed = records.size();
  uint64_t cursor = records.empty() ? 0 : align_up(records.back().offset + records.back().layout.bytes, kRecordAlignment);
  if (o.progress && !records.empty()) {
    std::fprintf(stderr, "charm convert: resuming after %zu verified experts of %zu\n", records.size(), plan.size());
  }
  // Rewrite the journal as exactly the verified prefix, and cut experts.bin after it.
  {
    std::string text = header.to_json().dump() + "\n";
    for (const auto& r : records) text += r.to_json().dump() + "\n";
    write_file_atomically(journal, text);
  }
  Fd out(data, O_RDWR | O_CREAT);
  out.truncate(cursor);
  std::ofstream log(journal, std::ios::app);

  for (size_t i = records.size(); i < plan.size(); ++i) {
    const ExpertKey key = plan[i];
    const ExpertSlices slices = checkpoint.locate_expert(names, static_cast<int>(key.first),
                                                         static_cast<int>(key.second), hidden_size, intermediate_size);
    ContainerRecord r;
    r.key = key;
    r.offset = cursor;
    r.layout = target_layout(slices, o);
    // One read of the checkpoint: its identity and the converted record come from the same bytes.
    const ExpertLayout stored = layout_of(slices);
    AlignedBuffer source(stored.bytes);
    read_checkpoint_expert(checkpoint, slices, stored, source.data());
    r.source_hash = blob_identity(stored, source.data());
    AlignedBuffer blob(r.layout.bytes);
    std::memset(blob.data(), 0, blob.size());
    build_blob(stored, source.data(), r.layout, blob.data());
    r.checksum = blob_checksum(blob.data(), r.layout.bytes);
    out.pwrite_all(blob.data(), blob.size(), cursor);  // padding included: the file ends aligned
    cursor += blob.size();
    // The journal line may reach the disk before the data; resume re-checks checksums.
    log << r.to_json().dump() << "\n";
    records.push_back(r);
    const bool layer_end = i + 1 == plan.size() || plan[i + 1].first != key.first;
    if (layer_end) {
      log.flush();
      if (!log) fail_io(journal.string() + ": write failed");
      out.sync();
      progress_line(o, key.first, i + 1, plan.size(), cursor);
    }
  }
  out.sync();
  log.close();

  json j = header.to_json();
  j["data_bytes"] = cursor;
  // One expert per line: readable, and diffable between two conversions.
  std::string text = j.dump();
  text.pop_back();
  text += ",\n\"experts\": [\n";
  for (size_t i = 0; i < records.size(); ++i) text += records[i].to_json().dump() + (i + 1 < records.size() ? ",\n" : "\n");
  text += "]}\n";
  write_file_atomically(index, text);  // published last: only now is it a container
  fs::remove(journal);
  result.experts = records.size();
  result.data_bytes = cursor;
  if (o.progress) {
    std::fprintf(stderr, "charm convert: wrote %llu experts (%.1f MiB) to %s\n",
                 static_cast<unsigned long long>(result.experts), static_cast<double>(cursor) / (1 << 20),
                 o.out.c_str());
  }
  return result;
}

}  // namespace charm
