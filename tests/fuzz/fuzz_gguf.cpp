// libFuzzer target: bytes as a .gguf file, through GgufFile::open (header, metadata of
// every value type and nesting, alignment, tensor infos, data placement), every
// accessor of every metadata value and array element, and a read of every tensor's
// first and last byte; then as a model (Checkpoint::open: the architecture's metadata to
// config.json, the tensors to their HF names; ModelConfig::parse; the tokenizer and chat
// template from tokenizer.*). Only charm::Error may escape.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/gguf.h"
#include "common/model_config.h"
#include "coordinator/models/checkpoint_families.h"
#include "coordinator/text/model_text.h"

namespace {

// One file per fuzzing process, rewritten for every input.
const std::filesystem::path& scratch() {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("charm-fuzz-" + std::to_string(::getpid()) + ".gguf");
  return path;
}

/// Calls every accessor of `v` (each may refuse with charm::Error) and walks its elements.
void touch(const charm::GgufValue& v, int budget) {
  auto attempt = [](auto&& fn) {
    try {
      fn();
    } catch (const charm::Error&) {
    }
  };
  attempt([&] { (void)v.as_u64(); });
  attempt([&] { (void)v.as_i64(); });
  attempt([&] { (void)v.as_u32(); });
  attempt([&] { (void)v.as_i32(); });
  attempt([&] { (void)v.as_f32(); });
  attempt([&] { (void)v.as_bool(); });
  attempt([&] { (void)v.as_string(); });
  attempt([&] { (void)v.as_i64_array(); });
  attempt([&] { (void)v.as_f32_array(); });
  attempt([&] { (void)v.as_string_array(); });
  attempt([&] { (void)v.as_array_array(); });
  if (!v.is_array()) return;
  // Bounded: a long array gets its first and last few elements touched.
  const uint64_t n = v.size();
  for (uint64_t i = 0; i < n && budget > 0; ++i, --budget) {
    const uint64_t at = i < 8 ? i : n - 1 - (i - 8);
    if (i >= 16) break;
    touch(v.at(at), budget / 2);
  }
  attempt([&] { (void)v.at(n); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(scratch().c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    auto file = charm::GgufFile::open(scratch());
    for (const auto& [key, value] : file->metadata()) touch(value, 64);
    for (const auto& info : file->tensors()) {
      (void)info.shape();
      (void)info.numel();
      (void)info.rows();
      (void)info.row_bytes();
      if (file->find_tensor(info.name) != &info) __builtin_trap();  // the index must agree
      if (info.nbytes == 0) continue;
      uint8_t byte = 0;
      file->read(info, 0, 1, &byte);
      file->read(info, info.nbytes - 1, 1, &byte);
      if (*file->mapped(info) != *file->mapped(info)) __builtin_trap();
    }
  } catch (const charm::Error&) {
  }
  try {
    const auto ckpt = charm::Checkpoint::open(scratch());
    (void)charm::ModelConfig::parse(ckpt->config_json(), ckpt->config_origin(), charm::checkpoint_families());
    (void)charm::load_model_text(*ckpt);
  } catch (const charm::Error&) {
  }
  return 0;
}
