// Checkpoint directory reader: config.json, generation_config.json, and the tensors of
// one model.safetensors or of the shards listed by model.safetensors.index.json (the
// layout transformers' save_pretrained writes). Routed experts are read with pread of
// exactly one expert's bytes, whichever hub layout the file uses.
#include "common/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include "common/error.h"
#include "common/json_reader.h"

namespace charm {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// "[i, j, k]": the index of element `flat` of a row-major tensor of `shape`.
std::string index_text(const std::vector<int64_t>& shape, uint64_t flat) {
  std::vector<uint64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    const auto dim = static_cast<uint64_t>(std::max<int64_t>(shape[d], 1));
    index[d] = flat % dim;
    flat /= dim;
  }
  std::string s = "[";
  for (size_t d = 0; d < index.size(); ++d) s += (d ? ", " : "") + std::to_string(index[d]);
  return s + "]";
}

/// Throws Error(kInvalidInput) naming the file, the tensor and the element unless the
/// `count` elements of `dtype` at `data` (element `first` onwards of tensor `info`) are
/// all finite: a NaN or Inf weight makes every output it touches garbage, silently.
[[noreturn]] void fail_non_finite(const TensorInfo& info, float value, uint64_t element) {
  fail_invalid(info.file.string() + ": tensor '" + info.name + "' holds " + non_finite_name(value) + " at " +
               index_text(info.shape, element) + "; charm refuses non-finite weights (the model would compute " +
               "garbage from them)");
}
void require_finite(const TensorInfo& info, DType dtype, const void* data, uint64_t count, uint64_t first = 0) {
  const uint64_t i = first_non_finite(dtype, data, count);
  if (i == count) return;
  float value;
  convert_to_f32(dtype, static_cast<const uint8_t*>(data) + i * dtype_size(dtype), &value, 1);
  fail_non_finite(info, value, first + i);
}

/// Throws naming the scale tensor unless each of its `count` f32 values is finite and
/// small enough that an F8_E4M3 value times it stays finite.
void require_fp8_scales(const TensorInfo& scale, const float* values, uint64_t count) {
  const uint64_t i = first_bad_scale(WeightFormat::kF8E4M3Block, values, count);
  if (i == count) return;
  const bool finite = std::isfinite(values[i]);
  fail_invalid(scale.file.string() + ": scale tensor '" + scale.name + "' holds " +
               (finite ? std::to_string(values[i]) + ", which overflows f32 times an F8_E4M3 value up to 448,"
                       : non_finite_name(values[i])) +
               " at " + index_text(scale.shape, i) + "; charm refuses non-finite weights");
}

/// True when `path` starts with the 4 bytes "GGUF".
bool has_gguf_magic(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

/// For a folder without config.json that holds GGUF files: which one to name instead.
std::string gguf_hint(const std::filesystem::path& dir) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".gguf") {
      return "; the folder holds GGUF files: point model: at one of them, e.g. " + it->path().string();
    }
  }
  return "";
}

/// Parses a JSON file within `limits`; throws Error(kInvalidInput) naming it if it is
/// absent, too large, nested too deep, malformed or not an object.
nlohmann::json read_json(const std::filesystem::path& path, const JsonLimits& limits) {
  if (!std::filesystem::is_regular_file(path)) fail_invalid(path.string() + ": missing or unreadable");
  nlohmann::json json = read_json_file(path, limits, "a checkpoint JSON file");
  if (!json.is_object()) fail_invalid(path.string() + ": top-level JSON value is not an object");
  return json;
}

/// The weight_map of an index file: tensor name -> shard file name (relative to `dir`).
/// Rejects shard names that leave the directory, so a checkpoint cannot point elsewhere.
std::map<std::string, std::string> read_weight_map(const std::filesystem::path& index_path) {
  const nlohmann::json index = read_json(index_path, kIndexJsonLimits);
  const std::string where = index_path.string();
  if (!index.contains("weight_map")) fail_invalid(where + ": missing 'weight_map'");
  const auto& map = index["weight_map"];
  if (!map.is_object()) fail_invalid(where + ": 'weight_map' is not a JSON object");
  std::map<std::string, std::string> out;
  for (const auto& [tensor, file] : map.items()) {
    if (!file.is_string()) fail_invalid(where + ": weight_map['" + tensor + "'] is not a file name string");
    const std::filesystem::path rel(file.get<std::string>());
    const bool escapes = rel.empty() || rel.is_absolute() ||
                         std::any_of(rel.begin(), rel.end(), [](const auto& part) { return part == ".."; });
    if (escapes) {
      fail_invalid(where + ": weight_map['" + tensor + "'] = '" + rel.string() +
                   "' is not a file inside the checkpoint directory");
    }
    out[tensor] = rel.string();
  }
  return out;
}

/// Shard files to open when there is no index: every *.safetensors in `dir`, sorted.
std::vector<std::filesystem::path> list_safetensors(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code file_ec;
    if (it->is_regular_file(file_ec) && it->path().extension() == ".safetensors") files.push_back(it->path());
  }
  if (ec) fail_io(dir.string() + ": cannot list the directory: " + ec.message());
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    fail_invalid(dir.string() + ": no model.safetensors.index.json and no *.safetensors file");
  }
  return files;
}

