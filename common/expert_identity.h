// The content identity of a routed expert: an XXH3-128 hash of its weight bytes as the
// checkpoint stores them (worker/experts/expert_source.h: blob_identity says which bytes, in what
// order). model_fingerprint (common/fingerprint.h) covers the config and the tensor
// headers only; this covers the bytes, so two checkpoints of one shape with different
// weights (fine-tuned, zeroed, corrupted on disk) are told apart. The coordinator holds
// the identities of its own checkpoint (worker/experts/expert_manifest.h), each worker reports
// those of the experts it serves in its helloReply, and they must agree.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/moe_types.h"

namespace charm {

/// A 128-bit content hash (XXH3-128, seed 0). `high` and `low` are XXH128_hash_t's halves.
struct ContentHash {
  uint64_t high = 0;
  uint64_t low = 0;

  /// 32 lower-case hex digits, high half first (XXH128's canonical form, as xxhsum -H2).
  std::string hex() const;
  /// Parses hex()'s form; nullopt for anything but exactly 32 hex digits.
  static std::optional<ContentHash> from_hex(const std::string& text);
  /// The 16 canonical bytes (big-endian, high half first), as the wire carries them.
  std::string bytes() const;
  /// Inverse of bytes(); `data` holds 16 bytes.
  static ContentHash from_bytes(const uint8_t* data);

  bool operator==(const ContentHash&) const = default;
};

/// Bytes of one identity on the wire (helloReply.held[].identities).
constexpr size_t kContentHashBytes = 16;

/// Incremental XXH3-128 over several byte ranges (the same value as one call over their
/// concatenation). Owns its XXH3 state. Thread-safety: one thread per hasher.
class ContentHasher {
 public:
  ContentHasher();
  ~ContentHasher();
  ContentHasher(const ContentHasher&) = delete;
  ContentHasher& operator=(const ContentHasher&) = delete;
  void update(const void* data, uint64_t bytes);
  ContentHash digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// Content identity per (layer, expert).
using ExpertIdentities = std::map<ExpertKey, ContentHash>;

/// One expert whose identity differs between two sides.
struct IdentityMismatch {
  ExpertKey key;
  ContentHash expected;  ///< the reference side's (the coordinator's checkpoint)
  std::optional<ContentHash> got;  ///< the other side's; nullopt when it reported none
};

/// The experts of `keys` whose identity in `got` is absent or differs from `expected`'s,
/// in `keys` order. Keys absent from `expected` are skipped (not known there). Throws nothing.
std::vector<IdentityMismatch> compare_identities(const ExpertIdentities& expected, const ExpertIdentities& got,
                                                 const std::vector<ExpertKey>& keys);

/// "layer 2 expert 4: content hash <got> <got_where>, <expected> <expected_where>" for the
/// first mismatch, then "; and N more (layer 0 expert 1, ...)" naming up to 8 further
/// experts. `mismatches` must not be empty.
std::string describe_mismatches(const std::vector<IdentityMismatch>& mismatches, const std::string& got_where,
                                const std::string& expected_where);

}  // namespace charm
