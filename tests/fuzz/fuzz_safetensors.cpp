// libFuzzer target: bytes as a .safetensors file, through SafetensorsFile::open (header
// length, JSON header, dtypes, shapes, offsets, overlaps) and a read of every tensor's
// first and last byte. Only charm::Error may escape the reader.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "common/error.h"
#include "common/safetensors.h"

namespace {

// One file per fuzzing process, rewritten for every input.
const std::filesystem::path& scratch() {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("charm-fuzz-" + std::to_string(::getpid()) + ".safetensors");
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(scratch().c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    auto file = charm::SafetensorsFile::open(scratch());
    for (const auto& [name, info] : file->tensors()) {
      if (info.nbytes == 0) continue;
      uint8_t byte = 0;
      file->read(info, 0, 1, &byte);
      file->read(info, info.nbytes - 1, 1, &byte);
      (void)file->mapped(info);
    }
  } catch (const charm::Error&) {
  }
  return 0;
}