/// Replaces the "{}" in `pattern` with `layer`.
std::string with_layer(const std::string& pattern, int layer) {
  const auto pos = pattern.find("{}");
  if (pos == std::string::npos) return pattern;
  return pattern.substr(0, pos) + std::to_string(layer) + pattern.substr(pos + 2);
}

/// quantization_config of config.json: nullopt without one and for quant_method "mxfp4"
/// (gpt-oss: only its experts are packed, as *_blocks / *_scales, which the expert
/// reader decodes); the fp8 block size for quant_method "fp8" (DeepSeek-V3); throws
/// naming the field for anything else.
std::optional<std::pair<int64_t, int64_t>> read_fp8_block(const nlohmann::json& config, const std::string& where) {
  if (!config.contains("quantization_config") || config["quantization_config"].is_null()) return std::nullopt;
  const auto& q = config["quantization_config"];
  if (!q.is_object()) fail_invalid(where + ": field 'quantization_config' is not a JSON object");
  const std::string method = q.value("quant_method", std::string());
  if (method == "mxfp4") return std::nullopt;
  if (method != "fp8") {
    fail_unsupported(where + ": quantization_config.quant_method '" + method +
                     "' is not supported (supported: fp8, and mxfp4 for gpt-oss experts)");
  }
  // DeepSeek-V3 spells the format "e4m3", MiniMax-M2 "float8_e4m3fn": the same bytes.
  if (q.contains("fmt") && q["fmt"] != "e4m3" && q["fmt"] != "float8_e4m3fn") {
    fail_unsupported(where + ": quantization_config.fmt " + q["fmt"].dump() +
                     " is not supported (supported: e4m3, float8_e4m3fn)");
  }
  const auto& b = q.contains("weight_block_size") ? q["weight_block_size"] : nlohmann::json();
  if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
      b[0].get<int64_t>() <= 0 || b[1].get<int64_t>() <= 0) {
    fail_invalid(where + ": quantization_config.weight_block_size must be two positive integers, got " + b.dump());
  }
  return std::pair{b[0].get<int64_t>(), b[1].get<int64_t>()};
}


/// `elements` values of `info` (whole rows) at `data` as f32: GGML blocks dequantised
/// (common/ggml_type.h), the float dtypes widened exactly.
void to_f32(const TensorInfo& info, const void* data, float* out, uint64_t elements) {
  if (info.block_type) {
    dequantize_row(*info.block_type, data, out, static_cast<int64_t>(elements));
  } else {
    convert_to_f32(info.dtype, data, out, elements);
  }
}

/// The TensorInfo of GGUF tensor `t` under `name`: F32 / F16 / BF16 as the safetensors
/// dtypes they equal, every other type as GGML blocks.
TensorInfo tensor_info_of(const GgufTensorInfo& t, const std::string& name, const std::filesystem::path& file) {
  TensorInfo info{name, DType::kF32, t.shape(), t.data_begin, t.nbytes, file, std::nullopt};
  switch (t.type) {
    case GgmlType::kF32: break;
    case GgmlType::kF16: info.dtype = DType::kF16; break;
    case GgmlType::kBF16: info.dtype = DType::kBF16; break;
    default: info.block_type = t.type;
  }
  return info;
}

/// Bytes of `elements` values of `info` (a multiple of its rows for block types).
uint64_t bytes_of(const TensorInfo& info, uint64_t elements) {
  if (!info.block_type) return elements * dtype_size(info.dtype);
  const GgmlTypeTraits t = ggml_traits(*info.block_type);
  return elements / static_cast<uint64_t>(t.block_elements) * static_cast<uint64_t>(t.block_bytes);
}

}  // namespace

std::unique_ptr<Checkpoint> Checkpoint::open(const UserPath& dir) {
  std::error_code ec;
  const auto status = std::filesystem::status(dir, ec);
  if (!std::filesystem::exists(status)) {
    fail_invalid(std::string(dir.extension() == ".gguf" ? "GGUF file " : "checkpoint directory ") + dir.describe() +
                 " does not exist" +
                 (ec && ec != std::errc::no_such_file_or_directory ? " or cannot be reached: " + ec.message() : ""));
  }
  // A GGUF by name or by its magic (Ollama keeps its GGUFs as extension-less blobs).
  const bool gguf = std::filesystem::is_regular_file(status) && (dir.extension() == ".gguf" || has_gguf_magic(dir));
  if (!gguf && !std::filesystem::is_directory(status)) {
    fail_invalid(dir.describe() + " is neither a checkpoint directory (a folder holding config.json and "
                 "*.safetensors) nor a GGUF file");
  }
  try {
    return gguf ? open_gguf(dir) : open_directory(dir);
  } catch (const Error& e) {
    rethrow_in(e, dir);  // a file inside it: name what the directory was resolved from
  }
}

