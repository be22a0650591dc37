#include "worker/experts/expert_container.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <xxhash.h>

#include "common/error.h"
#include "common/json_reader.h"

namespace charm {
namespace {

using nlohmann::json;

/// j[key] as T; throws naming `where` and the key when absent or of the wrong type.
template <typename T>
T field(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) fail_invalid(where + ": '" + key + "' is missing");
  const json& v = j.at(key);
  const bool ok = std::is_same_v<T, std::string> ? v.is_string()
                  : std::is_same_v<T, bool>      ? v.is_boolean()
                  : std::is_unsigned_v<T>        ? v.is_number_unsigned()
                                                 : v.is_number_integer();
  if (!ok) fail_invalid(where + ": '" + key + "' has the wrong type (" + v.type_name() + ")");
  return v.get<T>();
}

json matrix_json(const MatrixPart& p) {
  return json{{"dtype", matrix_dtype_name(p.shape)},
              {"shape", {p.shape.rows, p.shape.cols}},
              {"group_size", p.shape.group_size},
              {"offset", p.data_offset},
              {"scale_offset", p.scale_offset}};
}

MatrixShape matrix_shape(const json& j, const std::string& where, const ContainerHeader& h, int64_t rows,
                         int64_t cols) {
  const std::string dtype = field<std::string>(j, "dtype", where);
  MatrixShape parsed;
  if (!parse_matrix_dtype(dtype, parsed) || parsed.format == WeightFormat::kF8E4M3Block) {
    fail_invalid(where + ": dtype '" + dtype + "' is not a container dtype (F32, F16, BF16, I8G, I4G, or a GGML "
                 "block type kept from a GGUF: Q8_0, Q4_K, ...)");
  }
  if (!j.contains("shape") || !j["shape"].is_array() || j["shape"].size() != 2 || !j["shape"][0].is_number_integer() ||
      !j["shape"][1].is_number_integer()) {
    fail_invalid(where + ": 'shape' must be [rows, cols]");
  }
  MatrixShape s{parsed.format, j["shape"][0].get<int64_t>(), j["shape"][1].get<int64_t>(),
                field<int64_t>(j, "group_size", where)};
  s.ggml_type = parsed.ggml_type;
  if (s.format == WeightFormat::kGgml && !ggml_row_bytes(s.ggml_type, s.cols)) {
    fail_invalid(where + ": " + dtype + " rows of " + std::to_string(s.cols) + " columns are not whole blocks");
  }
  if (s.rows != rows || s.cols != cols) {
    fail_invalid(where + ": shape [" + std::to_string(s.rows) + ", " + std::to_string(s.cols) + "] but the model needs [" +
                 std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
  if (is_quantized(s.format) != (s.group_size > 0) || s.group_size < 0 ||
      (is_quantized(s.format) && s.group_size != h.group_size)) {
    fail_invalid(where + ": group_size " + std::to_string(s.group_size) + " does not fit dtype " + dtype +
                 " (container group_size " + std::to_string(h.group_size) + ")");
  }
  return s;
}

std::string key_text(const ExpertKey& key) {
  return "layer " + std::to_string(key.first) + " expert " + std::to_string(key.second);
}

}  // namespace

uint64_t blob_checksum(const uint8_t* data, uint64_t bytes) { return XXH3_64bits(data, bytes); }

std::string checksum_hex(uint64_t checksum) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(checksum));
  return hex;
}

json ContainerHeader::to_json() const {
  return json{{"format", kContainerFormat},
              {"version", kContainerVersion},
              {"model_fingerprint", model_fingerprint},
              {"hidden_size", hidden_size},
              {"moe_intermediate_size", moe_intermediate_size},
              {"quant", quant},
              {"lossy", quant != "none"},
              {"group_size", group_size},
              {"worker", worker},
              {"alignment", kRecordAlignment},
              {"data_file", "experts.bin"}};
}

ContainerHeader container_header_from_json(const json& j, const std::string& where) {
  if (field<std::string>(j, "format", where) != kContainerFormat) {
    fail_invalid(where + ": 'format' is '" + j["format"].get<std::string>() + "', not '" + kContainerFormat + "'");
  }
  if (const int64_t v = field<int64_t>(j, "version", where); v != kContainerVersion) {
    fail_invalid(where + ": container version " + std::to_string(v) + ", this charm reads version " +
                 std::to_string(kContainerVersion) +
                 (v < kContainerVersion ? " (its records carry no source content identity: convert again)" : ""));
  }
  ContainerHeader h;
  h.model_fingerprint = field<std::string>(j, "model_fingerprint", where);
  h.hidden_size = field<int64_t>(j, "hidden_size", where);
  h.moe_intermediate_size = field<int64_t>(j, "moe_intermediate_size", where);
  h.quant = field<std::string>(j, "quant", where);
  h.group_size = field<int64_t>(j, "group_size", where);
  h.worker = field<std::string>(j, "worker", where);
  if (h.quant != "none" && h.quant != "int8" && h.quant != "int4") {
    fail_invalid(where + ": 'quant' is '" + h.quant + "' (expected none, int8 or int4)");
  }
  if (h.hidden_size <= 0 || h.moe_intermediate_size <= 0) fail_invalid(where + ": sizes must be positive");
  if ((h.quant == "none") != (h.group_size == 0) || h.group_size < 0) {
    fail_invalid(where + ": 'group_size' " + std::to_string(h.group_size) + " does not fit quant '" + h.quant + "'");
  }
  return h;
}

