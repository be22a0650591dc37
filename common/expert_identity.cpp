#include "common/expert_identity.h"

#include <cstdio>
#include <new>

#include <xxhash.h>

#include "common/error.h"

namespace charm {

std::string ContentHash::hex() const {
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(high),
                static_cast<unsigned long long>(low));
  return text;
}

std::optional<ContentHash> ContentHash::from_hex(const std::string& text) {
  if (text.size() != 32) return std::nullopt;
  uint64_t halves[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    const char c = text[i];
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return std::nullopt;
    halves[i / 16] = (halves[i / 16] << 4) | static_cast<uint64_t>(digit);
  }
  return ContentHash{halves[0], halves[1]};
}

std::string ContentHash::bytes() const {
  std::string out(kContentHashBytes, '\0');
  for (int i = 0; i < 8; ++i) {
    out[static_cast<size_t>(i)] = static_cast<char>(high >> (56 - 8 * i));
    out[static_cast<size_t>(8 + i)] = static_cast<char>(low >> (56 - 8 * i));
  }
  return out;
}

ContentHash ContentHash::from_bytes(const uint8_t* data) {
  ContentHash h;
  for (int i = 0; i < 8; ++i) {
    h.high = (h.high << 8) | data[i];
    h.low = (h.low << 8) | data[8 + i];
  }
  return h;
}

struct ContentHasher::State {
  XXH3_state_t* xxh = nullptr;
};

ContentHasher::ContentHasher() : state_(std::make_unique<State>()) {
  state_->xxh = XXH3_createState();
  if (state_->xxh == nullptr) throw std::bad_alloc();
  XXH3_128bits_reset(state_->xxh);
}

ContentHasher::~ContentHasher() { XXH3_freeState(state_->xxh); }

void ContentHasher::update(const void* data, uint64_t bytes) {
  if (bytes > 0) XXH3_128bits_update(state_->xxh, data, static_cast<size_t>(bytes));
}

ContentHash ContentHasher::digest() const {
  const XXH128_hash_t h = XXH3_128bits_digest(state_->xxh);
  return ContentHash{h.high64, h.low64};
}

std::vector<IdentityMismatch> compare_identities(const ExpertIdentities& expected, const ExpertIdentities& got,
                                                 const std::vector<ExpertKey>& keys) {
  std::vector<IdentityMismatch> out;
  for (const ExpertKey& key : keys) {
    const auto want = expected.find(key);
    if (want == expected.end()) continue;
    const auto have = got.find(key);
    if (have == got.end()) {
      out.push_back({key, want->second, std::nullopt});
    } else if (!(have->second == want->second)) {
      out.push_back({key, want->second, have->second});
    }
  }
  return out;
}

namespace {

std::string key_text(const ExpertKey& key) {
  return "layer " + std::to_string(key.first) + " expert " + std::to_string(key.second);
}

}  // namespace

std::string describe_mismatches(const std::vector<IdentityMismatch>& mismatches, const std::string& got_where,
                                const std::string& expected_where) {
  if (mismatches.empty()) fail_internal("describe_mismatches: no mismatch to describe");
  const IdentityMismatch& first = mismatches.front();
  std::string text = key_text(first.key) + ": " +
                     (first.got ? "content hash " + first.got->hex() + " " + got_where
                                : "no content hash " + got_where) +
                     ", " + first.expected.hex() + " " + expected_where;
  if (mismatches.size() > 1) {
    constexpr size_t kNamed = 8;
    text += "; and " + std::to_string(mismatches.size() - 1) + " more (";
    for (size_t i = 1; i < mismatches.size() && i <= kNamed; ++i) {
      text += (i > 1 ? ", " : "") + key_text(mismatches[i].key);
    }
    text += mismatches.size() - 1 > kNamed ? ", ...)" : ")";
  }
  return text;
}

}  // namespace charm