std::unique_ptr<Checkpoint> Checkpoint::open_directory(const std::filesystem::path& dir) {
  std::unique_ptr<Checkpoint> self(new Checkpoint());
  self->dir_ = dir;
  if (!std::filesystem::exists(dir / "config.json")) {
    if (const std::string hint = gguf_hint(dir); !hint.empty()) {
      fail_invalid((dir / "config.json").string() + ": missing" + hint);
    }
  }
  self->config_ = read_json(dir / "config.json", kConfigJsonLimits);
  self->fp8_block_ = read_fp8_block(self->config_, (dir / "config.json").string());
  const auto gen_path = dir / "generation_config.json";
  std::error_code ec;
  self->generation_config_ =
      std::filesystem::exists(gen_path, ec) ? read_json(gen_path, kConfigJsonLimits) : nlohmann::json::object();

  const auto index_path = dir / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;
  std::vector<std::filesystem::path> paths;
  if (std::filesystem::exists(index_path, ec)) {
    weight_map = read_weight_map(index_path);
    std::set<std::string> shards;
    for (const auto& [tensor, file] : weight_map) {
      if (shards.insert(file).second && !std::filesystem::is_regular_file(dir / file, ec)) {
        fail_invalid(index_path.string() + ": tensor '" + tensor + "' is mapped to '" + file +
                     "', which does not exist in " + dir.string());
      }
    }
    for (const auto& file : shards) paths.push_back(dir / file);
  } else {
    paths = list_safetensors(dir);
  }

  for (const auto& path : paths) self->files_.push_back(SafetensorsFile::open(path));
  for (const auto& file : self->files_) {
    for (const auto& [name, info] : file->tensors()) {
      const auto [it, inserted] = self->index_.emplace(name, &info);
      if (!inserted) {
        fail_invalid(dir.string() + ": tensor '" + name + "' is present in both " + it->second->file.string() +
                     " and " + info.file.string());
      }
    }
  }
  for (const auto& [tensor, file] : weight_map) {
    const auto it = self->index_.find(tensor);
    if (it == self->index_.end() || it->second->file != dir / file) {
      fail_invalid(index_path.string() + ": tensor '" + tensor + "' is mapped to '" + file +
                   "' but that file does not hold it");
    }
  }
  return self;
}

std::unique_ptr<Checkpoint> Checkpoint::open_gguf(const std::filesystem::path& file) {
  std::unique_ptr<Checkpoint> self(new Checkpoint());
  self->dir_ = file.parent_path().empty() ? std::filesystem::path(".") : file.parent_path();
  self->gguf_ = GgufModelFiles::open(file);
  GgufHfModel model = map_gguf_to_hf(*self->gguf_);
  self->config_ = std::move(model.config);
  self->generation_config_ = std::move(model.generation_config);
  for (const GgufHfTensor& t : model.tensors) {
    // Messages name the tensor as the user's file does (blk.0.attn_q.weight); the index
    // finds it by its Hugging Face name.
    auto info = std::make_unique<TensorInfo>(
        tensor_info_of(*t.gguf, t.gguf->name, self->gguf_->file_of(*t.gguf).path()));
    info->shape = t.shape;
    if (!self->index_.emplace(t.hf_name, info.get()).second) {
      fail_invalid(file.string() + ": two GGUF tensors map to '" + t.hf_name + "' (the second is " + t.gguf->name + ")");
    }
    if (t.unpermute_heads > 0) self->unpermute_heads_[t.hf_name] = t.unpermute_heads;
    self->gguf_source_[info.get()] = t.gguf;
    self->gguf_infos_.push_back(std::move(info));
  }
  for (const GgufKvB& kv : model.kv_b) self->kv_b_[kv.hf_name] = kv;
  return self;
}

std::string Checkpoint::config_origin() const {
  if (gguf_) return gguf_->files().front()->path().string() + " (GGUF metadata)";
  return (dir_ / "config.json").string();
}

void Checkpoint::fail_missing_tensor(const std::string& name) const {
  if (gguf_ == nullptr) fail_invalid(dir_.string() + ": tensor '" + name + "' not found");
  fail_invalid(gguf_->files().front()->path().string() + ": no tensor of this GGUF maps to '" + name +
               "' (the Hugging Face name charm reads; common/gguf_model.h maps llama.cpp's names to those)");
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, info] : index_) names.push_back(name);
  return names;  // std::map keeps them sorted
}

std::vector<const TensorInfo*> Checkpoint::non_expert_tensors(const ExpertTensorNames& names) const {
  const size_t hole = names.prefix.find("{}");
  const std::string head = names.prefix.substr(0, hole);
  const std::string tail = hole == std::string::npos ? "" : names.prefix.substr(hole + 2) + ".";
  const auto is_expert = [&](const std::string& name) {
    if (hole == std::string::npos || name.compare(0, head.size(), head) != 0) return false;
    size_t i = head.size();
    const size_t digits = i;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
    return i > digits && name.compare(i, tail.size(), tail) == 0;
  };
  std::vector<const TensorInfo*> out;
  for (const auto& [name, info] : index_) {
    if (!is_expert(name)) out.push_back(info);
  }
  return out;
}

uint64_t Checkpoint::non_expert_bytes(const ExpertTensorNames& names) const {
  uint64_t bytes = 0;
  for (const TensorInfo* info : non_expert_tensors(names)) bytes += info->nbytes;
  return bytes;
}