json ContainerRecord::to_json() const {
  return json{{"layer", key.first},       {"expert", key.second},
              {"offset", offset},         {"bytes", layout.bytes},
              {"checksum", checksum_hex(checksum)}, {"source_hash", source_hash.hex()},
              {"gate", matrix_json(layout.gate)},
              {"up", matrix_json(layout.up)}, {"down", matrix_json(layout.down)}};
}

ContainerRecord ContainerRecord::from_json(const json& j, const ContainerHeader& h, const std::string& where) {
  ContainerRecord r;
  r.key = {field<uint32_t>(j, "layer", where), field<uint32_t>(j, "expert", where)};
  const std::string at = where + " (" + key_text(r.key) + ")";
  r.offset = field<uint64_t>(j, "offset", at);
  const uint64_t bytes = field<uint64_t>(j, "bytes", at);
  const std::string sum = field<std::string>(j, "checksum", at);
  char* end = nullptr;
  r.checksum = std::strtoull(sum.c_str(), &end, 16);
  if (sum.size() != 16 || end != sum.c_str() + sum.size()) fail_invalid(at + ": 'checksum' '" + sum + "' is not 16 hex digits");
  const std::string source = field<std::string>(j, "source_hash", at);
  const auto source_hash = ContentHash::from_hex(source);
  if (!source_hash) fail_invalid(at + ": 'source_hash' '" + source + "' is not 32 lower-case hex digits");
  r.source_hash = *source_hash;
  if (r.offset % kRecordAlignment != 0) {
    fail_invalid(at + ": offset " + std::to_string(r.offset) + " is not a multiple of " + std::to_string(kRecordAlignment));
  }
  const int64_t H = h.hidden_size;
  const int64_t I = h.moe_intermediate_size;
  for (const char* m : {"gate", "up", "down"}) {
    if (!j.contains(m) || !j[m].is_object()) fail_invalid(at + ": '" + m + "' is missing");
  }
  r.layout = ExpertLayout::make(matrix_shape(j["gate"], at + ".gate", h, I, H), matrix_shape(j["up"], at + ".up", h, I, H),
                                matrix_shape(j["down"], at + ".down", h, H, I));
  const ExpertLayout& l = r.layout;
  const bool offsets_match = l.bytes == bytes &&
                             field<uint64_t>(j["gate"], "offset", at + ".gate") == l.gate.data_offset &&
                             field<uint64_t>(j["gate"], "scale_offset", at + ".gate") == l.gate.scale_offset &&
                             field<uint64_t>(j["up"], "offset", at + ".up") == l.up.data_offset &&
                             field<uint64_t>(j["up"], "scale_offset", at + ".up") == l.up.scale_offset &&
                             field<uint64_t>(j["down"], "offset", at + ".down") == l.down.data_offset &&
                             field<uint64_t>(j["down"], "scale_offset", at + ".down") == l.down.scale_offset;
  if (!offsets_match) {
    fail_invalid(at + ": bytes/offsets disagree with the layout its dtypes and shapes give (" + std::to_string(l.bytes) +
                 " bytes expected, index says " + std::to_string(bytes) + ")");
  }
  return r;
}

