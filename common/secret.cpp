#include "common/secret.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include "common/error.h"

namespace charm {

std::string read_secret(const SecretSource& source) {
  if (!source.configured()) return "";
  std::string secret;
  std::string where;
  if (!source.file.empty()) {
    where = source.key + ": file " + source.file.describe();
    std::ifstream in(source.file, std::ios::binary);
    if (!in) {
      std::error_code ec;
      fail_invalid(where + (std::filesystem::exists(source.file, ec) ? " cannot be read" : " cannot be read: it does not exist"));
    }
    std::ostringstream text;
    text << in.rdbuf();
    secret = text.str();
    std::error_code ec;
    const auto mode = std::filesystem::status(source.file, ec).permissions();
    using std::filesystem::perms;
    if (!ec && (mode & (perms::group_read | perms::others_read)) != perms::none) {
      spdlog::warn("{} is readable by group or others; chmod 600 it", where);
    }
  } else {
    where = source.key + ": environment variable " + source.env;
    const char* value = std::getenv(source.env.c_str());
    if (value == nullptr) fail_invalid(where + " is not set");
    secret = value;
  }
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r' ||
                             secret.back() == ' ' || secret.back() == '\t')) {
    secret.pop_back();
  }
  if (secret.size() < kMinSecretBytes) {
    fail_invalid(where + " holds " + std::to_string(secret.size()) + " bytes; a secret needs at least " +
                 std::to_string(kMinSecretBytes) + " (make one with: openssl rand -hex 32)");
  }
  return secret;
}

namespace {

std::string sha256(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr) != 1) {
    fail_internal("SHA-256 failed (OpenSSL EVP_Digest)");
  }
  return std::string(reinterpret_cast<const char*>(digest), size);
}

}  // namespace

bool constant_time_equal(const std::string& a, const std::string& b) {
  // Comparing digests makes the time independent of where, and whether in length, the
  // two differ.
  const std::string da = sha256(a), db = sha256(b);
  return CRYPTO_memcmp(da.data(), db.data(), da.size()) == 0;
}

}  // namespace charm