const SafetensorsFile& Checkpoint::file_of(const TensorInfo& info) const {
  for (const auto& file : files_) {
    if (file->path() == info.file) return *file;
  }
  fail_internal("tensor '" + info.name + "' names file " + info.file.string() + ", which this checkpoint did not open");
}

const uint8_t* Checkpoint::mapped(const TensorInfo& info) const {
  if (const auto it = gguf_source_.find(&info); it != gguf_source_.end()) return gguf_->mapped(*it->second);
  return file_of(info).mapped(info);
}

void Checkpoint::read_bytes(const TensorInfo& info, uint64_t offset, uint64_t count, void* dst) const {
  if (const auto it = gguf_source_.find(&info); it != gguf_source_.end()) {
    gguf_->read(*it->second, offset, count, dst);
    return;
  }
  file_of(info).read(info, offset, count, dst);
}


std::vector<float> Checkpoint::load_f32(const std::string& name, const std::vector<int64_t>& shape) const {
  if (const auto it = kv_b_.find(name); it != kv_b_.end()) {
    const GgufKvB& kv = it->second;
    const std::vector<int64_t> have{kv.heads * (kv.nope + kv.v), kv.kv_lora_rank};
    if (have != shape) {
      fail_invalid(kv.k_b->name + " / " + kv.v_b->name + ": assembled '" + name + "' has shape " + shape_text(have) +
                   ", expected " + shape_text(shape));
    }
    return assemble_kv_b(kv);
  }
  const TensorInfo* info = find(name);
  if (info == nullptr) fail_missing_tensor(name);
  if (info->shape != shape) {  // info->name: the file's own name (a GGUF's blk.N...)
    fail_invalid(info->file.string() + ": tensor '" + info->name + "' has shape " + shape_text(info->shape) +
                 ", expected " + shape_text(shape));
  }
  std::vector<float> out(info->numel());
  to_f32(*info, mapped(*info), out.data(), out.size());
  if (progress_) progress_->add(info->nbytes);
  if (info->dtype == DType::kF8E4M3 && !info->block_type) dequantise_fp8(*info, out);
  require_finite(*info, DType::kF32, out.data(), out.size());  // after dequantisation: what is computed with
  if (!shape.empty()) {
    unpermute_rows(name, reinterpret_cast<uint8_t*>(out.data()), shape.front(),
                   out.size() / static_cast<size_t>(std::max<int64_t>(shape.front(), 1)) * sizeof(float));
  }
  return out;
}

StoredMatrix Checkpoint::load_matrix(const std::string& name, int64_t rows, int64_t cols) const {
  StoredMatrix m;
  m.shape.rows = rows;
  m.shape.cols = cols;
  const TensorInfo* info = find(name);
  if (info == nullptr || info->dtype == DType::kF8E4M3) {
    // Missing (throws, or DeepSeek's kv_b_proj assembled from a GGUF) or fp8: kept as
    // their exact f32 values.
    return StoredMatrix::from_f32(load_f32(name, {rows, cols}), rows, cols);
  }
  if (info->shape != std::vector<int64_t>{rows, cols}) {
    fail_invalid(info->file.string() + ": tensor '" + info->name + "' has shape " + shape_text(info->shape) +
                 ", expected " + shape_text({rows, cols}));
  }
  const auto* bytes = mapped(*info);
  if (progress_) progress_->add(info->nbytes);
  if (info->block_type) {  // GGML blocks stay as stored (a row is whole blocks, so rows permute)
    m.shape.format = WeightFormat::kGgml;
    m.shape.ggml_type = *info->block_type;
    m.data.assign(bytes, bytes + info->nbytes);
    if (const auto bad = find_non_finite(m.view())) {
      fail_invalid(info->file.string() + ": tensor '" + info->name + "' dequantises to " + bad->describe(m.shape) +
                   "; charm refuses non-finite weights");
    }
  } else {
    m.shape.format = weight_format_of(info->dtype);
    require_finite(*info, info->dtype, bytes, info->numel());
    m.data.assign(bytes, bytes + info->nbytes);
  }
  unpermute_rows(name, m.data.data(), rows, static_cast<size_t>(m.shape.data_bytes() / std::max<int64_t>(rows, 1)));
  return m;
}

void Checkpoint::unpermute_rows(const std::string& name, uint8_t* data, int64_t rows, size_t row_bytes) const {
  const auto it = unpermute_heads_.find(name);
  if (it == unpermute_heads_.end()) return;
  const int64_t heads = it->second;
  const int64_t d = rows / heads, half = d / 2;
  std::vector<uint8_t> gguf_order(data, data + static_cast<size_t>(rows) * row_bytes);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < 2; ++t) {
      for (int64_t j = 0; j < half; ++j) {
        const int64_t hf_row = h * d + t * half + j, gguf_row = h * d + 2 * j + t;
        std::memcpy(data + static_cast<size_t>(hf_row) * row_bytes,
                    gguf_order.data() + static_cast<size_t>(gguf_row) * row_bytes, row_bytes);
      }
    }
  }
}