std::unique_ptr<ExpertContainer> ExpertContainer::open(const std::filesystem::path& dir,
                                                       const std::string& expected_fingerprint, int64_t hidden_size,
                                                       int64_t intermediate_size, IoMode io) {
  const auto index_path = dir / "index.json";
  if (!std::filesystem::exists(index_path)) {
    const bool unfinished = std::filesystem::exists(dir / "convert.journal");
    fail_invalid(dir.string() + ": not an expert container (no index.json" +
                 (unfinished ? "; a conversion started here did not finish: rerun charm convert to resume it)"
                             : "; write one with charm convert)"));
  }
  const std::string where = index_path.string();
  const json index = read_json_file(index_path, kIndexJsonLimits, "an expert container index");
  std::unique_ptr<ExpertContainer> c(new ExpertContainer());
  c->dir_ = dir;
  c->header_ = container_header_from_json(index, where);
  const ContainerHeader& h = c->header_;
  if (h.model_fingerprint != expected_fingerprint) {
    fail_invalid(where + ": converted from a model with fingerprint " + h.model_fingerprint +
                 ", but the served model has fingerprint " + expected_fingerprint + " (convert this model again)");
  }
  if (h.hidden_size != hidden_size || h.moe_intermediate_size != intermediate_size) {
    fail_invalid(where + ": hidden_size " + std::to_string(h.hidden_size) + " / moe_intermediate_size " +
                 std::to_string(h.moe_intermediate_size) + " differ from the model's " + std::to_string(hidden_size) +
                 " / " + std::to_string(intermediate_size));
  }
  c->data_path_ = dir / field<std::string>(index, "data_file", where);
  if (c->data_path_.filename() != "experts.bin") fail_invalid(where + ": 'data_file' must be experts.bin");
  const uint64_t data_bytes = field<uint64_t>(index, "data_bytes", where);
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(c->data_path_, ec);
  if (ec) fail_invalid(c->data_path_.string() + ": missing (" + ec.message() + "); the container is incomplete");
  if (file_size != data_bytes) {
    fail_invalid(c->data_path_.string() + ": " + std::to_string(file_size) + " bytes, but " + where + " says " +
                 std::to_string(data_bytes) + (file_size < data_bytes ? " (truncated)" : " (trailing bytes)"));
  }
  if (data_bytes % kRecordAlignment != 0) {
    fail_invalid(where + ": 'data_bytes' " + std::to_string(data_bytes) + " is not a multiple of " +
                 std::to_string(kRecordAlignment));
  }
  if (!index.contains("experts") || !index["experts"].is_array()) fail_invalid(where + ": 'experts' must be a list");
  uint64_t previous_end = 0;
  for (size_t i = 0; i < index["experts"].size(); ++i) {
    const std::string at = where + ": experts[" + std::to_string(i) + "]";
    ContainerRecord r = ContainerRecord::from_json(index["experts"][i], h, at);
    if (r.offset + r.layout.bytes > file_size || r.offset + r.layout.bytes < r.offset) {
      fail_invalid(at + " (" + key_text(r.key) + "): record [" + std::to_string(r.offset) + ", +" +
                   std::to_string(r.layout.bytes) + ") runs past the end of " + c->data_path_.string() + " (" +
                   std::to_string(file_size) + " bytes)");
    }
    if (r.offset < previous_end) fail_invalid(at + " (" + key_text(r.key) + "): overlaps the previous record (records must be in file order)");
    previous_end = r.offset + r.layout.bytes;
    const ExpertKey key = r.key;
    if (!c->records_.emplace(key, std::move(r)).second) fail_invalid(at + ": " + key_text(key) + " is listed twice");
  }
  const int flags = O_RDONLY | O_CLOEXEC | (io == IoMode::kODirect ? O_DIRECT : 0);
  c->fd_ = ::open(c->data_path_.c_str(), flags);
  if (c->fd_ < 0) {
    const std::string why = std::strerror(errno);
    if (io == IoMode::kODirect && errno == EINVAL) fail_unsupported(c->data_path_.string() + ": O_DIRECT refused by the file system (use io: pread)");
    fail_io(c->data_path_.string() + ": cannot open: " + why);
  }
  return c;
}

ExpertContainer::~ExpertContainer() {
  if (fd_ >= 0) ::close(fd_);
}

const ExpertLayout* ExpertContainer::layout(const ExpertKey& key) const {
  const auto it = records_.find(key);
  return it == records_.end() ? nullptr : &it->second.layout;
}

uint64_t ExpertContainer::read(const ExpertKey& key, uint8_t* dst) const {
  const auto it = records_.find(key);
  if (it == records_.end()) fail_internal(describe() + ": holds no " + key_text(key));
  const ContainerRecord& r = it->second;
  // The file ends on a 4 KiB boundary, so the rounded-up read stays inside it (O_DIRECT
  // needs whole aligned blocks).
  const uint64_t want = align_up(r.layout.bytes, kRecordAlignment);
  uint64_t done = 0;
  while (done < want) {
    const ssize_t n = ::pread(fd_, dst + done, want - done, static_cast<off_t>(r.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fail_io(data_path_.string() + ": " + key_text(key) + ": read failed at byte " + std::to_string(r.offset + done) +
              (n < 0 ? std::string(": ") + std::strerror(errno) : std::string(": end of file")));
    }
    done += static_cast<uint64_t>(n);
  }
  const uint64_t sum = blob_checksum(dst, r.layout.bytes);
  if (sum != r.checksum) {
    fail_io(data_path_.string() + ": " + key_text(key) + ": checksum mismatch (index.json says " +
            checksum_hex(r.checksum) + ", the data hashes to " + checksum_hex(sum) +
            "): the container is corrupt; convert again");
  }
  // A record can hold NaN with a valid checksum (converted from a bad checkpoint before
  // charm convert refused those); serving it would print garbage.
  if (const auto bad = describe_non_finite(r.layout, dst)) {
    fail_invalid(data_path_.string() + ": " + key_text(key) + ": " + *bad +
                 "; charm refuses non-finite weights (convert from a good checkpoint)");
  }
  return want;
}

std::optional<ContentHash> ExpertContainer::identity(const ExpertKey& key) const {
  const auto it = records_.find(key);
  if (it == records_.end()) return std::nullopt;
  return it->second.source_hash;
}

std::string ExpertContainer::lossy_form() const {
  if (header_.quant == "none") return "";
  return header_.quant + " group_size " + std::to_string(header_.group_size);
}

void ExpertContainer::verify_all() const {
  uint64_t largest = 0;
  for (const auto& [key, r] : records_) largest = std::max(largest, r.layout.bytes);
  AlignedBuffer buffer(largest);
  for (const auto& [key, r] : records_) read(key, buffer.data());
}

}  // namespace charm
