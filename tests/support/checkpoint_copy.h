// Test support: a private copy of a fixture checkpoint (config and weights) in a temp dir,
// and an in-place change of one routed expert's bytes, as an edit, a fine-tune of one
// expert or disk corruption would leave it. Used by the content-identity tests.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "common/checkpoint.h"
#include "common/model_config.h"
#include "coordinator/models/checkpoint_families.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"

namespace charm::testing {

inline const std::filesystem::path kQwen3Tiny =
    std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/models/qwen3-moe-tiny";

/// `source`'s config, index and safetensors files (not its tokenizer or reference
/// outputs) copied into a fresh temp dir, removed with it.
class CheckpointCopy {
 public:
  explicit CheckpointCopy(const std::filesystem::path& source = kQwen3Tiny) {
    for (const auto& entry : std::filesystem::directory_iterator(source)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_regular_file() && (name.ends_with(".json") || name.ends_with(".safetensors"))) {
        std::filesystem::copy_file(entry.path(), dir_ / name);
      }
    }
  }
  const std::filesystem::path& path() const { return dir_.path(); }

 private:
  test::TempDir dir_{"charm-checkpoint-copy"};
};

/// XORs byte 7 of (layer, expert)'s gate weight in the checkpoint at `dir`, in place with
/// pwrite (the shard keeps its inode; its mtime and ctime move).
inline void change_expert_bytes(const std::filesystem::path& dir, uint32_t layer, uint32_t expert) {
  const auto checkpoint = Checkpoint::open(dir);
  const ModelConfig config = ModelConfig::parse(checkpoint->config_json(), "config.json", checkpoint_families());
  const ExpertSlices s = checkpoint->locate_expert(config.expert_tensors, static_cast<int>(layer),
                                                   static_cast<int>(expert), config.hidden_size,
                                                   config.moe_intermediate_size);
  const auto at = static_cast<off_t>(s.gate.tensor->data_begin + s.gate.offset + 7);
  const int fd = ::open(s.gate.tensor->file.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  uint8_t byte = 0;
  REQUIRE(::pread(fd, &byte, 1, at) == 1);
  byte ^= 0x40;
  REQUIRE(::pwrite(fd, &byte, 1, at) == 1);
  ::close(fd);
}

/// Points CHARM_CACHE (common/cache_root.h) at a fresh temp dir for its lifetime, so a
/// test sees only the cache files it makes; restores the previous value.
class ScopedCacheRoot {
 public:
  ScopedCacheRoot() {
    if (const char* old = std::getenv("CHARM_CACHE")) previous_ = old;
    ::setenv("CHARM_CACHE", dir_.path().c_str(), 1);
  }
  ~ScopedCacheRoot() {
    if (previous_) {
      ::setenv("CHARM_CACHE", previous_->c_str(), 1);
    } else {
      ::unsetenv("CHARM_CACHE");
    }
  }
  ScopedCacheRoot(const ScopedCacheRoot&) = delete;
  ScopedCacheRoot& operator=(const ScopedCacheRoot&) = delete;
  const std::filesystem::path& path() const { return dir_.path(); }

 private:
  test::TempDir dir_{"charm-cache"};
  std::optional<std::string> previous_;
};

}  // namespace charm::testing