std::vector<float> Checkpoint::assemble_kv_b(const GgufKvB& kv) const {
  std::vector<float> k_b(kv.k_b->numel()), v_b(kv.v_b->numel());  // [heads, rank, nope], [heads, v, rank]
  for (auto [info, out] : {std::pair{kv.k_b, &k_b}, std::pair{kv.v_b, &v_b}}) {
    const TensorInfo t = tensor_info_of(*info, info->name, gguf_->file_of(*info).path());
    to_f32(t, gguf_->mapped(*info), out->data(), out->size());
    require_finite(t, DType::kF32, out->data(), out->size());
  }
  const int64_t rank = kv.kv_lora_rank, per_head = kv.nope + kv.v;
  std::vector<float> out(static_cast<size_t>(kv.heads * per_head * rank));
  for (int64_t h = 0; h < kv.heads; ++h) {
    for (int64_t r = 0; r < kv.nope; ++r) {  // k rows: column r of the head's [rank, nope] k_b
      for (int64_t c = 0; c < rank; ++c) out[(h * per_head + r) * rank + c] = k_b[(h * rank + c) * kv.nope + r];
    }
    for (int64_t r = 0; r < kv.v; ++r) {
      std::memcpy(&out[(h * per_head + kv.nope + r) * rank], &v_b[(h * kv.v + r) * rank], rank * sizeof(float));
    }
  }
  return out;
}

const TensorInfo& Checkpoint::fp8_scale_of(const TensorInfo& info) const {
  const std::string where = info.file.string() + ": F8_E4M3 tensor '" + info.name + "'";
  if (info.shape.size() != 2) fail_invalid(where + " has shape " + shape_text(info.shape) + ", expected 2-D");
  if (!fp8_block_) fail_invalid(where + " needs quantization_config.weight_block_size in config.json");
  const std::string scale_name = info.name + "_scale_inv";
  const TensorInfo* scale_info = find(scale_name);
  if (scale_info == nullptr) fail_invalid(where + " has no scale tensor '" + scale_name + "'");
  if (scale_info->dtype == DType::kF8E4M3) fail_invalid(info.file.string() + ": scale tensor '" + scale_name + "' is F8_E4M3");
  const auto [br, bc] = *fp8_block_;
  const int64_t rows = info.shape[0], cols = info.shape[1];
  const int64_t srows = (rows + br - 1) / br, scols = (cols + bc - 1) / bc;
  if (scale_info->shape != std::vector<int64_t>{srows, scols}) {
    fail_invalid(scale_info->file.string() + ": scale tensor '" + scale_name + "' has shape " +
                 shape_text(scale_info->shape) + ", expected " + shape_text({srows, scols}) + " for '" + info.name +
                 "' " + shape_text(info.shape) + " in blocks of [" + std::to_string(br) + ", " + std::to_string(bc) +
                 "]");
  }
  return *scale_info;
}

void Checkpoint::dequantise_fp8(const TensorInfo& info, std::vector<float>& weight) const {
  const TensorInfo& scale_info = fp8_scale_of(info);
  const auto [br, bc] = *fp8_block_;
  const int64_t rows = info.shape[0], cols = info.shape[1];
  const int64_t scols = scale_info.shape[1];
  std::vector<float> scale(scale_info.numel());
  convert_to_f32(scale_info.dtype, mapped(scale_info), scale.data(), scale.size());
  require_fp8_scales(scale_info, scale.data(), scale.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = scale.data() + (r / br) * scols;
    float* w = weight.data() + r * cols;
    for (int64_t c = 0; c < cols; ++c) w[c] *= s[c / bc];
  }
}

void Checkpoint::read_slice_scales(const ExpertSlice& slice, float* dst) const {
  const TensorInfo& s = *slice.scale;
  std::vector<uint8_t> raw(s.nbytes);
  read_bytes(s, 0, s.nbytes, raw.data());
  convert_to_f32(s.dtype, raw.data(), dst, s.numel());
  require_fp8_scales(s, dst, s.numel());
}

std::vector<float> Checkpoint::slice_f32(const ExpertSlice& slice) const {
  std::vector<uint8_t> raw(slice.bytes);
  read_slice(slice, raw.data());
  std::vector<float> out(static_cast<size_t>(slice.rows * slice.cols));
  to_f32(*slice.tensor, raw.data(), out.data(), out.size());
  if (slice.scale) dequantise_fp8(*slice.tensor, out);
  return out;
}

