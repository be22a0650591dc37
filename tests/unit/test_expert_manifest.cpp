// worker/experts/expert_manifest.h: the expert content-identity manifest is hashed once, cached
// under the cache root (never in the checkpoint directory), reused on restart without
// reading the checkpoint, re-hashed when a shard file changes, and a malformed or
// oversized cache file is rejected with a clear error and rebuilt.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include <xxhash.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/fingerprint.h"
#include "common/model_config.h"
#include "coordinator/models/checkpoint_families.h"
#include "tests/support/checkpoint_copy.h"
#include "tests/support/expect_error.h"
#include "worker/experts/expert_manifest.h"
#include "worker/experts/expert_source.h"

using namespace charm;
using namespace charm::testing;
namespace fs = std::filesystem;

namespace {

struct Model {
  std::unique_ptr<Checkpoint> checkpoint;
  ModelConfig config;
  std::string fingerprint;
  std::vector<ExpertKey> all;
  explicit Model(const fs::path& dir) {
    checkpoint = Checkpoint::open(dir);
    config = ModelConfig::parse(checkpoint->config_json(), "config.json", checkpoint_families());
    fingerprint = model_fingerprint(*checkpoint);
    for (int64_t l : config.moe_layer_ids()) {
      for (int64_t e = 0; e < config.num_experts; ++e) all.emplace_back(l, e);
    }
  }
  ExpertIdentities load(ManifestStats& stats, const std::vector<ExpertKey>* keys = nullptr) const {
    ManifestOptions o;
    o.cache_file = manifest_cache_file(*checkpoint, fingerprint);
    return load_expert_manifest(*checkpoint, config, keys ? *keys : all, o, &stats);
  }
  fs::path cache_file() const { return manifest_cache_file(*checkpoint, fingerprint); }
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("an expert's identity is XXH3-128 of its stored bytes: gate, up, down") {
  const Model m(kQwen3Tiny);
  const ExpertSlices s = m.checkpoint->locate_expert({}, 2, 4, m.config.hidden_size, m.config.moe_intermediate_size);
  std::string bytes;
  for (const ExpertSlice* slice : {&s.gate, &s.up, &s.down}) {
    std::string part(slice->bytes, '\0');
    m.checkpoint->read_slice(*slice, part.data());
    bytes += part;
  }
  const XXH128_hash_t want = XXH3_128bits(bytes.data(), bytes.size());
  const ExpertIdentities got = hash_expert_identities(*m.checkpoint, {}, {{2, 4}}, m.config.hidden_size,
                                                      m.config.moe_intermediate_size);
  CHECK(got.at({2, 4}) == ContentHash{want.high64, want.low64});
  CHECK(ContentHash::from_hex(got.at({2, 4}).hex()) == got.at({2, 4}));
  CHECK(ContentHash::from_bytes(reinterpret_cast<const uint8_t*>(got.at({2, 4}).bytes().data())) == got.at({2, 4}));
  CHECK_FALSE(ContentHash::from_hex(std::string(31, 'a')));
  CHECK_FALSE(ContentHash::from_hex(std::string(32, 'A')));
}

TEST_CASE("the manifest is hashed once, cached under the cache root, and reused on restart") {
  const ScopedCacheRoot root;
  const std::vector<std::string> fixture_files = listing(kQwen3Tiny);
  const Model m(kQwen3Tiny);
  ManifestStats first;
  const ExpertIdentities hashed = m.load(first);
  CHECK(hashed.size() == m.all.size());
  CHECK(first.hashed == m.all.size());
  CHECK(first.from_cache == 0);
  CHECK(first.bytes_hashed == m.all.size() * 3 * 32 * 64 * 2);  // three bf16 [32, 64] matrices each
  CHECK(first.written);
  CHECK(first.not_reused.empty());
  // Under the cache root, keyed by the fingerprint; the checkpoint directory is untouched.
  CHECK(m.cache_file().string().starts_with((root.path() / m.fingerprint).string()));
  CHECK(fs::exists(m.cache_file()));
  CHECK(listing(kQwen3Tiny) == fixture_files);

  // A restart (a fresh Checkpoint) reads nothing of the checkpoint's expert bytes.
  const Model again(kQwen3Tiny);
  ManifestStats second;
  CHECK(again.load(second) == hashed);
  CHECK(second.hashed == 0);
  CHECK(second.bytes_hashed == 0);
  CHECK(second.from_cache == m.all.size());
  CHECK_FALSE(second.written);

  // hash_missing = false (charm status): what is cached, nothing read.
  ManifestOptions status;
  status.cache_file = again.cache_file();
  status.hash_missing = false;
  CHECK(load_expert_manifest(*again.checkpoint, again.config, again.all, status).size() == m.all.size());
}

TEST_CASE("processes of one checkpoint merge their entries in the cache file") {
  const ScopedCacheRoot root;
  const Model m(kQwen3Tiny);
  const std::vector<ExpertKey> evens = {{0, 0}, {2, 2}}, odds = {{0, 1}, {3, 5}};
  ManifestStats a, b, both;
  m.load(a, &evens);
  m.load(b, &odds);
  CHECK(b.hashed == 2);
  std::vector<ExpertKey> all4 = evens;
  all4.insert(all4.end(), odds.begin(), odds.end());
  CHECK(m.load(both, &all4).size() == 4);
  CHECK(both.from_cache == 4);
  CHECK(both.hashed == 0);
}

TEST_CASE("a shard file changed after the manifest was cached is re-hashed") {
  const ScopedCacheRoot root;
  CheckpointCopy copy;
  ExpertIdentities before;
  {
    const Model m(copy.path());
    ManifestStats stats;
    before = m.load(stats);
    CHECK(stats.hashed == m.all.size());
  }
  change_expert_bytes(copy.path(), 2, 4);
  const Model m(copy.path());
  ManifestStats stats;
  const ExpertIdentities after = m.load(stats);
  CHECK(stats.hashed == m.all.size());
  CHECK(stats.from_cache == 0);
  CHECK(stats.not_reused.find(".safetensors changed since (size, mtime, ctime or inode)") != std::string::npos);
  CHECK_FALSE(after.at({2, 4}) == before.at({2, 4}));
  for (const auto& [key, hash] : before) {
    if (key != ExpertKey{2, 4}) CHECK(after.at(key) == hash);
  }
  // ... and the rewritten cache is used by the next start.
  ManifestStats next;
  CHECK(Model(copy.path()).load(next) == after);
  CHECK(next.hashed == 0);
}

TEST_CASE("a malformed or oversized cached manifest is rejected with a clear error and rebuilt") {
  const ScopedCacheRoot root;
  const Model m(kQwen3Tiny);
  ManifestStats first;
  const ExpertIdentities want = m.load(first);
  const std::string good = slurp(m.cache_file());

  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"{not json", "not valid JSON"},
           {std::string(max_manifest_bytes(m.config, 2) + 1, ' '), "over the limit of"},
           {"[]", "not an object"}}) {
    INFO(why);
    write_bytes(m.cache_file(), text);
    ManifestStats stats;
    CHECK(m.load(stats) == want);
    CHECK(stats.not_reused.find(m.cache_file().string()) != std::string::npos);
    CHECK(stats.not_reused.find(why) != std::string::npos);
    CHECK(stats.hashed == m.all.size());
    CHECK(stats.written);
    CHECK(slurp(m.cache_file()) == good);  // rebuilt as it was
  }
}