namespace {

/// Throws naming the tensor unless its shape is `want`.
void expect_shape(const TensorInfo& info, const std::vector<int64_t>& want, const std::string& what) {
  if (info.shape != want) {
    fail_invalid(info.file.string() + ": tensor '" + info.name + "' has shape " + shape_text(info.shape) +
                 ", expected " + shape_text(want) + " (" + what + ")");
  }
}

/// A [rows, cols] slice starting at element `first` of `info`.
ExpertSlice slice_of(const TensorInfo& info, uint64_t first, int64_t rows, int64_t cols) {
  return ExpertSlice{&info, bytes_of(info, first), bytes_of(info, static_cast<uint64_t>(rows * cols)), rows, cols};
}

/// gpt-oss's expert `expert` as llama.cpp's converter writes it (GptOssModel.modify_tensors,
/// read from GGUF): "<prefix>.gate_proj.weight" / "up_proj.weight" [E, I, H] and
/// "down_proj.weight" [E, H, I], [out, in] in any stored type, with biases
/// "<prefix>.{gate,up}_proj.bias" [E, I] and "down_proj.bias" [E, H]; or, converted with
/// --fuse-gate-up-exps, gate and up joined as "<prefix>.gate_up_proj.weight" [E, 2I, H]
/// (gate rows first) with "gate_up_proj.bias" [E, 2I] (likewise). Throws
/// Error(kInvalidInput) naming a missing or mis-shaped tensor, or one too few experts.
ExpertSlices split_gpt_oss_slices(const Checkpoint& ckpt, const std::string& prefix, const ExpertTensorNames& names,
                                  int expert, int64_t H, int64_t I) {
  auto tensor = [&](const std::string& name, std::vector<int64_t> shape, const std::string& what) -> const TensorInfo& {
    const TensorInfo* t = ckpt.find(prefix + "." + name);
    if (t == nullptr) ckpt.fail_missing_tensor(prefix + "." + name);
    shape[0] = t->shape.empty() ? 0 : t->shape[0];
    expect_shape(*t, shape, what);
    if (expert >= shape[0]) {
      fail_invalid(t->file.string() + ": tensor '" + t->name + "' holds " + std::to_string(shape[0]) +
                   " experts, expert " + std::to_string(expert) + " requested");
    }
    return *t;
  };
  const auto e = static_cast<uint64_t>(expert);
  const auto matrix = static_cast<uint64_t>(I * H), width = static_cast<uint64_t>(I);
  ExpertSlices out;
  if (ckpt.find(prefix + "." + names.gate_up + ".weight") != nullptr) {  // --fuse-gate-up-exps
    const TensorInfo& gate_up = tensor(names.gate_up + ".weight", {0, 2 * I, H},
                                       "experts, 2 * intermediate_size, hidden_size");
    const TensorInfo& bias = tensor(names.gate_up + ".bias", {0, 2 * I}, "experts, 2 * intermediate_size");
    out.gate = slice_of(gate_up, 2 * e * matrix, I, H);
    out.up = slice_of(gate_up, 2 * e * matrix + matrix, I, H);
    out.gate_bias = slice_of(bias, 2 * e * width, 1, I);
    out.up_bias = slice_of(bias, 2 * e * width + width, 1, I);
  } else {
    const std::string shape = "experts, intermediate_size, hidden_size";
    out.gate = slice_of(tensor(names.gate + ".weight", {0, I, H}, shape), e * matrix, I, H);
    out.up = slice_of(tensor(names.up + ".weight", {0, I, H}, shape), e * matrix, I, H);
    out.gate_bias = slice_of(tensor(names.gate + ".bias", {0, I}, "experts, intermediate_size"), e * width, 1, I);
    out.up_bias = slice_of(tensor(names.up + ".bias", {0, I}, "experts, intermediate_size"), e * width, 1, I);
  }
  out.down = slice_of(tensor(names.down + ".weight", {0, H, I}, "experts, hidden_size, intermediate_size"),
                      e * matrix, H, I);
  out.down_bias = slice_of(tensor(names.down + ".bias", {0, H}, "experts, hidden_size"), e * static_cast<uint64_t>(H),
                           1, H);
  return out;
}

}  // namespace

void Checkpoint::read_slice(const ExpertSlice& slice, void* dst) const {
  const TensorInfo& t = *slice.tensor;
  read_bytes(t, slice.offset, slice.bytes, dst);
  if (t.block_type) {  // the blocks' scales decide finiteness (find_non_finite reads just them)
    MatrixShape shape{WeightFormat::kGgml, slice.rows, slice.cols, 0};
    shape.ggml_type = *t.block_type;
    if (const auto bad = find_non_finite(MatrixView{shape, static_cast<const uint8_t*>(dst), nullptr})) {
      const auto cols = static_cast<uint64_t>(slice.cols);
      const uint64_t first = slice.offset / bytes_of(t, cols) * cols;
      fail_non_finite(t, bad->value, first + static_cast<uint64_t>(bad->row) * cols + static_cast<uint64_t>(bad->col));
    }
    return;
  }
  const uint64_t esize = dtype_size(t.dtype);
  require_finite(t, t.dtype, dst, slice.bytes / esize, slice.offset / esize);
}

ExpertWeights Checkpoint::load_expert(const ExpertTensorNames& names, int layer, int expert,
                                      int64_t hidden_size, int64_t intermediate_size) const {
  const ExpertSlices slices = locate_expert(names, layer, expert, hidden_size, intermediate_size);
  if (slices.transposed || slices.has_biases()) {
    fail_unsupported(dir_.string() + ": load_expert does not read gpt-oss's experts (the hub's transposed expert "
                     "layout, llama.cpp's biased one; the expert store does: worker/experts/expert_source.h)");
  }
  return ExpertWeights{slice_f32(slices.gate), slice_f32(slices.up), slice_f32(slices.down)};
}

ExpertSlices Checkpoint::locate_gpt_oss_expert(const std::string& prefix, const ExpertTensorNames& names, int expert,
                                               int64_t H, int64_t I) const {
  const bool converted = find(prefix + "." + names.gate + ".weight") != nullptr ||
                         find(prefix + "." + names.gate_up + ".weight") != nullptr;
  if (find(prefix + "." + names.gate_up) == nullptr && converted) {  // llama.cpp's forms (GGUF)
    return split_gpt_oss_slices(*this, prefix, names, expert, H, I);
  }
  // gpt-oss (GptOssExperts): gate_up_proj [E, H, 2I] and down_proj [E, I, H], each used
  // as x @ W, with biases [E, 2I] and [E, H]; every expert's block is contiguous.
  auto tensor = [&](const std::string& name, std::vector<int64_t> shape, const std::string& what) -> const TensorInfo& {
    const TensorInfo* t = find(prefix + "." + name);
    if (t == nullptr) fail_missing_tensor(prefix + "." + name);
    if (t->block_type || t->dtype == DType::kF8E4M3) {
      fail_unsupported(t->file.string() + ": tensor '" + t->name + "' is quantised; gpt-oss experts are read in " +
                       "f32, f16 or bf16, or as MXFP4 *_blocks / *_scales");
    }
    if (t->shape.size() != shape.size() || !std::equal(shape.begin() + 1, shape.end(), t->shape.begin() + 1)) {
      shape[0] = t->shape.empty() ? 0 : t->shape[0];
      expect_shape(*t, shape, what);
    }
    if (expert >= t->shape[0]) {
      fail_invalid(t->file.string() + ": tensor '" + t->name + "' holds " + std::to_string(t->shape[0]) +
                   " experts, expert " + std::to_string(expert) + " requested");
    }
    return *t;
  };
  const auto e = static_cast<uint64_t>(expert);
  const TensorInfo& gate_up_bias = tensor(names.gate_up + "_bias", {0, 2 * I}, "experts, 2 * intermediate_size");
  const TensorInfo& down_bias = tensor(names.down + "_bias", {0, H}, "experts, hidden_size");
  ExpertSlices out;
  out.transposed = true;
  if (find(prefix + "." + names.gate_up) == nullptr && find(prefix + "." + names.gate_up + "_blocks") != nullptr) {
    // MXFP4 (openai/gpt-oss-* as shipped): [E, out, in / 32, 16] blocks and [E, out, in / 32] scales.
    if (H % 32 != 0 || I % 32 != 0) {
      fail_invalid(dir_.string() + ": MXFP4 experts need hidden_size (" + std::to_string(H) +
                   ") and intermediate_size (" + std::to_string(I) + ") divisible by 32");
    }
    auto packed = [&](const std::string& name, int64_t rows, int64_t in, bool blocks) -> const TensorInfo& {
      std::vector<int64_t> shape{0, rows, in / 32};
      if (blocks) shape.push_back(16);
      const TensorInfo* t = find(prefix + "." + name);
      if (t == nullptr) fail_missing_tensor(prefix + "." + name);
      if (t->dtype != DType::kU8) {
        fail_invalid(t->file.string() + ": tensor '" + t->name + "' is " + dtype_name(t->dtype) +
                     "; MXFP4 blocks and scales are U8");
      }
      if (t->shape.size() != shape.size() || !std::equal(shape.begin() + 1, shape.end(), t->shape.begin() + 1)) {
        shape[0] = t->shape.empty() ? 0 : t->shape[0];
        expect_shape(*t, shape, blocks ? "experts, out, in / 32, 16 (MXFP4 blocks)" : "experts, out, in / 32 (E8M0 scales)");
      }
      if (expert >= t->shape[0]) {
        fail_invalid(t->file.string() + ": tensor '" + t->name + "' holds " + std::to_string(t->shape[0]) +
                     " experts, expert " + std::to_string(expert) + " requested");
      }
      return *t;
    };
    const TensorInfo& gu_blocks = packed(names.gate_up + "_blocks", 2 * I, H, true);
    const TensorInfo& gu_scales = packed(names.gate_up + "_scales", 2 * I, H, false);
    const TensorInfo& d_blocks = packed(names.down + "_blocks", H, I, true);
    const TensorInfo& d_scales = packed(names.down + "_scales", H, I, false);
    out.mxfp4 = true;
    out.gate = slice_of(gu_blocks, e * static_cast<uint64_t>(2 * I * H / 2), 2 * I, H / 2);
    out.gate_up_scales = slice_of(gu_scales, e * static_cast<uint64_t>(2 * I * H / 32), 2 * I, H / 32);
    out.down = slice_of(d_blocks, e * static_cast<uint64_t>(H * I / 2), H, I / 2);
    out.down_scales = slice_of(d_scales, e * static_cast<uint64_t>(H * I / 32), H, I / 32);
  } else {
    const TensorInfo& gate_up = tensor(names.gate_up, {0, H, 2 * I}, "experts, hidden_size, 2 * intermediate_size");
    const TensorInfo& down = tensor(names.down, {0, I, H}, "experts, intermediate_size, hidden_size");
    out.gate = slice_of(gate_up, e * static_cast<uint64_t>(H * 2 * I), H, 2 * I);
    out.down = slice_of(down, e * static_cast<uint64_t>(I * H), I, H);
  }
  out.gate_up_bias = slice_of(gate_up_bias, e * static_cast<uint64_t>(2 * I), 1, 2 * I);
  out.down_bias = slice_of(down_bias, e * static_cast<uint64_t>(H), 1, H);
  return out;
}