TEST_CASE("parse_manifest names the field at fault") {
  const Model m(kQwen3Tiny);
  const ManifestFile file{m.fingerprint, "/x", {{"model.safetensors", FileIdentity{1, 2, 3, 4}}},
                          {{{0, 1}, ContentHash{1, 2}}}};
  const std::string good = manifest_text(file);
  const uint64_t limit = max_manifest_bytes(m.config, 1);
  const ManifestFile parsed = parse_manifest(good, "f", m.config, limit);
  CHECK(parsed.experts == file.experts);
  CHECK(parsed.shards == file.shards);
  CHECK(parsed.model_fingerprint == m.fingerprint);

  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    REQUIRE(text.find(from) != std::string::npos);
    return text.replace(text.find(from), from.size(), to);
  };
  const std::vector<std::pair<std::string, std::string>> bad = {
      {with("charm-expert-manifest", "other"), "f: 'format' is not 'charm-expert-manifest'"},
      {with("\"version\":1", "\"version\":2"), "manifest version 2"},
      {with("xxh3-128", "md5"), "'hash' is not 'xxh3-128'"},
      {with("\"size\":1", "\"size\":-1"), "shards[0]: 'size' has the wrong type"},
      {with("\"model.safetensors\"", "\"../x.safetensors\""), "is not a file inside the checkpoint directory"},
      {with("[0,1,", "[1,1,"), "experts[0]: layer 1 is not an MoE layer"},
      {with("[0,1,", "[0,16,"), "experts[0]: expert 16 is out of range (num_experts 16)"},
      {with("[0,1,", "[0,1,7,"), "experts[0]: not [layer, expert"},
      {with("00000000000000010000000000000002", "0000000000000001000000000000000G"), "is not 32 lower-case hex"},
      {with("[0,1,\"00000000000000010000000000000002\"]", "[0,1,\"00000000000000010000000000000002\"],[0,1,\"00000000000000010000000000000002\"]"),
       "experts[1]: layer 0 expert 1 is listed twice"},
      {good + std::string(limit, ' '), "over the limit of"},
  };
  for (const auto& [text, message] : bad) {
    INFO(message);
    test::expect_error([&] { parse_manifest(text, "f", m.config, limit); }, ErrorCategory::kInvalidInput, {message});
  }
}

TEST_CASE("without a cache root the manifest is hashed every time and nothing is written") {
  const ScopedCacheRoot root;
  ::unsetenv("CHARM_CACHE");
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string saved_xdg = xdg ? xdg : "", saved_home = home ? home : "";
  ::unsetenv("XDG_CACHE_HOME");
  ::unsetenv("HOME");
  const Model m(kQwen3Tiny);
  CHECK(m.cache_file().empty());
  ManifestStats stats;
  CHECK(m.load(stats).size() == m.all.size());
  CHECK(stats.hashed == m.all.size());
  CHECK_FALSE(stats.written);
  if (xdg) ::setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1);
  if (home) ::setenv("HOME", saved_home.c_str(), 1);
}