ExpertSlices Checkpoint::locate_expert(const ExpertTensorNames& names, int layer, int expert,
                                       int64_t hidden_size, int64_t intermediate_size) const {
  const std::string prefix = with_layer(names.prefix, layer);
  const int64_t H = hidden_size;
  const int64_t I = intermediate_size;
  const uint64_t slice = static_cast<uint64_t>(I * H);  // elements of one [I,H] or [H,I] matrix
  if (expert < 0) fail_invalid(prefix + ": expert id " + std::to_string(expert) + " is negative");
  if (H <= 0 || I <= 0) {
    fail_invalid(prefix + ": hidden_size " + std::to_string(H) + " and moe_intermediate_size " + std::to_string(I) +
                 " must be positive");
  }

  // The 3-D tensors appear both with and without ".weight" on the hub.
  auto find_3d = [&](const std::string& base) -> const TensorInfo* {
    if (const TensorInfo* t = find(base)) return t;
    return find(base + ".weight");
  };
  // Checks [E, rows, cols] with expert < E; returns the element offset of the expert's slice.
  auto expert_slice = [&](const TensorInfo& t, int64_t rows, int64_t cols, const std::string& what) {
    if (t.dtype == DType::kF8E4M3) {
      fail_unsupported(t.file.string() + ": tensor '" + t.name + "' is a fused 3-D F8_E4M3 expert tensor; only " +
                       "per-expert fp8 tensors with block scales are read");
    }
    if (t.shape.size() != 3 || t.shape[1] != rows || t.shape[2] != cols) {
      expect_shape(t, {t.shape.empty() ? 0 : t.shape[0], rows, cols}, what);
    }
    if (expert >= t.shape[0]) {
      fail_invalid(t.file.string() + ": tensor '" + t.name + "' holds " + std::to_string(t.shape[0]) +
                   " experts, expert " + std::to_string(expert) + " requested");
    }
    return static_cast<uint64_t>(expert) * static_cast<uint64_t>(rows * cols);
  };

  if (names.gpt_oss_layout) return locate_gpt_oss_expert(prefix, names, expert, H, I);
  ExpertSlices out;
  // Layout 1: one 2-D tensor per expert and projection.
  const std::string per = prefix + "." + std::to_string(expert) + ".";
  if (const TensorInfo* gate = find(per + names.gate + ".weight")) {
    const TensorInfo* up = find(per + names.up + ".weight");
    const TensorInfo* down = find(per + names.down + ".weight");
    if (up == nullptr) fail_missing_tensor(per + names.up + ".weight");
    if (down == nullptr) fail_missing_tensor(per + names.down + ".weight");
    expect_shape(*gate, {I, H}, "moe_intermediate_size, hidden_size");
    expect_shape(*up, {I, H}, "moe_intermediate_size, hidden_size");
    expect_shape(*down, {H, I}, "hidden_size, moe_intermediate_size");
    out.gate = slice_of(*gate, 0, I, H);
    out.up = slice_of(*up, 0, I, H);
    out.down = slice_of(*down, 0, H, I);
    for (ExpertSlice* sl : {&out.gate, &out.up, &out.down}) {
      if (sl->tensor->dtype != DType::kF8E4M3) continue;
      sl->scale = &fp8_scale_of(*sl->tensor);
      sl->block_rows = fp8_block_->first;
      sl->block_cols = fp8_block_->second;
    }
    return out;
  }

  const TensorInfo* down = find_3d(prefix + "." + names.down);
  // Layout 2: fused gate_up [E, 2I, H]; gate is the first I rows of the expert's slice.
  if (const TensorInfo* gate_up = find_3d(prefix + "." + names.gate_up)) {
    if (down == nullptr) fail_missing_tensor(prefix + "." + names.down);
    const uint64_t first = expert_slice(*gate_up, 2 * I, H, "experts, 2 * moe_intermediate_size, hidden_size");
    out.gate = slice_of(*gate_up, first, I, H);
    out.up = slice_of(*gate_up, first + slice, I, H);
  } else if (const TensorInfo* gate = find_3d(prefix + "." + names.gate)) {
    // Layout 3: separate 3-D gate and up [E, I, H].
    const TensorInfo* up = find_3d(prefix + "." + names.up);
    if (up == nullptr) fail_missing_tensor(prefix + "." + names.up);
    if (down == nullptr) fail_missing_tensor(prefix + "." + names.down);
    out.gate = slice_of(*gate, expert_slice(*gate, I, H, "experts, moe_intermediate_size, hidden_size"), I, H);
    out.up = slice_of(*up, expert_slice(*up, I, H, "experts, moe_intermediate_size, hidden_size"), I, H);
  } else {
    fail_invalid(dir_.string() + ": no weights for layer " + std::to_string(layer) + " expert " +
                 std::to_string(expert) + ": neither '" + per + names.gate + ".weight' nor '" + prefix + "." +
                 names.gate_up + "' nor '" + prefix + "." + names.gate + "' exists");
  }
  out.down = slice_of(*down, expert_slice(*down, H, I, "experts, hidden_size, moe_intermediate_size"), H, I);
  return out;
}

}  // namespace charm
